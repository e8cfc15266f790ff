// AVX-512 VNNI kernels for INT8 and INT4 weights. Every function carries the target attribute,
// so this file is compiled for baseline x86-64 and only runs after quant_kernels.cc has checked
// cpuid.
//
// INT4: each token's activations are quantized to int8 per weight group (scale max|x|/127) and
// laid out per 128-column chunk as even and odd elements, matching the low and high nibbles of
// the 64 packed weight bytes of that chunk. Two vpdpbusd (unsigned nibble x signed int8) give, per
// 32-bit lane, the dot product of 8 consecutive columns; the +8 storage offset is removed by
// starting each lane at -8 * sum(x_q of its columns); one convert and one FMA with
// (weight scale x activation scale) per lane finish the chunk. That is ~4 vector ops per 64 weight
// bytes per token instead of ~20 for widening nibbles to f32.
// INT8: the same with 64-column activation groups and the weight sign bit flipped (w + 128).

#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "engine/quant/kernels_internal.h"
#include "engine/quant/kernels_x86.h"

namespace edge::engine::quant::detail {
namespace {

// One token's activations for 128 columns, prepared for the VNNI INT4 kernel.
struct alignas(64) Int4Chunk {
    int8_t even[64];       // x_q of columns 0, 2, ..., 126 (matches the low nibbles).
    int8_t odd[64];        // x_q of columns 1, 3, ..., 127 (matches the high nibbles).
    int32_t neg_corr[16];  // Lane j: -8 * sum of x_q over columns 8j .. 8j+7.
    float scale[16];       // Lane j: activation scale of the group holding columns 8j .. 8j+7.
};
static_assert(sizeof(Int4Chunk) == 256, "one cache-line-aligned chunk per 128 columns");

// One token's activations for the INT4 VNNI kernel (quantize_int4_x128 per 128 columns).
template <int G>
EDGE_AVX512_VNNI void prepare_int4_activations(const float* x, int64_t cols, Int4Chunk* chunks) {
    const __m512i group_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    for (int64_t k = 0; k < (cols + 127) / 128; ++k) {
        Int4Chunk& ch = chunks[k];
        alignas(16) float scale[4];
        const __m512i sum = quantize_int4_x128<G>(x, k * 128, cols, ch.even, ch.odd, scale);
        _mm512_store_si512(ch.neg_corr,
                           _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 3)));
        _mm512_store_ps(ch.scale, _mm512_permutexvar_ps(
                                      group_of_lane, _mm512_castps128_ps512(_mm_load_ps(scale))));
    }
}

// Chunk k's dot products for T tokens, the nibbles already split (lo: even columns, hi: odd
// ones, as unsigned bytes), into acc[t] scaled by the weight and activation scales.
template <int T>
EDGE_AVX512_VNNI EDGE_INLINE void int4_dot_tokens(__m512i lo, __m512i hi, __m512 wscale,
                                                  const Int4Chunk* prepared, int64_t n_chunks,
                                                  int64_t k, __m512* acc) {
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
        const Int4Chunk& ch = prepared[t * n_chunks + k];
        __m512i dot = _mm512_load_si512(ch.neg_corr);
        dot = _mm512_dpbusd_epi32(dot, lo, _mm512_load_si512(ch.even));
        dot = _mm512_dpbusd_epi32(dot, hi, _mm512_load_si512(ch.odd));
        const __m512 s = _mm512_mul_ps(wscale, _mm512_load_ps(ch.scale));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc[t]);
    }
}

// One 128-column chunk of one row for T tokens; `wv` holds its 64 packed bytes (zeros past the
// row's end) and `wscale` the weight scale of each lane's group.
template <int T>
EDGE_AVX512_VNNI EDGE_INLINE void int4_vnni_chunk(__m512i wv, __m512 wscale,
                                                  const Int4Chunk* prepared, int64_t n_chunks,
                                                  int64_t k, __m512* acc) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i lo = _mm512_and_si512(wv, nib);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nib);
    int4_dot_tokens<T>(lo, hi, wscale, prepared, n_chunks, k, acc);
}

