// AVX-512 VNNI kernels for INT4 and INT8 weights in row tiles (WeightLayout::kRowTiles16,
// engine/cpu/weight.h). Every function carries its target attribute, so this file is compiled
// for baseline x86-64 and only runs after quant_kernels.cc has checked cpuid.
//
// A 64-byte vector of a tile holds one 4-byte word of each of its 16 rows, so lane i of every
// accumulator belongs to row i of the tile and no horizontal sums are needed: each token's
// activations are quantized to int8 (per weight group for INT4, per 64 columns for INT8) and
// vpdpbusd multiplies the word of each row by the same four activation bytes, broadcast.
// INT4: the low nibbles (columns 8d, 8d+2, 8d+4, 8d+6) meet a broadcast of the even activations,
// the high nibbles (through one GFNI shift) the odd ones; the +8 storage offset is removed by
// starting a group's int32 sum at -8 * sum(x_q of the group). Per group and token: one convert and
// one FMA with the 16 rows' scales times the activation scale. INT8: the sign bit is flipped
// (w + 128, unsigned), and the sum starts at -128 * sum(x_q). Up to 8 tokens share each loaded
// weight vector.

#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "engine/quant/kernels_internal.h"
#include "engine/quant/kernels_x86.h"

namespace edge::engine::quant::detail {
namespace {

// Tokens one pass over a tile serves (an accumulator per token and group stays in registers).
constexpr int kTileTokens = 8;

// One token's activations for 128 columns, prepared for the tiled INT4 kernel.
struct alignas(64) Int4TileChunk {
    int8_t even[64];      // x_q of columns 0, 2, ..., 126 (word d: columns 8d, 8d+2, 8d+4, 8d+6).
    int8_t odd[64];       // x_q of columns 1, 3, ..., 127.
    int32_t neg_corr[4];  // G = 32: -8 * sum of x_q of group p; G = 128: [0] for the chunk.
    float scale[4];       // Activation scale of group p (G = 128: all four equal).
};

// One token's activations for the tiled INT4 kernel (quantize_int4_x128 per 128 columns).
template <int G>
EDGE_AVX512_VNNI void prepare_int4_tiles(const float* x, int64_t cols, Int4TileChunk* chunks) {
    for (int64_t k = 0; k < (cols + 127) / 128; ++k) {
        Int4TileChunk& ch = chunks[k];
        // Lane j: sum of x_q over columns 8j .. 8j+7; group p holds lanes 4p .. 4p+3.
        alignas(64) int32_t lanes[16];
        _mm512_store_si512(lanes, quantize_int4_x128<G>(x, k * 128, cols, ch.even, ch.odd,
                                                        ch.scale));
        for (int p = 0; p < 4; ++p) {
            ch.neg_corr[p] =
                -8 * (lanes[4 * p] + lanes[4 * p + 1] + lanes[4 * p + 2] + lanes[4 * p + 3]);
        }
        if constexpr (G == 128) {
            ch.neg_corr[0] += ch.neg_corr[1] + ch.neg_corr[2] + ch.neg_corr[3];
        }
    }
}

// A broadcast of the four activation bytes at p (one int32 lane pattern for vpdpbusd).
EDGE_AVX512_VNNI EDGE_INLINE __m512i broadcast_quad(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

// Lanes of tile `tile` whose rows lie in [row_begin, row_end).
inline __mmask16 tile_rows_mask(int64_t tile, int64_t row_begin, int64_t row_end) {
    const int64_t lo = std::max<int64_t>(row_begin - tile * kRowTile, 0);
    const int64_t hi = std::min<int64_t>(row_end - tile * kRowTile, kRowTile);
    return static_cast<__mmask16>(mask16(hi) & ~mask16(lo));
}

// NG groups of 32 columns (chunk c, NG = 4 for a full chunk) of one tile (data d, scales s) for
// T tokens into acc[T]. Two int32 sums per token and group (low and high nibbles) keep the
// dependency chains short.
template <int T, int NG>
EDGE_AVX512_VNNI_GFNI EDGE_INLINE void int4_g32_tile_chunk(const uint8_t* d, const float* s,
                                                           const Int4TileChunk* prepared,
                                                           int64_t n_chunks, int64_t c,
                                                           __m512* acc) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i shr = _mm512_set1_epi64(kShiftRight4Matrix);
    __m512i sum[T][NG][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
#pragma GCC unroll 4
        for (int g = 0; g < NG; ++g) {
            sum[t][g][0] = _mm512_set1_epi32(prepared[t * n_chunks + c].neg_corr[g]);
            sum[t][g][1] = _mm512_setzero_si512();
        }
    }
#pragma GCC unroll 16
    for (int v = 0; v < NG * 4; ++v) {
        const uint8_t* p = d + (c * 16 + v) * 64;
        prefetch_ahead(p);
        const __m512i wv = _mm512_loadu_si512(p);
        const __m512i lo = _mm512_and_si512(wv, nib);
        const __m512i hi = _mm512_gf2p8affine_epi64_epi8(wv, shr, 0);
        const int g = v / 4;
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            const Int4TileChunk& ch = prepared[t * n_chunks + c];
            sum[t][g][0] = _mm512_dpbusd_epi32(sum[t][g][0], lo, broadcast_quad(ch.even + 4 * v));
            sum[t][g][1] = _mm512_dpbusd_epi32(sum[t][g][1], hi, broadcast_quad(ch.odd + 4 * v));
        }
    }
    // The tile's scales run 1/4 as fast as its data: a quarter of the data's distance ahead.
    prefetch_span(reinterpret_cast<const char*>(s + c * 64) + kPrefetchBytes / 4, NG * 64);
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) {
        const __m512 ws = _mm512_loadu_ps(s + (c * 4 + g) * kRowTile);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            const __m512 scale =
                _mm512_mul_ps(ws, _mm512_set1_ps(prepared[t * n_chunks + c].scale[g]));
            acc[t] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(_mm512_add_epi32(sum[t][g][0], sum[t][g][1])), scale, acc[t]);
        }
    }
}

