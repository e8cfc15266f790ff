// The sigmoid router limited to groups, in DeepSeek-V3's own shape (more than two groups, more
// than one kept: 256 experts, n_group 8, topk_group 4) scaled down to 16 experts in 4 groups of 4
// keeping 2, on cases worked out by hand where the group limit changes the choice from a plain
// top-k, and where equal scores go to the lower index (expert or group).

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/cpu/router.h"

namespace edge::engine {
namespace {

float sig(float x) { return 1.0f / (1.0f + std::exp(-x)); }

struct Routed {
    std::vector<int32_t> idx;
    std::vector<float> weights;

    // The chosen experts, best first, as "8 4 5 9" (so a failed check prints them).
    std::string experts() const {
        std::string s;
        for (int32_t e : idx) {
            s += (s.empty() ? "" : " ") + std::to_string(e);
        }
        return s;
    }
};

Routed route(const float* logits, const float* bias, const cpu::GroupRouterConfig& c) {
    Routed r{std::vector<int32_t>(c.top_k), std::vector<float>(c.top_k)};
    std::vector<float> scratch(static_cast<size_t>(2 * c.experts + c.n_group));
    cpu::route_sigmoid_grouped(logits, bias, c, r.idx.data(), r.weights.data(), scratch.data());
    return r;
}

// Weights of experts with router logits `l`: their sigmoids renormalised, times 2.5.
void check_weights(const Routed& r, const std::vector<float>& l) {
    REQUIRE(r.weights.size() == l.size());
    float sum = 0.0f;
    for (float x : l) {
        sum += sig(x);
    }
    for (size_t j = 0; j < l.size(); ++j) {
        CAPTURE(j);
        CHECK(r.weights[j] == doctest::Approx(2.5f * sig(l[j]) / sum));
    }
}

TEST_CASE("router: 2 of 4 groups, each scored by the sum of its two best, ties to the lower") {
    cpu::GroupRouterConfig c;
    c.experts = 16;
    c.top_k = 4;
    c.n_group = 4;
    c.topk_group = 2;
    c.norm_topk_prob = true;
    c.scaling_factor = 2.5f;
    // Group scores (sums of the two best sigmoids; no bias unless given):
    //   group 0: s(4) + s(-3)   = 0.982 + 0.047 = 1.029  holds the best expert, yet is dropped
    //   group 1: s(1) + s(1)    = 0.731 + 0.731 = 1.462  kept
    //   group 2: s(1.5) + s(.5) = 0.818 + 0.622 = 1.440  kept
    //   group 3: s(3) + s(-4)   = 0.953 + 0.018 = 0.971  holds the second best, dropped
    // A plain top-4 takes 0, 12, 8, 4; a group scored by its best expert alone keeps 0 and 3.
    float logits[16] = {4.0f, -3.0f, -3.0f, -3.0f, 1.0f, 1.0f, -3.0f, -3.0f,
                        1.5f, 0.5f,  -3.0f, -3.0f, 3.0f, -4.0f, -4.0f, -4.0f};
    SUBCASE("the two best groups, experts 4 and 5 tied in the lower's favour") {
        const Routed r = route(logits, nullptr, c);
        CHECK(r.experts() == "8 4 5 9");
        check_weights(r, {1.5f, 1.0f, 1.0f, 0.5f});
    }
    SUBCASE("keeping every group is a plain top-k") {
        c.topk_group = 4;
        const Routed r = route(logits, nullptr, c);
        CHECK(r.experts() == "0 12 8 4");
        check_weights(r, {4.0f, 3.0f, 1.5f, 1.0f});
    }
    SUBCASE("two groups tied for the last place: the lower group is kept") {
        // Group 3 made a copy of group 2 (1.440 each, below group 1's 1.462).
        for (int e = 0; e < 4; ++e) {
            logits[12 + e] = logits[8 + e];
        }
        const Routed r = route(logits, nullptr, c);
        CHECK(r.experts() == "8 4 5 9");
    }
    SUBCASE("the correction bias counts in the group score, not in the weights") {
        // Expert 13 biased by 0.5: group 3 scores s(3) + s(-4) + 0.5 = 1.471, above group 1
        // (1.462) and group 2 (1.440): groups 3 and 1 are kept. Inside them the biased scores
        // rank 12 (0.953), 4 and 5 (0.731), 13 (0.518); the weights take the unbiased s.
        float bias[16] = {};
        bias[13] = 0.5f;
        const Routed r = route(logits, bias, c);
        CHECK(r.experts() == "12 4 5 13");
        check_weights(r, {3.0f, 1.0f, 1.0f, -4.0f});
    }
}

}  // namespace
}  // namespace edge::engine
