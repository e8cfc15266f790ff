#pragma once

// Matrix kernels for quantized weight formats. A kernel computes, for tokens t in [0, n_tokens)
// and output rows r in [row_begin, row_end):  y[t * ldy + r] = sum_c W[r][c] * x[t * w.cols + c],
// reading the stored quantized bytes and dequantizing in registers. The caller splits rows over
// threads; kernels are thread-safe on disjoint row ranges. Preconditions (the engine's own
// invariants, not checked): `w` is a valid view as built by quantize_* or from_* in
// quantized_weight.h / checkpoint_formats.h (for int4, cols is a multiple of the group), x holds
// n_tokens * w.cols floats, y holds rows [row_begin, row_end) of n_tokens rows of stride ldy.
// Kernels keep per-thread scratch (thread_local) for prepared activations.

#include <cstdint>
#include <vector>

#include "engine/cpu/weight.h"

namespace edge::engine::quant {

using MatmulKernel = void (*)(const Weight& w, const float* x, int64_t n_tokens, float* y,
                              int64_t ldy, int64_t row_begin, int64_t row_end);

// The instruction sets a kernel may use, as engine.cpu_kernels names them (engine/cpu's Isa):
// scalar < avx2 (with the i8dot variants) < avx512 (F/BW/VL/DQ, and VNNI, VBMI, GFNI where the
// CPU has them) < avx512_bf16 (the AVX512_BF16 variants too).
enum class KernelLevel { kScalar, kAvx2, kAvx512, kAvx512Bf16 };

// The fastest kernel this CPU runs for `format` in `layout` within `level`, or nullptr for float
// formats (engine/cpu's job) and for a layout this CPU (or level) has no kernel for (row tiles:
// INT4 needs AVX-512 VNNI and GFNI, INT8 AVX-512 VNNI). A kernel for one layout must never
// receive the other.
MatmulKernel matmul_kernel_for(WeightFormat format, WeightLayout layout = WeightLayout::kRows,
                               KernelLevel level = KernelLevel::kAvx512Bf16);

// One implementation of a format's kernel, for tests (SIMD vs scalar reference) and benchmarks.
struct KernelVariant {
    const char* name = "";  // "scalar", "avx2", "avx512", "avx512-vnni", "avx512-bf16".
    MatmulKernel kernel = nullptr;
    // 0: activations are used as f32, so the result equals the dequantized-weight product up to
    // f32 rounding. Otherwise the kernel rounds each token's activations to int8 per this many
    // columns (scale max|x| / 127) and uses integer dot products (VNNI), adding at most
    // sum_g (max_{c in g} |x_c| / 254) * sum_{c in g} |W[r][c]| to |y - y_exact| per output.
    int64_t activation_group = 0;
    // 0, or: the kernel uses each activation x as a bf16 approximation x' (one rounded bf16, or
    // hi + lo bf16) with |x - x'| <= this * |x| (AVX512_BF16 dot products), adding at most
    // this * sum_c |W[r][c] * x_c| per output.
    double activation_rel_error = 0.0;
};

// Relative error of rounding an f32 to the nearest bf16 (8 significant bits): half an ulp, at most
// 2^-8 of the value. The FP8 weights themselves carry up to 2^-4 (half an ulp of 3 mantissa bits),
// so a single-bf16 activation adds ~1/16 of the weight error.
inline constexpr double kBf16RoundRelError = 1.0 / 256;

// Every variant this CPU runs for `format` in `layout`, the one matmul_kernel_for picks last;
// empty for float formats. Row-major: the scalar reference first. Row tiles: only SIMD kernels
// (tests compare them with the row-major scalar reference on the same weights), empty when this
// CPU has none.
std::vector<KernelVariant> matmul_kernel_variants(WeightFormat format,
                                                  WeightLayout layout = WeightLayout::kRows);

// For the AMX tile products of engine/cpu (matmul_amx.cc), which multiply bf16 weights: whether
// this CPU decodes `w` for them (row-major FP8 block, INT8 row or INT4 group weights, on a CPU with
// AVX512_BF16).
bool decodes_to_bf16(const Weight& w);
// Rows [r0, r0 + rows) of such a weight, each value times its scale in f32 (rounded once, as the
// scalar kernels compute it), as bf16 rows of kp elements (cols rounded up to 32, zero padded;
// rows past w.rows all zero): `hi` gets bf16(v) rounded to nearest (relative error <= 2^-8) and,
// when `lo` is not null, `lo` gets bf16(v - hi), so that |v - (hi + lo)| <= 2^-17 |v|
// (engine/cpu/bf16_split.h). Only after decodes_to_bf16(w). Thread-safe (per-thread scratch).
void decode_rows_bf16(const Weight& w, int64_t r0, int64_t rows, int64_t kp, uint16_t* hi,
                      uint16_t* lo);

}  // namespace edge::engine::quant
