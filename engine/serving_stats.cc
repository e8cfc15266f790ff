#include "engine/serving_stats.h"

#include <limits>

namespace edge::engine {

double LatencyHistogram::quantile_bound(double q) const {
    if (count_ == 0) {
        return 0.0;
    }
    const double target = q * static_cast<double>(count_);
    uint64_t seen = 0;
    for (size_t i = 0; i < kBounds.size(); ++i) {
        seen += counts_[i];
        if (static_cast<double>(seen) >= target) {
            return kBounds[i];
        }
    }
    return std::numeric_limits<double>::infinity();
}

}  // namespace edge::engine
