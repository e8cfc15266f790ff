#pragma once

// Rotary frequency tables: plain theta^(-2i/d), and YaRN (DeepSeek-V3 / Kimi K2 `rope_scaling`
// type "yarn"), which blends interpolated and extrapolated frequencies across a ramp set by
// beta_fast / beta_slow and scales attention by an mscale factor. Pure functions.

#include <cstdint>
#include <vector>

namespace edge::engine::cpu {

// inv_freq[i] = theta^(-2i / rot_dim), i < rot_dim / 2.
std::vector<double> rope_inv_freq(double theta, int64_t rot_dim);

struct YarnConfig {
    double factor = 1.0;                   // Context extension factor (> 1 to take effect).
    int64_t original_max_position = 4096;  // original_max_position_embeddings.
    double beta_fast = 32.0;               // Rotations above which dims extrapolate.
    double beta_slow = 1.0;                // Rotations below which dims interpolate.
    double mscale = 1.0;                   // Scales cos/sin (with mscale_all_dim).
    double mscale_all_dim = 0.0;           // Scales the softmax (squared).
    // `truncate` (transformers' default true): the ramp's ends rounded to whole dims (floor
    // of the low end, ceil of the high one); false keeps them fractional.
    bool truncate = true;
};

// YaRN inverse frequencies for `rot_dim` rotated dims.
std::vector<double> yarn_inv_freq(double theta, int64_t rot_dim, const YarnConfig& c);

// 0.1 * m * ln(factor) + 1 for factor > 1, else 1.
double yarn_get_mscale(double factor, double m);

}  // namespace edge::engine::cpu
