// AVX-512 kernels (F, BW, VL, DQ, plus VNNI for INT4). Every function carries the target
// attribute, so this file is compiled for baseline x86-64 and only runs after quant_kernels.cc has
// checked cpuid. Tails use masked loads, so any number of columns works without a scalar loop.
//
// INT4 (VNNI): each token's activations are quantized to int8 per weight group (scale max|x|/127)
// and laid out per 128-column chunk as even and odd elements, matching the low and high nibbles of
// the 64 packed weight bytes of that chunk. Two vpdpbusd (unsigned nibble x signed int8) give, per
// 32-bit lane, the dot product of 8 consecutive columns; the +8 storage offset is removed by
// starting each lane at -8 * sum(x_q of its columns); one convert and one FMA with
// (weight scale x activation scale) per lane finish the chunk. That is ~4 vector ops per 64 weight
// bytes per token instead of ~20 for widening nibbles to f32.

#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "engine/quant/fp8.h"
#include "engine/quant/kernels_internal.h"

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsic headers as
// "may be used uninitialized" (a known false positive of the reduce/convert intrinsics).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define EDGE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2")))
#define EDGE_AVX512_VBMI \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,fma,f16c,avx2")))
#define EDGE_INLINE inline __attribute__((always_inline))
#define EDGE_AVX512_VNNI \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c,avx2")))

