#include "routing/membership/timing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace edge::routing::membership {

Duration suspicion_timeout(int mult, size_t n, Duration interval) {
    const double node_scale = std::max(1.0, std::log10(std::max(1.0, static_cast<double>(n))));
    // memberlist truncates the scale to thousandths before multiplying.
    const int64_t scale_milli = static_cast<int64_t>(node_scale * 1000.0);
    return Duration(static_cast<int64_t>(mult) * scale_milli * interval.count() / 1000);
}

int retransmit_limit(int mult, size_t n) {
    const double node_scale = std::ceil(std::log10(static_cast<double>(n) + 1.0));
    return mult * static_cast<int>(node_scale);
}

Duration remaining_suspicion_time(int n, int k, Duration elapsed, Duration min, Duration max) {
    double frac = 0.0;
    if (k > 0) {
        frac = std::log(static_cast<double>(n) + 1.0) / std::log(static_cast<double>(k) + 1.0);
    } else {
        frac = 1.0;
    }
    const double raw = to_seconds(max) - frac * (to_seconds(max) - to_seconds(min));
    Duration timeout =
        std::chrono::milliseconds(static_cast<int64_t>(std::floor(1000.0 * raw)));
    if (timeout < min) {
        timeout = min;
    }
    return timeout - elapsed;
}

Duration push_pull_scale(Duration interval, size_t n) {
    constexpr size_t kThreshold = 32;
    if (n <= kThreshold) {
        return interval;
    }
    const double mult =
        std::ceil(std::log2(static_cast<double>(n)) - std::log2(static_cast<double>(kThreshold))) +
        1.0;
    return Duration(static_cast<int64_t>(mult) * interval.count());
}

}  // namespace edge::routing::membership
