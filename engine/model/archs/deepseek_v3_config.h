#pragma once

// The Multi-head Latent Attention fields of a DeepseekV3ForCausalLM config.json, with the rotary
// tables and softmax scale they imply (YaRN included). Immutable once read.

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/result.h"
#include "engine/cpu/rope_scaling.h"
#include "engine/model/archs/deepseek_v3.h"
#include "engine/model/archs/glm4_moe_common.h"

namespace edge::engine {

// The epsilon of q_a_layernorm and kv_a_layernorm. Hugging Face's DeepseekV3Attention builds both
// with DeepseekV3RMSNorm's default rather than config.rms_norm_eps (which only the input,
// post-attention and final norms take; llama.cpp uses it for all). The CPU model and the device
// path (cuda::mla_dims) both read it from here, so a checkpoint whose rms_norm_eps is not 1e-6
// gives the same logits on either backend.
inline constexpr float kMlaSubNormEps = 1e-6f;

// q_lora_rank when config.json omits it (not when it is null): DeepseekV3Config's default.
inline constexpr int64_t kDeepseekV3QLoraRank = 1536;

struct MlaConfig {
    int64_t q_lora_rank = 0;       // 0: q_proj directly (no query LoRA; null in config.json).
    int64_t kv_lora_rank = 0;      // Latent width (cached).
    int64_t qk_nope_head_dim = 0;  // Per-head q/k dims without RoPE.
    int64_t qk_rope_head_dim = 0;  // Per-head q dims with RoPE; the shared rope key (cached).
    int64_t v_head_dim = 0;        // Per-head value dims.
    bool rope_interleave = true;   // Pairs (2i, 2i+1); false: rotate-half.
    double softmax_scale = 0.0;    // (nope + rope)^-0.5, times mscale^2 under YaRN.
    double rope_mscale = 1.0;      // YaRN's factor on cos/sin.
    std::vector<double> inv_freq;  // qk_rope_head_dim / 2 frequencies (YaRN applied).
    // Positions the model serves: RotaryConfig::max_positions (with YaRN, at least
    // original_max_position_embeddings x factor).
    int64_t rope_max_positions = 0;

    static Result<MlaConfig> from_json(const ConfigJson& config, const SigmoidMoeConfig& common);
};

}  // namespace edge::engine