namespace edge::engine::quant::detail {
namespace {

constexpr int kMaxTile = 4;

__mmask16 mask16(int64_t n) {
    return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}
__mmask32 mask32(int64_t n) {
    return n >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu) : static_cast<__mmask32>((1u << n) - 1);
}
__mmask64 mask64(int64_t n) {
    return n >= 64 ? ~__mmask64{0} : static_cast<__mmask64>((uint64_t{1} << n) - 1);
}

// 32 E4M3 bytes (already zero-extended to 16-bit lanes) -> two vectors of value / 256, through
// the bit-identical F16 encoding: with the byte in the high half of a 16-bit lane, an arithmetic
// shift right by one puts the magnitude bits into an F16's exponent and mantissa (value * 2^-8,
// subnormals included) and copies the sign into bit 14, which the mask clears; vcvtph2ps is exact.
EDGE_AVX512 EDGE_INLINE void fp8_words_to_f32(__m512i v, __m512* lo, __m512* hi) {
    const __m512i h = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(v, 8), 1),
                                       _mm512_set1_epi16(static_cast<int16_t>(0xBFFF)));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

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
EDGE_AVX512 void fp8_rows(const Weight& w, const float* x, float* y, int64_t ldy,
                          int64_t row_begin, int64_t row_end) {
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
            fp8_block<T, true>(q + b * 128, x, cols, b * 128, 128,
                               _mm512_set1_ps(srow[b] * 256.0f), acc);
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
                const int64_t n = end - c;
                __m512 wv[4];
                if (n >= 64) {
                    fp8_decode_64_vbmi(_mm512_loadu_si512(q + c), tables, order, wv);
                    for (int t = 0; t < T; ++t) {
                        const float* xt = x + t * cols + c;
                        for (int j = 0; j < 4; ++j) {
                            part[t][j] = _mm512_fmadd_ps(wv[j], _mm512_loadu_ps(xt + 16 * j),
                                                         part[t][j]);
                        }
                    }
                } else {
                    fp8_decode_64_vbmi(_mm512_maskz_loadu_epi8(mask64(n), q + c), tables, order,
                                       wv);
                    for (int t = 0; t < T; ++t) {
                        const float* xt = x + t * cols + c;
                        for (int j = 0; j < 4 && 16 * j < n; ++j) {
                            const __m512 xv = _mm512_maskz_loadu_ps(mask16(n - 16 * j), xt + 16 * j);
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

// One token's activations for 128 columns, prepared for the VNNI INT4 kernel.
struct alignas(64) Int4Chunk {
    int8_t even[64];       // x_q of columns 0, 2, ..., 126 (matches the low nibbles).
    int8_t odd[64];        // x_q of columns 1, 3, ..., 127 (matches the high nibbles).
    int32_t neg_corr[16];  // Lane j: -8 * sum of x_q over columns 8j .. 8j+7.
    float scale[16];       // Lane j: activation scale of the group holding columns 8j .. 8j+7.
};
static_assert(sizeof(Int4Chunk) == 256, "one cache-line-aligned chunk per 128 columns");

// Quantizes one token's activations for the VNNI kernel: per group of G columns, scale =
// max|x| / 127 and x_q = round-to-nearest-even(x * 127 / max|x|) (0 for an all-zero group). Columns
// past `cols` in the last chunk read as zero. Vectorized because it runs once per kernel call and
// thread: for a 256-row slice of a 1024-column matrix a scalar version took half the call's time.
template <int G>
EDGE_AVX512_VNNI void prepare_int4_activations(const float* x, int64_t cols, Int4Chunk* chunks) {
    const int64_t n_chunks = (cols + 127) / 128;
    const __m512i even_idx =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd_idx =
        _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512i group_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    for (int64_t k = 0; k < n_chunks; ++k) {
        Int4Chunk& ch = chunks[k];
        __m512 v[8];
        for (int i = 0; i < 8; ++i) {
            const int64_t c = k * 128 + i * 16;
            v[i] = c < cols ? _mm512_maskz_loadu_ps(mask16(cols - c), x + c) : _mm512_setzero_ps();
        }
        __m512 amax[4];
        for (int p = 0; p < 4; ++p) {
            amax[p] = _mm512_max_ps(_mm512_and_ps(v[2 * p], abs_mask),
                                    _mm512_and_ps(v[2 * p + 1], abs_mask));
        }
        alignas(16) float scale[4];
        float inv[4];
        if constexpr (G == 32) {
            for (int p = 0; p < 4; ++p) {
                const float m = _mm512_reduce_max_ps(amax[p]);
                scale[p] = m / 127.0f;
                inv[p] = m > 0.0f ? 127.0f / m : 0.0f;
            }
        } else {
            const float m = _mm512_reduce_max_ps(
                _mm512_max_ps(_mm512_max_ps(amax[0], amax[1]), _mm512_max_ps(amax[2], amax[3])));
            for (int p = 0; p < 4; ++p) {
                scale[p] = m / 127.0f;
                inv[p] = m > 0.0f ? 127.0f / m : 0.0f;
            }
        }
        for (int p = 0; p < 4; ++p) {  // Columns 32p .. 32p+31 of the chunk.
            const __m512 s = _mm512_set1_ps(inv[p]);
            const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(v[2 * p], s));
            const __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(v[2 * p + 1], s));
            _mm_store_si128(reinterpret_cast<__m128i*>(ch.even + 16 * p),
                            _mm512_cvtsepi32_epi8(_mm512_permutex2var_epi32(a, even_idx, b)));
            _mm_store_si128(reinterpret_cast<__m128i*>(ch.odd + 16 * p),
                            _mm512_cvtsepi32_epi8(_mm512_permutex2var_epi32(a, odd_idx, b)));
        }
        // Lane j's sum of x_q over columns 8j..8j+7: four even plus four odd bytes.
        __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones,
                                          _mm512_load_si512(ch.even));
        sum = _mm512_dpbusd_epi32(sum, ones, _mm512_load_si512(ch.odd));
        _mm512_store_si512(ch.neg_corr, _mm512_sub_epi32(_mm512_setzero_si512(),
                                                         _mm512_slli_epi32(sum, 3)));
        _mm512_store_ps(ch.scale,
                        _mm512_permutexvar_ps(group_of_lane, _mm512_castps128_ps512(
                                                                 _mm_load_ps(scale))));
    }
}

// One 128-column chunk of one row for T tokens; `wv` holds its 64 packed bytes (zeros past the
// row's end) and `wscale` the weight scale of each lane's group.
template <int T>
EDGE_AVX512_VNNI EDGE_INLINE void int4_vnni_chunk(__m512i wv, __m512 wscale, const Int4Chunk* prepared,
                                             int64_t n_chunks, int64_t k, __m512* acc) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i lo = _mm512_and_si512(wv, nib);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nib);
    for (int t = 0; t < T; ++t) {
        const Int4Chunk& ch = prepared[t * n_chunks + k];
        __m512i dot = _mm512_load_si512(ch.neg_corr);
        dot = _mm512_dpbusd_epi32(dot, lo, _mm512_load_si512(ch.even));
        dot = _mm512_dpbusd_epi32(dot, hi, _mm512_load_si512(ch.odd));
        const __m512 s = _mm512_mul_ps(wscale, _mm512_load_ps(ch.scale));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc[t]);
    }
}

