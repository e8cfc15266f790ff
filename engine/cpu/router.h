#pragma once

// Expert routers of the DeepSeek-V3 / GLM-4.5 family: sigmoid scores, a per-expert correction
// bias used only to choose experts, group-limited selection (keep the best `topk_group` of
// `n_group` groups, a group scored by the sum of its two best biased scores), then top-k inside
// the kept groups. Experts of dropped groups are excluded outright (llama.cpp's -inf masking; HF
// masks with 0.0, which only differs when a biased score is negative). Ties go to the lower
// index. Pure functions over caller-owned buffers; thread-safe on disjoint outputs.

#include <cstdint>

namespace edge::engine::cpu {

struct GroupRouterConfig {
    int64_t experts = 0;          // Routed experts (E).
    int64_t top_k = 0;            // Experts chosen per token.
    int64_t n_group = 1;          // Groups the experts are split into (must divide E).
    int64_t topk_group = 1;       // Groups kept per token.
    bool norm_topk_prob = true;   // Renormalise the chosen weights to sum to 1.
    float scaling_factor = 1.0f;  // routed_scaling_factor, applied after renormalisation.
};

// Chooses top_k experts for one token from its E router logits. `bias` (E values, may be null)
// is the e_score_correction_bias. Writes top_k expert ids to `idx` (best first) and their weights
// (the unbiased sigmoid scores, renormalised and scaled) to `weights`. `scratch` holds 2 * E +
// n_group floats.
void route_sigmoid_grouped(const float* logits, const float* bias, const GroupRouterConfig& c,
                           int32_t* idx, float* weights, float* scratch);

}  // namespace edge::engine::cpu
