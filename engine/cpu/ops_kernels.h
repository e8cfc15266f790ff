#pragma once

// The per-ISA versions of the element-wise kernels behind ops.h: the scalar references (any CPU)
// and the AVX-512 versions (ops_avx512.cc, only called after cpuid reports AVX-512F/BW/VL/DQ).
// ops.h's functions pick one at run time; this header is for them and for the parity tests.
// Same contracts as the ops.h functions of the same name; pure functions, thread-safe on disjoint
// outputs.

#include <cstdint>

namespace edge::engine::cpu {

void rms_norm_scalar(const float* x, const float* weight, int64_t n, float eps, float* out);
void rope_neox_scalar(float* head, int64_t rot_dim, const float* cos, const float* sin);
void rope_interleaved_scalar(float* head, int64_t rot_dim, const float* cos, const float* sin);
void softmax_scalar(float* x, int64_t n);
void silu_mul_scalar(const float* gate, const float* up, int64_t n, float* out);

void rms_norm_avx512(const float* x, const float* weight, int64_t n, float eps, float* out);
void rope_neox_avx512(float* head, int64_t rot_dim, const float* cos, const float* sin);
void rope_interleaved_avx512(float* head, int64_t rot_dim, const float* cos, const float* sin);
void softmax_avx512(float* x, int64_t n);
void silu_mul_avx512(const float* gate, const float* up, int64_t n, float* out);

// Whether ops.h dispatches to the AVX-512 versions on this CPU.
bool ops_use_avx512();

}  // namespace edge::engine::cpu
