#pragma once

// The expert-routing rules as one function each, run by the CUDA router kernel (one thread per
// token) and by the host (hd.h), so the device picks experts exactly as the CPU backend does:
//  - softmax top-k (Qwen3-MoE): probabilities = softmax(logits), the k most probable experts,
//    weights renormalised to sum to 1 when norm_topk_prob;
//  - sigmoid grouped top-k (DeepSeek-V3 / GLM-4.5): the algorithm of cpu::route_sigmoid_grouped
//    (bias used only to choose, group-limited selection, renormalise, scale).
// Ties always go to the lower expert index. Pure functions over caller-owned buffers.

#include <cmath>
#include <cstdint>

#include "engine/cuda/host/hd.h"
#include "engine/cuda/host/quant_layout.h"

namespace edge::engine::cuda {

enum class RouterScoring : int32_t { kSoftmax = 0, kSigmoid = 1 };

struct RouterParams {
    RouterScoring scoring = RouterScoring::kSoftmax;  // How logits become scores.
    int32_t experts = 0;          // Routed experts (E), at most kMaxRouterExperts.
    int32_t top_k = 0;            // Experts chosen per token (K <= E).
    int32_t n_group = 1;          // Sigmoid only: groups the experts are split into (divides E).
    int32_t topk_group = 1;       // Sigmoid only: groups kept per token.
    bool norm_topk_prob = true;   // Renormalise the chosen weights to sum to 1.
    float scaling_factor = 1.0f;  // Sigmoid only: routed_scaling_factor after renormalising.
};

inline constexpr int32_t kMaxRouterExperts = 1024;

// Floats of scratch one token's routing needs.
EDGE_HD int64_t router_scratch_floats(const RouterParams& p) {
    return 2 * static_cast<int64_t>(p.experts) + (p.n_group > 0 ? p.n_group : 1);
}

// Picks the best expert not yet in idx[0, j) among scores `v` (ties to the lower index); experts
// at -inf are only taken when nothing else is left (as the CPU rule).
EDGE_HD int32_t router_pick(const float* v, int32_t E, const int32_t* idx, int32_t j) {
    const float neg_inf = float_from_bits(0xFF800000u);
    int32_t best = -1;
    for (int32_t e = 0; e < E; ++e) {
        if (v[e] == neg_inf && best >= 0) {
            continue;
        }
        bool taken = false;
        for (int32_t t = 0; t < j; ++t) {
            taken = taken || idx[t] == e;
        }
        if (!taken && (best < 0 || v[e] > v[best])) {
            best = e;
        }
    }
    return best;
}

// Routes one token: `logits` (E values), `bias` (E values or null; sigmoid only). Writes K expert
// ids best first to `idx` and their weights to `w`. `scratch` holds router_scratch_floats(p).
EDGE_HD void route_token(const float* logits, const float* bias, const RouterParams& p,
                         int32_t* idx, float* w, float* scratch) {
    const int32_t E = p.experts;
    const float neg_inf = float_from_bits(0xFF800000u);
    float* s = scratch;           // Scores the weights come from.
    float* choice = scratch + E;  // Scores the experts are chosen by.
    if (p.scoring == RouterScoring::kSoftmax) {
        float mx = logits[0];
        for (int32_t e = 1; e < E; ++e) {
            mx = fmaxf(mx, logits[e]);
        }
        double sum = 0.0;
        for (int32_t e = 0; e < E; ++e) {
            s[e] = expf(logits[e] - mx);
            sum += s[e];
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int32_t e = 0; e < E; ++e) {
            s[e] *= inv;
            choice[e] = s[e];
        }
        float total = 0.0f;
        for (int32_t j = 0; j < p.top_k; ++j) {
            idx[j] = router_pick(choice, E, idx, j);
            total += s[idx[j]];
        }
        for (int32_t j = 0; j < p.top_k; ++j) {
            w[j] = p.norm_topk_prob ? s[idx[j]] / total : s[idx[j]];
        }
        return;
    }
    float* group_score = scratch + 2 * E;
    for (int32_t e = 0; e < E; ++e) {
        s[e] = 1.0f / (1.0f + expf(-logits[e]));
        choice[e] = s[e] + (bias != nullptr ? bias[e] : 0.0f);
    }
    const int32_t groups = p.n_group > 0 ? p.n_group : 1;
    if (groups > 1 && p.topk_group < groups) {
        const int32_t per = E / groups;
        for (int32_t g = 0; g < groups; ++g) {
            float best = neg_inf;
            float second = neg_inf;
            for (int32_t e = g * per; e < (g + 1) * per; ++e) {
                if (choice[e] > best) {
                    second = best;
                    best = choice[e];
                } else if (choice[e] > second) {
                    second = choice[e];
                }
            }
            group_score[g] = per >= 2 ? best + second : best;
        }
        const float kept_mark = float_from_bits(0x7FC00000u);  // NaN marks "kept".
        for (int32_t kept = 0; kept < p.topk_group; ++kept) {
            int32_t bg = -1;
            for (int32_t g = 0; g < groups; ++g) {
                const float gs = group_score[g];
                if (gs == gs && gs != neg_inf && (bg < 0 || gs > group_score[bg])) {
                    bg = g;
                }
            }
            if (bg < 0) {
                break;
            }
            group_score[bg] = kept_mark;
        }
        for (int32_t g = 0; g < groups; ++g) {
            if (group_score[g] == group_score[g]) {
                for (int32_t e = g * per; e < (g + 1) * per; ++e) {
                    choice[e] = neg_inf;
                }
            }
        }
    }
    float sum = 0.0f;
    for (int32_t j = 0; j < p.top_k; ++j) {
        idx[j] = router_pick(choice, E, idx, j);
        w[j] = s[idx[j]];
        sum += s[idx[j]];
    }
    for (int32_t j = 0; j < p.top_k; ++j) {
        if (p.norm_topk_prob) {
            w[j] /= (sum + 1e-20f);
        }
        w[j] *= p.scaling_factor;
    }
}

}  // namespace edge::engine::cuda
