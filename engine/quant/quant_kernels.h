#pragma once

// Matrix kernels for quantized weight formats. A kernel computes, for tokens t in [0, n_tokens)
// and output rows r in [row_begin, row_end):  y[t * ldy + r] = sum_c W[r][c] * x[t * w.cols + c],
// reading the stored quantized bytes and dequantizing in registers. The caller splits rows over
// threads; kernels are thread-safe on disjoint row ranges.

#include <cstdint>

#include "engine/cpu/weight.h"

namespace edge::engine::quant {

using MatmulKernel = void (*)(const Weight& w, const float* x, int64_t n_tokens, float* y,
                              int64_t ldy, int64_t row_begin, int64_t row_end);

// The fastest kernel this CPU runs for `format`, or nullptr for float formats (engine/cpu's job).
MatmulKernel matmul_kernel_for(WeightFormat format);

}  // namespace edge::engine::quant
