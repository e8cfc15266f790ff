#pragma once

// Glm4MoeForCausalLM (GLM-4.5 / 4.6): the shared sigmoid-routed MoE stack
// (glm4_moe_common.h) with GQA attention: q/k/v projections with bias, optional per-head q/k
// RMSNorm after the bias, and NeoX (rotate-half) RoPE on the first
// head_dim * partial_rotary_factor dims of each head; the rest pass through.
//
// Threading: as CausalLM.

#include <memory>
#include <string>

#include "common/result.h"
#include "engine/model/causal_lm.h"
#include "engine/model/loader.h"

namespace edge::engine {

class ConfigJson;

inline constexpr const char* kGlm4MoeArchitecture = "Glm4MoeForCausalLM";

Result<std::unique_ptr<CausalLM>> load_glm4_moe(const std::string& dir, const ConfigJson& config,
                                                const LoadOptions& options);
// What load_glm4_moe checks before it reads a weight: the config's fields.
Status check_glm4_moe_config(const ConfigJson& config);

}  // namespace edge::engine
