// CpuBackend::swiglu_batch with one token per expert (single-stream decode: one parallel
// step, gate/up parts then down parts) equals the unfused path (matmul, silu_mul, matmul) on a
// one-thread backend, at 1, 2 and 3 threads, for shapes whose rows are not multiples of the
// 16-row part alignment. Each output row is computed by the same kernel on the same inputs in
// both paths, so the results are equal up to the order of the BF16 kernel's row blocks
// (tolerance 1e-5 relative to the largest output, far below any real difference).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/cpu/convert.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/ops.h"

namespace edge::engine::cpu {
namespace {

struct Expert {
    std::vector<uint16_t> gate, up, down;
    Weight wg, wu, wd;
};

std::vector<uint16_t> random_bf16(std::mt19937& rng, int64_t n, float scale) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<uint16_t> out(static_cast<size_t>(n));
    for (uint16_t& v : out) {
        v = f32_to_bf16(normal(rng));
    }
    return out;
}

TEST_CASE("swiglu_batch of one token per expert equals gate/up matmuls, silu_mul and down matmul") {
    std::mt19937 rng(17);
    for (auto [hidden, inter, count] : {std::tuple<int64_t, int64_t, int>{131, 77, 5},
                                        {256, 512, 8}, {64, 16, 1}}) {
        std::vector<Expert> experts(static_cast<size_t>(count));
        for (Expert& e : experts) {
            e.gate = random_bf16(rng, inter * hidden, 0.1f);
            e.up = random_bf16(rng, inter * hidden, 0.1f);
            e.down = random_bf16(rng, hidden * inter, 0.1f);
            e.wg = {WeightFormat::kBF16, inter, hidden, e.gate.data(), nullptr};
            e.wu = {WeightFormat::kBF16, inter, hidden, e.up.data(), nullptr};
            e.wd = {WeightFormat::kBF16, hidden, inter, e.down.data(), nullptr};
        }
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(count * hidden));
        for (float& v : x) {
            v = normal(rng);
        }
        // Reference: the unfused path on one thread.
        CpuBackend one(BackendOptions{1, 0});
        std::vector<float> g(inter), u(inter), a(inter);
        std::vector<float> want(static_cast<size_t>(count * hidden));
        for (int j = 0; j < count; ++j) {
            const Expert& e = experts[j];
            one.matmul(e.wg, x.data() + j * hidden, 1, g.data(), inter);
            one.matmul(e.wu, x.data() + j * hidden, 1, u.data(), inter);
            silu_mul(g.data(), u.data(), inter, a.data());
            one.matmul(e.wd, a.data(), 1, want.data() + j * hidden, hidden);
        }
        float peak = 0.0f;
        for (float v : want) {
            peak = std::max(peak, std::fabs(v));
        }
        REQUIRE(peak > 0.0f);
        for (int threads : {1, 2, 3}) {
            CAPTURE(threads);
            CAPTURE(hidden);
            CpuBackend backend(BackendOptions{threads, 0});
            std::vector<float> got(static_cast<size_t>(count * hidden), NAN);
            std::vector<SwiGluJob> jobs;
            for (int j = 0; j < count; ++j) {
                const Expert& e = experts[j];
                jobs.push_back({&e.wg, &e.wu, &e.wd, x.data() + j * hidden, 1,
                                got.data() + j * hidden, hidden});
            }
            for (int round = 0; round < 20; ++round) {  // Back to back: no stale part counts.
                backend.swiglu_batch(jobs);
                for (size_t i = 0; i < want.size(); ++i) {
                    REQUIRE(std::fabs(got[i] - want[i]) <= 1e-5f * peak);
                }
            }
        }
    }
}

}  // namespace
}  // namespace edge::engine::cpu
