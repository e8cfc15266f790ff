#pragma once

// MembershipSnapshot is an immutable picture of the cluster as one member sees it, for the
// router: built on the membership strand, published as std::shared_ptr<const MembershipSnapshot>
// and read from any thread without locks (a reader keeps the one it loaded for as long as it
// needs). MemberEvent is a change notification delivered on the membership strand.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "routing/coords/vivaldi.h"
#include "routing/membership/messages.h"
#include "routing/membership/site_state.h"

namespace edge::routing::membership {

struct MemberView {
    std::string name;
    std::string addr;
    NodeState state = NodeState::kAlive;
    uint64_t incarnation = 0;
    // Newest state version heard of, and the version `site` holds (older while being fetched;
    // 0 without one).
    uint64_t state_version = 0;
    uint64_t site_version = 0;
    // Which life of the member this is: a number that changes exactly when the memberlist finds
    // the member begun anew (first heard of; back after a death or a leave; or restarted, told by
    // a newer incarnation whose state versions went down), never when a suspect refutes or its
    // state changes within one life. Per memberlist: compare it only between snapshots of one.
    uint64_t life = 0;
    // Null until known, and from when the member is known to have restarted (came back after a
    // death or leave, or counts its versions anew) until its new life's state arrives: a
    // previous life's pools are never routed to.
    std::shared_ptr<const SiteState> site;
    std::optional<coords::Coordinate> coord;
    bool is_local = false;
};

struct MembershipSnapshot {
    std::string local_name;
    coords::Coordinate local_coord;
    TimePoint taken{};
    std::vector<MemberView> members;  // sorted by name

    const MemberView* find(const std::string& name) const;
    size_t count(NodeState state) const;
};

enum class MemberEventKind { kJoin, kUpdate, kSuspect, kRecover, kDead, kLeave };
std::string_view member_event_name(MemberEventKind k);

struct MemberEvent {
    MemberEventKind kind;
    std::string name;
};

}  // namespace edge::routing::membership
