#include "routing/membership/config.h"

#include <cmath>
#include <string>

namespace edge::routing::membership {

namespace {

// Members take an incarnation at most 2^32 past the one they know for a member (the plausibility
// bound in memberlist.cc), so a start above it would be dropped by members that knew this site's
// previous life at a small one. Unix seconds stay below it until 2106.
constexpr uint64_t kMaxInitialIncarnation = uint64_t{1} << 32;

int64_t to_ms(Duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

}  // namespace

Status MembershipConfig::validate() const {
    auto bad = [](const std::string& what) {
        return invalid_argument_error("membership config: " + what);
    };
    if (name.empty() || name.size() > 255) {
        return bad("name must be 1..255 bytes");
    }
    if (advertise_addr.empty() || advertise_addr.size() > 255) {
        return bad("advertise_addr must be 1..255 bytes");
    }
    if (label.size() > 255) {
        return bad("label must be at most 255 bytes");
    }
    if (probe_interval <= Duration::zero() || probe_timeout <= Duration::zero()) {
        return bad("probe_interval and probe_timeout must be positive");
    }
    if (probe_timeout >= probe_interval) {
        // The next probe tick ends the round: with no time left after the direct wait, indirect
        // and TCP probes would never be sent and one lost ping would make a suspect.
        return bad("probe_timeout (" + std::to_string(to_ms(probe_timeout)) +
                   " ms) must be less than probe_interval (" +
                   std::to_string(to_ms(probe_interval)) +
                   " ms), to leave time for indirect and TCP probes");
    }
    if (snapshot_interval <= Duration::zero()) {
        return bad("snapshot_interval must be positive");
    }
    if (max_inbound_streams == 0) {
        return bad("max_inbound_streams must be positive");
    }
    if (join_retry_interval <= Duration::zero() || join_retry_max_interval < join_retry_interval) {
        return bad("need 0 < join_retry_interval <= join_retry_max_interval");
    }
    if (gossip_interval <= Duration::zero() || push_pull_interval <= Duration::zero() ||
        reconnect_interval <= Duration::zero() ||
        stream_timeout <= Duration::zero()) {
        return bad("gossip_interval, push_pull_interval, reconnect_interval and stream_timeout must "
                   "be positive");
    }
    if (awareness_max_multiplier < 1 || suspicion_mult < 1 || suspicion_max_timeout_mult < 1 ||
        retransmit_mult < 1) {
        return bad("multipliers must be at least 1");
    }
    if (mtu < 256 || mtu > 65000) {
        return bad("mtu must be in [256, 65000] bytes");
    }
    if (max_inline_state > mtu / 2) {
        return bad("max_inline_state must be at most mtu / 2");
    }
    if (max_members < 2 || max_fetches_in_flight < 1) {
        return bad("max_members must be at least 2 and max_fetches_in_flight at least 1");
    }
    if (max_stream_bytes < 4096) {
        return bad("max_stream_bytes must be at least 4096");
    }
    if (!(load_change_fraction >= 0.0)) {
        return bad("load_change_fraction must be >= 0");
    }
    if (!(saturation.kv_saturated >= 0.0 && saturation.kv_saturated <= 1.0) ||
        !(saturation.queue_per_slot > 0.0 && std::isfinite(saturation.queue_per_slot))) {
        return bad("saturation.kv_saturated must be in 0..1 and queue_per_slot positive");
    }
    if (user_event_buffer == 0) {
        return bad("user_event_buffer must be positive");
    }
    if (initial_incarnation >= kMaxInitialIncarnation) {
        return bad("initial_incarnation must be below 2^32");
    }
    return ok_status();
}

MembershipConfig lan_profile() { return MembershipConfig{}; }

MembershipConfig wan_profile() {
    MembershipConfig c;
    c.probe_interval = std::chrono::seconds(5);
    c.probe_timeout = std::chrono::seconds(3);
    c.suspicion_mult = 6;
    c.gossip_interval = std::chrono::milliseconds(500);
    c.gossip_nodes = 4;
    c.gossip_to_the_dead_time = std::chrono::seconds(60);
    c.push_pull_interval = std::chrono::seconds(60);
    c.stream_timeout = std::chrono::seconds(30);
    return c;
}

MembershipConfig local_profile() {
    MembershipConfig c;
    c.probe_interval = std::chrono::seconds(1);
    c.probe_timeout = std::chrono::milliseconds(200);
    c.suspicion_mult = 3;
    c.gossip_interval = std::chrono::milliseconds(100);
    c.gossip_to_the_dead_time = std::chrono::seconds(15);
    c.push_pull_interval = std::chrono::seconds(15);
    c.stream_timeout = std::chrono::seconds(1);
    return c;
}

}  // namespace edge::routing::membership
