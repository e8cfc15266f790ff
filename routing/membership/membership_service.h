#pragma once

// MembershipService runs a Memberlist over real sockets: UDP for probes and gossip and TCP (same
// port) for push-pull and the fallback probe, on one Boost.Asio io_context. All protocol state is
// mutated on one strand; readers call snapshot() from any thread and get an immutable
// std::shared_ptr<const MembershipSnapshot> swapped atomically after every change. Work that must
// touch the protocol (state updates, user events, key rotation) goes through post().
//
// Lifetime: create() binds the sockets; start() joins; stop() leaves gracefully, and kill() drops
// everything at once (as SIGKILL would). The io_context must outlive the service and keep running
// until stop()/kill() return. The injected clock must be the system steady clock's time (timers
// are Asio steady timers). Callbacks run on the strand; set them before start().

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "routing/membership/config.h"
#include "routing/membership/keyring.h"
#include "routing/membership/memberlist.h"
#include "routing/membership/site_state.h"
#include "routing/membership/snapshot.h"
#include "routing/membership/stats.h"

namespace edge::routing::membership {

class MembershipService {
public:
    // Binds UDP and TCP on bind_host:port (port 0 picks a free one). When
    // config.advertise_addr is empty it becomes bind_host:bound_port, or for a wildcard bind
    // (0.0.0.0, ::) an interface's address (choose_advertise_address; an error when there is
    // none).
    static Result<std::unique_ptr<MembershipService>> create(boost::asio::io_context& io,
                                                             MembershipConfig config,
                                                             Keyring keyring,
                                                             SiteState initial_state,
                                                             const std::string& bind_host,
                                                             uint16_t port);
    ~MembershipService();

    uint16_t port() const;
    const std::string& advertise_addr() const;

    void set_event_callback(Memberlist::EventCallback cb);
    void set_user_event_callback(Memberlist::UserEventCallback cb);
    // Memberlist::set_local_state and set_merge_remote_state. Set before start().
    void set_local_state(Memberlist::LocalStateFn fn);
    void set_merge_remote_state(Memberlist::MergeStateFn fn);

    // TESTING ONLY: every UDP packet to an address is held back by `delay(addr)` before it is
    // sent (runs on the strand; zero sends at once), so loopback tests see distinct RTTs. Set
    // before start().
    void set_packet_delay(std::function<Duration(const std::string& addr)> delay);

    // Starts the timers and joins through `seeds` ("ip:port"); returns at once.
    void start(const std::vector<std::string>& seeds);
    // Runs `fn` on the strand with the protocol object.
    void post(std::function<void(Memberlist&)> fn);
    // Broadcasts a leave, keeps gossiping for `drain`, then closes the sockets and waits (a few
    // seconds at most) for the snapshot file's last write. Blocks; call from a thread that is not
    // running the io_context.
    void stop(Duration drain);
    // Closes everything at once without a leave. Blocks like stop().
    void kill();

    std::shared_ptr<const MembershipSnapshot> snapshot() const;
    const MembershipStats& stats() const;

private:
    class Impl;
    explicit MembershipService(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<Impl> impl_;
};

// Parses "a.b.c.d:port" or "[v6]:port".
Result<std::pair<std::string, uint16_t>> split_host_port(const std::string& addr);

}  // namespace edge::routing::membership
