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

// Picks the best expert whose bit in `taken` is clear among scores `v` (ties to the lower
// index); experts at -inf are only taken when nothing else is left (as the CPU rule).
EDGE_HD int32_t router_pick(const float* v, int32_t E, const uint32_t* taken) {
    const float neg_inf = float_from_bits(0xFF800000u);
    int32_t best = -1;
    float best_v = 0.0f;
    for (int32_t e = 0; e < E; ++e) {
        if (((taken[e / 32] >> (e % 32)) & 1u) != 0) {
            continue;
        }
        const float x = v[e];
        if (x == neg_inf && best >= 0) {
            continue;
        }
        if (best < 0 || x > best_v) {
            best = e;
            best_v = x;
        }
    }
    return best;
}

// The K best of `v` into idx, best first (K <= E <= kMaxRouterExperts).
EDGE_HD void router_pick_top_k(const float* v, int32_t E, int32_t K, int32_t* idx) {
    uint32_t taken[kMaxRouterExperts / 32] = {};
    for (int32_t j = 0; j < K; ++j) {
        const int32_t b = router_pick(v, E, taken);
        idx[j] = b;
        taken[b / 32] |= 1u << (b % 32);
    }
}

// The steps of the rule below, shared with the CUDA router kernel (a warp per token), which does
// the per-expert loops by lane and calls these for what depends on order.

// 1 / (sum of the E softmax numerators s), summed in index order in double.
EDGE_HD float router_softmax_inverse(const float* s, int32_t E) {
    double sum = 0.0;
    for (int32_t e = 0; e < E; ++e) {
        sum += s[e];
    }
    return static_cast<float>(1.0 / sum);
}

// Group g's score: the sum of its two best choice scores (its best alone if it has one expert).
EDGE_HD float router_group_score(const float* choice, int32_t g, int32_t per) {
    const float neg_inf = float_from_bits(0xFF800000u);
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
    return per >= 2 ? best + second : best;
}

// Marks the topk_group best groups (ties to the lower index) NaN in group_score.
EDGE_HD void router_keep_groups(float* group_score, int32_t groups, int32_t topk_group) {
    const float neg_inf = float_from_bits(0xFF800000u);
    const float kept_mark = float_from_bits(0x7FC00000u);
    for (int32_t kept = 0; kept < topk_group; ++kept) {
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
}

// The chosen experts' weights from their scores s.
EDGE_HD void router_weights(const float* s, const int32_t* idx, const RouterParams& p, float* w) {
    if (p.scoring == RouterScoring::kSoftmax) {
        float total = 0.0f;
        for (int32_t j = 0; j < p.top_k; ++j) {
            total += s[idx[j]];
        }
        for (int32_t j = 0; j < p.top_k; ++j) {
            w[j] = p.norm_topk_prob ? s[idx[j]] / total : s[idx[j]];
        }
        return;
    }
    float sum = 0.0f;
    for (int32_t j = 0; j < p.top_k; ++j) {
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
        for (int32_t e = 0; e < E; ++e) {
            s[e] = expf(logits[e] - mx);
        }
        const float inv = router_softmax_inverse(s, E);
        for (int32_t e = 0; e < E; ++e) {
            s[e] *= inv;
            choice[e] = s[e];
        }
    } else {
        float* group_score = scratch + 2 * E;
        for (int32_t e = 0; e < E; ++e) {
            s[e] = 1.0f / (1.0f + expf(-logits[e]));
            choice[e] = s[e] + (bias != nullptr ? bias[e] : 0.0f);
        }
        const int32_t groups = p.n_group > 0 ? p.n_group : 1;
        if (groups > 1 && p.topk_group < groups) {
            const int32_t per = E / groups;
            for (int32_t g = 0; g < groups; ++g) {
                group_score[g] = router_group_score(choice, g, per);
            }
            router_keep_groups(group_score, groups, p.topk_group);
            for (int32_t e = 0; e < E; ++e) {
                const float gs = group_score[e / per];
                if (gs == gs) {  // Not kept.
                    choice[e] = neg_inf;
                }
            }
        }
    }
    router_pick_top_k(choice, E, p.top_k, idx);
    router_weights(s, idx, p, w);
}

}  // namespace edge::engine::cuda