template <int T, int G>
EDGE_AVX512_VNNI void int4_vnni_rows(const Weight& w, const Int4Chunk* prepared, int64_t n_chunks,
                                     float* y, int64_t ldy, int64_t row_begin, int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t groups = cols / G;
    const int64_t full_chunks = cols / 128;
    // Lane j of a chunk covers columns 8j..8j+7, i.e. group j / 4 of the chunk's four (G = 32).
    const __m512i group_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
        const float* srow = w.scales + r * groups;
        __m512 acc[T];
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm512_setzero_ps();
        }
        for (int64_t k = 0; k < full_chunks; ++k) {
            const __m512i wv = _mm512_loadu_si512(q + k * 64);
            __m512 wscale;
            if constexpr (G == 32) {
                wscale = _mm512_permutexvar_ps(group_of_lane,
                                               _mm512_castps128_ps512(_mm_loadu_ps(srow + k * 4)));
            } else {
                wscale = _mm512_set1_ps(srow[k]);
            }
            int4_vnni_chunk<T>(wv, wscale, prepared, n_chunks, k, acc);
        }
        if constexpr (G == 32) {
            if (full_chunks < n_chunks) {  // 1..3 trailing groups of 32 columns.
                const int64_t ng = (cols - full_chunks * 128) / 32;
                const __m512i wv = _mm512_maskz_loadu_epi8(mask64(ng * 16), q + full_chunks * 64);
                const __m128 s4 = _mm_maskz_loadu_ps(static_cast<__mmask8>((1u << ng) - 1),
                                                     srow + full_chunks * 4);
                const __m512 wscale =
                    _mm512_permutexvar_ps(group_of_lane, _mm512_castps128_ps512(s4));
                int4_vnni_chunk<T>(wv, wscale, prepared, n_chunks, full_chunks, acc);
            }
        }
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
        }
    }
}

// One token's activations for 64 columns, prepared for the VNNI INT8 kernel. Weights are made
// unsigned by flipping their sign bit (w + 128), so vpdpbusd computes sum (w + 128) * x_q; each lane
// starts at -128 * sum(x_q of its 4 columns) to cancel the offset.
struct alignas(64) Int8Chunk {
    int8_t x[64];          // x_q of the 64 columns.
    int32_t neg_corr[16];  // Lane j: -128 * sum of x_q over columns 4j .. 4j+3.
    float scale;           // Activation scale of the 64 columns.
    float pad[15];
};
static_assert(sizeof(Int8Chunk) == 192, "three cache lines per 64 columns");

// Per 64 columns: scale = max|x| / 127, x_q = round-to-nearest-even(x * 127 / max|x|).
EDGE_AVX512_VNNI void prepare_int8_activations(const float* x, int64_t cols, Int8Chunk* chunks) {
    const int64_t n_chunks = (cols + 63) / 64;
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    for (int64_t k = 0; k < n_chunks; ++k) {
        Int8Chunk& ch = chunks[k];
        __m512 v[4];
        __m512 amax = _mm512_setzero_ps();
        for (int i = 0; i < 4; ++i) {
            const int64_t c = k * 64 + i * 16;
            v[i] = c < cols ? _mm512_maskz_loadu_ps(mask16(cols - c), x + c) : _mm512_setzero_ps();
            amax = _mm512_max_ps(amax, _mm512_and_ps(v[i], abs_mask));
        }
        const float m = _mm512_reduce_max_ps(amax);
        const __m512 inv = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
        for (int i = 0; i < 4; ++i) {
            _mm_store_si128(reinterpret_cast<__m128i*>(ch.x + 16 * i),
                            _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v[i], inv))));
        }
        const __m512i sum =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_load_si512(ch.x));
        _mm512_store_si512(ch.neg_corr,
                           _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
        ch.scale = m / 127.0f;
    }
}

template <int T>
EDGE_AVX512_VNNI void int8_vnni_rows(const Weight& w, const Int8Chunk* prepared, int64_t n_chunks,
                                     float* y, int64_t ldy, int64_t row_begin, int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t full_chunks = cols / 64;
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int64_t r = row_begin; r < row_end; ++r) {
        const int8_t* q = static_cast<const int8_t*>(w.data) + r * cols;
        __m512 acc[T];
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm512_setzero_ps();
        }
        for (int64_t k = 0; k < n_chunks; ++k) {
            // Past the row's end the masked load gives 0, flipped to 128, times x_q = 0.
            const __m512i raw = k < full_chunks ? _mm512_loadu_si512(q + k * 64)
                                                : _mm512_maskz_loadu_epi8(mask64(cols - k * 64),
                                                                          q + k * 64);
            const __m512i wu = _mm512_xor_si512(raw, flip);
            for (int t = 0; t < T; ++t) {
                const Int8Chunk& ch = prepared[t * n_chunks + k];
                const __m512i dot = _mm512_dpbusd_epi32(_mm512_load_si512(ch.neg_corr), wu,
                                                        _mm512_load_si512(ch.x));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(ch.scale), acc[t]);
            }
        }
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]) * w.scales[r];
        }
    }
}