template <int T, int G>
EDGE_AVX512_VNNI void int4_vnni_rows(const Weight& w, const Int4Chunk* prepared, int64_t n_chunks,
                                     float* y, int64_t ldy, int64_t row_begin, int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t groups = cols / G;
    const int64_t full_chunks = cols / 128;
    // Lane j of a chunk covers columns 8j..8j+7, i.e. group j / 4 of the chunk's four (G = 32).
    const __m512i group_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const int64_t ahead_rows = kPrefetchBytes / std::max<int64_t>(1, cols / 2);
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
        const float* srow = w.scales + r * groups;
        __m512 acc[T];
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm512_setzero_ps();
        }
        // The scales of the row the weight prefetch is reaching (a stream of its own).
        if (r + ahead_rows < w.rows) {
            prefetch_span(srow + ahead_rows * groups, groups * 4);
        }
        for (int64_t k = 0; k < full_chunks; ++k) {
            prefetch_ahead(q + k * 64);
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

// The same kernel with GFNI: the high nibbles come out of one vgf2p8affineqb (a bit matrix that
// shifts each byte right by 4) instead of a 16-bit shift and a mask, and four rows (or, at four
// tokens, four tokens of a row) share one horizontal reduction.

template <int T>
EDGE_AVX512_VNNI_GFNI EDGE_INLINE void int4_gfni_chunk(__m512i wv, __m512 wscale,
                                                       const Int4Chunk* prepared, int64_t n_chunks,
                                                       int64_t k, __m512* acc) {
    const __m512i lo = _mm512_and_si512(wv, _mm512_set1_epi8(0x0F));
    const __m512i hi = _mm512_gf2p8affine_epi64_epi8(wv, _mm512_set1_epi64(kShiftRight4Matrix), 0);
    int4_dot_tokens<T>(lo, hi, wscale, prepared, n_chunks, k, acc);
}

// Full chunk k of a row (packed bytes q, scales srow) for T tokens into `into`.
template <int T, int G>
EDGE_AVX512_VNNI_GFNI EDGE_INLINE void int4_gfni_full_chunk(const uint8_t* q, const float* srow,
                                                            int64_t k, const Int4Chunk* prepared,
                                                            int64_t n_chunks, __m512* into) {
    prefetch_ahead(q + k * 64);
    const __m512i wv = _mm512_loadu_si512(q + k * 64);
    __m512 wscale;
    if constexpr (G == 32) {
        const __m512i group_of_lane =
            _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        wscale = _mm512_permutexvar_ps(group_of_lane,
                                       _mm512_castps128_ps512(_mm_loadu_ps(srow + k * 4)));
    } else {
        wscale = _mm512_set1_ps(srow[k]);
    }
    int4_gfni_chunk<T>(wv, wscale, prepared, n_chunks, k, into);
}

// Row r for T tokens into acc[T] (not yet reduced).
template <int T, int G>
EDGE_AVX512_VNNI_GFNI EDGE_INLINE void int4_gfni_row(const Weight& w, const Int4Chunk* prepared,
                                                     int64_t n_chunks, int64_t ahead_rows,
                                                     int64_t r, __m512* acc) {
    const int64_t cols = w.cols;
    const int64_t groups = cols / G;
    const int64_t full_chunks = cols / 128;
    const __m512i group_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
    const float* srow = w.scales + r * groups;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        acc[t] = _mm512_setzero_ps();
    }
    if (r + ahead_rows < w.rows) {
        prefetch_span(srow + ahead_rows * groups, groups * 4);
    }
    int64_t k = 0;
    if constexpr (T <= 2) {
        // Odd chunks into a second accumulator (measured in cache, one 512 x 1024 matrix: int4-g32
        // 39-41 -> 45-46 GB/s; the same for INT8 measured no gain).
        __m512 acc2[T];
#pragma GCC unroll 2
        for (int t = 0; t < T; ++t) {
            acc2[t] = _mm512_setzero_ps();
        }
        for (; k + 2 <= full_chunks; k += 2) {
            int4_gfni_full_chunk<T, G>(q, srow, k, prepared, n_chunks, acc);
            int4_gfni_full_chunk<T, G>(q, srow, k + 1, prepared, n_chunks, acc2);
        }
#pragma GCC unroll 2
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm512_add_ps(acc[t], acc2[t]);
        }
    }
    for (; k < full_chunks; ++k) {
        int4_gfni_full_chunk<T, G>(q, srow, k, prepared, n_chunks, acc);
    }
    if constexpr (G == 32) {
        if (full_chunks < n_chunks) {  // 1..3 trailing groups of 32 columns.
            const int64_t ng = (cols - full_chunks * 128) / 32;
            const __m512i wv = _mm512_maskz_loadu_epi8(mask64(ng * 16), q + full_chunks * 64);
            const __m128 s4 =
                _mm_maskz_loadu_ps(static_cast<__mmask8>((1u << ng) - 1), srow + full_chunks * 4);
            const __m512 wscale = _mm512_permutexvar_ps(group_of_lane, _mm512_castps128_ps512(s4));
            int4_gfni_chunk<T>(wv, wscale, prepared, n_chunks, full_chunks, acc);
        }
    }
}

