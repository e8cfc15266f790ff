// The non-matmul kernels against direct formulas.

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "engine/cpu/ops.h"

namespace edge::engine::cpu {
namespace {

TEST_CASE("rms_norm / softmax / silu_mul") {
    std::vector<float> x = {1, -2, 3, 0.5f}, w = {1, 2, 0.5f, 1}, out(4);
    rms_norm(x.data(), w.data(), 4, 1e-6f, out.data());
    double rms = std::sqrt((1 + 4 + 9 + 0.25) / 4 + 1e-6);
    for (int i = 0; i < 4; ++i) {
        CHECK(out[i] == doctest::Approx(x[i] / rms * w[i]).epsilon(1e-6));
    }
    std::vector<float> s = {1, 2, 3, 1000};
    softmax(s.data(), 4);
    CHECK(s[3] == doctest::Approx(1.0));
    CHECK(s[0] >= 0.0f);
    float g = 1.5f, u = -2.0f, o = 0;
    silu_mul(&g, &u, 1, &o);
    CHECK(o == doctest::Approx(1.5 / (1 + std::exp(-1.5)) * -2.0));
}

TEST_CASE("NeoX RoPE pairs i with i + d/2 and partial rotary leaves the tail") {
    const int64_t d = 8;
    std::vector<double> inv = {1.0, 0.1, 0.01, 0.001};
    std::vector<float> cs(4), sn(4);
    rope_angles(3, inv.data(), 4, cs.data(), sn.data());
    std::vector<float> h = {1, 2, 3, 4, 5, 6, 7, 8};
    std::vector<float> r = h;
    rope_neox(r.data(), d, cs.data(), sn.data());
    for (int i = 0; i < 4; ++i) {
        double a = 3 * inv[i];
        CHECK(r[i] == doctest::Approx(h[i] * std::cos(a) - h[i + 4] * std::sin(a)));
        CHECK(r[i + 4] == doctest::Approx(h[i + 4] * std::cos(a) + h[i] * std::sin(a)));
    }
    std::vector<float> p = h;
    rope_angles(3, inv.data(), 2, cs.data(), sn.data());
    rope_neox(p.data(), 4, cs.data(), sn.data());  // Rotates dims 0..3 only.
    CHECK(p[4] == 5);
    CHECK(p[7] == 8);
    CHECK(p[0] == doctest::Approx(1 * std::cos(3.0) - 3 * std::sin(3.0)));
}

TEST_CASE("attention over one position returns its value and causal weights sum to one") {
    const int64_t hd = 4;
    std::vector<float> q = {1, 0, 0, 0, 0, 1, 0, 0};  // Two query heads sharing the KV head.
    std::vector<float> k = {1, 0, 0, 0, 0, 1, 0, 0};
    std::vector<float> v = {1, 2, 3, 4, 5, 6, 7, 8};
    std::vector<float> scores(2 * 2), out(2 * hd);
    attention_gqa(q.data(), 2, hd, k.data(), v.data(), hd, 1, 1.0f, scores.data(), out.data());
    CHECK(out[0] == 1);
    CHECK(out[7] == 4);
    attention_gqa(q.data(), 2, hd, k.data(), v.data(), hd, 2, 1.0f, scores.data(), out.data());
    double e = std::exp(1.0);
    CHECK(out[0] == doctest::Approx((1 * e + 5) / (e + 1)));       // Head 0 prefers key 0.
    CHECK(out[hd] == doctest::Approx((1 + 5 * e) / (e + 1)));      // Head 1 prefers key 1.
}

}  // namespace
}  // namespace edge::engine::cpu
