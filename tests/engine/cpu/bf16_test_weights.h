#pragma once

// Random BF16 weights and f32 activations for the CPU matmul tests (bf16_activations_test,
// matmul_gemm_test, matmul_test): N(0,1)/sqrt(cols) weights stored as BF16 beside their exact f32
// values, and N(0,1) activations; and the row ranges a pool split takes. Plain functions of the
// given generator; no shared state.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/cpu/convert.h"
#include "engine/cpu/weight.h"

namespace edge::engine::cpu::testing {

// A BF16 weight; `values` holds its elements as stored (exact f32 of the bf16 bits).
struct Bf16Weight {
    std::vector<float> values;
    std::vector<uint16_t> bits;
    Weight w;
};

inline void make_weight(int64_t rows, int64_t cols, std::mt19937& rng, Bf16Weight* out) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    out->values.resize(static_cast<size_t>(rows * cols));
    out->bits.resize(out->values.size());
    for (size_t i = 0; i < out->values.size(); ++i) {
        out->bits[i] = f32_to_bf16(normal(rng) / std::sqrt(static_cast<float>(cols)));
        out->values[i] = bf16_to_f32(out->bits[i]);
    }
    out->w = Weight{WeightFormat::kBF16, rows, cols, out->bits.data(), nullptr};
}

// n rows of `cols` N(0,1) activations.
inline std::vector<float> random_x(int64_t n, int64_t cols, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n * cols));
    for (float& v : x) {
        v = normal(rng);
    }
    return x;
}

// run(r0, r1) over rows [0, rows) cut at `first` and `second` (each clamped to rows), as the pool
// splits a matmul's rows: a prepared entry must give the same outputs whatever the cuts.
template <typename F>
void in_three_row_ranges(int64_t rows, int64_t first, int64_t second, F&& run) {
    const int64_t a = std::min(first, rows);
    const int64_t b = std::min(second, rows);
    run(0, a);
    run(a, b);
    run(b, rows);
}

}  // namespace edge::engine::cpu::testing
