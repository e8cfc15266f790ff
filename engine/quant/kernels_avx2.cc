// AVX2 + FMA + F16C kernels. Every function carries the target attribute, so this file is compiled
// for baseline x86-64 and only runs after quant_kernels.cc has checked cpuid. Weights are widened
// to f32 in registers and multiplied with FMA; a tile of up to 4 tokens shares each weight load.

#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>

#include "engine/quant/fp8.h"
#include "engine/quant/kernels_internal.h"
#include "engine/quant/kernels_x86.h"

namespace edge::engine::quant::detail {
namespace {

EDGE_AVX2 inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// 16 E4M3 bytes -> 16 floats (two vectors) times `scale`, via the bit-identical F16 encoding:
// E4M3 magnitude bits shifted into an F16's exponent/mantissa give the value * 2^-8, subnormals
// included, and vcvtph2ps converts exactly.
EDGE_AVX2 inline void decode_fp8_16(const uint8_t* p, __m256 scale256, __m256* lo, __m256* hi) {
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i mag = _mm256_and_si256(_mm256_slli_epi16(v, 7), _mm256_set1_epi16(0x3F80));
    const __m256i sign = _mm256_and_si256(_mm256_slli_epi16(v, 8), _mm256_set1_epi16(-32768));
    const __m256i h = _mm256_or_si256(mag, sign);
    *lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), scale256);
    *hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), scale256);
}

template <int T>
EDGE_AVX2 void fp8_rows(const Weight& w, const float* x, float* y, int64_t ldy, int64_t row_begin,
                        int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t block_cols = (cols + 127) / 128;
    const float* table = fp8_e4m3_table();
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols;
        const float* srow = w.scales + (r / 128) * block_cols;
        __m256 acc[T][2];
        for (int t = 0; t < T; ++t) {
            acc[t][0] = _mm256_setzero_ps();
            acc[t][1] = _mm256_setzero_ps();
        }
        float tail[T] = {};
        for (int64_t c0 = 0; c0 < cols; c0 += 128) {
            const int64_t end = std::min<int64_t>(c0 + 128, cols);
            const float s = srow[c0 / 128];
            const __m256 s256 = _mm256_set1_ps(s * 256.0f);
            int64_t c = c0;
            for (; c + 16 <= end; c += 16) {
                __m256 w0, w1;
                decode_fp8_16(q + c, s256, &w0, &w1);
                for (int t = 0; t < T; ++t) {
                    const float* xt = x + t * cols + c;
                    acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), acc[t][0]);
                    acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), acc[t][1]);
                }
            }
            for (; c < end; ++c) {
                const float wv = table[q[c]] * s;
                for (int t = 0; t < T; ++t) {
                    tail[t] += wv * x[t * cols + c];
                }
            }
        }
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = hsum(_mm256_add_ps(acc[t][0], acc[t][1])) + tail[t];
        }
    }
}

template <int T>
EDGE_AVX2 void int8_rows(const Weight& w, const float* x, float* y, int64_t ldy, int64_t row_begin,
                         int64_t row_end) {
    const int64_t cols = w.cols;
    for (int64_t r = row_begin; r < row_end; ++r) {
        const int8_t* q = static_cast<const int8_t*>(w.data) + r * cols;
        __m256 acc[T][2];
        for (int t = 0; t < T; ++t) {
            acc[t][0] = _mm256_setzero_ps();
            acc[t][1] = _mm256_setzero_ps();
        }
        int64_t c = 0;
        for (; c + 16 <= cols; c += 16) {
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c));
            const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
            const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
            for (int t = 0; t < T; ++t) {
                const float* xt = x + t * cols + c;
                acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), acc[t][0]);
                acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), acc[t][1]);
            }
        }
        for (int t = 0; t < T; ++t) {
            float sum = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
            for (int64_t i = c; i < cols; ++i) {
                sum += static_cast<float>(q[i]) * x[t * cols + i];
            }
            y[t * ldy + r] = sum * w.scales[r];
        }
    }
}

// 16 packed bytes (32 int4 values in order) -> four vectors of (q - 8) * scale.
EDGE_AVX2 inline void decode_int4_32(const uint8_t* p, __m256 scale, __m256 offset, __m256* out) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    const __m128i e0 = _mm_unpacklo_epi8(lo, hi);  // Elements 0..15.
    const __m128i e1 = _mm_unpackhi_epi8(lo, hi);  // Elements 16..31.
    out[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e0)), scale, offset);
    out[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e0, 8))), scale,
                             offset);
    out[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e1)), scale, offset);
    out[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e1, 8))), scale,
                             offset);
}

template <int T>
EDGE_AVX2 void int4_rows(const Weight& w, const float* x, float* y, int64_t ldy, int64_t row_begin,
                         int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t g = w.format == WeightFormat::kInt4G32 ? 32 : 128;
    const int64_t groups = cols / g;
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
        const float* srow = w.scales + r * groups;
        __m256 acc[T][2];
        for (int t = 0; t < T; ++t) {
            acc[t][0] = _mm256_setzero_ps();
            acc[t][1] = _mm256_setzero_ps();
        }
        for (int64_t gi = 0; gi < groups; ++gi) {
            const __m256 scale = _mm256_set1_ps(srow[gi]);
            const __m256 offset = _mm256_set1_ps(-8.0f * srow[gi]);
            for (int64_t c = gi * g; c < (gi + 1) * g; c += 32) {
                __m256 wv[4];
                decode_int4_32(q + c / 2, scale, offset, wv);
                for (int t = 0; t < T; ++t) {
                    const float* xt = x + t * cols + c;
                    acc[t][0] = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(xt), acc[t][0]);
                    acc[t][1] = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xt + 8), acc[t][1]);
                    acc[t][0] = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(xt + 16), acc[t][0]);
                    acc[t][1] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(xt + 24), acc[t][1]);
                }
            }
        }
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
        }
    }
}

}  // namespace

void matmul_fp8_avx2(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy,
                     int64_t row_begin, int64_t row_end) {
    static constexpr RowsFn kTiles[kMaxTile] = {fp8_rows<1>, fp8_rows<2>, fp8_rows<3>, fp8_rows<4>};
    run_tiles(kTiles, w, x, n_tokens, y, ldy, row_begin, row_end);
}

void matmul_int8_avx2(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy,
                      int64_t row_begin, int64_t row_end) {
    static constexpr RowsFn kTiles[kMaxTile] = {int8_rows<1>, int8_rows<2>, int8_rows<3>,
                                                int8_rows<4>};
    run_tiles(kTiles, w, x, n_tokens, y, ldy, row_begin, row_end);
}

void matmul_int4_avx2(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy,
                      int64_t row_begin, int64_t row_end) {
    static constexpr RowsFn kTiles[kMaxTile] = {int4_rows<1>, int4_rows<2>, int4_rows<3>,
                                                int4_rows<4>};
    run_tiles(kTiles, w, x, n_tokens, y, ldy, row_begin, row_end);
}

}  // namespace edge::engine::quant::detail

#endif  // defined(__x86_64__)
