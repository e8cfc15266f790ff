// AVX-512 kernels (F, BW, VL, DQ; VBMI for the table-decode FP8 variant). Every function carries
// the target attribute, so this file is compiled for baseline x86-64 and only runs after
// quant_kernels.cc has checked cpuid. Tails use masked loads, so any number of columns works
// without a scalar loop.
//
// The VNNI kernels (int8, int4) are in kernels_avx512_vnni.cc.

#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "engine/quant/fp8.h"
#include "engine/quant/kernels_internal.h"
#include "engine/quant/kernels_x86.h"

namespace edge::engine::quant::detail {
namespace {

// Columns [c, c + n) of one row (n <= 128, one scale block) for T tokens; `full` means n == 128
// and lets the loads go unmasked.
template <int T, bool kFull>
EDGE_AVX512 EDGE_INLINE void fp8_block(const uint8_t* q, const float* x, int64_t cols, int64_t c,
                                       int64_t n, __m512 scale256, __m512* acc) {
    __m512 part[T][4];
    for (int t = 0; t < T; ++t) {
        for (int j = 0; j < 4; ++j) {
            part[t][j] = _mm512_setzero_ps();
        }
    }
    for (int64_t i = 0; i < (kFull ? 128 : n); i += 32) {
        __m512 w0, w1;
        __m512i v;
        __mmask16 m0 = 0xFFFF, m1 = 0xFFFF;
        if constexpr (kFull) {
            v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i)));
        } else {
            v = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(mask32(n - i), q + i));
            m0 = mask16(n - i);
            m1 = mask16(n - i > 16 ? n - i - 16 : 0);
        }
        fp8_words_to_f32(v, &w0, &w1);
        const int j = static_cast<int>((i / 32) & 1) * 2;
        for (int t = 0; t < T; ++t) {
            const float* xt = x + t * cols + c + i;
            if constexpr (kFull) {
                part[t][j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt), part[t][j]);
                part[t][j + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt + 16), part[t][j + 1]);
            } else {
                part[t][j] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m0, xt), part[t][j]);
                part[t][j + 1] =
                    _mm512_fmadd_ps(w1, _mm512_maskz_loadu_ps(m1, xt + 16), part[t][j + 1]);
            }
        }
    }
    for (int t = 0; t < T; ++t) {
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(part[t][0], part[t][1]),
                                         _mm512_add_ps(part[t][2], part[t][3]));
        acc[t] = _mm512_fmadd_ps(sum, scale256, acc[t]);
    }
}

template <int T>
EDGE_AVX512 void fp8_rows(const Weight& w, const float* x, float* y, int64_t ldy, int64_t row_begin,
                          int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t block_cols = (cols + 127) / 128;
    const int64_t full_blocks = cols / 128;
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols;
        const float* srow = w.scales + (r / 128) * block_cols;
        __m512 acc[T];
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm512_setzero_ps();
        }
        for (int64_t b = 0; b < full_blocks; ++b) {
            prefetch_ahead(q + b * 128);
            prefetch_ahead(q + b * 128 + 64);
            fp8_block<T, true>(q + b * 128, x, cols, b * 128, 128, _mm512_set1_ps(srow[b] * 256.0f),
                               acc);
        }
        if (full_blocks < block_cols) {
            const int64_t c = full_blocks * 128;
            fp8_block<T, false>(q + c, x, cols, c, cols - c,
                                _mm512_set1_ps(srow[full_blocks] * 256.0f), acc);
        }
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
        }
    }
}

// FP8 with VBMI: every finite E4M3 value is an f32 whose low 16 bits are zero, so two 128-entry
// byte lookups (vpermi2b) on the 7 magnitude bits give the f32's bytes 2 and 3; the sign is OR-ed
// into byte 3 and two rounds of unpacking against zero place them into 32-bit lanes. The input
// bytes are first permuted so that the unpacks' lane-wise order comes out as column order.
struct Fp8LookupTables {
    alignas(64) uint8_t byte2[128];
    alignas(64) uint8_t byte3[128];
};

const Fp8LookupTables& fp8_lookup_tables() {
    static const Fp8LookupTables tables = [] {
        Fp8LookupTables t{};
        const float* decode = fp8_e4m3_table();
        for (int m = 0; m < 128; ++m) {
            const uint32_t bits = m == 0x7F ? 0 : std::bit_cast<uint32_t>(decode[m]);  // NaN: 0.
            t.byte2[m] = static_cast<uint8_t>(bits >> 16);
            t.byte3[m] = static_cast<uint8_t>(bits >> 24);
        }
        return t;
    }();
    return tables;
}

