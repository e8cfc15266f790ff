#pragma once

// DeepseekV3ForCausalLM (DeepSeek-V3, Kimi K2): the shared sigmoid-routed MoE stack
// (glm4_moe_common.h) with Multi-head Latent Attention. Per token and layer the KV cache holds
// only the normed latent (kv_lora_rank values) and the shared rope key (qk_rope_head_dim values).
// Two attention paths give the same result:
//   plain:    the cached latents are expanded by kv_b_proj into per-head k_nope and v, then
//             ordinary attention (cheaper for chunks long next to their cached prefix);
//   absorbed: q_nope is multiplied into the latent space through kv_b_proj's k part, attention
//             runs over the latents directly, and the latent output is expanded by the v part
//             (cheaper for decoding and short chunks: nothing per context position is expanded).
// RoPE is interleaved (pairs 2i, 2i+1) when rope_interleave (the default), on the last
// qk_rope_head_dim dims of each q head and of kv_a_proj_with_mqa's output; YaRN rope_scaling is
// applied when config.json asks for it. Softmax scale (qk_nope + qk_rope)^-0.5, times mscale^2
// under YaRN with mscale_all_dim.
//
// Threading: as CausalLM.

#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"
#include "engine/model/causal_lm.h"
#include "engine/model/loader.h"

namespace edge::engine {

class ConfigJson;

inline constexpr const char* kDeepseekV3Architecture = "DeepseekV3ForCausalLM";

struct MlaConfig;

enum class MlaPath {
    kAuto,      // Per chunk, the path with fewer multiply-adds (mla_auto_picks_plain).
    kPlain,     // Always expand the latents.
    kAbsorbed,  // Always attend in the latent space.
};

// kAuto's choice for a chunk of `tokens` consecutive tokens of one sequence whose last token
// attends over `context` positions (itself included): true for plain, when expanding the whole
// context costs no more multiply-adds than attending in the latent space (the counts are in
// deepseek_v3.cc). False for a single token.
bool mla_auto_picks_plain(const MlaConfig& m, int64_t tokens, int64_t context);

Result<std::unique_ptr<CausalLM>> load_deepseek_v3(const std::string& dir, const ConfigJson& config,
                                                   const LoadOptions& options,
                                                   MlaPath path = MlaPath::kAuto);
// What load_deepseek_v3 checks before it reads a weight: the config's fields.
Status check_deepseek_v3_config(const ConfigJson& config);

}  // namespace edge::engine