// One group of 128 columns (chunk c) of one tile for T tokens into acc[T]; four int32 sums per
// token (words of even and odd index, low and high nibbles).
template <int T>
EDGE_AVX512_VNNI_GFNI EDGE_INLINE void int4_g128_tile_chunk(const uint8_t* d, const float* s,
                                                            const Int4TileChunk* prepared,
                                                            int64_t n_chunks, int64_t c,
                                                            __m512* acc) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i shr = _mm512_set1_epi64(kShiftRight4Matrix);
    __m512i sum[T][4];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        sum[t][0] = _mm512_set1_epi32(prepared[t * n_chunks + c].neg_corr[0]);
        sum[t][1] = sum[t][2] = sum[t][3] = _mm512_setzero_si512();
    }
#pragma GCC unroll 16
    for (int v = 0; v < 16; ++v) {
        const uint8_t* p = d + (c * 16 + v) * 64;
        prefetch_ahead(p);
        const __m512i wv = _mm512_loadu_si512(p);
        const __m512i lo = _mm512_and_si512(wv, nib);
        const __m512i hi = _mm512_gf2p8affine_epi64_epi8(wv, shr, 0);
        const int a = (v & 1) * 2;
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            const Int4TileChunk& ch = prepared[t * n_chunks + c];
            sum[t][a] = _mm512_dpbusd_epi32(sum[t][a], lo, broadcast_quad(ch.even + 4 * v));
            sum[t][a + 1] = _mm512_dpbusd_epi32(sum[t][a + 1], hi, broadcast_quad(ch.odd + 4 * v));
        }
    }
    prefetch_span(reinterpret_cast<const char*>(s + c * kRowTile) + kPrefetchBytes / 16, 64);
    const __m512 ws = _mm512_loadu_ps(s + c * kRowTile);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        const __m512 scale = _mm512_mul_ps(ws, _mm512_set1_ps(prepared[t * n_chunks + c].scale[0]));
        const __m512i total = _mm512_add_epi32(_mm512_add_epi32(sum[t][0], sum[t][1]),
                                               _mm512_add_epi32(sum[t][2], sum[t][3]));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), scale, acc[t]);
    }
}

