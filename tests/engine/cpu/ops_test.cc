// The non-matmul kernels against direct formulas.

#include "engine/cpu/ops.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/ops_kernels.h"

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

// Each SIMD element-wise kernel (AVX2, AVX-512: every variant this CPU runs) against its scalar
// reference on random inputs, with lengths that are and are not multiples of the vector widths
// (8, 16). Tolerances:
//   rms_norm: 4e-6 relative + 1e-7 (f32 instead of f64 sum of squares);
//   softmax, exp_sum: 4e-6 relative + 1e-9 (polynomial exp, about 2e-7, and softmax's f32
//             reciprocal of the sum);
//   silu_mul: 4e-6 relative + 1e-7 (polynomial exp);
//   RoPE:     2e-6 absolute on values of magnitude <= 4 (fused multiply-add rounding).
void check_ops_variant(const OpsVariant& simd) {
    const std::string variant = simd.name;
    CAPTURE(variant);
    std::mt19937 rng(77);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    auto close = [](float got, float want, double rel, double abs_tol) {
        return std::fabs(static_cast<double>(got) - want) <= rel * std::fabs(want) + abs_tol;
    };
    for (int64_t n : {1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 100, 128, 1000, 1024, 4097}) {
        std::vector<float> x(n), w(n), a(n), b(n);
        for (int64_t i = 0; i < n; ++i) {
            x[i] = normal(rng);
            w[i] = normal(rng);
        }
        INFO("n = " << n);
        rms_norm_scalar(x.data(), w.data(), n, 1e-6f, a.data());
        simd.rms_norm(x.data(), w.data(), n, 1e-6f, b.data());
        for (int64_t i = 0; i < n; ++i) {
            CHECK(close(b[i], a[i], 4e-6, 1e-7));
        }
        // In place, as the archs call it.
        b = x;
        simd.rms_norm(b.data(), w.data(), n, 1e-6f, b.data());
        for (int64_t i = 0; i < n; ++i) {
            CHECK(close(b[i], a[i], 4e-6, 1e-7));
        }
        // Softmax over a wide range, with some -inf (masked) entries when n allows.
        a = x;
        for (int64_t i = 0; i < n; ++i) {
            a[i] *= 10.0f;
        }
        if (n > 3) {
            a[1] = -std::numeric_limits<float>::infinity();
        }
        b = a;
        softmax_scalar(a.data(), n);
        simd.softmax(b.data(), n);
        for (int64_t i = 0; i < n; ++i) {
            CHECK(close(b[i], a[i], 4e-6, 1e-9));
        }
        // The sampler's pass: shifted by the largest value (every term <= 1) and by less (terms
        // up to e^5), -inf entries exactly 0, the sum within the same bound, in place too.
        a = x;
        for (int64_t i = 0; i < n; ++i) {
            a[i] *= 10.0f;
        }
        if (n > 3) {
            a[2] = -std::numeric_limits<float>::infinity();
        }
        const float top = *std::max_element(a.begin(), a.end());
        for (float shift : {top, top - 5.0f}) {
            std::vector<float> want(n), got(n);
            const double want_sum = exp_sum_scalar(a.data(), n, shift, want.data());
            const double got_sum = simd.exp_sum(a.data(), n, shift, got.data());
            CHECK(close(static_cast<float>(got_sum), static_cast<float>(want_sum), 4e-6, 1e-9));
            for (int64_t i = 0; i < n; ++i) {
                CHECK(close(got[i], want[i], 4e-6, 1e-9));
            }
            if (n > 3) {
                CHECK(got[2] == 0.0f);
            }
            b = a;
            CHECK(simd.exp_sum(b.data(), n, shift, b.data()) == got_sum);
            CHECK(b == got);
        }
        // SiLU product, including large magnitudes where exp over/underflows.
        std::vector<float> g = x;
        if (n > 4) {
            g[2] = 120.0f;
            g[3] = -120.0f;
        }
        silu_mul_scalar(g.data(), w.data(), n, a.data());
        simd.silu_mul(g.data(), w.data(), n, b.data());
        for (int64_t i = 0; i < n; ++i) {
            CHECK(close(b[i], a[i], 4e-6, 1e-7));
        }
    }
    // RoPE on head sizes with half-dims that are and are not multiples of 16 (and 8 for the
    // interleaved pairs), partial rotary included (rot_dim < head_dim leaves the tail).
    for (int64_t hd : {4, 8, 14, 32, 34, 64, 96, 128, 192}) {
        for (int64_t rot : {hd, hd / 2}) {
            if (rot % 2 != 0) {
                continue;
            }
            std::vector<float> head(hd), cs(rot / 2), sn(rot / 2);
            std::uniform_real_distribution<float> u(-4.0f, 4.0f);
            for (float& v : head) {
                v = u(rng);
            }
            for (int64_t i = 0; i < rot / 2; ++i) {
                const float angle = u(rng);
                cs[i] = std::cos(angle);
                sn[i] = std::sin(angle);
            }
            INFO("head_dim " << hd << " rot_dim " << rot);
            std::vector<float> a = head, b = head;
            rope_neox_scalar(a.data(), rot, cs.data(), sn.data());
            simd.rope_neox(b.data(), rot, cs.data(), sn.data());
            for (int64_t i = 0; i < hd; ++i) {
                CHECK(std::fabs(a[i] - b[i]) <= 2e-6);
            }
            a = head;
            b = head;
            rope_interleaved_scalar(a.data(), rot, cs.data(), sn.data());
            simd.rope_interleaved(b.data(), rot, cs.data(), sn.data());
            for (int64_t i = 0; i < hd; ++i) {
                CHECK(std::fabs(a[i] - b[i]) <= 2e-6);
            }
            for (int64_t i = rot; i < hd; ++i) {
                CHECK(b[i] == head[i]);
            }
        }
    }
}

TEST_CASE("exp_sum returns the sum of its own terms, however small next to the largest") {
    // One term of 1 and the others 5.5e-8 each, below half an f32 ulp of 1: an f32 running sum
    // drops those after the 1 in its lane (5e-4 of the total at 151936 terms, the sampler's
    // draw then never reaches the last ids). Also wide random terms, lengths off the widths.
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 20.0f);
    for (const OpsVariant& v : ops_variants()) {
        const std::string variant = v.name;
        CAPTURE(variant);
        for (int64_t n : {151936, 151941}) {
            for (bool dominated : {true, false}) {
                std::vector<float> x(static_cast<size_t>(n)), out(static_cast<size_t>(n));
                for (float& a : x) {
                    a = dominated ? std::log(5.5e-8f) : normal(rng);
                }
                x[0] = dominated ? 0.0f : *std::max_element(x.begin(), x.end()) + 1.0f;
                const double got = v.exp_sum(x.data(), n, x[0], out.data());
                double want = 0.0;
                for (float e : out) {
                    want += e;
                }
                CAPTURE(n);
                CAPTURE(dominated);
                CHECK(std::fabs(got - want) <= 1e-12 * want);
            }
        }
    }
}

TEST_CASE("SIMD element-wise kernels equal their scalar references") {
    const std::vector<OpsVariant> variants = ops_variants();
    REQUIRE(!variants.empty());
    CHECK(std::string(variants.front().name) == "scalar");
    CHECK(ops_isa_name() == variants.back().name);
    if (variants.size() == 1) {
        MESSAGE("no AVX2 or AVX-512 on this CPU: the dispatchers use the scalar references");
    }
    for (size_t i = 1; i < variants.size(); ++i) {
        check_ops_variant(variants[i]);
    }
}

}  // namespace
}  // namespace edge::engine::cpu
