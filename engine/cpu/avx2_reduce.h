#pragma once

// Horizontal reductions of one AVX2 vector, for the AVX2 kernel files (engine/cpu/matmul_avx2.cc,
// ops_avx2.cc, engine/quant/kernels_avx2.cc, paged attention's AVX2 form). `static` on purpose:
// each includer gets its own copy, so no AVX2 code can stand in for a shared out-of-line one;
// only call them after cpuid reports AVX2.

#if defined(__x86_64__)

#include <immintrin.h>

namespace edge::engine::cpu {

// The sum of the 8 lanes.
__attribute__((target("avx2"), always_inline)) static inline float hsum_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// The largest of the 8 lanes.
__attribute__((target("avx2"), always_inline)) static inline float hmax_avx2(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

}  // namespace edge::engine::cpu

#endif  // defined(__x86_64__)
