#pragma once

// Activations prepared for AVX512_BF16 dot products (vdpbf16ps multiplies pairs of bf16): each
// f32 activation x becomes hi = bf16(x) and lo = bf16(x - hi), so w * hi + w * lo carries about 16
// mantissa bits of x (|x - (hi + lo)| <= 2^-17 |x|) while the weights go into the dot product as
// bf16 without widening. Used by the BF16 kernel (engine/cpu/matmul_avx512_bf16.cc) and the FP8
// kernel (engine/quant/kernels_avx512_bf16.cc). Only call after cpuid reports avx512_bf16.
// Plain function: thread-safe.

#include <immintrin.h>

#include <bit>
#include <cstdint>

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsic headers as
// "may be used uninitialized" (a known false positive of the convert intrinsics); silenced for
// this function only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace edge::engine::cpu {

// Relative error bound of hi + lo against x (for the tests' tolerances).
inline constexpr double kBf16SplitRelError = 1.0 / (1 << 17);
// Relative error bound of one activation rounded to bf16 (8 significant bits, round to nearest:
// half an ulp, 2^-8 of the value at most).
inline constexpr double kBf16RoundRelError = 1.0 / (1 << 8);

// x (n rows of k f32) -> hi/lo bf16 rows of kp (k rounded up to 32) elements, zero padded.
// Non-finite activations keep lo = 0 so inf stays inf (inf - inf would be NaN).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) static inline void
split_activations_bf16(const float* x, int64_t n, int64_t k, int64_t kp, uint16_t* hi,
                       uint16_t* lo) {
    const __m512 inf = _mm512_set1_ps(__builtin_inff());
    for (int64_t t = 0; t < n; ++t) {
        const float* xt = x + t * k;
        uint16_t* ht = hi + t * kp;
        uint16_t* lt = lo + t * kp;
        for (int64_t c = 0; c < kp; c += 16) {
            const __mmask16 m = c + 16 <= k   ? static_cast<__mmask16>(0xFFFF)
                                : c < k       ? static_cast<__mmask16>((1u << (k - c)) - 1u)
                                              : static_cast<__mmask16>(0);
            const __m512 v = _mm512_maskz_loadu_ps(m, xt + c);
            const __m256bh h = _mm512_cvtneps_pbh(v);
            const __m256i hbits = reinterpret_cast<__m256i>(h);  // Vector casts: same bytes.
            const __m512 hv =
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hbits), 16));
            const __mmask16 finite = _mm512_cmp_ps_mask(_mm512_abs_ps(hv), inf, _CMP_LT_OQ);
            const __m512 rest = _mm512_maskz_sub_ps(finite, v, hv);
            const __m256i lbits = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(rest));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(ht + c), hbits);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(lt + c), lbits);
        }
    }
}

// x (n rows of k f32) -> one bf16 row of kp (k rounded up to 32) elements per token, each
// activation rounded to nearest even (relative error <= 2^-8, kBf16RoundRelError), zero padded.
// For engine.activation_precision: bf16 (one product per weight instead of two).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) static inline void
round_activations_bf16(const float* x, int64_t n, int64_t k, int64_t kp, uint16_t* out) {
    for (int64_t t = 0; t < n; ++t) {
        const float* xt = x + t * k;
        uint16_t* ot = out + t * kp;
        for (int64_t c = 0; c < kp; c += 16) {
            const __mmask16 m = c + 16 <= k   ? static_cast<__mmask16>(0xFFFF)
                                : c < k       ? static_cast<__mmask16>((1u << (k - c)) - 1u)
                                              : static_cast<__mmask16>(0);
            const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, xt + c));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(ot + c),
                                reinterpret_cast<__m256i>(h));
        }
    }
}

}  // namespace edge::engine::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