template <int T, int G>
EDGE_AVX512_VNNI_GFNI void int4_tiles_rows(const Weight& w, const Int4TileChunk* prepared,
                                           int64_t n_chunks, float* y, int64_t ldy,
                                           int64_t row_begin, int64_t row_end) {
    const int64_t groups = w.cols / G;
    const int64_t full_chunks = w.cols / 128;
    const int64_t tile_bytes = kRowTile * w.cols / 2;
    const int64_t first = row_begin / kRowTile;
    const int64_t last = (row_end + kRowTile - 1) / kRowTile;
    // Every call (a claim of the pool) starts cold; the lookahead covers the rest.
    prefetch_start(static_cast<const uint8_t*>(w.data) + first * tile_bytes,
                   (last - first) * tile_bytes);
    for (int64_t tile = row_begin / kRowTile; tile * kRowTile < row_end; ++tile) {
        const uint8_t* d = static_cast<const uint8_t*>(w.data) + tile * tile_bytes;
        const float* s = w.scales + tile * groups * kRowTile;
        __m512 acc[T];
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm512_setzero_ps();
        }
        if constexpr (G == 32) {
            for (int64_t c = 0; c < full_chunks; ++c) {
                int4_g32_tile_chunk<T, 4>(d, s, prepared, n_chunks, c, acc);
            }
            switch (groups - full_chunks * 4) {  // 1..3 trailing groups of 32 columns.
                case 1:
                    int4_g32_tile_chunk<T, 1>(d, s, prepared, n_chunks, full_chunks, acc);
                    break;
                case 2:
                    int4_g32_tile_chunk<T, 2>(d, s, prepared, n_chunks, full_chunks, acc);
                    break;
                case 3:
                    int4_g32_tile_chunk<T, 3>(d, s, prepared, n_chunks, full_chunks, acc);
                    break;
                default:
                    break;
            }
        } else {
            for (int64_t c = 0; c < full_chunks; ++c) {
                int4_g128_tile_chunk<T>(d, s, prepared, n_chunks, c, acc);
            }
        }
        const __mmask16 m = tile_rows_mask(tile, row_begin, row_end);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            _mm512_mask_storeu_ps(y + t * ldy + tile * kRowTile, m, acc[t]);
        }
    }
}

using Int4TilesFn = PreparedRowsFn<Int4TileChunk>;

// One token's activations for 64 columns, prepared for the tiled INT8 kernel.
struct alignas(64) Int8TileChunk {
    int8_t x[64];      // x_q of the 64 columns (zero past the matrix's last column).
    int32_t neg_corr;  // -128 * sum of x_q (cancels the +128 of the sign-flipped weights).
    float scale;       // Activation scale of the 64 columns.
};

// One token's activations for the tiled INT8 kernel (quantize_int8_x64 per 64 columns).
EDGE_AVX512_VNNI void prepare_int8_tiles(const float* x, int64_t cols, Int8TileChunk* chunks) {
    for (int64_t k = 0; k < (cols + 63) / 64; ++k) {
        Int8TileChunk& ch = chunks[k];
        __m512i sum;
        ch.scale = quantize_int8_x64(x, k * 64, cols, ch.x, &sum);
        ch.neg_corr = -128 * _mm512_reduce_add_epi32(sum);
    }
}

// Word v of chunk c of one tile (64 bytes: 4 columns of 16 rows) for T tokens into sum[T][2].
template <int T>
EDGE_AVX512_VNNI EDGE_INLINE void int8_tile_word(const uint8_t* d, const Int8TileChunk* prepared,
                                                 int64_t n_chunks, int64_t c, int v,
                                                 __m512i (*sum)[2]) {
    const uint8_t* p = d + (c * 16 + v) * 64;
    prefetch_ahead(p);
    const __m512i wu =
        _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set1_epi8(static_cast<char>(0x80)));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        const Int8TileChunk& ch = prepared[t * n_chunks + c];
        sum[t][v & 1] = _mm512_dpbusd_epi32(sum[t][v & 1], wu, broadcast_quad(ch.x + 4 * v));
    }
}

// `words` (1..16) words of chunk c (64 columns) of one tile for T tokens into acc[T]; two int32
// sums per token (words of even and odd index) keep the dependency chains short.
template <int T>
EDGE_AVX512_VNNI EDGE_INLINE void int8_tile_chunk(const uint8_t* d, const Int8TileChunk* prepared,
                                                  int64_t n_chunks, int64_t c, int64_t words,
                                                  __m512* acc) {
    __m512i sum[T][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        sum[t][0] = _mm512_set1_epi32(prepared[t * n_chunks + c].neg_corr);
        sum[t][1] = _mm512_setzero_si512();
    }
    if (words == 16) {
#pragma GCC unroll 16
        for (int v = 0; v < 16; ++v) {
            int8_tile_word<T>(d, prepared, n_chunks, c, v, sum);
        }
    } else {
        for (int v = 0; v < words; ++v) {
            int8_tile_word<T>(d, prepared, n_chunks, c, v, sum);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(sum[t][0], sum[t][1])),
                                 _mm512_set1_ps(prepared[t * n_chunks + c].scale), acc[t]);
    }
}

