// FP8 E4M3 (128 x 128 block scales) with AVX512_BF16 dot products. Every finite E4M3 value is
// exactly a bf16 (3 mantissa bits), so 32 weights are converted to bf16 with a few integer ops
// and go straight into vdpbf16ps against the activations split into hi + lo bf16 pairs
// (engine/cpu/bf16_split.h): per 32 weights, ~8 integer ops and two dot products per token,
// against two F16 conversions and two f32 FMAs per token for the F16-decode kernel, so decode is
// memory-bound again. Functions carry target attributes; quant_kernels.cc calls them only after
// cpuid reports avx512_bf16.

#if defined(__x86_64__)

#include <immintrin.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/cpu/bf16_split.h"
#include "engine/quant/fp8.h"
#include "engine/quant/kernels_internal.h"
#include "engine/quant/kernels_x86.h"

#define EDGE_AVX512_BF16 \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c,avx2")))

namespace edge::engine::quant::detail {
namespace {

// bf16 bits of the E4M3 subnormals (magnitude codes 0..7: m * 2^-9), indexed by code; the other
// 24 entries are unused. Normal codes (8..126) are converted arithmetically: the bf16 exponent is
// the E4M3 exponent + 120 and the 3 mantissa bits move up by 4.
struct SubnormalTable {
    alignas(64) uint16_t bits[32];
};

const SubnormalTable& subnormal_table() {
    static const SubnormalTable table = [] {
        SubnormalTable t{};
        const float* decode = fp8_e4m3_table();
        for (int m = 0; m < 8; ++m) {
            t.bits[m] = static_cast<uint16_t>(std::bit_cast<uint32_t>(decode[m]) >> 16);
        }
        return t;
    }();
    return table;
}

// 32 E4M3 bytes -> 32 bf16 of the same values (NaN codes never reach a kernel: load rejects them).
EDGE_AVX512_BF16 EDGE_INLINE void fp8x32_to_bf16(__m256i bytes, __m512i subnormals, __m512bh* out) {
    const __m512i v = _mm512_cvtepu8_epi16(bytes);
    const __m512i mag = _mm512_and_si512(v, _mm512_set1_epi16(0x7F));
    __m512i bits = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(120 << 7));
    const __mmask32 sub = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8));
    bits = _mm512_mask_permutexvar_epi16(bits, sub, mag, subnormals);
    // bits | (v << 8 & 0x8000): the byte's sign bit to the bf16's.
    bits = _mm512_ternarylogic_epi32(bits, _mm512_slli_epi16(v, 8),
                                     _mm512_set1_epi16(static_cast<int16_t>(0x8000)), 0xF8);
    *out = reinterpret_cast<__m512bh>(bits);  // A vector cast: the same 64 bytes.
}

// Rows [row_begin, row_end) for T tokens whose activations are split into hi/lo (rows of kp).
template <int T>
EDGE_AVX512_BF16 void fp8_bf16_rows(const Weight& w, const uint16_t* hi, const uint16_t* lo,
                                    int64_t kp, float* y, int64_t ldy, int64_t row_begin,
                                    int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t block_cols = (cols + 127) / 128;
    const __m512i subnormals = _mm512_load_si512(subnormal_table().bits);
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols;
        const float* srow = w.scales + (r / 128) * block_cols;
        __m512 acc[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm512_setzero_ps();
        }
        for (int64_t b = 0; b < block_cols; ++b) {
            const int64_t c0 = b * 128;
            const int64_t end = c0 + 128 < cols ? c0 + 128 : cols;
            prefetch_ahead(q + c0);
            prefetch_ahead(q + c0 + 64);
            // Two chains per token (hi and lo products) for latency.
            __m512 ph[T], pl[T];
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) {
                ph[t] = _mm512_setzero_ps();
                pl[t] = _mm512_setzero_ps();
            }
            for (int64_t c = c0; c < end; c += 32) {
                const __m256i raw =
                    end - c >= 32
                        ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + c))
                        : _mm256_maskz_loadu_epi8(mask32(end - c), q + c);  // Zero: +0.0.
                __m512bh wv;
                fp8x32_to_bf16(raw, subnormals, &wv);
#pragma GCC unroll 4
                for (int t = 0; t < T; ++t) {
                    // hi/lo are zero padded to kp, so a tail's extra lanes add 0 * 0.
                    ph[t] = _mm512_dpbf16_ps(
                        ph[t], wv, reinterpret_cast<__m512bh>(_mm512_loadu_si512(hi + t * kp + c)));
                    pl[t] = _mm512_dpbf16_ps(
                        pl[t], wv, reinterpret_cast<__m512bh>(_mm512_loadu_si512(lo + t * kp + c)));
                }
            }
            const __m512 scale = _mm512_set1_ps(srow[b]);
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) {
                acc[t] = _mm512_fmadd_ps(_mm512_add_ps(ph[t], pl[t]), scale, acc[t]);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
        }
    }
}

using Bf16RowsFn = void (*)(const Weight&, const uint16_t*, const uint16_t*, int64_t, float*,
                            int64_t, int64_t, int64_t);

}  // namespace

void matmul_fp8_avx512_bf16(const Weight& w, const float* x, int64_t n_tokens, float* y,
                            int64_t ldy, int64_t row_begin, int64_t row_end) {
    static constexpr Bf16RowsFn kTiles[kMaxTile] = {fp8_bf16_rows<1>, fp8_bf16_rows<2>,
                                                    fp8_bf16_rows<3>, fp8_bf16_rows<4>};
    const int64_t k = w.cols;
    const int64_t kp = (k + 31) / 32 * 32;
    thread_local std::vector<uint16_t> scratch;
    if (scratch.size() < static_cast<size_t>(2 * kMaxTile * kp)) {
        scratch.resize(static_cast<size_t>(2 * kMaxTile * kp));
    }
    uint16_t* hi = scratch.data();
    uint16_t* lo = hi + kMaxTile * kp;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kMaxTile) {
        const int64_t nt = n_tokens - t0 < kMaxTile ? n_tokens - t0 : kMaxTile;
        cpu::split_activations_bf16(x + t0 * k, nt, k, kp, hi, lo);
        kTiles[nt - 1](w, hi, lo, kp, y + t0 * ldy, ldy, row_begin, row_end);
    }
}

}  // namespace edge::engine::quant::detail

#endif  // defined(__x86_64__)
