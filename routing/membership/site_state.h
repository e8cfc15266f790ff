#pragma once

// SiteState is what one member (an edge site) tells every other: where it is, how to reach it,
// and per model pool which version it serves, in what state, with what capacity and live load.
// A member's state carries a version (SiteState travels with it in Alive messages and push-pull)
// so a newer state always replaces an older one. Plain values; encode/decode are pure functions.
// decode_site_state treats its input as untrusted, skips fields it does not know, and leaves out
// a pool in a state it does not know (a newer peer's: not servable as far as this version can
// tell), keeping the site's other pools.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace edge::routing::membership {

enum class PoolState : uint8_t { kLoading = 1, kServing = 2, kDraining = 3 };
std::string_view pool_state_name(PoolState s);

struct PoolLoad {
    // Requests waiting for admission.
    uint32_t queue_depth = 0;
    // Requests being generated now.
    uint32_t running = 0;
    // Fraction of the KV cache in use, 0..1.
    double kv_use = 0.0;
    // Recent decode throughput of the pool, tokens per second.
    double tokens_per_s = 0.0;
    // Recent prefill throughput (prompt tokens computed per second); 0 = not advertised (a
    // member from before this field), so routing assumes its default_prefill_tokens_per_s.
    double prefill_tokens_per_s = 0.0;
    // Queue depth at which the engine refuses new requests (503, engine.max_queue); 0 = not
    // advertised (a member from before this field): only routing's own saturation rule applies.
    uint32_t max_queue = 0;

    bool operator==(const PoolLoad&) const = default;
};

struct PoolInfo {
    // Model name as clients request it ("kimi-k2").
    std::string model;
    // Digest of the exact weights served (rollouts pin versions by it).
    std::string version_digest;
    PoolState state = PoolState::kLoading;
    // Concurrent requests the pool can run.
    uint32_t capacity = 0;
    PoolLoad load;

    bool operator==(const PoolInfo&) const = default;
};

struct SiteState {
    std::string site_id;
    std::string region;
    // Position in degrees (the routing prior before coordinates converge).
    double latitude = 0.0;
    double longitude = 0.0;
    // host:port of the admin listener and of the peer (forwarding) listener.
    std::string admin_addr;
    std::string peer_addr;
    std::vector<PoolInfo> pools;

    bool operator==(const SiteState&) const = default;
};

// The longest string (site id, region, address, model name, digest) a site state may hold;
// decode_site_state refuses longer ones, so configuration must too (models[].name).
inline constexpr size_t kMaxSiteStringBytes = 255;

// The largest capacity a pool may advertise, concurrent sequences; decode_site_state refuses
// more, so configuration must too (engine.max_batch_sequences). A pool claiming billions of slots
// would never look busy or saturated, and draw every site's traffic.
inline constexpr uint32_t kMaxPoolCapacity = 1u << 16;

// The KV use a pool's saturation and cost are judged by: advertised figures come from the
// network, so a NaN or infinite one counts as a full cache and the rest is clamped to 0..1.
inline double effective_kv_use(double kv_use) {
    return std::isfinite(kv_use) ? std::clamp(kv_use, 0.0, 1.0) : 1.0;
}

// Routing's saturation thresholds (daemon config routing.cost.kv_saturated and
// routing.cost.saturation_queue_per_slot; selection::CostConfig takes its defaults from here).
// Gossip needs them too: a pool's load crossing one is material (load_changed_materially).
struct SaturationLimits {
    // KV-cache use (0..1) at or above which the pool counts as saturated.
    double kv_saturated = 0.98;
    // Queued requests per slot of capacity at which the pool counts as saturated.
    double queue_per_slot = 4.0;

    bool operator==(const SaturationLimits&) const = default;
};

// True when a pool of `capacity` slots with `load` takes no requests: its queue holds
// `queue_per_slot` requests per slot (at least one slot), or reaches its engine's queue bound
// (`max_queue`, 0: not advertised, no bound), or its effective KV use is at `kv_saturated`. At
// the queue bound the engine answers 503 "queue full", and the per-slot line may lie beyond it
// (4 slots, max_queue 4: 16 queued, never reached), so the bound counts on its own. Routing
// (selection::compute_cost) and gossip (load_changed_materially) both read this one definition,
// so a pool every site counts as saturated is one whose load this site sent on crossing the line.
inline bool pool_saturated(const PoolLoad& load, uint32_t capacity,
                           const SaturationLimits& limits) {
    return static_cast<double>(load.queue_depth) >=
               limits.queue_per_slot * std::max<uint32_t>(capacity, 1) ||
           (load.max_queue > 0 && load.queue_depth >= load.max_queue) ||
           effective_kv_use(load.kv_use) >= limits.kv_saturated;
}

std::vector<uint8_t> encode_site_state(const SiteState& s);
Result<SiteState> decode_site_state(std::span<const uint8_t> bytes);

// True when `next` differs from `prev` enough to be worth gossiping now: anything but load
// changed, a pool's queue depth or running count went to 0, its queue bound changed or it
// became or stopped being saturated under `limits` (pool_saturated, however small the step), or
// a load figure moved by at least `fraction` of its old value and `abs_requests` (queue depth,
// running), `fraction` (KV use) or 1 (decode and prefill tokens/s). Steps are compared with a
// little slack, so 0.9 -> 1.0 of KV use is the 0.1 it reads as, not the 0.0999... floating point
// makes it. `limits` has no default: they are routing's (MembershipConfig::saturation, reloaded
// live), and a caller that forgot them would judge crossings by a line no site routes by.
bool load_changed_materially(const SiteState& prev, const SiteState& next, double fraction,
                             uint32_t abs_requests, const SaturationLimits& limits);
// True when the two states differ only in pool load figures.
bool only_load_differs(const SiteState& a, const SiteState& b);

}  // namespace edge::routing::membership
