#pragma once

// The routing cost of one candidate pool: how long, in seconds, a request sent there now is
// expected to wait for its first token. It is the sum of three parts, each reported separately so
// operators can see why a pool was chosen:
//
//   cost = rtt + ttft + penalties
//   rtt  = 0 for the local pool; the Vivaldi estimate between the two coordinates when both are
//          valid and both errors are <= coord_error_max; otherwise the great-circle distance
//          between the sites' latitude/longitude, there and back at 2/3 c (light in fibre),
//          times path_inflation.
//   ttft = queue_s + prefill_s + kv_s
//          queue_s   = slots_ahead * mean_output_tokens / max(decode_tokens_per_s, min_rate)
//                      slots_ahead = max(0, queue_depth + running + 1 - max(capacity, 1))
//                      (queued requests count only beyond the free slots)
//          prefill_s = prompt_tokens / max(prefill_tokens_per_s, min_rate)
//          kv_s      = kv_use > kv_soft_limit ?
//                      (kv_use - kv_soft_limit) / (1 - kv_soft_limit) * kv_full_penalty_s : 0
//   penalties = suspect_penalty_s (member suspected) + ejected_penalty_s (outlier-ejected)
//               + degraded_penalty_s (degraded health)
//   saturated = queue_depth >= saturation_queue_per_slot * max(capacity, 1)
//               or queue_depth >= max_queue (when the pool advertises one: > 0)
//               or kv_use >= kv_saturated
//               (membership::pool_saturated, which gossip reads too: a pool's load crossing
//               it is sent at once)
//
// Advertised values come from the network: a NaN or infinite rate counts as not advertised, a
// NaN kv_use as a full cache, a bad position as the far side of the planet. The total is always
// finite; where it would not be (a config outside its checked ranges) it is kUnusableCostS and
// the pool counts as saturated.
//
// Pure functions on plain values; safe from any thread.

#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

#include "routing/coords/vivaldi.h"
#include "routing/membership/site_state.h"

namespace edge::routing::selection {

// Speed of light in vacuum, metres per second; fibre carries light at about 2/3 of it.
inline constexpr double kLightSpeedMps = 299'792'458.0;
inline constexpr double kFibreFraction = 2.0 / 3.0;
inline constexpr double kEarthRadiusM = 6'371'000.0;
// The total of a pool whose cost is not a number: after every real cost, seconds.
inline constexpr double kUnusableCostS = std::numeric_limits<double>::max();

struct CostConfig {
    // Ratio of real fibre path length to the great-circle distance (dimensionless, >= 1).
    double path_inflation = 1.5;
    // Largest Vivaldi error estimate (relative, dimensionless) at which the coordinate estimate
    // is trusted; above it the great-circle prior is used.
    double coord_error_max = 0.5;
    // Prompt length assumed for the prefill estimate, tokens.
    double prompt_tokens = 512.0;
    // Mean output length of a request, tokens (how long a busy slot stays busy).
    double mean_output_tokens = 256.0;
    // Prefill rate used when a pool advertises none, tokens per second.
    double default_prefill_tokens_per_s = 4000.0;
    // Floor on any advertised rate so an idle or new pool does not divide by zero, tokens/s.
    double min_rate = 1.0;
    // KV-cache use (0..1) above which the kv term grows linearly.
    double kv_soft_limit = 0.8;
    // kv term at a full cache, seconds.
    double kv_full_penalty_s = 1.0;
    // KV-cache use (0..1) at or above which the pool counts as saturated.
    double kv_saturated = membership::SaturationLimits{}.kv_saturated;
    // Queued requests per slot of capacity at which the pool counts as saturated.
    double saturation_queue_per_slot = membership::SaturationLimits{}.queue_per_slot;
    // Added when the pool's member is suspected by gossip, seconds.
    double suspect_penalty_s = 0.5;
    // Added when the pool is outlier-ejected, seconds.
    double ejected_penalty_s = 30.0;
    // Added when the pool's health is degraded (not ejected), seconds.
    double degraded_penalty_s = 0.2;

    // The two thresholds above, as membership::pool_saturated (and gossip) takes them.
    membership::SaturationLimits saturation_limits() const {
        return {.kv_saturated = kv_saturated, .queue_per_slot = saturation_queue_per_slot};
    }

    bool operator==(const CostConfig&) const = default;
};

enum class RttSource : uint8_t { kLocal, kVivaldi, kGreatCircle };
std::string_view rtt_source_name(RttSource s);

struct CostInput {
    bool is_local = false;
    // Coordinates of this site and of the candidate's site, when known.
    std::optional<coords::Coordinate> local_coord;
    std::optional<coords::Coordinate> remote_coord;
    // Positions in degrees.
    double local_lat = 0.0;
    double local_lon = 0.0;
    double remote_lat = 0.0;
    double remote_lon = 0.0;
    // Advertised load.
    uint32_t capacity = 0;
    uint32_t queue_depth = 0;
    uint32_t running = 0;
    double kv_use = 0.0;
    // Advertised rates, tokens per second; 0 means not advertised.
    double prefill_tokens_per_s = 0.0;
    double decode_tokens_per_s = 0.0;
    // Queue depth at which the pool's engine refuses requests (503); 0 means not advertised.
    uint32_t max_queue = 0;
    // Health flags.
    bool suspect = false;
    bool ejected = false;
    bool degraded = false;
};

struct CostTerms {
    double rtt_s = 0.0;
    RttSource rtt_source = RttSource::kLocal;
    double queue_s = 0.0;
    double prefill_s = 0.0;
    double kv_s = 0.0;
    double penalty_s = 0.0;
    double total_s = 0.0;
    bool saturated = false;
};

// Great-circle distance between two points given in degrees, metres (haversine).
double great_circle_m(double lat1, double lon1, double lat2, double lon2);
// Round-trip time over fibre for a great-circle distance, seconds.
double fibre_rtt_s(double distance_m, double path_inflation);

CostTerms compute_cost(const CostInput& in, const CostConfig& config);

}  // namespace edge::routing::selection
