#include "routing/membership/site_state.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <unordered_set>

#include "routing/membership/wire.h"

namespace edge::routing::membership {
namespace {

// Field tags. New fields get new tags; old decoders skip them.
enum SiteTag : uint32_t {
    kSiteId = 1, kRegion = 2, kLat = 3, kLon = 4, kAdmin = 5, kPeer = 6, kPool = 7,
};
enum PoolTag : uint32_t {
    kModel = 1, kDigest = 2, kState = 3, kCapacity = 4, kQueue = 5, kRunning = 6, kKv = 7,
    kTokens = 8, kPrefillTokens = 9, kMaxQueue = 10,
};

constexpr size_t kMaxPools = 4096;
// The largest decode or prefill rate a pool may advertise, tokens per second
// (routing.default_prefill_tokens_per_s has the same bound): a lying peer's 1e300 would make its
// pools look free of queueing or prefill cost.
constexpr double kMaxTokensPerS = 1e9;

Result<uint32_t> as_u32(const WireField& f, std::string_view what) {
    EDGE_ASSIGN_OR_RETURN(uint64_t v, f.as_uint());
    if (v > 0xffffffffull) {
        return data_loss_error("site state: " + std::string(what) + " exceeds 32 bits");
    }
    return static_cast<uint32_t>(v);
}

Result<double> as_finite(const WireField& f, std::string_view what) {
    EDGE_ASSIGN_OR_RETURN(double v, f.as_double());
    if (!std::isfinite(v)) {
        return data_loss_error("site state: " + std::string(what) + " is not finite");
    }
    return v;
}

Result<double> as_rate(const WireField& f, std::string_view what) {
    EDGE_ASSIGN_OR_RETURN(double v, as_finite(f, what));
    if (v < 0.0 || v > kMaxTokensPerS) {
        return data_loss_error("site state: " + std::string(what) + " is outside 0..1e9");
    }
    return v;
}

// Every string is bounded: the states of thousands of members are kept, copied into each
// snapshot and shown on the admin pages, and one peer's megabyte "model name" would be too.
Result<std::string> as_string(const WireField& f, std::string_view what) {
    if (f.value.size() > kMaxSiteStringBytes) {
        return data_loss_error("site state: " + std::string(what) + " is " +
                               std::to_string(f.value.size()) + " bytes (at most " +
                               std::to_string(kMaxSiteStringBytes) + ")");
    }
    return f.as_string();
}

// A pool, or nullopt for one in a state this version does not know (a newer peer's): such a pool
// is not servable as far as this site can tell, so it is left out and never routed to, while
// the site's other pools are taken. Every field is still checked, so a malformed pool fails the
// whole state as before.
Result<std::optional<PoolInfo>> decode_pool(std::span<const uint8_t> bytes) {
    PoolInfo p;
    bool known_state = true;
    WireReader r(bytes);
    while (!r.done()) {
        EDGE_ASSIGN_OR_RETURN(WireField f, r.read_field("pool"));
        switch (f.tag) {
            case kModel: {
                EDGE_ASSIGN_OR_RETURN(p.model, as_string(f, "model name"));
                break;
            }
            case kDigest: {
                EDGE_ASSIGN_OR_RETURN(p.version_digest, as_string(f, "version digest"));
                break;
            }
            case kState: {
                auto s = f.as_enum(static_cast<uint64_t>(PoolState::kLoading),
                                   static_cast<uint64_t>(PoolState::kDraining));
                if (!s.ok()) {
                    return s.status().with_context("site state: pool state");
                }
                known_state = s->has_value();
                if (known_state) {
                    p.state = static_cast<PoolState>(**s);
                }
                break;
            }
            case kCapacity: {
                EDGE_ASSIGN_OR_RETURN(p.capacity, as_u32(f, "capacity"));
                if (p.capacity > kMaxPoolCapacity) {
                    return data_loss_error("site state: capacity " + std::to_string(p.capacity) +
                                           " exceeds " + std::to_string(kMaxPoolCapacity));
                }
                break;
            }
            case kQueue: { EDGE_ASSIGN_OR_RETURN(p.load.queue_depth, as_u32(f, "queue")); break; }
            case kRunning: { EDGE_ASSIGN_OR_RETURN(p.load.running, as_u32(f, "running")); break; }
            case kKv: { EDGE_ASSIGN_OR_RETURN(p.load.kv_use, as_finite(f, "kv use")); break; }
            case kTokens: {
                EDGE_ASSIGN_OR_RETURN(p.load.tokens_per_s, as_rate(f, "tokens/s"));
                break;
            }
            case kPrefillTokens: {
                // Absent from an older member's state: 0, not advertised.
                EDGE_ASSIGN_OR_RETURN(p.load.prefill_tokens_per_s, as_rate(f, "prefill tokens/s"));
                break;
            }
            case kMaxQueue: {
                // Absent from an older member's state: 0, no bound known.
                EDGE_ASSIGN_OR_RETURN(p.load.max_queue, as_u32(f, "max queue"));
                break;
            }
            default: break;  // a newer peer's field
        }
    }
    if (!known_state) {
        return std::optional<PoolInfo>();
    }
    return std::optional<PoolInfo>(std::move(p));
}

double bounded_rate(double rate) {
    return std::isnan(rate) ? 0.0 : std::clamp(rate, 0.0, kMaxTokensPerS);
}

bool moved(double a, double b, double fraction, double abs_min) {
    // The slack takes rounding back out of the difference: 1.0 - 0.9 is 0.0999..., and KV use
    // going from 0.9 to a full cache (saturated, to the planner) was not gossiped at 0.1.
    const double slack = 1e-9 * std::max({1.0, std::abs(a), std::abs(b)});
    const double d = a == b ? 0.0 : std::abs(a - b) + slack;
    return d >= abs_min && d >= fraction * std::abs(a);
}

}  // namespace

std::string_view pool_state_name(PoolState s) {
    switch (s) {
        case PoolState::kLoading: return "loading";
        case PoolState::kServing: return "serving";
        case PoolState::kDraining: return "draining";
    }
    return "unknown";
}

std::vector<uint8_t> encode_site_state(const SiteState& s) {
    WireWriter w;
    w.field_string(kSiteId, s.site_id);
    w.field_string(kRegion, s.region);
    w.field_double(kLat, s.latitude);
    w.field_double(kLon, s.longitude);
    w.field_string(kAdmin, s.admin_addr);
    w.field_string(kPeer, s.peer_addr);
    for (const PoolInfo& p : s.pools) {
        WireWriter pw;
        pw.field_string(kModel, p.model);
        pw.field_string(kDigest, p.version_digest);
        pw.field_uint(kState, static_cast<uint64_t>(p.state));
        // Capacity and rates within what every decoder takes (one it refuses drops the whole
        // state).
        pw.field_uint(kCapacity, std::min(p.capacity, kMaxPoolCapacity));
        pw.field_uint(kQueue, p.load.queue_depth);
        pw.field_uint(kRunning, p.load.running);
        pw.field_double(kKv, p.load.kv_use);
        pw.field_double(kTokens, bounded_rate(p.load.tokens_per_s));
        pw.field_double(kPrefillTokens, bounded_rate(p.load.prefill_tokens_per_s));
        pw.field_uint(kMaxQueue, p.load.max_queue);
        w.field_bytes(kPool, pw.bytes());
    }
    return w.take();
}

Result<SiteState> decode_site_state(std::span<const uint8_t> bytes) {
    SiteState s;
    std::unordered_set<std::string> models;  // Of s.pools.
    size_t pools_seen = 0;
    WireReader r(bytes);
    while (!r.done()) {
        EDGE_ASSIGN_OR_RETURN(WireField f, r.read_field("site state"));
        switch (f.tag) {
            case kSiteId: {
                EDGE_ASSIGN_OR_RETURN(s.site_id, as_string(f, "site id"));
                break;
            }
            case kRegion: {
                EDGE_ASSIGN_OR_RETURN(s.region, as_string(f, "region"));
                break;
            }
            case kLat: { EDGE_ASSIGN_OR_RETURN(s.latitude, as_finite(f, "latitude")); break; }
            case kLon: { EDGE_ASSIGN_OR_RETURN(s.longitude, as_finite(f, "longitude")); break; }
            case kAdmin: {
                EDGE_ASSIGN_OR_RETURN(s.admin_addr, as_string(f, "admin address"));
                break;
            }
            case kPeer: {
                EDGE_ASSIGN_OR_RETURN(s.peer_addr, as_string(f, "peer address"));
                break;
            }
            case kPool: {
                // Pools as sent, those left out included, so neither the bound nor the index an
                // error names depends on which states this version knows.
                const size_t index = pools_seen++;
                if (index >= kMaxPools) {
                    return data_loss_error("site state: more than 4096 pools");
                }
                auto pool = decode_pool(f.value);
                if (!pool.ok()) {
                    return pool.status().with_context("pool " + std::to_string(index));
                }
                if (!pool->has_value()) {
                    // Not in the set either: a newer peer may stage a model's next version in a
                    // new state beside the pool serving it.
                    break;
                }
                PoolInfo& p = **pool;
                // A site serves a model once: pools are keyed by (site, model) downstream
                // (outlier records, the pool views), where a second would take the first's.
                // A set, not a scan: 4096 pools would cost 8 M comparisons a decode.
                if (!models.insert(p.model).second) {
                    return data_loss_error("site state: pool " + std::to_string(index) +
                                           " repeats model '" + p.model + "'");
                }
                s.pools.push_back(std::move(p));
                break;
            }
            default: break;
        }
    }
    if (s.latitude < -90.0 || s.latitude > 90.0 || s.longitude < -180.0 || s.longitude > 180.0) {
        return data_loss_error("site state: latitude/longitude out of range");
    }
    return s;
}

bool only_load_differs(const SiteState& a, const SiteState& b) {
    if (a.site_id != b.site_id || a.region != b.region || a.latitude != b.latitude ||
        a.longitude != b.longitude || a.admin_addr != b.admin_addr ||
        a.peer_addr != b.peer_addr || a.pools.size() != b.pools.size()) {
        return false;
    }
    for (size_t i = 0; i < a.pools.size(); ++i) {
        const PoolInfo& p = a.pools[i];
        const PoolInfo& q = b.pools[i];
        if (p.model != q.model || p.version_digest != q.version_digest || p.state != q.state ||
            p.capacity != q.capacity) {
            return false;
        }
    }
    return true;
}

bool load_changed_materially(const SiteState& prev, const SiteState& next, double fraction,
                             uint32_t abs_requests, const SaturationLimits& limits) {
    if (!only_load_differs(prev, next)) {
        return true;
    }
    for (size_t i = 0; i < prev.pools.size(); ++i) {
        const PoolLoad& a = prev.pools[i].load;
        const PoolLoad& b = next.pools[i].load;
        // A pool going idle (its queue or running count back to 0) is news however small the
        // step: else an idle site advertises its last request until something else changes.
        // So is a changed queue bound: it decides when the pool counts as saturated. So is the
        // pool becoming or ceasing to be saturated (its queue reaching or leaving a bound, its KV
        // use crossing kv_saturated), however small the step: every site, this one too, routes by
        // the gossiped figures, and would keep choosing a pool whose engine answers 503 "queue
        // full", or keep refusing one that has room again (503 all_pools_saturated).
        const uint32_t capacity = next.pools[i].capacity;  // only_load_differs: prev's too
        if ((a.queue_depth != 0 && b.queue_depth == 0) || (a.running != 0 && b.running == 0) ||
            a.max_queue != b.max_queue ||
            pool_saturated(a, capacity, limits) != pool_saturated(b, capacity, limits) ||
            moved(a.queue_depth, b.queue_depth, fraction, abs_requests) ||
            moved(a.running, b.running, fraction, abs_requests) ||
            moved(a.kv_use, b.kv_use, fraction, fraction) ||
            moved(a.tokens_per_s, b.tokens_per_s, fraction, 1.0) ||
            moved(a.prefill_tokens_per_s, b.prefill_tokens_per_s, fraction, 1.0)) {
            return true;
        }
    }
    return false;
}

}  // namespace edge::routing::membership
