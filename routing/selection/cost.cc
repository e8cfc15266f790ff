#include "routing/selection/cost.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>

#include "routing/membership/site_state.h"

namespace edge::routing::selection {

std::string_view rtt_source_name(RttSource s) {
    switch (s) {
        case RttSource::kLocal:
            return "local";
        case RttSource::kVivaldi:
            return "vivaldi";
        case RttSource::kGreatCircle:
            return "great_circle";
    }
    return "unknown";
}

double great_circle_m(double lat1, double lon1, double lat2, double lon2) {
    const double to_rad = std::numbers::pi / 180.0;
    const double p1 = lat1 * to_rad;
    const double p2 = lat2 * to_rad;
    const double dp = (lat2 - lat1) * to_rad;
    const double dl = (lon2 - lon1) * to_rad;
    const double a = std::sin(dp / 2) * std::sin(dp / 2) +
                     std::cos(p1) * std::cos(p2) * std::sin(dl / 2) * std::sin(dl / 2);
    const double c = 2.0 * std::atan2(std::sqrt(a), std::sqrt(std::max(0.0, 1.0 - a)));
    return kEarthRadiusM * c;
}

double fibre_rtt_s(double distance_m, double path_inflation) {
    return 2.0 * distance_m * path_inflation / (kLightSpeedMps * kFibreFraction);
}

namespace {

// An advertised rate that is NaN or infinite is garbage from the network: taken as not
// advertised (0), so it gets the floor or the default rather than a NaN or a free pool.
double advertised_rate(double rate) { return std::isfinite(rate) ? rate : 0.0; }

bool finite_position(double lat, double lon) {
    return std::isfinite(lat) && std::isfinite(lon) && lat >= -90.0 && lat <= 90.0 &&
           lon >= -180.0 && lon <= 180.0;
}

}  // namespace

CostTerms compute_cost(const CostInput& in, const CostConfig& config) {
    CostTerms t;
    if (in.is_local) {
        t.rtt_s = 0.0;
        t.rtt_source = RttSource::kLocal;
    } else if (in.local_coord && in.remote_coord && in.local_coord->is_valid() &&
               in.remote_coord->is_valid() && in.local_coord->error <= config.coord_error_max &&
               in.remote_coord->error <= config.coord_error_max) {
        t.rtt_s =
            std::chrono::duration<double>(coords::estimate_rtt(*in.local_coord, *in.remote_coord))
                .count();
        t.rtt_source = RttSource::kVivaldi;
    } else {
        t.rtt_source = RttSource::kGreatCircle;
        if (finite_position(in.local_lat, in.local_lon) &&
            finite_position(in.remote_lat, in.remote_lon)) {
            t.rtt_s = fibre_rtt_s(
                great_circle_m(in.local_lat, in.local_lon, in.remote_lat, in.remote_lon),
                config.path_inflation);
        } else {
            // A bad position from the network: assume the far side of the planet.
            t.rtt_s = fibre_rtt_s(std::numbers::pi * kEarthRadiusM, config.path_inflation);
        }
    }

    // std::max(NaN, floor) is NaN: the rates are made finite before the floor applies.
    const double decode_rate = std::max(advertised_rate(in.decode_tokens_per_s), config.min_rate);
    const double prefill = advertised_rate(in.prefill_tokens_per_s);
    const double prefill_rate =
        std::max(prefill > 0.0 ? prefill : config.default_prefill_tokens_per_s, config.min_rate);
    // Requests that must finish before this one gets a slot: the running and queued ones beyond
    // the slots (a queued request with a slot free starts at the next engine step, so a short
    // burst at an idle pool does not make it look a whole generation away).
    const double slots_ahead =
        std::max(0.0, static_cast<double>(in.queue_depth) + static_cast<double>(in.running) + 1.0 -
                          static_cast<double>(std::max<uint32_t>(in.capacity, 1)));
    t.queue_s = slots_ahead * config.mean_output_tokens / decode_rate;
    t.prefill_s = config.prompt_tokens / prefill_rate;
    const double kv = membership::effective_kv_use(in.kv_use);
    if (kv > config.kv_soft_limit && config.kv_soft_limit < 1.0) {
        t.kv_s =
            (kv - config.kv_soft_limit) / (1.0 - config.kv_soft_limit) * config.kv_full_penalty_s;
    }
    t.penalty_s = (in.suspect ? config.suspect_penalty_s : 0.0) +
                  (in.ejected ? config.ejected_penalty_s : 0.0) +
                  (in.degraded ? config.degraded_penalty_s : 0.0);
    t.total_s = t.rtt_s + t.queue_s + t.prefill_s + t.kv_s + t.penalty_s;
    // The one definition gossip reads too (it sends a pool's load at once when it crosses it).
    membership::PoolLoad load;
    load.queue_depth = in.queue_depth;
    load.running = in.running;
    load.kv_use = in.kv_use;
    load.max_queue = in.max_queue;
    t.saturated = membership::pool_saturated(load, in.capacity, config.saturation_limits());
    if (!std::isfinite(t.total_s)) {
        // Only a config outside its checked ranges gets here (a rate floor of 0 or NaN, an
        // infinite penalty). A NaN total would break the route table's sort: the pool sorts
        // last and is not used.
        t.total_s = kUnusableCostS;
        t.saturated = true;
    }
    return t;
}

}  // namespace edge::routing::selection
