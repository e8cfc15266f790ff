#pragma once

// The float-weight matmul kernels, one per (ISA, format), all with the signature of
// quant::MatmulKernel: for tokens t < n and rows r in [row_begin, row_end),
//   y[t * ldy + r] = sum_c W[r][c] * x[t * cols + c]
// Weights are converted to f32 in registers and accumulated with FMA in f32. The scalar versions
// are the reference the SIMD ones are tested against. Thread-safe on disjoint row ranges.
// Callers use engine/cpu/matmul.h, which picks the kernel for the CPU; this header is for it and
// for the parity tests.

#include <cstdint>

#include "engine/cpu/matmul_job.h"
#include "engine/cpu/weight.h"

namespace edge::engine::cpu {

void matmul_f32_scalar(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                       int64_t r0, int64_t r1);
void matmul_bf16_scalar(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                        int64_t r0, int64_t r1);
void matmul_f16_scalar(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                       int64_t r0, int64_t r1);
void matmul_f32_avx2(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                     int64_t r0, int64_t r1);
void matmul_bf16_avx2(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                      int64_t r0, int64_t r1);
void matmul_f16_avx2(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                     int64_t r0, int64_t r1);
void matmul_f32_avx512(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                       int64_t r0, int64_t r1);
void matmul_bf16_avx512(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                        int64_t r0, int64_t r1);
void matmul_f16_avx512(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                       int64_t r0, int64_t r1);
// Per-thread scratch for the kernels of files compiled with ISA flags, which must not instantiate
// std::vector themselves: an out-of-line copy of its members compiled with those flags could be
// the one the linker keeps for the whole program, and would then fault on a CPU without them.
// `slot` (< kKernelScratchSlots) picks one of independent buffers, for a kernel that needs two at
// once. Returns at least `bytes` bytes, valid until the next call for the same slot on the same
// thread.
inline constexpr int kKernelScratchSlots = 2;
void* kernel_scratch(int slot, int64_t bytes);
// The activations of one multi-token call packed once for the AVX2 float kernels (matmul() and
// matmul_batch() pack them on the calling thread and the workers share them, instead of each row
// range packing its own): groups of up to 6 tokens, each as blocks of 16 columns whose floats
// are in the order the format's weights are widened in (matmul_avx2.cc).
struct PackedActivations {
    const float* x = nullptr;       // The tokens as given: the columns past the last block.
    const float* packed = nullptr;  // packed_activation_floats(n, k) floats.
    int64_t n = 0;                  // Tokens.
    int64_t k = 0;                  // Columns (the weight's cols).
};
// Floats of packed activations for n tokens of k columns (defined in matmul.cc, not inline, so
// the ISA-flagged kernel file that calls it emits no copy of it).
int64_t packed_activation_floats(int64_t n, int64_t k);
// Packs x (n > 1 rows of k f32) for weights of `format` (F32, BF16 or F16) in `scratch`.
PackedActivations pack_activations_avx2(WeightFormat format, const float* x, int64_t n, int64_t k,
                                        float* scratch);
// matmul_{f32,bf16,f16}_avx2 on packed activations (for w's format), rows [r0, r1); the same
// results as those.
void matmul_avx2_packed(const Weight& w, const PackedActivations& a, float* y, int64_t ldy,
                        int64_t r0, int64_t r1);
// AVX512_BF16 (vdpbf16ps) with the activations split into bf16 hi + lo parts: about 16 mantissa
// bits per activation instead of 24 (see matmul_avx512_bf16.cc for the error bound).
void matmul_bf16_avx512bf16(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                            int64_t r0, int64_t r1);
// The same with each activation rounded to one bf16 (ActivationPrecision::kBf16): one product per
// weight. Equals matmul_bf16_scalar_bf16act within 1e-5 * sum_c |w * bf16(x)| + 1e-6 for
// cols <= 4096 (each bf16 product is exact in f32; only the f32 sum is reordered); against the
// exact f32 product it is off by at most 2^-8 * sum_c |w * x| more (the rounding of x).
void matmul_bf16_avx512bf16_bf16act(const Weight& w, const float* x, int64_t n, float* y,
                                    int64_t ldy, int64_t r0, int64_t r1);
// The activations of one call prepared once for the AVX512_BF16 kernel (matmul() prepares them on
// the calling thread and the workers share them, instead of each row range preparing its own):
// n rows of kp = k rounded up to 32 bf16, zero padded; `lo` is the exact mode's residual rows
// (bf16_split.h), nullptr with single-bf16 activations.
struct Bf16Activations {
    const uint16_t* hi = nullptr;
    const uint16_t* lo = nullptr;
    // The same in AMX's layout (to_amx_layout), for matmul_bf16_amx_prepared; else nullptr.
    // matmul() prepares only these for the tiles (hi and lo then null).
    const uint16_t* amx_hi = nullptr;
    const uint16_t* amx_lo = nullptr;
    int64_t n = 0;   // Tokens.
    int64_t k = 0;   // Columns (the weight's cols).
    int64_t kp = 0;  // Row stride of hi and lo, elements.
};
// uint16_t elements of scratch prepare_bf16_activations needs.
int64_t bf16_activation_elements(int64_t n, int64_t k, ActivationPrecision precision);
// Prepares x (n rows of k f32) in `scratch`; the result points into it.
Bf16Activations prepare_bf16_activations(const float* x, int64_t n, int64_t k,
                                         ActivationPrecision precision, uint16_t* scratch);
// matmul_bf16_avx512bf16 (a.lo set) or matmul_bf16_avx512bf16_bf16act (a.lo null) on prepared
// activations, rows [r0, r1); same results as those. Calls of 16 or more tokens (per group of
// 64) use register blocks of 3 rows x 8 tokens over L2-sized row panels (compute-bound shapes).
void matmul_bf16_avx512bf16_prepared(const Weight& w, const Bf16Activations& a, float* y,
                                     int64_t ldy, int64_t r0, int64_t r1);
// Reference for it: each activation rounded to bf16 (nearest even), products summed in double.
void matmul_bf16_scalar_bf16act(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                                int64_t r0, int64_t r1);

// AMX-BF16 tiles (Isa::kAmxBf16, matmul_amx.cc) for calls of amx_min_tokens() tokens or more;
// fewer go to the AVX512_BF16 (or the format's) kernels. Same error bounds as those.
// amx_bf16_usable(): the CPU has AMX-BF16 and the kernel granted tile data (once).
// A tile holds 16 tokens, so fewer waste it, but with BF16 weights and exact activations the
// AVX512_BF16 kernel does two dot products per weight and token, and the tiles win from 4 tokens
// (bench_decode batched 32 sequences, ~4 tokens per expert: +17%; bench_tenancy: +21%). With
// bf16 activations (one dot product) the tiles lost below 16 (-9% at 4); quantized weights are
// decoded per 16-row block, which fewer tokens do not repay.
inline constexpr int64_t kAmxMinTokens = 16;
inline constexpr int64_t kAmxMinTokensExactBf16 = 4;
inline int64_t amx_min_tokens(WeightFormat format, ActivationPrecision precision) {
    return format == WeightFormat::kBF16 && precision == ActivationPrecision::kExact
               ? kAmxMinTokensExactBf16
               : kAmxMinTokens;
}
inline constexpr int64_t kAmxGroup = 16;  // Tokens per B tile (one group of the layout).
bool amx_bf16_usable();
// bf16 elements of the AMX layout of n rows of k columns: 16-token groups x 32-column chunks,
// each 16 column pairs x 16 tokens (zero past n).
int64_t amx_activation_elements(int64_t n, int64_t k);
// Lays out `rows` (n rows, stride kp, a multiple of 32) for the tiles in `out`.
void to_amx_layout(const uint16_t* rows, int64_t n, int64_t kp, uint16_t* out);
// Rows [r0, r1) from activations with amx_hi (and amx_lo for kExact) set. Any split of the rows
// gives the same bits.
void matmul_bf16_amx_prepared(const Weight& w, const Bf16Activations& a, float* y, int64_t ldy,
                              int64_t r0, int64_t r1);
// The same for a quantized weight the tiles take (quant::decodes_to_bf16: row-major FP8, INT8,
// INT4): each 16-row block is decoded once per call and range into bf16 rows (quant::
// decode_rows_bf16), with exact activations as hi + lo (three products: w_hi x_hi, w_hi x_lo,
// w_lo x_hi), with kBf16 ones as hi alone. Error against the f32 product of the dequantized
// weights: exact, at most 4 * 2^-17 * sum_c |w * x| (the two splits, 2^-17 each, and the
// dropped lo x lo product, up to 2^-16); kBf16, at most (2^-7 + 2^-16) * sum_c |w * x| (weights
// and activations each rounded to one bf16, 2^-8). Any split of the rows gives the same bits.
void matmul_quant_amx_prepared(const Weight& w, const Bf16Activations& a, float* y, int64_t ldy,
                               int64_t r0, int64_t r1);
// Per-call entries (kExact, kBf16 activations): prepare on the calling thread, then as above; the
// AVX512_BF16 kernels below amx_min_tokens().
void matmul_bf16_amx(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                     int64_t r0, int64_t r1);
void matmul_bf16_amx_bf16act(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                             int64_t r0, int64_t r1);

// One SwiGLU job (gate, up and down all BF16) on the calling thread with the same dot products:
// each projection's input is split once, and each weight is read as four long sequential streams
// (a block takes rows i, i + q, i + 2q, i + 3q of q = rows / 4), which the hardware prefetchers
// follow far better than the many short rows of the plain kernel. Same tolerance as
// matmul_bf16_avx512bf16 per projection; with kBf16 each projection's input is rounded to bf16
// instead (as matmul_bf16_avx512bf16_bf16act).
void swiglu_bf16_avx512bf16(const SwiGluJob& job,
                            ActivationPrecision precision = ActivationPrecision::kExact);

}  // namespace edge::engine::cpu