using RowsFn = void (*)(const Weight&, const float*, float*, int64_t, int64_t, int64_t);

void run_tiles(const RowsFn (&tiles)[kMaxTile], const Weight& w, const float* x, int64_t n_tokens,
               float* y, int64_t ldy, int64_t row_begin, int64_t row_end) {
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kMaxTile) {
        const int64_t nt = std::min<int64_t>(kMaxTile, n_tokens - t0);
        tiles[nt - 1](w, x + t0 * w.cols, y + t0 * ldy, ldy, row_begin, row_end);
    }
}

using VnniRowsFn = void (*)(const Weight&, const Int4Chunk*, int64_t, float*, int64_t, int64_t,
                            int64_t);

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

void matmul_int8_avx512_vnni(const Weight& w, const float* x, int64_t n_tokens, float* y,
                             int64_t ldy, int64_t row_begin, int64_t row_end) {
    const int64_t n_chunks = (w.cols + 63) / 64;
    thread_local std::vector<Int8Chunk> prepared;
    if (prepared.size() < static_cast<size_t>(n_tokens * n_chunks)) {
        prepared.resize(static_cast<size_t>(n_tokens * n_chunks));
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
        prepare_int8_activations(x + t * w.cols, w.cols, prepared.data() + t * n_chunks);
    }
    using VnniRows = void (*)(const Weight&, const Int8Chunk*, int64_t, float*, int64_t, int64_t,
                              int64_t);
    static constexpr VnniRows kTiles[kMaxTile] = {int8_vnni_rows<1>, int8_vnni_rows<2>,
                                                  int8_vnni_rows<3>, int8_vnni_rows<4>};
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kMaxTile) {
        const int64_t nt = std::min<int64_t>(kMaxTile, n_tokens - t0);
        kTiles[nt - 1](w, prepared.data() + t0 * n_chunks, n_chunks, y + t0 * ldy, ldy,
                       row_begin, row_end);
    }
}

void matmul_int4_avx512(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy,
                        int64_t row_begin, int64_t row_end) {
    static constexpr RowsFn kTiles[kMaxTile] = {int4_float_rows<1>, int4_float_rows<2>,
                                                int4_float_rows<3>, int4_float_rows<4>};
    run_tiles(kTiles, w, x, n_tokens, y, ldy, row_begin, row_end);
}

void matmul_int4_avx512_vnni(const Weight& w, const float* x, int64_t n_tokens, float* y,
                             int64_t ldy, int64_t row_begin, int64_t row_end) {
    const bool g32 = w.format == WeightFormat::kInt4G32;
    const int64_t n_chunks = (w.cols + 127) / 128;
    thread_local std::vector<Int4Chunk> prepared;
    if (prepared.size() < static_cast<size_t>(n_tokens * n_chunks)) {
        prepared.resize(static_cast<size_t>(n_tokens * n_chunks));
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
        if (g32) {
            prepare_int4_activations<32>(x + t * w.cols, w.cols, prepared.data() + t * n_chunks);
        } else {
            prepare_int4_activations<128>(x + t * w.cols, w.cols, prepared.data() + t * n_chunks);
        }
    }
    static constexpr VnniRowsFn kTiles32[kMaxTile] = {
        int4_vnni_rows<1, 32>, int4_vnni_rows<2, 32>, int4_vnni_rows<3, 32>, int4_vnni_rows<4, 32>};
    static constexpr VnniRowsFn kTiles128[kMaxTile] = {int4_vnni_rows<1, 128>,
                                                       int4_vnni_rows<2, 128>,
                                                       int4_vnni_rows<3, 128>,
                                                       int4_vnni_rows<4, 128>};
    const auto& tiles = g32 ? kTiles32 : kTiles128;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kMaxTile) {
        const int64_t nt = std::min<int64_t>(kMaxTile, n_tokens - t0);
        tiles[nt - 1](w, prepared.data() + t0 * n_chunks, n_chunks, y + t0 * ldy, ldy, row_begin,
                      row_end);
    }
}

}  // namespace edge::engine::quant::detail

#endif  // defined(__x86_64__)
