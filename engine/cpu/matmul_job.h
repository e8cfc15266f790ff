#pragma once

// MatmulJob: one matmul of a batch of independent matmuls (Backend::matmul_batch),
//   y[t * ldy + r] = sum_c W[r][c] * x[t * W.cols + c]   for t < n, r < W.rows.
// SwiGluJob: one SwiGLU feed-forward (a routed expert) of a batch (Backend::swiglu_batch),
//   y[t * ldy + :] = down(silu(gate x_t) * up x_t)   for t < n.
// ActivationPrecision: how multi-token BF16 products carry the f32 activations
// (engine.activation_precision).
// Plain views; the weights and buffers are the caller's and must outlive the call.

#include <cstdint>

#include "engine/cpu/weight.h"

namespace edge::engine {

// How the CPU's AVX512_BF16 kernels carry f32 activations into bf16 dot products when a call has
// more than one token (one-token calls are always exact; other ISAs and formats ignore it).
enum class ActivationPrecision {
    kExact,  // bf16 hi + lo pair per activation: about 16 mantissa bits, two products per weight.
    kBf16,   // One bf16 per activation (round to nearest even, 8 bits): one product per weight.
};

struct MatmulJob {
    const Weight* w = nullptr;
    const float* x = nullptr;  // n rows of w->cols inputs.
    int64_t n = 0;             // Tokens.
    float* y = nullptr;        // n rows with stride ldy.
    int64_t ldy = 0;           // Output row stride, floats.
};

struct SwiGluJob {
    const Weight* gate = nullptr;  // [inter][in].
    const Weight* up = nullptr;    // [inter][in], same shape as gate.
    const Weight* down = nullptr;  // [out][inter].
    const float* x = nullptr;      // n rows of `in` inputs (contiguous).
    int64_t n = 0;                 // Tokens.
    float* y = nullptr;            // n rows of `out` outputs with stride ldy (overwritten).
    int64_t ldy = 0;               // Output row stride, floats.
};

}  // namespace edge::engine
