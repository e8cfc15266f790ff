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
    kAuto,      // Per chunk, the path with fewer multiply-adds, plain within a memory bound
                // (mla_auto_picks_plain).
    kPlain,     // Always expand the latents (no bound on the scratch: for tests and comparisons).
    kAbsorbed,  // Always attend in the latent space.
};

// The most the plain path may expand under kAuto for one chunk in one layer: the bytes of its
// per-head k_nope and v rows, context x heads x (nope + v) f32 (the scratch is kept between
// forwards and shared by the layers). DeepSeek-V3 and Kimi K2 expand 128 x 256 floats = 128 KiB
// a position, so this admits 2048 positions: a fresh prefill chunk of the scheduler's default
// max_batch_tokens still takes plain, where it saves the most. Without a bound a chunk late in
// a 128k context would commit 16 GiB; the absorbed path needs row + context + latent floats a
// thread whatever the context (the price: on a long prefix a 2048-token chunk of DeepSeek-V3
// takes about 2.8x the attention multiply-adds of plain).
inline constexpr int64_t kMlaPlainMaxExpandedBytes = int64_t{256} << 20;

// kAuto's choice for a chunk of `tokens` consecutive tokens of one sequence whose last token
// attends over `context` positions (itself included), with `heads` attention heads: true for
// plain, when expanding the whole context costs no more multiply-adds than attending in the
// latent space (the counts are in deepseek_v3.cc) and its expanded rows take at most
// `max_expanded_bytes`. False for a single token.
bool mla_auto_picks_plain(const MlaConfig& m, int64_t heads, int64_t tokens, int64_t context,
                          int64_t max_expanded_bytes = kMlaPlainMaxExpandedBytes);

// `plain_max_expanded_bytes`: kAuto's bound on the plain path's expansion (tests lower it).
Result<std::unique_ptr<CausalLM>> load_deepseek_v3(
    const std::string& dir, const ConfigJson& config, const LoadOptions& options,
    MlaPath path = MlaPath::kAuto, int64_t plain_max_expanded_bytes = kMlaPlainMaxExpandedBytes);
// What load_deepseek_v3 checks before it reads a weight: the config's fields. On success,
// `max_positions` (when given) is set to the positions the model serves, as the load serves
// them (with YaRN, the stretched length).
Status check_deepseek_v3_config(const ConfigJson& config, int64_t* max_positions = nullptr);

}  // namespace edge::engine
