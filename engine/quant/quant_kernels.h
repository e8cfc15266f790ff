#pragma once

// Matrix kernels for quantized weight formats. A kernel computes, for tokens t in [0, n_tokens)
// and output rows r in [row_begin, row_end):  y[t * ldy + r] = sum_c W[r][c] * x[t * w.cols + c],
// reading the stored quantized bytes and dequantizing in registers. The caller splits rows over
// threads; kernels are thread-safe on disjoint row ranges.

#include <cstdint>
#include <vector>

#include "engine/cpu/weight.h"

namespace edge::engine::quant {

using MatmulKernel = void (*)(const Weight& w, const float* x, int64_t n_tokens, float* y,
                              int64_t ldy, int64_t row_begin, int64_t row_end);

// The fastest kernel this CPU runs for `format`, or nullptr for float formats (engine/cpu's job).
MatmulKernel matmul_kernel_for(WeightFormat format);

// One implementation of a format's kernel, for tests (SIMD vs scalar reference) and benchmarks.
struct KernelVariant {
    const char* name = "";     // "scalar", "avx2", "avx512", "avx512-vnni".
    MatmulKernel kernel = nullptr;
    // Largest |y - y_exact| relative to sum_c |W[r][c] * x[c]| this variant may show, beyond f32
    // rounding: 0 for kernels that multiply dequantized f32 weights; for int4 VNNI kernels the
    // activations are rounded to int8 per group, so the error per group g is bounded by
    // (max_{c in g} |x_c| / 254) * sum_{c in g} |W[r][c]| instead (see docs/quantization.md).
    bool quantizes_activations = false;
};

// Every variant this CPU runs for `format`, the scalar reference first and the one
// matmul_kernel_for picks last; empty for float formats.
std::vector<KernelVariant> matmul_kernel_variants(WeightFormat format);

}  // namespace edge::engine::quant
