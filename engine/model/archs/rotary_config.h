#pragma once

// The rotary embedding a config.json asks for: plain RoPE over the rotated dims of a head, or
// YaRN when `rope_scaling` (or transformers v5's `rope_parameters`, which ConfigJson lifts into
// it) has the type "yarn", read as transformers' _compute_yarn_parameters reads it. Shared by the
// architectures whose Hugging Face modeling builds its rotary tables with those functions
// (Qwen3-MoE, GLM-4.5 over its partial rotary dims, DeepSeek-V3's MLA rope dims).
// Immutable once read.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/cpu/rope_scaling.h"

namespace edge::engine {

class ConfigJson;

struct RotaryConfig {
    std::vector<double> inv_freq;         // rot_dim / 2 frequencies (radians per position).
    double mscale = 1.0;                  // Factor on cos and sin: YaRN's attention factor.
    std::optional<cpu::YarnConfig> yarn;  // The YaRN fields, when rope_scaling is YaRN.
    // Positions the model serves: max_position_embeddings, or with YaRN the larger of it and
    // original_max_position_embeddings x factor, the length YaRN stretches the pretrained one
    // to (as vLLM derives its max_model_len: Qwen's recipe, 32768 x 4, serves 131072 while the
    // config still says 40960).
    int64_t max_positions = 0;

    // `theta` is rope_theta, `rot_dim` the even number of dims of a head that rotate, and
    // `max_position_embeddings` the model's (YaRN's pretrained length when rope_scaling has no
    // original_max_position_embeddings). A scaling of another type is kUnimplemented naming
    // the field, the type and `architecture`; a bad YaRN value is kInvalidArgument naming the
    // file and the field.
    static Result<RotaryConfig> from_json(const ConfigJson& config, double theta, int64_t rot_dim,
                                          int64_t max_position_embeddings,
                                          std::string_view architecture);

    // cos and sin of `pos` times each frequency, times mscale: rot_dim / 2 values each.
    void angles(int64_t pos, float* cos_out, float* sin_out) const;
};

}  // namespace edge::engine