template <int T>
EDGE_AVX512_VNNI void int8_tiles_rows(const Weight& w, const Int8TileChunk* prepared,
                                      int64_t n_chunks, float* y, int64_t ldy, int64_t row_begin,
                                      int64_t row_end) {
    const int64_t words = w.cols / 4;
    const int64_t tile_bytes = kRowTile * w.cols;
    const int64_t first = row_begin / kRowTile;
    const int64_t last = (row_end + kRowTile - 1) / kRowTile;
    prefetch_start(static_cast<const uint8_t*>(w.data) + first * tile_bytes,
                   (last - first) * tile_bytes);
    for (int64_t tile = row_begin / kRowTile; tile * kRowTile < row_end; ++tile) {
        const uint8_t* d = static_cast<const uint8_t*>(w.data) + tile * tile_bytes;
        __m512 acc[T];
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm512_setzero_ps();
        }
        for (int64_t c = 0; c < n_chunks; ++c) {
            int8_tile_chunk<T>(d, prepared, n_chunks, c, std::min<int64_t>(16, words - c * 16),
                               acc);
        }
        const __m512 ws = _mm512_loadu_ps(w.scales + tile * kRowTile);
        const __mmask16 m = tile_rows_mask(tile, row_begin, row_end);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            _mm512_mask_storeu_ps(y + t * ldy + tile * kRowTile, m, _mm512_mul_ps(acc[t], ws));
        }
    }
}

using Int8TilesFn = PreparedRowsFn<Int8TileChunk>;

}  // namespace

void matmul_int4_tiles_avx512_vnni_gfni(const Weight& w, const float* x, int64_t n_tokens, float* y,
                                        int64_t ldy, int64_t row_begin, int64_t row_end) {
    const bool g32 = w.format == WeightFormat::kInt4G32;
    const int64_t n_chunks = (w.cols + 127) / 128;
    const Int4TileChunk* prepared =
        g32 ? prepare_tokens<Int4TileChunk>(x, w.cols, n_tokens, n_chunks, prepare_int4_tiles<32>)
            : prepare_tokens<Int4TileChunk>(x, w.cols, n_tokens, n_chunks, prepare_int4_tiles<128>);
    static constexpr Int4TilesFn kTiles32[kTileTokens] = {
        int4_tiles_rows<1, 32>, int4_tiles_rows<2, 32>, int4_tiles_rows<3, 32>,
        int4_tiles_rows<4, 32>, int4_tiles_rows<5, 32>, int4_tiles_rows<6, 32>,
        int4_tiles_rows<7, 32>, int4_tiles_rows<8, 32>};
    static constexpr Int4TilesFn kTiles128[kTileTokens] = {
        int4_tiles_rows<1, 128>, int4_tiles_rows<2, 128>, int4_tiles_rows<3, 128>,
        int4_tiles_rows<4, 128>, int4_tiles_rows<5, 128>, int4_tiles_rows<6, 128>,
        int4_tiles_rows<7, 128>, int4_tiles_rows<8, 128>};
    const auto& tiles = g32 ? kTiles32 : kTiles128;
    run_prepared_tiles(tiles, w, prepared, n_chunks, n_tokens, y, ldy, row_begin, row_end);
}

void matmul_int8_tiles_avx512_vnni(const Weight& w, const float* x, int64_t n_tokens, float* y,
                                   int64_t ldy, int64_t row_begin, int64_t row_end) {
    const int64_t n_chunks = (w.cols + 63) / 64;
    const Int8TileChunk* prepared =
        prepare_tokens<Int8TileChunk>(x, w.cols, n_tokens, n_chunks, prepare_int8_tiles);
    static constexpr Int8TilesFn kTiles[kTileTokens] = {
        int8_tiles_rows<1>, int8_tiles_rows<2>, int8_tiles_rows<3>, int8_tiles_rows<4>,
        int8_tiles_rows<5>, int8_tiles_rows<6>, int8_tiles_rows<7>, int8_tiles_rows<8>};
    run_prepared_tiles(kTiles, w, prepared, n_chunks, n_tokens, y, ldy, row_begin, row_end);
}

}  // namespace edge::engine::quant::detail

#endif  // defined(__x86_64__)
