#pragma once

// MembershipStats are the counters and gauges of one member, plain atomics so the daemon's
// metrics exporter can read them from any thread while the membership strand writes them.

#include <atomic>
#include <cstdint>

namespace edge::routing::membership {

struct MembershipStats {
    // Gauges: members by state as this member sees them (itself included).
    std::atomic<int64_t> members_alive{0};
    std::atomic<int64_t> members_suspect{0};
    std::atomic<int64_t> members_dead{0};
    // Every transition of any member's state (join, suspect, alive, dead, left, state update).
    std::atomic<uint64_t> state_changes{0};
    std::atomic<uint64_t> probes_sent{0};
    std::atomic<uint64_t> probe_failures{0};
    // Direct probe round-trip times: count, sum and last, in microseconds.
    std::atomic<uint64_t> probe_rtt_count{0};
    std::atomic<uint64_t> probe_rtt_sum_us{0};
    std::atomic<uint64_t> probe_rtt_last_us{0};
    // Suspicions this member raised (not those it learned), and refutations of its own.
    std::atomic<uint64_t> suspicions_raised{0};
    std::atomic<uint64_t> refutations{0};
    // Members this member declared dead after its own suspicion timer ran out.
    std::atomic<uint64_t> deaths_declared{0};
    std::atomic<uint64_t> packets_sent{0};
    std::atomic<uint64_t> packets_received{0};
    std::atomic<uint64_t> bytes_sent{0};
    std::atomic<uint64_t> bytes_received{0};
    std::atomic<uint64_t> push_pulls{0};
    std::atomic<uint64_t> stream_failures{0};
    // Gauge: inbound TCP stream connections open now; and those closed at accept because
    // max_inbound_streams were open.
    std::atomic<int64_t> inbound_streams{0};
    std::atomic<uint64_t> inbound_streams_refused{0};
    // Packets and streams dropped because they failed authentication (never parsed).
    std::atomic<uint64_t> auth_failures{0};
    // Authenticated packets that did not decode.
    std::atomic<uint64_t> decode_failures{0};
    // Alive, suspect and dead messages dropped for an incarnation implausibly far past the one
    // known for their member, and user events and push-pull clocks for a Lamport time
    // implausibly far past this member's clock (forged or corrupt).
    std::atomic<uint64_t> implausible_dropped{0};
    // Alive messages naming a new member refused because the table holds max_members.
    std::atomic<uint64_t> members_refused{0};
    std::atomic<uint64_t> user_events_delivered{0};
    // Lifeguard local-health score (0 = healthy).
    std::atomic<int64_t> awareness{0};
};

}  // namespace edge::routing::membership
