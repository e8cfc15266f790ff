// AVX2+FMA versions of the element-wise kernels of ops.h (RMSNorm, NeoX and interleaved RoPE,
// softmax, SiLU-gated product), for CPUs without AVX-512 (Zen 3, Haswell to Skylake client). This
// file is compiled with AVX2/FMA flags (engine/CMakeLists.txt) and only called after cpuid reports
// them (ops.cc picks at run time). Lengths that are not multiples of 8 finish with scalar code of
// the same arithmetic. It calls no extern inline function of a shared header (only intrinsics,
// builtins and avx2_reduce.h's static ones): an out-of-line copy compiled here with AVX2 could be
// the one the linker keeps.
// Tolerances against the scalar references of ops_kernels.h are stated in
// tests/engine/cpu/ops_test.cc.

#include <immintrin.h>

#include "engine/cpu/avx2_reduce.h"
#include "engine/cpu/ops_kernels.h"

namespace edge::engine::cpu {
namespace {

// e^x for 8 lanes, as ops_avx512.cc's exp_ps: x = n ln2 + r with |r| <= ln2 / 2, e^r by its
// degree-6 Taylor polynomial, times 2^n built in the exponent field. Without vscalefps the range
// is clamped to [-87.3, 88.3], where 2^n stays a normal f32: below, the result is ~1e-38 instead
// of a smaller number or 0 (an absolute error under 1.2e-38); above, e^88.3 ~ 2.2e38 instead of
// a larger number or inf (silu's g / (1 + e^-g) is then 0 either way for g <= -88.3). NaN stays
// NaN (max/min return the second operand, here x, when it is NaN).
inline __m256 exp_ps(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);
    x = _mm256_min_ps(_mm256_set1_ps(88.3f), x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), x);  // ln2 high part, exact.
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), r);          // ln2 low part.
    __m256 p = _mm256_set1_ps(kExpTaylor[0]);
    for (int i = 1; i < 7; ++i) {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpTaylor[i]));
    }
    const __m256i bits =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// exp_ps with 0 below its clamp (e^x under 1.2e-38, -inf included), so that an id a filter took
// out (at -inf) has no probability at all, as in the scalar and AVX-512 forms. NaN stays NaN.
inline __m256 exp_or_zero(__m256 x) {
    return _mm256_and_ps(exp_ps(x), _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_NLT_UQ));
}

}  // namespace

void rms_norm_avx2(const float* x, const float* weight, int64_t n, float eps, float* out) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a = _mm256_loadu_ps(x + i);
        const __m256 b = _mm256_loadu_ps(x + i + 8);
        s0 = _mm256_fmadd_ps(a, a, s0);
        s1 = _mm256_fmadd_ps(b, b, s1);
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 a = _mm256_loadu_ps(x + i);
        s0 = _mm256_fmadd_ps(a, a, s0);
    }
    double ss = hsum_avx2(_mm256_add_ps(s0, s1));
    for (; i < n; ++i) {
        ss += static_cast<double>(x[i]) * x[i];
    }
    const float inv = static_cast<float>(1.0 / __builtin_sqrt(ss / static_cast<double>(n) + eps));
    const __m256 vinv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 a = _mm256_loadu_ps(x + i);
        const __m256 w = _mm256_loadu_ps(weight + i);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(a, vinv), w));
    }
    for (; i < n; ++i) {
        out[i] = x[i] * inv * weight[i];
    }
}

