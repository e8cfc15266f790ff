#include "engine/cpu/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace edge::engine::cpu {

std::vector<double> rope_inv_freq(double theta, int64_t rot_dim) {
    std::vector<double> out;
    for (int64_t i = 0; i < rot_dim / 2; ++i) {
        out.push_back(
            std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim)));
    }
    return out;
}

double yarn_get_mscale(double factor, double m) {
    return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

double yarn_attention_factor(const YarnConfig& c) {
    if (c.attention_factor > 0.0) {
        return c.attention_factor;
    }
    if (c.mscale != 0.0 && c.mscale_all_dim != 0.0) {
        return yarn_get_mscale(c.factor, c.mscale) / yarn_get_mscale(c.factor, c.mscale_all_dim);
    }
    return yarn_get_mscale(c.factor, 1.0);
}

namespace {

// The dim index whose wavelength makes `rotations` turns over the original context.
double correction_dim(double rotations, int64_t dim, double theta, int64_t max_pos) {
    return static_cast<double>(dim) *
           std::log(static_cast<double>(max_pos) / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(theta));
}

}  // namespace

std::vector<double> yarn_inv_freq(double theta, int64_t rot_dim, const YarnConfig& c) {
    std::vector<double> extra = rope_inv_freq(theta, rot_dim);
    if (!(c.factor > 1.0)) {
        return extra;
    }
    double low = correction_dim(c.beta_fast, rot_dim, theta, c.original_max_position);
    double high = correction_dim(c.beta_slow, rot_dim, theta, c.original_max_position);
    if (c.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(rot_dim - 1));
    if (low == high) {
        high += 0.001;
    }
    std::vector<double> out(extra.size());
    for (size_t i = 0; i < extra.size(); ++i) {
        double ramp = (static_cast<double>(i) - low) / (high - low);
        ramp = std::clamp(ramp, 0.0, 1.0);
        const double extrapolate = 1.0 - ramp;  // 1 for high-frequency dims.
        const double inter = extra[i] / c.factor;
        out[i] = inter * (1.0 - extrapolate) + extra[i] * extrapolate;
    }
    return out;
}

}  // namespace edge::engine::cpu
