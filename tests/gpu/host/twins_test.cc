// The routing rule the device runs (router_rule.h) against the CPU backend's routers, and the CPU
// twins of the kernels against the CPU backend and first principles. No GPU needed.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "engine/backend.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/ops.h"
#include "engine/cpu/convert.h"
#include "engine/cuda/host/cpu_twins.h"
#include "engine/cuda/host/router_rule.h"

namespace edge::engine::cuda {
namespace {

std::vector<float> randoms(std::mt19937_64& rng, size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) {
        x = d(rng);
    }
    return v;
}

TEST_CASE("route_token: exact ties go to the lower expert index") {
    RouterParams p;
    p.experts = 6;
    p.top_k = 3;
    const float logits[6] = {1.0f, 2.0f, 2.0f, 0.5f, 2.0f, 1.0f};
    int32_t idx[3];
    float w[3];
    float scratch[16];
    route_token(logits, nullptr, p, idx, w, scratch);
    CHECK(idx[0] == 1);
    CHECK(idx[1] == 2);
    CHECK(idx[2] == 4);
    CHECK(w[0] == doctest::Approx(1.0f / 3.0f));
    p.top_k = 5;
    int32_t idx5[5];
    float w5[5];
    route_token(logits, nullptr, p, idx5, w5, scratch);
    CHECK(idx5[3] == 0);  // 1.0 at 0 and 5: the lower one first.
    CHECK(idx5[4] == 5);
}

TEST_CASE("route_token equals the CPU routers (softmax top-k, sigmoid grouped) with ties") {
    std::mt19937_64 rng(9);
    for (RouterScoring scoring : {RouterScoring::kSoftmax, RouterScoring::kSigmoid}) {
        for (int trial = 0; trial < 20; ++trial) {
            RouterParams p;
            p.scoring = scoring;
            p.experts = 8 << (trial % 4);
            p.top_k = 1 + static_cast<int32_t>(rng() % 8);
            p.n_group = scoring == RouterScoring::kSigmoid ? 4 : 1;
            p.topk_group = 1 + static_cast<int32_t>(rng() % 4);
            p.norm_topk_prob = trial % 3 != 0;
            p.scaling_factor = scoring == RouterScoring::kSigmoid ? 1.5f : 1.0f;
            const int64_t T = 5;
            std::vector<float> logits(T * p.experts);
            for (float& l : logits) {
                l = static_cast<float>(static_cast<int>(rng() % 7) - 3) * 0.25f;  // Many ties.
            }
            auto bias = randoms(rng, p.experts, -0.05f, 0.05f);
            const float* b = scoring == RouterScoring::kSigmoid ? bias.data() : nullptr;
            std::vector<int32_t> want_idx(T * p.top_k), got_idx(T * p.top_k);
            std::vector<float> want_w(T * p.top_k), got_w(T * p.top_k);
            twin::route(logits.data(), b, p, T, want_idx.data(), want_w.data());
            std::vector<float> scratch(router_scratch_floats(p));
            for (int64_t t = 0; t < T; ++t) {
                route_token(logits.data() + t * p.experts, b, p, got_idx.data() + t * p.top_k,
                            got_w.data() + t * p.top_k, scratch.data());
            }
            CHECK(got_idx == want_idx);
            for (size_t i = 0; i < got_w.size(); ++i) {
                CHECK(got_w[i] == doctest::Approx(want_w[i]).epsilon(1e-6));
            }
        }
    }
}

TEST_CASE("permute groups assignments stably by expert, unpermute is the weighted sum") {
    const int32_t E = 4, K = 2;
    const int64_t T = 3, H = 2;
    const std::vector<int32_t> idx = {2, 0, 0, 2, 3, 0};
    const std::vector<float> x = {1, 1, 2, 2, 3, 3};
    std::vector<int32_t> offsets(E + 1), row_of(T * K);
    std::vector<float> permuted(T * K * H);
    twin::permute(idx.data(), T, K, E, x.data(), H, offsets.data(), row_of.data(),
                  permuted.data());
    CHECK(offsets == std::vector<int32_t>{0, 3, 3, 5, 6});
    // Expert 0 gets (t0, j1), (t1, j0), (t2, j1) in that order; expert 2 gets t0 then t1.
    CHECK(row_of == std::vector<int32_t>{3, 0, 1, 4, 5, 2});
    CHECK(permuted == std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
    const std::vector<float> w = {0.25f, 0.75f, 0.5f, 0.5f, 1.0f, 0.0f};
    std::vector<float> out(T * H, 10.0f);
    twin::unpermute(permuted.data(), row_of.data(), w.data(), T, K, H, true, out.data());
    CHECK(out == std::vector<float>{11, 11, 12, 12, 13, 13});
}

TEST_CASE("add_bias_rows adds the bias to every row, column by column") {
    std::vector<float> x = {1, 2, 3, 4, 5, 6};
    const std::vector<float> bias = {10, 20, 30};
    twin::add_bias_rows(x.data(), bias.data(), 2, 3);
    CHECK(x == std::vector<float>{11, 22, 33, 14, 25, 36});
}

TEST_CASE("gather_rows copies the indexed rows in index order, repeats included") {
    const std::vector<float> x = {1, 2, 3, 4, 5, 6};  // Three rows of two.
    const std::vector<int32_t> idx = {2, 0, 2};
    std::vector<float> out(6, -1.0f);
    twin::gather_rows(x.data(), idx.data(), 3, 2, out.data());
    CHECK(out == std::vector<float>{5, 6, 1, 2, 5, 6});
}

TEST_CASE("grouped_matmul twin equals the CPU backend's matmul per group") {
    std::mt19937_64 rng(10);
    const int64_t rows = 33, cols = 64;
    std::vector<std::vector<uint16_t>> stored(3, std::vector<uint16_t>(rows * cols));
    std::vector<Weight> ws;
    for (auto& s : stored) {
        for (uint16_t& v : s) {
            v = cpu::f32_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
        }
        ws.push_back(Weight{WeightFormat::kBF16, rows, cols, s.data(), nullptr});
    }
    const std::vector<int32_t> offsets = {0, 2, 2, 5};
    auto x = randoms(rng, 5 * cols, -1, 1);
    std::vector<float> got(5 * rows);
    twin::grouped_matmul(ws, offsets.data(), x.data(), got.data());
    BackendOptions o;
    o.threads = 1;
    cpu::CpuBackend cpu(o, cpu::Isa::kScalar);
    std::vector<float> want(5 * rows);
    for (int g = 0; g < 3; ++g) {
        const int64_t n = offsets[g + 1] - offsets[g];
        if (n > 0) {
            cpu.matmul(ws[g], x.data() + offsets[g] * cols, n, want.data() + offsets[g] * rows,
                       rows);
        }
    }
    for (size_t i = 0; i < got.size(); ++i) {
        CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
    }
}

TEST_CASE("paged_attention twin over shuffled blocks equals contiguous attention") {
    std::mt19937_64 rng(12);
    PagedKvLayout L{1, 1, 16, 6};
    const std::vector<int32_t> table = {4, 0, 5};
    const int32_t n_ctx = 40;
    auto keys = randoms(rng, n_ctx * 16, -1, 1);
    auto values = randoms(rng, n_ctx * 16, -1, 1);
    std::vector<float> pool(L.pool_floats(), NAN);  // Unused rows must never be read.
    std::vector<int32_t> seq(n_ctx, 0), pos(n_ctx);
    std::iota(pos.begin(), pos.end(), 0);
    twin::paged_kv_write(L, 0, keys.data(), values.data(), seq.data(), pos.data(), n_ctx,
                         table.data(), 3, pool.data());
    auto q = randoms(rng, 2 * 16, -1, 1);  // Two query heads on the one KV head.
    const int32_t last = n_ctx - 1;
    std::vector<float> got(2 * 16), want(2 * 16), scores(2 * n_ctx);
    twin::paged_attention(L, 0, q.data(), 1, 2, seq.data(), &last, table.data(), 3, pool.data(),
                          0.25f, got.data());
    cpu::attention_gqa(q.data(), 2, 16, keys.data(), values.data(), 16, n_ctx, 0.25f,
                       scores.data(), want.data());
    CHECK(got == want);
}

TEST_CASE("sample_top_p: temperature 0 and a tiny top_p are argmax, u walks the nucleus") {
    const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 3.0f, -1.0f};
    CHECK(twin::argmax(logits.data(), 5) == 1);
    CHECK(twin::sample_top_p(logits.data(), 5, 0.0f, 0.9f, 0.7f) == 1);
    // Nucleus at top_p 0.5: the two tied maxima (each ~0.44 of the mass) together.
    CHECK(twin::sample_top_p(logits.data(), 5, 1.0f, 0.5f, 0.1f) == 1);
    CHECK(twin::sample_top_p(logits.data(), 5, 1.0f, 0.5f, 0.9f) == 3);
    // top_p 1: everything; u near 0 takes the first token.
    CHECK(twin::sample_top_p(logits.data(), 5, 1.0f, 1.0f, 0.0f) == 0);
    // Frequencies over many u follow the nucleus probabilities.
    std::vector<int> hits(5, 0);
    for (int i = 0; i < 1000; ++i) {
        ++hits[twin::sample_top_p(logits.data(), 5, 1.0f, 1.0f, (i + 0.5f) / 1000.0f)];
    }
    double total = 0;
    for (float l : logits) {
        total += std::exp(l - 3.0);
    }
    CHECK(hits[2] == doctest::Approx(1000 * std::exp(-2.0) / total).epsilon(0.05));
}

}  // namespace
}  // namespace edge::engine::cuda