// One token, rows r, r + q, r + 2q and r + 3q at once into acc[4] (not yet reduced): chunk k of
// the four rows in one loop body, so four dot-product chains and four memory streams run at once
// (as the FP8 table kernel; one row at a time left two chains and one stream in flight).
template <int G>
EDGE_AVX512_VNNI_GFNI EDGE_INLINE void int4_gfni_four_rows(const Weight& w,
                                                           const Int4Chunk* prepared,
                                                           int64_t n_chunks, int64_t ahead_rows,
                                                           int64_t r, int64_t q, __m512* acc) {
    const int64_t cols = w.cols;
    const int64_t groups = cols / G;
    const int64_t full_chunks = cols / 128;
    const __m512i group_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const uint8_t* rows[4];
    const float* srow[4];
#pragma GCC unroll 4
    for (int s = 0; s < 4; ++s) {
        rows[s] = static_cast<const uint8_t*>(w.data) + (r + s * q) * (cols / 2);
        srow[s] = w.scales + (r + s * q) * groups;
        acc[s] = _mm512_setzero_ps();
        if (r + s * q + ahead_rows < w.rows) {
            prefetch_span(srow[s] + ahead_rows * groups, groups * 4);
        }
    }
    for (int64_t k = 0; k < full_chunks; ++k) {
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
            int4_gfni_full_chunk<1, G>(rows[s], srow[s], k, prepared, n_chunks, &acc[s]);
        }
    }
    if constexpr (G == 32) {
        if (full_chunks < n_chunks) {  // 1..3 trailing groups of 32 columns.
            const int64_t ng = (cols - full_chunks * 128) / 32;
            for (int s = 0; s < 4; ++s) {
                const __m512i wv =
                    _mm512_maskz_loadu_epi8(mask64(ng * 16), rows[s] + full_chunks * 64);
                const __m128 s4 = _mm_maskz_loadu_ps(static_cast<__mmask8>((1u << ng) - 1),
                                                     srow[s] + full_chunks * 4);
                const __m512 wscale =
                    _mm512_permutexvar_ps(group_of_lane, _mm512_castps128_ps512(s4));
                int4_gfni_chunk<1>(wv, wscale, prepared, n_chunks, full_chunks, &acc[s]);
            }
        }
    }
}

template <int T, int G>
EDGE_AVX512_VNNI_GFNI void int4_gfni_rows(const Weight& w, const Int4Chunk* prepared,
                                          int64_t n_chunks, float* y, int64_t ldy,
                                          int64_t row_begin, int64_t row_end) {
    const int64_t ahead_rows = kPrefetchBytes / std::max<int64_t>(1, w.cols / 2);
    int64_t r = row_begin;
    if constexpr (T == 1) {  // Four streams (rows r + i, r + q + i, ...), one reduction.
        const int64_t q = (row_end - row_begin) / 4;
        prefetch_stream_heads(w.data, w.cols / 2, row_begin, q);
        for (int64_t i = 0; i < q; ++i) {
            __m512 acc[4];
            int4_gfni_four_rows<G>(w, prepared, n_chunks, ahead_rows, row_begin + i, q, acc);
            store_stream_sums(acc, y, row_begin + i, q);
        }
        r = row_begin + 4 * q;
    } else {
        prefetch_start(static_cast<const uint8_t*>(w.data) + row_begin * (w.cols / 2),
                       (row_end - row_begin) * (w.cols / 2));
        prefetch_start(w.scales + row_begin * (w.cols / G),
                       (row_end - row_begin) * (w.cols / G) * 4);
    }
    if constexpr (T == 2) {  // Four rows per reduction.
        for (; r + 4 <= row_end; r += 4) {
            __m512 acc[4][T];
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                int4_gfni_row<T, G>(w, prepared, n_chunks, ahead_rows, r + i, acc[i]);
            }
#pragma GCC unroll 2
            for (int t = 0; t < T; ++t) {
                _mm_storeu_ps(y + t * ldy + r, reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
            }
        }
    }
    for (; r < row_end; ++r) {
        __m512 acc[T];
        int4_gfni_row<T, G>(w, prepared, n_chunks, ahead_rows, r, acc);
        store_token_sums<T>(acc, y, ldy, r);
    }
}

