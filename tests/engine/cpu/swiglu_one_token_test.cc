// CpuBackend::swiglu_batch with one token per expert (single-stream decode: one task per
// expert) equals the unfused path (matmul, silu_mul, matmul) on a one-thread backend, at 1, 2 and
// 3 threads, for BF16 and quantized experts (FP8 block-128, INT8 per row, INT4 g32 and g128) and
// shapes whose rows are not multiples of the kernels' 4-row blocks. Each output row is computed
// by the same kernel on the same inputs in both paths, so the results are equal up to the order
// of the kernels' row blocks and reductions (tolerance 1e-5 relative to the largest output, far
// below any real difference).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/convert.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/ops.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine::cpu {
namespace {

struct Expert {
    std::vector<uint16_t> gate, up, down;
    Weight wg, wu, wd;
    std::vector<quant::QuantizedWeight> quantized;  // Owns wg, wu, wd when not BF16.
};

// `bf16` (rows x cols) as `format`: itself for BF16, else quantized into `owner`.
Weight as_format(const std::vector<uint16_t>& bf16, int64_t rows, int64_t cols,
                 WeightFormat format, std::vector<quant::QuantizedWeight>* owner) {
    if (format == WeightFormat::kBF16) {
        return {WeightFormat::kBF16, rows, cols, bf16.data(), nullptr};
    }
    std::vector<float> f(bf16.size());
    for (size_t i = 0; i < bf16.size(); ++i) {
        f[i] = bf16_to_f32(bf16[i]);
    }
    auto q = quant::quantize(quant::SourceMatrix::f32(f.data(), rows, cols), format);
    REQUIRE(q.ok());
    owner->push_back(std::move(q).value());
    return owner->back().view();
}

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
    struct Shape {
        int64_t hidden, inter;
        int count;
        WeightFormat format;
    };
    // INT4 needs widths that are multiples of its group; FP8 blocks may be partial.
    const Shape shapes[] = {{131, 77, 5, WeightFormat::kBF16},
                            {256, 512, 8, WeightFormat::kBF16},
                            {64, 16, 1, WeightFormat::kBF16},
                            {131, 77, 5, WeightFormat::kFP8E4M3Block128},
                            {256, 320, 8, WeightFormat::kFP8E4M3Block128},
                            {131, 77, 5, WeightFormat::kInt8Row},
                            {96, 160, 6, WeightFormat::kInt4G32},
                            {256, 384, 8, WeightFormat::kInt4G128},
                            {128, 128, 3, WeightFormat::kInt4G128}};
    for (const Shape& shape : shapes) {
        const int64_t hidden = shape.hidden;
        const int64_t inter = shape.inter;
        const int count = shape.count;
        const std::string format = quant::weight_format_name(shape.format);
        CAPTURE(format);
        std::vector<Expert> experts(static_cast<size_t>(count));
        for (Expert& e : experts) {
            e.gate = random_bf16(rng, inter * hidden, 0.1f);
            e.up = random_bf16(rng, inter * hidden, 0.1f);
            e.down = random_bf16(rng, hidden * inter, 0.1f);
            e.quantized.reserve(3);  // Views stay valid: no reallocation.
            e.wg = as_format(e.gate, inter, hidden, shape.format, &e.quantized);
            e.wu = as_format(e.up, inter, hidden, shape.format, &e.quantized);
            e.wd = as_format(e.down, hidden, inter, shape.format, &e.quantized);
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
