#pragma once

// Glm4MoeForCausalLM (GLM-4.5 / 4.6): the shared sigmoid-routed MoE stack
// (glm4_moe_common.h) with GQA attention: q/k/v projections with bias, optional per-head q/k
// RMSNorm after the bias, and NeoX (rotate-half) RoPE (YaRN-scaled when rope_scaling asks for
// it) on the first head_dim * partial_rotary_factor dims of each head; the rest pass through.
//
// Threading: as CausalLM.

#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"
#include "engine/model/archs/rotary_config.h"
#include "engine/model/causal_lm.h"
#include "engine/model/loader.h"

namespace edge::engine {

class ConfigJson;

inline constexpr const char* kGlm4MoeArchitecture = "Glm4MoeForCausalLM";

// partial_rotary_factor when config.json omits it: Glm4MoeConfig's default in transformers.
// Not 1.0: a GLM-4.5 config without the field rotates half of each head.
inline constexpr double kGlm4MoePartialRotaryFactor = 0.5;

struct SigmoidMoeConfig;

// GLM-specific config.json fields.
struct Glm4AttentionConfig {
    int64_t num_key_value_heads = 0;
    int64_t head_dim = 0;    // Defaults to hidden_size / num_attention_heads.
    int64_t rotary_dim = 0;  // head_dim * partial_rotary_factor, even.
    RotaryConfig rope;       // Frequencies over rotary_dim, YaRN from rope_scaling.
    bool attention_bias = false;
    bool use_qk_norm = false;

    // Reads and range-checks the fields; errors name config.json and the field.
    static Result<Glm4AttentionConfig> from_json(const ConfigJson& config,
                                                 const SigmoidMoeConfig& common);
};

Result<std::unique_ptr<CausalLM>> load_glm4_moe(const std::string& dir, const ConfigJson& config,
                                                const LoadOptions& options);
// What load_glm4_moe checks before it reads a weight: the config's fields. On success,
// `max_positions` (when given) is set to the positions the model serves, as the load serves
// them (with YaRN, the stretched length).
Status check_glm4_moe_config(const ConfigJson& config, int64_t* max_positions = nullptr);

}  // namespace edge::engine