// One token's activations for 64 columns, prepared for the VNNI INT8 kernel. Weights are made
// unsigned by flipping their sign bit (w + 128), so vpdpbusd computes sum (w + 128) * x_q; each
// lane starts at -128 * sum(x_q of its 4 columns) to cancel the offset.
struct alignas(64) Int8Chunk {
    int8_t x[64];          // x_q of the 64 columns.
    int32_t neg_corr[16];  // Lane j: -128 * sum of x_q over columns 4j .. 4j+3.
    float scale;           // Activation scale of the 64 columns.
    float pad[15];
};
static_assert(sizeof(Int8Chunk) == 192, "three cache lines per 64 columns");

// One token's activations for the INT8 VNNI kernel (quantize_int8_x64 per 64 columns).
EDGE_AVX512_VNNI void prepare_int8_activations(const float* x, int64_t cols, Int8Chunk* chunks) {
    for (int64_t k = 0; k < (cols + 63) / 64; ++k) {
        Int8Chunk& ch = chunks[k];
        __m512i sum;
        ch.scale = quantize_int8_x64(x, k * 64, cols, ch.x, &sum);
        _mm512_store_si512(ch.neg_corr,
                           _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
    }
}

// Chunk k (64 columns) of an INT8 row q of `cols` for T tokens into `into`.
template <int T>
EDGE_AVX512_VNNI EDGE_INLINE void int8_vnni_chunk(const int8_t* q, int64_t cols, int64_t k,
                                                  const Int8Chunk* prepared, int64_t n_chunks,
                                                  __m512* into) {
    prefetch_ahead(q + k * 64);
    // Past the row's end the masked load gives 0, flipped to 128, times x_q = 0.
    const __m512i raw = k < cols / 64 ? _mm512_loadu_si512(q + k * 64)
                                      : _mm512_maskz_loadu_epi8(mask64(cols - k * 64), q + k * 64);
    const __m512i wu = _mm512_xor_si512(raw, _mm512_set1_epi8(static_cast<char>(0x80)));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        const Int8Chunk& ch = prepared[t * n_chunks + k];
        const __m512i dot =
            _mm512_dpbusd_epi32(_mm512_load_si512(ch.neg_corr), wu, _mm512_load_si512(ch.x));
        into[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(ch.scale), into[t]);
    }
}

// Row r for T tokens into acc[T] (not yet reduced, not yet times the row's weight scale).
template <int T>
EDGE_AVX512_VNNI EDGE_INLINE void int8_vnni_row(const Weight& w, const Int8Chunk* prepared,
                                                int64_t n_chunks, int64_t r, __m512* acc) {
    const int64_t cols = w.cols;
    const int8_t* q = static_cast<const int8_t*>(w.data) + r * cols;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        acc[t] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < n_chunks; ++k) {
        int8_vnni_chunk<T>(q, cols, k, prepared, n_chunks, acc);
    }
}

// Rows [row_begin, row_end) for T tokens: four rows (T <= 2) or four tokens of a row share one
// horizontal reduction.
template <int T>
EDGE_AVX512_VNNI void int8_vnni_rows(const Weight& w, const Int8Chunk* prepared, int64_t n_chunks,
                                     float* y, int64_t ldy, int64_t row_begin, int64_t row_end) {
    prefetch_start(static_cast<const int8_t*>(w.data) + row_begin * w.cols,
                   (row_end - row_begin) * w.cols);
    int64_t r = row_begin;
    if constexpr (T <= 2) {
        for (; r + 4 <= row_end; r += 4) {
            __m512 acc[4][T];
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                int8_vnni_row<T>(w, prepared, n_chunks, r + i, acc[i]);
            }
            const __m128 ws = _mm_loadu_ps(w.scales + r);
#pragma GCC unroll 2
            for (int t = 0; t < T; ++t) {
                _mm_storeu_ps(y + t * ldy + r,
                              _mm_mul_ps(reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]), ws));
            }
        }
    }
    for (; r < row_end; ++r) {
        __m512 acc[T];
        int8_vnni_row<T>(w, prepared, n_chunks, r, acc);
        int t = 0;
        for (; t + 4 <= T; t += 4) {
            alignas(16) float sums[4];
            _mm_store_ps(sums, reduce4(acc[t], acc[t + 1], acc[t + 2], acc[t + 3]));
            for (int i = 0; i < 4; ++i) {
                y[(t + i) * ldy + r] = sums[i] * w.scales[r];
            }
        }
        for (; t < T; ++t) {
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]) * w.scales[r];
        }
    }
}

