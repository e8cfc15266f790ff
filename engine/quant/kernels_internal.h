#pragma once

// The per-ISA matrix kernels behind quant::matmul_kernel_for (quant_kernels.h), one file per ISA:
// kernels_scalar.cc (reference, any CPU), kernels_avx2.cc (AVX2+FMA+F16C), kernels_avx512.cc
// (AVX-512 F/BW/VL/DQ, and VBMI for one FP8 variant), kernels_avx512_vnni.cc (AVX-512 VNNI, INT8
// and INT4 with int8 activations), kernels_avx512_bf16.cc (AVX512_BF16, FP8),
// kernels_avx512_tiles.cc (INT4/INT8 in row tiles); shared helpers in kernels_x86.h. Each ISA
// file compiles its functions with target attributes, so the binary runs on any x86-64 and
// quant_kernels.cc picks by cpuid at run time. All kernels have the MatmulKernel contract and are
// thread-safe on disjoint row ranges (scratch is thread_local).

#include <cstdint>

#include "engine/cpu/weight.h"

namespace edge::engine::quant::detail {

#define EDGE_QUANT_KERNEL(name)                                                         \
    void name(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy, \
              int64_t row_begin, int64_t row_end)

EDGE_QUANT_KERNEL(matmul_fp8_scalar);
EDGE_QUANT_KERNEL(matmul_int8_scalar);
EDGE_QUANT_KERNEL(matmul_int4_scalar);

#if defined(__x86_64__)
EDGE_QUANT_KERNEL(matmul_fp8_avx2);
EDGE_QUANT_KERNEL(matmul_int8_avx2);
EDGE_QUANT_KERNEL(matmul_int4_avx2);
// INT8 / INT4 with the activations rounded to int8 per group and vpmaddubsw dot products.
EDGE_QUANT_KERNEL(matmul_int8_avx2_i8dot);
EDGE_QUANT_KERNEL(matmul_int4_avx2_i8dot);

EDGE_QUANT_KERNEL(matmul_fp8_avx512);
// FP8 decoded by two vpermi2b table lookups (AVX-512 VBMI).
EDGE_QUANT_KERNEL(matmul_fp8_avx512_vbmi);
// FP8 converted to bf16 in registers and multiplied with AVX512_BF16 dot products against the
// activations split into hi + lo bf16 (kernels_avx512_bf16.cc).
EDGE_QUANT_KERNEL(matmul_fp8_avx512_bf16);
// FP8 decoded to bf16 by two vpermi2b table lookups (VBMI) and multiplied with AVX512_BF16 dot
// products against the activations rounded to one bf16 each (relative error <= 2^-8).
EDGE_QUANT_KERNEL(matmul_fp8_avx512_bf16_vbmi);
EDGE_QUANT_KERNEL(matmul_int8_avx512);
// INT8 with the activations quantized to int8 per 64 columns and VNNI dot products.
EDGE_QUANT_KERNEL(matmul_int8_avx512_vnni);
// INT4 with the activations quantized to int8 per weight group and VNNI dot products.
EDGE_QUANT_KERNEL(matmul_int4_avx512_vnni);
// The same with GFNI nibble extraction, shared reductions and up to 8 tokens per weight pass.
EDGE_QUANT_KERNEL(matmul_int4_avx512_vnni_gfni);
// INT4 with nibbles widened to f32 and FMA (exact up to f32 rounding), for comparison.
EDGE_QUANT_KERNEL(matmul_int4_avx512);
// Row-tiled layout (WeightLayout::kRowTiles16, kernels_avx512_tiles.cc): one row per lane, VNNI
// with broadcast activations; INT4 needs GFNI too.
EDGE_QUANT_KERNEL(matmul_int4_tiles_avx512_vnni_gfni);
EDGE_QUANT_KERNEL(matmul_int8_tiles_avx512_vnni);
#endif

#undef EDGE_QUANT_KERNEL

}  // namespace edge::engine::quant::detail
