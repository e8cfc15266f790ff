// AVX-512 versions of the element-wise kernels of ops.h (RMSNorm, NeoX and interleaved RoPE,
// softmax, SiLU-gated product). This file is compiled with AVX-512 flags (engine/CMakeLists.txt)
// and only called after cpuid reports AVX-512F/BW/VL/DQ (ops.cc picks at run time). Tails use
// masked loads and stores, so any length works. Tolerances against the scalar references of
// ops_kernels.h are stated in tests/engine/cpu/ops_test.cc.

#include <immintrin.h>

#include "engine/cpu/ops_kernels.h"

namespace edge::engine::cpu {
namespace {

inline __mmask16 tail_mask(int64_t n) {
    return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// e^x for 16 lanes: x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial
// (truncation error below 1.2e-7 relative), then scaled by 2^n with vscalefps, which gives 0 and
// inf at the ends of the range. Inputs below -104 are clamped (e^-104 is 0 in f32); NaN stays NaN.
inline __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(89.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), x);  // ln2 high part, exact.
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), r);          // ln2 low part.
    __m512 p = _mm512_set1_ps(kExpTaylor[0]);
    for (int i = 1; i < 7; ++i) {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpTaylor[i]));
    }
    return _mm512_scalef_ps(p, n);
}

}  // namespace

void rms_norm_avx512(const float* x, const float* weight, int64_t n, float eps, float* out) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 a = _mm512_loadu_ps(x + i);
        const __m512 b = _mm512_loadu_ps(x + i + 16);
        s0 = _mm512_fmadd_ps(a, a, s0);
        s1 = _mm512_fmadd_ps(b, b, s1);
    }
    for (; i < n; i += 16) {
        const __m512 a = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
        s0 = _mm512_fmadd_ps(a, a, s0);
    }
    const double ss = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    const __m512 inv = _mm512_set1_ps(
        static_cast<float>(1.0 / __builtin_sqrt(ss / static_cast<double>(n) + eps)));
    for (i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 a = _mm512_maskz_loadu_ps(m, x + i);
        const __m512 w = _mm512_maskz_loadu_ps(m, weight + i);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_mul_ps(a, inv), w));
    }
}

void rope_neox_avx512(float* head, int64_t rot_dim, const float* cos, const float* sin) {
    const int64_t half = rot_dim / 2;
    for (int64_t i = 0; i < half; i += 16) {
        const __mmask16 m = tail_mask(half - i);
        const __m512 a = _mm512_maskz_loadu_ps(m, head + i);
        const __m512 b = _mm512_maskz_loadu_ps(m, head + i + half);
        const __m512 c = _mm512_maskz_loadu_ps(m, cos + i);
        const __m512 s = _mm512_maskz_loadu_ps(m, sin + i);
        _mm512_mask_storeu_ps(head + i, m, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
        _mm512_mask_storeu_ps(head + i + half, m, _mm512_fmadd_ps(b, c, _mm512_mul_ps(a, s)));
    }
}

void rope_interleaved_avx512(float* head, int64_t rot_dim, const float* cos, const float* sin) {
    // Pairs (2i, 2i+1): 16 floats hold 8 pairs; cos/sin are duplicated into both lanes of a pair.
    const int64_t half = rot_dim / 2;
    const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __mmask16 odd = 0xAAAA;
    for (int64_t i = 0; i < half; i += 8) {
        const int64_t pairs = half - i < 8 ? half - i : 8;
        const __mmask16 m = tail_mask(2 * pairs);
        const __mmask16 mh = tail_mask(pairs);
        const __m512 v = _mm512_maskz_loadu_ps(m, head + 2 * i);
        const __m512 c = _mm512_permutexvar_ps(dup, _mm512_maskz_loadu_ps(mh, cos + i));
        const __m512 s = _mm512_permutexvar_ps(dup, _mm512_maskz_loadu_ps(mh, sin + i));
        // swapped = (b, a) per pair; even lanes get a*c - b*s, odd lanes b*c + a*s.
        const __m512 swapped = _mm512_permute_ps(v, 0xB1);
        const __m512 signed_s = _mm512_mask_blend_ps(odd, _mm512_sub_ps(_mm512_setzero_ps(), s), s);
        _mm512_mask_storeu_ps(head + 2 * i, m,
                              _mm512_fmadd_ps(v, c, _mm512_mul_ps(swapped, signed_s)));
    }
}

void softmax_avx512(float* x, int64_t n) {
    if (n <= 0) {
        return;
    }
    __m512 mx = _mm512_set1_ps(-__builtin_inff());
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, x + i));
    }
    const float sum = static_cast<float>(exp_sum_avx512(x, n, _mm512_reduce_max_ps(mx), x));
    const __m512 inv = _mm512_set1_ps(1.0f / sum);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
    }
}

double exp_sum_avx512(const float* x, int64_t n, float shift, float* out) {
    // The sum in f64 lanes: an f32 lane drops a term under half an ulp of its running sum (every
    // id 6e-8 as likely as the likeliest, after it), and the sampler's draw is scaled by this.
    const __m512 vshift = _mm512_set1_ps(shift);
    __m512d sum_lo = _mm512_setzero_pd();
    __m512d sum_hi = _mm512_setzero_pd();
    auto add = [&](__m512 e) {
        sum_lo = _mm512_add_pd(sum_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        sum_hi = _mm512_add_pd(sum_hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    };
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vshift));
        _mm512_storeu_ps(out + i, e);
        add(e);
    }
    if (i < n) {  // The lanes past the end are zeroed before they are added.
        const __mmask16 m = tail_mask(n - i);
        const __m512 e =
            _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vshift)));
        _mm512_mask_storeu_ps(out + i, m, e);
        add(e);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(sum_lo, sum_hi));
}

void silu_mul_avx512(const float* gate, const float* up, int64_t n, float* out) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
        const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
        const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, u));
    }
}

}  // namespace edge::engine::cpu
