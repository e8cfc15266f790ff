#pragma once

// Rotary frequency tables: plain theta^(-2i/d), and YaRN (`rope_scaling` type "yarn" of
// DeepSeek-V3 / Kimi K2, Qwen3-MoE and GLM-4.5, as transformers' _compute_yarn_parameters), which
// blends interpolated and extrapolated frequencies across a ramp set by beta_fast / beta_slow and
// scales cos and sin by an attention factor. Pure functions.

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
    double mscale = 0.0;                   // Scales cos/sin (with mscale_all_dim); 0: absent.
    double mscale_all_dim = 0.0;           // Scales the softmax (squared); 0: absent.
    double attention_factor = 0.0;         // The cos/sin factor itself when > 0; 0: absent.
    // `truncate` (transformers' default true): the ramp's ends rounded to whole dims (floor
    // of the low end, ceil of the high one); false keeps them fractional.
    bool truncate = true;
};

// YaRN inverse frequencies for `rot_dim` rotated dims.
std::vector<double> yarn_inv_freq(double theta, int64_t rot_dim, const YarnConfig& c);

// 0.1 * m * ln(factor) + 1 for factor > 1, else 1.
double yarn_get_mscale(double factor, double m);

// The factor on cos and sin: attention_factor when set, else get_mscale(factor, mscale) /
// get_mscale(factor, mscale_all_dim) when both are set, else get_mscale(factor, 1).
double yarn_attention_factor(const YarnConfig& c);

}  // namespace edge::engine::cpu