using VnniRowsFn = PreparedRowsFn<Int4Chunk>;

}  // namespace

void matmul_int8_avx512_vnni(const Weight& w, const float* x, int64_t n_tokens, float* y,
                             int64_t ldy, int64_t row_begin, int64_t row_end) {
    const int64_t n_chunks = (w.cols + 63) / 64;
    const Int8Chunk* prepared =
        prepare_tokens<Int8Chunk>(x, w.cols, n_tokens, n_chunks, prepare_int8_activations);
    using VnniRows = PreparedRowsFn<Int8Chunk>;
    constexpr int kTile = 8;  // Tokens one pass over the weights serves.
    static constexpr VnniRows kTiles[kTile] = {
        int8_vnni_rows<1>, int8_vnni_rows<2>, int8_vnni_rows<3>, int8_vnni_rows<4>,
        int8_vnni_rows<5>, int8_vnni_rows<6>, int8_vnni_rows<7>, int8_vnni_rows<8>};
    run_prepared_tiles(kTiles, w, prepared, n_chunks, n_tokens, y, ldy, row_begin, row_end);
}

// Every token's activations prepared for the INT4 kernels, in this thread's scratch (valid until
// the thread's next call).
const Int4Chunk* prepare_int4_tokens(const Weight& w, const float* x, int64_t n_tokens) {
    const int64_t n_chunks = (w.cols + 127) / 128;
    return w.format == WeightFormat::kInt4G32
               ? prepare_tokens<Int4Chunk>(x, w.cols, n_tokens, n_chunks,
                                           prepare_int4_activations<32>)
               : prepare_tokens<Int4Chunk>(x, w.cols, n_tokens, n_chunks,
                                           prepare_int4_activations<128>);
}

void matmul_int4_avx512_vnni(const Weight& w, const float* x, int64_t n_tokens, float* y,
                             int64_t ldy, int64_t row_begin, int64_t row_end) {
    const bool g32 = w.format == WeightFormat::kInt4G32;
    const int64_t n_chunks = (w.cols + 127) / 128;
    const Int4Chunk* prepared = prepare_int4_tokens(w, x, n_tokens);
    static constexpr VnniRowsFn kTiles32[kMaxTile] = {int4_vnni_rows<1, 32>, int4_vnni_rows<2, 32>,
                                                      int4_vnni_rows<3, 32>, int4_vnni_rows<4, 32>};
    static constexpr VnniRowsFn kTiles128[kMaxTile] = {
        int4_vnni_rows<1, 128>, int4_vnni_rows<2, 128>, int4_vnni_rows<3, 128>,
        int4_vnni_rows<4, 128>};
    const auto& tiles = g32 ? kTiles32 : kTiles128;
    run_prepared_tiles(tiles, w, prepared, n_chunks, n_tokens, y, ldy, row_begin, row_end);
}

// Tokens one pass of the GFNI INT4 kernel serves (each weight chunk is decoded once for all).
constexpr int kInt4GfniMaxTile = 8;

void matmul_int4_avx512_vnni_gfni(const Weight& w, const float* x, int64_t n_tokens, float* y,
                                  int64_t ldy, int64_t row_begin, int64_t row_end) {
    const bool g32 = w.format == WeightFormat::kInt4G32;
    const int64_t n_chunks = (w.cols + 127) / 128;
    const Int4Chunk* prepared = prepare_int4_tokens(w, x, n_tokens);
    static constexpr VnniRowsFn kTiles32[kInt4GfniMaxTile] = {
        int4_gfni_rows<1, 32>, int4_gfni_rows<2, 32>, int4_gfni_rows<3, 32>, int4_gfni_rows<4, 32>,
        int4_gfni_rows<5, 32>, int4_gfni_rows<6, 32>, int4_gfni_rows<7, 32>, int4_gfni_rows<8, 32>};
    static constexpr VnniRowsFn kTiles128[kInt4GfniMaxTile] = {
        int4_gfni_rows<1, 128>, int4_gfni_rows<2, 128>, int4_gfni_rows<3, 128>,
        int4_gfni_rows<4, 128>, int4_gfni_rows<5, 128>, int4_gfni_rows<6, 128>,
        int4_gfni_rows<7, 128>, int4_gfni_rows<8, 128>};
    const auto& tiles = g32 ? kTiles32 : kTiles128;
    run_prepared_tiles(tiles, w, prepared, n_chunks, n_tokens, y, ldy, row_begin, row_end);
}

}  // namespace edge::engine::quant::detail

#endif  // defined(__x86_64__)
