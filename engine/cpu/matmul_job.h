#pragma once

// MatmulJob: one matmul of a batch of independent matmuls (Backend::matmul_batch),
//   y[t * ldy + r] = sum_c W[r][c] * x[t * W.cols + c]   for t < n, r < W.rows.
// A plain view; the weight and buffers are the caller's and must outlive the call.

#include <cstdint>

#include "engine/cpu/weight.h"

namespace edge::engine {

struct MatmulJob {
    const Weight* w = nullptr;
    const float* x = nullptr;  // n rows of w->cols inputs.
    int64_t n = 0;             // Tokens.
    float* y = nullptr;        // n rows with stride ldy.
    int64_t ldy = 0;           // Output row stride, floats.
};

}  // namespace edge::engine
