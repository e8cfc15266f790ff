#include "engine/cpu/router.h"

#include <cmath>
#include <limits>

namespace edge::engine::cpu {

void route_sigmoid_grouped(const float* logits, const float* bias, const GroupRouterConfig& c,
                           int32_t* idx, float* weights, float* scratch) {
    const int64_t E = c.experts;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    float* s = scratch;           // Unbiased sigmoid scores.
    float* choice = scratch + E;  // Biased scores, dropped groups set to -inf.
    float* group_score = scratch + 2 * E;
    for (int64_t e = 0; e < E; ++e) {
        s[e] = 1.0f / (1.0f + std::exp(-logits[e]));
        choice[e] = s[e] + (bias != nullptr ? bias[e] : 0.0f);
    }
    const int64_t groups = c.n_group > 0 ? c.n_group : 1;
    if (groups > 1 && c.topk_group < groups) {
        const int64_t per = E / groups;
        for (int64_t g = 0; g < groups; ++g) {
            float best = neg_inf;
            float second = neg_inf;
            for (int64_t e = g * per; e < (g + 1) * per; ++e) {
                if (choice[e] > best) {
                    second = best;
                    best = choice[e];
                } else if (choice[e] > second) {
                    second = choice[e];
                }
            }
            group_score[g] = per >= 2 ? best + second : best;
        }
        // Keep the topk_group best groups (ties to the lower group); mask the rest.
        for (int64_t kept = 0; kept < c.topk_group; ++kept) {
            int64_t bg = -1;
            for (int64_t g = 0; g < groups; ++g) {
                if (!std::isnan(group_score[g]) && group_score[g] != neg_inf &&
                    (bg < 0 || group_score[g] > group_score[bg])) {
                    bg = g;
                }
            }
            if (bg < 0) {
                break;
            }
            group_score[bg] = std::numeric_limits<float>::quiet_NaN();  // NaN marks "kept".
        }
        for (int64_t g = 0; g < groups; ++g) {
            if (!std::isnan(group_score[g])) {
                for (int64_t e = g * per; e < (g + 1) * per; ++e) {
                    choice[e] = neg_inf;
                }
            }
        }
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < c.top_k; ++j) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; ++e) {
            if (choice[e] == neg_inf && best >= 0) {
                continue;
            }
            bool taken = false;
            for (int64_t t = 0; t < j; ++t) {
                taken = taken || idx[t] == e;
            }
            if (!taken && (best < 0 || choice[e] > choice[best])) {
                best = e;
            }
        }
        idx[j] = best;
        weights[j] = s[best];
        sum += s[best];
    }
    for (int64_t j = 0; j < c.top_k; ++j) {
        if (c.norm_topk_prob) {
            weights[j] /= (sum + 1e-20f);
        }
        weights[j] *= c.scaling_factor;
    }
}

}  // namespace edge::engine::cpu