void rope_neox_avx2(float* head, int64_t rot_dim, const float* cos, const float* sin) {
    const int64_t half = rot_dim / 2;
    int64_t i = 0;
    for (; i + 8 <= half; i += 8) {
        const __m256 a = _mm256_loadu_ps(head + i);
        const __m256 b = _mm256_loadu_ps(head + i + half);
        const __m256 c = _mm256_loadu_ps(cos + i);
        const __m256 s = _mm256_loadu_ps(sin + i);
        _mm256_storeu_ps(head + i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
        _mm256_storeu_ps(head + i + half, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
    }
    for (; i < half; ++i) {
        const float a = head[i], b = head[i + half];
        head[i] = __builtin_fmaf(a, cos[i], -(b * sin[i]));
        head[i + half] = __builtin_fmaf(b, cos[i], a * sin[i]);
    }
}

void rope_interleaved_avx2(float* head, int64_t rot_dim, const float* cos, const float* sin) {
    // Pairs (2i, 2i+1): 8 floats hold 4 pairs; cos/sin are duplicated into both lanes of a pair.
    const int64_t half = rot_dim / 2;
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256 sign = _mm256_setr_ps(-1.0f, 1.0f, -1.0f, 1.0f, -1.0f, 1.0f, -1.0f, 1.0f);
    int64_t i = 0;
    for (; i + 4 <= half; i += 4) {
        const __m256 v = _mm256_loadu_ps(head + 2 * i);
        const __m256 c =
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cos + i)), dup);
        const __m256 s =
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sin + i)), dup);
        // swapped = (b, a) per pair; even lanes get a*c - b*s, odd lanes b*c + a*s.
        const __m256 swapped = _mm256_permute_ps(v, 0xB1);
        _mm256_storeu_ps(head + 2 * i,
                         _mm256_fmadd_ps(v, c, _mm256_mul_ps(swapped, _mm256_mul_ps(s, sign))));
    }
    for (; i < half; ++i) {
        const float a = head[2 * i], b = head[2 * i + 1];
        head[2 * i] = __builtin_fmaf(a, cos[i], -(b * sin[i]));
        head[2 * i + 1] = __builtin_fmaf(b, cos[i], a * sin[i]);
    }
}

void softmax_avx2(float* x, int64_t n) {
    if (n <= 0) {
        return;
    }
    __m256 mx = _mm256_set1_ps(-__builtin_inff());
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
    }
    float m = hmax_avx2(mx);
    for (; i < n; ++i) {
        m = x[i] > m ? x[i] : m;
    }
    const auto sum = static_cast<float>(exp_sum_avx2(x, n, m, x));
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (i = 0; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    }
    for (; i < n; ++i) {
        x[i] *= 1.0f / sum;
    }
}

double exp_sum_avx2(const float* x, int64_t n, float shift, float* out) {
    // The sum in f64 lanes: an f32 lane drops a term under half an ulp of its running sum (every
    // id 6e-8 as likely as the likeliest, after it), and the sampler's draw is scaled by this.
    const __m256 vshift = _mm256_set1_ps(shift);
    __m256d sum_lo = _mm256_setzero_pd();
    __m256d sum_hi = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp_or_zero(_mm256_sub_ps(_mm256_loadu_ps(x + i), vshift));
        _mm256_storeu_ps(out + i, e);
        sum_lo = _mm256_add_pd(sum_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        sum_hi = _mm256_add_pd(sum_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    const __m256d sum4 = _mm256_add_pd(sum_lo, sum_hi);
    const __m128d sum2 = _mm_add_pd(_mm256_castpd256_pd128(sum4), _mm256_extractf128_pd(sum4, 1));
    double sum = _mm_cvtsd_f64(_mm_add_sd(sum2, _mm_unpackhi_pd(sum2, sum2)));
    if (i < n) {  // The tail through the same exp, eight lanes with the unused ones at -inf.
        alignas(32) float tail[8];
        for (int j = 0; j < 8; ++j) {
            tail[j] = i + j < n ? x[i + j] : -__builtin_inff();
        }
        _mm256_store_ps(tail, exp_or_zero(_mm256_sub_ps(_mm256_load_ps(tail), vshift)));
        for (; i < n; ++i) {
            out[i] = tail[i % 8];
            sum += out[i];
        }
    }
    return sum;
}

void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* out) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 8) {
        alignas(32) float g8[8] = {}, u8[8] = {}, o8[8];
        const bool full = i + 8 <= n;
        if (!full) {
            for (int64_t j = i; j < n; ++j) {
                g8[j - i] = gate[j];
                u8[j - i] = up[j];
            }
        }
        const __m256 g = full ? _mm256_loadu_ps(gate + i) : _mm256_load_ps(g8);
        const __m256 u = full ? _mm256_loadu_ps(up + i) : _mm256_load_ps(u8);
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
        const __m256 y = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
        if (full) {
            _mm256_storeu_ps(out + i, y);
        } else {
            _mm256_store_ps(o8, y);
            for (int64_t j = i; j < n; ++j) {
                out[j] = o8[j - i];
            }
        }
    }
}

}  // namespace edge::engine::cpu