// 64 E4M3 bytes -> four vectors of exact f32 values, columns 16j .. 16j+15 in out[j].
EDGE_AVX512_VBMI EDGE_INLINE void fp8_decode_64_vbmi(__m512i bytes, const __m512i* tables,
                                                     __m512i order, __m512* out) {
    const __m512i b = _mm512_permutexvar_epi8(order, bytes);
    const __m512i lo = _mm512_permutex2var_epi8(tables[0], b, tables[1]);
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(tables[2], b, tables[3]),
                                                 b, _mm512_set1_epi8(static_cast<char>(0x80)),
                                                 0xF8);  // hi | (b & 0x80)
    const __m512i zero = _mm512_setzero_si512();
    const __m512i w0 = _mm512_unpacklo_epi8(lo, hi);
    const __m512i w1 = _mm512_unpackhi_epi8(lo, hi);
    out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, w0));
    out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, w0));
    out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, w1));
    out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, w1));
}

template <int T>
EDGE_AVX512_VBMI void fp8_vbmi_rows(const Weight& w, const float* x, float* y, int64_t ldy,
                                    int64_t row_begin, int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t block_cols = (cols + 127) / 128;
    const Fp8LookupTables& lut = fp8_lookup_tables();
    const __m512i tables[4] = {_mm512_load_si512(lut.byte2), _mm512_load_si512(lut.byte2 + 64),
                               _mm512_load_si512(lut.byte3), _mm512_load_si512(lut.byte3 + 64)};
    // order[16L + 4j + q] = 16j + 4L + q (see fp8_decode_64_vbmi).
    alignas(64) uint8_t order_bytes[64];
    for (int l = 0; l < 4; ++l) {
        for (int j = 0; j < 4; ++j) {
            for (int q = 0; q < 4; ++q) {
                order_bytes[16 * l + 4 * j + q] = static_cast<uint8_t>(16 * j + 4 * l + q);
            }
        }
    }
    const __m512i order = _mm512_load_si512(order_bytes);
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols;
        const float* srow = w.scales + (r / 128) * block_cols;
        __m512 acc[T];
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm512_setzero_ps();
        }
        for (int64_t b = 0; b < block_cols; ++b) {
            __m512 part[T][4];
            for (int t = 0; t < T; ++t) {
                for (int j = 0; j < 4; ++j) {
                    part[t][j] = _mm512_setzero_ps();
                }
            }
            const int64_t end = std::min<int64_t>(cols, b * 128 + 128);
            for (int64_t c = b * 128; c < end; c += 64) {
                prefetch_ahead(q + c);
                const int64_t n = end - c;
                __m512 wv[4];
                if (n >= 64) {
                    fp8_decode_64_vbmi(_mm512_loadu_si512(q + c), tables, order, wv);
                    for (int t = 0; t < T; ++t) {
                        const float* xt = x + t * cols + c;
                        for (int j = 0; j < 4; ++j) {
                            part[t][j] =
                                _mm512_fmadd_ps(wv[j], _mm512_loadu_ps(xt + 16 * j), part[t][j]);
                        }
                    }
                } else {
                    fp8_decode_64_vbmi(_mm512_maskz_loadu_epi8(mask64(n), q + c), tables, order,
                                       wv);
                    for (int t = 0; t < T; ++t) {
                        const float* xt = x + t * cols + c;
                        for (int j = 0; j < 4 && 16 * j < n; ++j) {
                            const __m512 xv =
                                _mm512_maskz_loadu_ps(mask16(n - 16 * j), xt + 16 * j);
                            part[t][j] = _mm512_fmadd_ps(wv[j], xv, part[t][j]);
                        }
                    }
                }
            }
            const __m512 scale = _mm512_set1_ps(srow[b]);
            for (int t = 0; t < T; ++t) {
                const __m512 sum = _mm512_add_ps(_mm512_add_ps(part[t][0], part[t][1]),
                                                 _mm512_add_ps(part[t][2], part[t][3]));
                acc[t] = _mm512_fmadd_ps(sum, scale, acc[t]);
            }
        }
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
        }
    }
}

// 64 int8 weights (or fewer, masked) times T tokens into four accumulators per token.
template <int T, bool kFull>
EDGE_AVX512 EDGE_INLINE void int8_piece(const int8_t* q, const float* x, int64_t cols, int64_t c,
                                        int64_t n, __m512 (*acc)[4]) {
    for (int j = 0; j < 4; ++j) {
        const int64_t left = n - 16 * j;
        if (!kFull && left <= 0) {
            break;
        }
        const __mmask16 m = kFull ? static_cast<__mmask16>(0xFFFF) : mask16(left);
        const __m128i b = kFull ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c + 16 * j))
                                : _mm_maskz_loadu_epi8(m, q + c + 16 * j);
        const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
        for (int t = 0; t < T; ++t) {
            const float* xt = x + t * cols + c + 16 * j;
            const __m512 xv = kFull ? _mm512_loadu_ps(xt) : _mm512_maskz_loadu_ps(m, xt);
            acc[t][j] = _mm512_fmadd_ps(wv, xv, acc[t][j]);
        }
    }
}

