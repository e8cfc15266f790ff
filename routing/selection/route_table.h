#pragma once

// RouteTable is every pool the cluster advertises, grouped by model, with its routing cost
// already computed (see cost.h). It is built from one MembershipSnapshot (and the local health
// view) when the snapshot changes, so a routing decision only filters and compares numbers.
// Immutable after build: share it as std::shared_ptr<const RouteTable> and read it from any thread.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "routing/membership/messages.h"
#include "routing/membership/site_state.h"
#include "routing/membership/snapshot.h"
#include "routing/selection/cost.h"

namespace edge::routing::selection {

enum class PoolHealth : uint8_t { kHealthy, kDegraded, kEjected };

// Health of a member's pool for a model, as this site's outlier detector sees it.
using PoolHealthFn = std::function<PoolHealth(std::string_view member, std::string_view model)>;

struct RouteCandidate {
    // Gossip member name and the site it advertises.
    std::string member;
    std::string site_id;
    std::string model;
    std::string version_digest;
    membership::PoolState state = membership::PoolState::kLoading;
    membership::NodeState member_state = membership::NodeState::kAlive;
    PoolHealth health = PoolHealth::kHealthy;
    bool is_local = false;
    // False for a remote pool whose site takes no forwarded requests (it advertises no peer
    // address) when the table was built for forwarding: listed, never chosen.
    bool reachable = true;
    CostTerms cost;
};

// The pools of one model. The request path reads only the compact parallel arrays, which are
// sorted by total cost (so a decision scans only the cheap end, however many pools there are);
// `candidates` holds the full records in insertion order and `index` points into it.
struct ModelPools {
    std::vector<RouteCandidate> candidates;
    std::vector<uint32_t> index;
    std::vector<double> total_s;
    // kServing | kSaturated | kLocal per candidate; kServing only for a reachable pool, so
    // choose() takes an unreachable one for not serving.
    std::vector<uint8_t> flags;
    // Index into `versions` per candidate.
    std::vector<uint32_t> version;
    std::vector<std::string> versions;
    // Positions (in the sorted arrays) of the local pools, ascending.
    std::vector<uint32_t> local_positions;

    static constexpr uint8_t kServing = 1;
    static constexpr uint8_t kSaturated = 2;
    static constexpr uint8_t kLocal = 4;

    // Index of `digest` in `versions`, or -1.
    int64_t find_version(std::string_view digest) const;
};

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct RouteTable {
    // Name of the local member (the one whose pools get hysteresis).
    std::string local_member;
    // Pools per model name, in insertion (snapshot member name) order.
    std::unordered_map<std::string, ModelPools, StringHash, std::equal_to<>> by_model;

    // Appends a candidate; the cost-sorted arrays are built by seal(), once after the adds.
    void add(RouteCandidate c);
    void seal();
    // The pools of `model` (null when none); only on a sealed table.
    const ModelPools* find(std::string_view model) const;
    size_t size() const;

  private:
    bool sealed_ = true;  // Every add() has been sealed.
};

// Builds the table from a snapshot. Members that are dead or left, or whose site state is not
// known yet, contribute no candidates. `health` may be empty (every pool healthy). With
// `need_peer_addr` (a table requests are forwarded by), the remote pools of a site without a peer
// address are not reachable: left out of the choice itself, not dropped after it (where they had
// already beaten the local pool or turned "all saturated" into "no pool").
RouteTable build_route_table(const membership::MembershipSnapshot& snapshot,
                             const CostConfig& config, const PoolHealthFn& health = {},
                             bool need_peer_addr = false);

}  // namespace edge::routing::selection
