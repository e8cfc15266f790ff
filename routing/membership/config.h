#pragma once

// MembershipConfig holds every tunable of the SWIM/Lifeguard membership protocol. lan_profile()
// returns hashicorp/memberlist's DefaultLANConfig values, wan_profile() its DefaultWANConfig and
// local_profile() its DefaultLocalConfig. A plain value: copy it freely; validate() before use.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "routing/coords/vivaldi.h"
#include "routing/membership/site_state.h"

namespace edge::routing::membership {

struct MembershipConfig {
    // This member's unique name (the site id); must be non-empty and at most 255 bytes.
    std::string name;
    // The address ("host:port") other members send packets and streams to.
    std::string advertise_addr;
    // Cluster label bound into every packet as authenticated data (or sent in clear when no key
    // is configured), so two clusters on one network never mix. At most 255 bytes.
    std::string label;

    // Time between failure-detection probes of one member each.
    Duration probe_interval = std::chrono::seconds(1);
    // Time to wait for a direct ack before asking others to probe indirectly. Must be less than
    // probe_interval: a round ends when the next is due, so a wait as long as the interval would
    // leave no time for the indirect and TCP probes, and one lost ping would make a suspect.
    Duration probe_timeout = std::chrono::milliseconds(500);
    // Number of members asked to probe indirectly when a direct probe fails.
    size_t indirect_checks = 3;
    // Whether a failed probe also tries a TCP ping (catches UDP-only packet loss).
    bool tcp_fallback_probe = true;
    // Lifeguard local-health multiplier cap: timeouts stretch up to this many times.
    int awareness_max_multiplier = 8;

    // Suspicion lasts at least suspicion_mult * max(1, log10(N)) * probe_interval.
    int suspicion_mult = 4;
    // ... and at most suspicion_max_timeout_mult times that, before confirmations shrink it.
    int suspicion_max_timeout_mult = 6;

    // Time between gossip rounds (piggybacked broadcasts sent to gossip_nodes members).
    Duration gossip_interval = std::chrono::milliseconds(200);
    // Members each gossip round sends to.
    size_t gossip_nodes = 3;
    // How long dead members keep receiving gossip (so they learn they were declared dead).
    Duration gossip_to_the_dead_time = std::chrono::seconds(30);
    // Each broadcast is sent retransmit_mult * ceil(log10(N + 1)) times.
    int retransmit_mult = 4;

    // Time between periodic full-state push-pull exchanges (scaled up above 32 members).
    Duration push_pull_interval = std::chrono::seconds(30);
    // Deadline for one TCP stream (push-pull or fallback ping) to complete.
    Duration stream_timeout = std::chrono::seconds(10);
    // Largest stream message accepted, in bytes. The buffer grows only as bytes arrive, since a
    // frame can be authenticated only once it is whole.
    size_t max_stream_bytes = 32u << 20;
    // Inbound stream connections served at once, an eighth of them (at least one) from any one
    // address (that many for each member known there); more are closed at accept. With
    // stream_timeout and max_stream_bytes this bounds what unauthenticated clients can hold,
    // and one host cannot hold them all.
    size_t max_inbound_streams = 64;
    // Members kept at most (dead and left ones included, for dead_reclaim_time): far past any
    // real cluster; alive messages naming more are refused (names forged without end).
    size_t max_members = size_t{1} << 16;
    // Push-pull fetches of members' site states in flight at once.
    int64_t max_fetches_in_flight = 32;

    // Largest UDP payload sent, in bytes (memberlist's UDPBufferSize).
    size_t mtu = 1400;
    // Site state whose encoding exceeds this many bytes is not inlined in alive messages; the
    // receivers fetch it by push-pull instead (there is no cap on the state itself).
    size_t max_inline_state = 512;

    // Minimum time between two load-only state updates of this member.
    Duration load_update_min_interval = std::chrono::seconds(1);
    // A load figure counts as changed materially when it moves by this fraction (0.1 = 10 %)...
    double load_change_fraction = 0.1;
    // ... or by at least this many requests (queue depth, running requests).
    uint32_t load_change_abs = 2;
    // Routing's saturation thresholds (routing.cost.kv_saturated and saturation_queue_per_slot):
    // a pool's load crossing them is material however small the step (pool_saturated). The
    // daemon sets them from its routing config and again on each reload
    // (Memberlist::set_saturation_limits).
    SaturationLimits saturation;

    // Number of recent user events remembered to deliver each once and to replay by push-pull.
    size_t user_event_buffer = 512;

    // Members that failed are kept (and retried, see reconnect_interval) this long before being
    // forgotten; members that left are forgotten after gossip_to_the_dead_time.
    Duration dead_reclaim_time = std::chrono::hours(24);
    // Every this often, one random failed member gets a push-pull: this is how the two sides of
    // a healed partition find each other again (serf's reconnect).
    Duration reconnect_interval = std::chrono::seconds(30);

    // While this member knows no other live member, it retries its join seeds, first after
    // join_retry_interval, then at twice the previous wait up to join_retry_max_interval (so a
    // site that boots before its seeds, or whose seeds all restart, joins when they are back).
    Duration join_retry_interval = std::chrono::seconds(1);
    Duration join_retry_max_interval = std::chrono::seconds(30);

    // The gossip snapshot file (snapshot_file.h; serf's -snapshot), "" for none. Read at
    // create(): its event clock is restored (a member that restarts does not stamp events from
    // 0) and its members are joined at start() as well as the seeds. Written, when what it
    // would hold changed, at most once per snapshot_interval, and at leave().
    std::string snapshot_file;
    Duration snapshot_interval = std::chrono::seconds(1);

    // Vivaldi tunables for this member's coordinate.
    coords::VivaldiConfig vivaldi;

    // Seed for this member's random choices (probe order, gossip targets).
    uint64_t seed = 1;

    // The incarnation this process life starts from (its first site state is published at the
    // next one). MembershipService raises it to the wall-clock time in Unix seconds, so a
    // restarted site out-ranks what its previous life left in the cluster from its first message
    // on, a state too large to travel inline included. Below 2^32. The default, 0, is for a bare
    // Memberlist (simulations pin incarnations).
    uint64_t initial_incarnation = 0;

    [[nodiscard]] Status validate() const;
};

// memberlist DefaultLANConfig: probe 1 s, timeout 500 ms, gossip 200 ms to 3, push-pull 30 s.
MembershipConfig lan_profile();
// memberlist DefaultWANConfig: probe 5 s, timeout 3 s, gossip 500 ms to 4, suspicion mult 6,
// push-pull 60 s; for sites far apart.
MembershipConfig wan_profile();
// memberlist DefaultLocalConfig: probe 1 s, timeout 200 ms, gossip 100 ms, suspicion mult 3,
// push-pull 15 s; for loopback tests.
MembershipConfig local_profile();

}  // namespace edge::routing::membership