template <int T>
EDGE_AVX512 void int8_rows(const Weight& w, const float* x, float* y, int64_t ldy,
                           int64_t row_begin, int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t full = cols / 64 * 64;
    for (int64_t r = row_begin; r < row_end; ++r) {
        const int8_t* q = static_cast<const int8_t*>(w.data) + r * cols;
        __m512 acc[T][4];
        for (int t = 0; t < T; ++t) {
            for (int j = 0; j < 4; ++j) {
                acc[t][j] = _mm512_setzero_ps();
            }
        }
        for (int64_t c = 0; c < full; c += 64) {
            prefetch_ahead(q + c);
            int8_piece<T, true>(q, x, cols, c, 64, acc);
        }
        if (full < cols) {
            int8_piece<T, false>(q, x, cols, full, cols - full, acc);
        }
        for (int t = 0; t < T; ++t) {
            const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]),
                                             _mm512_add_ps(acc[t][2], acc[t][3]));
            y[t * ldy + r] = _mm512_reduce_add_ps(sum) * w.scales[r];
        }
    }
}

// INT4 widened to f32: 16 packed bytes -> two vectors of (q - 8) * scale, in column order.
template <int T>
EDGE_AVX512 void int4_float_rows(const Weight& w, const float* x, float* y, int64_t ldy,
                                 int64_t row_begin, int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t g = w.format == WeightFormat::kInt4G32 ? 32 : 128;
    const int64_t groups = cols / g;
    const __m128i nib = _mm_set1_epi8(0x0F);
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
        const float* srow = w.scales + r * groups;
        __m512 acc[T][2];
        for (int t = 0; t < T; ++t) {
            acc[t][0] = _mm512_setzero_ps();
            acc[t][1] = _mm512_setzero_ps();
        }
        for (int64_t gi = 0; gi < groups; ++gi) {
            prefetch_ahead(q + gi * g / 2);
            const __m512 scale = _mm512_set1_ps(srow[gi]);
            const __m512 offset = _mm512_set1_ps(-8.0f * srow[gi]);
            for (int64_t c = gi * g; c < (gi + 1) * g; c += 32) {
                const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c / 2));
                const __m128i lo = _mm_and_si128(b, nib);
                const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), nib);
                const __m512 w0 = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi))), scale,
                    offset);
                const __m512 w1 = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi))), scale,
                    offset);
                for (int t = 0; t < T; ++t) {
                    const float* xt = x + t * cols + c;
                    acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt), acc[t][0]);
                    acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt + 16), acc[t][1]);
                }
            }
        }
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
        }
    }
}

}  // namespace

void matmul_fp8_avx512(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy,
                       int64_t row_begin, int64_t row_end) {
    static constexpr RowsFn kTiles[kMaxTile] = {fp8_rows<1>, fp8_rows<2>, fp8_rows<3>, fp8_rows<4>};
    run_tiles(kTiles, w, x, n_tokens, y, ldy, row_begin, row_end);
}

void matmul_fp8_avx512_vbmi(const Weight& w, const float* x, int64_t n_tokens, float* y,
                            int64_t ldy, int64_t row_begin, int64_t row_end) {
    static constexpr RowsFn kTiles[kMaxTile] = {fp8_vbmi_rows<1>, fp8_vbmi_rows<2>,
                                                fp8_vbmi_rows<3>, fp8_vbmi_rows<4>};
    run_tiles(kTiles, w, x, n_tokens, y, ldy, row_begin, row_end);
}

void matmul_int8_avx512(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy,
                        int64_t row_begin, int64_t row_end) {
    static constexpr RowsFn kTiles[kMaxTile] = {int8_rows<1>, int8_rows<2>, int8_rows<3>,
                                                int8_rows<4>};
    run_tiles(kTiles, w, x, n_tokens, y, ldy, row_begin, row_end);
}

void matmul_int4_avx512(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy,
                        int64_t row_begin, int64_t row_end) {
    static constexpr RowsFn kTiles[kMaxTile] = {int4_float_rows<1>, int4_float_rows<2>,
                                                int4_float_rows<3>, int4_float_rows<4>};
    run_tiles(kTiles, w, x, n_tokens, y, ldy, row_begin, row_end);
}

}  // namespace edge::engine::quant::detail

#endif  // defined(__x86_64__)
