// AVX2 + FMA + F16C kernels. Every function carries the target attribute, so this file is compiled
// for baseline x86-64 and only runs after quant_kernels.cc has checked cpuid.
//
// "avx2" (FP8, INT8, INT4): weights widened to f32 in registers and multiplied with FMA; a tile of
// up to 4 tokens shares each weight load. Exact up to f32 rounding.
//
// "avx2-i8dot" (INT8, INT4): integer dot products for CPUs without VNNI (Zen 3, Haswell to
// Skylake client). Each token's activations are rounded to int8 per group, as the VNNI kernels do
// (kernels_x86.h's rule: scale max|x| / 127, round to nearest even), and vpmaddubsw (unsigned x
// signed bytes, pairs summed to int16) plus vpmaddwd (pairs of int16 summed to int32) give the
// dot product of 4 or 8 columns per 32-bit lane: ~5 vector ops per 32 weight bytes per token
// instead of ~12 (INT8) or ~24 (INT4) for widening to f32.
//  - INT4: the nibbles (q + 8, 0..15) are the unsigned operand, the activations the signed one
//    (|pair sum| <= 2 * 15 * 127, no saturation); each lane starts at -8 * sum(x_q of its
//    columns), as in kernels_avx512_vnni.cc.
//  - INT8: both operands are signed, so the weights' signs move onto the activations (vpsignb):
//    |w| * (x_q * sign(w)), |pair sum| <= 2 * 128 * 127 < 2^15, no saturation.

#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/cpu/avx2_reduce.h"
#include "engine/quant/fp8.h"
#include "engine/quant/kernels_internal.h"
#include "engine/quant/kernels_x86.h"

namespace edge::engine::quant::detail {
namespace {

using cpu::hmax_avx2;
using cpu::hsum_avx2;

// 16 E4M3 bytes -> two vectors of value / 256, as kernels_x86.h's fp8_words_to_f32: with the
// byte in the high half of a 16-bit lane, an arithmetic shift right by one puts the magnitude bits
// into an F16's exponent and mantissa (subnormals included) and copies the sign into bit 14, which
// the mask clears; vcvtph2ps is exact.
EDGE_AVX2 EDGE_INLINE void decode_fp8_16(const uint8_t* p, __m256* lo, __m256* hi) {
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 1),
                                       _mm256_set1_epi16(static_cast<int16_t>(0xBFFF)));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

// Columns c + i .. c + i + 15 of one row for T tokens into partials J and J + 1 (a constant
// index, so the partials stay in registers).
template <int T, int J>
EDGE_AVX2 EDGE_INLINE void fp8_step(const uint8_t* q, const float* x, int64_t cols, int64_t c,
                                    int64_t i, __m256 (*part)[4]) {
    __m256 w0, w1;
    decode_fp8_16(q + i, &w0, &w1);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
        const float* xt = x + t * cols + c + i;
        part[t][J] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), part[t][J]);
        part[t][J + 1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), part[t][J + 1]);
    }
}

// 32 E4M3 bytes -> four vectors of value / 256 in column order (0-7, 8-15, 16-23, 24-31). The byte
// unpacks against zero put each byte into the high half of a 16-bit lane (the shift of
// decode_fp8_16 for free), in the unpacks' order: the low result holds columns 0-7 and 16-23, the
// high one 8-15 and 24-31.
EDGE_AVX2 EDGE_INLINE void decode_fp8_32(const uint8_t* p, __m256* w) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i mask = _mm256_set1_epi16(static_cast<int16_t>(0xBFFF));
    const __m256i a = _mm256_and_si256(
        _mm256_srai_epi16(_mm256_unpacklo_epi8(_mm256_setzero_si256(), v), 1), mask);
    const __m256i b = _mm256_and_si256(
        _mm256_srai_epi16(_mm256_unpackhi_epi8(_mm256_setzero_si256(), v), 1), mask);
    w[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(a));
    w[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(b));
    w[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(a, 1));
    w[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(b, 1));
}

// Columns c + i .. c + i + 31 for T tokens into the partials (four for one token, else two).
template <int T>
EDGE_AVX2 EDGE_INLINE void fp8_step32(const uint8_t* q, const float* x, int64_t cols, int64_t c,
                                      int64_t i, __m256 (*part)[4]) {
    __m256 w[4];
    decode_fp8_32(q + i, w);
    constexpr int J = T == 1 ? 2 : 0;
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
        const float* xt = x + t * cols + c + i;
        part[t][0] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xt), part[t][0]);
        part[t][1] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt + 8), part[t][1]);
        part[t][J] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xt + 16), part[t][J]);
        part[t][J + 1] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt + 24), part[t][J + 1]);
    }
}

// Columns [c + i, c + n) of one row (q = the row + c) for T tokens through the decode table, into
// tail[t]: a block's last columns past its 16-column steps. The table comes from a call into
// another file, which clobbers every vector register, so it is made only when there is a tail
// (made for every block, it cost the FP8 token tiles ~12%).
template <int T>
EDGE_AVX2 EDGE_INLINE void fp8_table_tail(const uint8_t* q, const float* x, int64_t cols, int64_t c,
                                          int64_t i, int64_t n, float scale, float* tail) {
    if (i >= n) {
        return;
    }
    const float* table = fp8_e4m3_table();
    for (; i < n; ++i) {
        const float wv = table[q[i]] * scale;
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            tail[t] += wv * x[t * cols + c + i];
        }
    }
}

// Columns [c, c + n) of one row (n <= 128, one scale block) for T tokens, summed unscaled in
// partial vectors (one token: four, since two FMA chains would wait on FMA latency; more tokens:
// two each, so that all stay in the 16 registers), then added to acc[t] times the block's
// scale * 256. Columns past the last multiple of 16 go through the table, into tail[t].
template <int T>
EDGE_AVX2 EDGE_INLINE void fp8_block(const uint8_t* q, const float* x, int64_t cols, int64_t c,
                                     int64_t n, float scale, __m256* acc, float* tail) {
    __m256 part[T][4];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
        for (int j = 0; j < 4; ++j) {
            part[t][j] = _mm256_setzero_ps();
        }
    }
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        if (i % 64 == 0) {
            prefetch_ahead(q + i);
        }
        fp8_step32<T>(q, x, cols, c, i, part);
    }
    if (i + 16 <= n) {
        fp8_step<T, 0>(q, x, cols, c, i, part);
        i += 16;
    }
    const __m256 s256 = _mm256_set1_ps(scale * 256.0f);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
        __m256 sum = _mm256_add_ps(part[t][0], part[t][1]);
        if constexpr (T == 1) {
            sum = _mm256_add_ps(sum, _mm256_add_ps(part[t][2], part[t][3]));
        }
        acc[t] = _mm256_fmadd_ps(sum, s256, acc[t]);
    }
    fp8_table_tail<T>(q, x, cols, c, i, n, scale, tail);
}

// One token, rows from kStreamMinRows up: four row streams (rows i, i + q, i + 2q and i + 3q
// of the range), as matmul_avx2.cc reads BF16 and for the same reason (Zen 3's prefetchers follow
// four long sequential reads better than one that restarts on every row of a small matrix); the
// four rows also share each activation load.
constexpr int64_t kStreamMinRows = 64;

// The streams and the token tiles decode FP8 with integer shifts alone (no byte unpacks, extracts
// or vcvtph2ps, the cost of decode_fp8_16 that made the one-token kernel compute-bound: 10.4 GB/s
// per core on in-L2 rows against ~11 GB/s of memory bandwidth per core). The 32 bytes of a step,
// read as 8 dwords, give four vectors: byte k of each dword shifted to the top (left by 24 - 8k),
// then arithmetically right by 4, puts its magnitude bits at f32 bits 20-26 (the top of the
// exponent field stays 0) and copies its sign to bits 27-31; masking with 0x87F00000 leaves an f32
// of the FP8 value * 2^-120 exactly, subnormals included (E4M3 subnormals land on f32 subnormals,
// which Zen 3 multiplies at full speed, measured; a CPU that slows down on subnormal inputs pays
// that for these few tiny weights, and one running with denormals-are-zero reads them as zero).
// Vector k holds columns 4i + k, so the activations are prepared in that order (Fp8ShiftChunk),
// times 2^64 so that the products stay normal; each block's sum takes scale * 2^56 instead of
// scale.
struct alignas(32) Fp8ShiftChunk {
    float x[32];  // x[8k + i] = activation of column 4i + k of the 32-column step, times 2^64.
};
constexpr float kFp8ShiftXScale = 0x1p64f;
constexpr float kFp8ShiftBlockScale = 0x1p56f;  // 2^120 / 2^64.

// One token's activations as Fp8ShiftChunks (columns below cols rounded down to 32), or false when
// max|x| is outside [2^-60, 2^60) (or infinite), where 2^64 could overflow or leave products
// subnormal: the caller then decodes through F16 instead. (A NaN activation gives NaN outputs
// either way.) Each group of 32 is an 8 x 4 transpose (column 4i + k to lane i of vector k): the
// 4 x 4 transpose of each 128-bit lane, then one lane-crossing permute per vector.
EDGE_AVX2 bool prepare_fp8_shift(const float* x, int64_t cols, Fp8ShiftChunk* chunks) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 mv = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
        mv = _mm256_max_ps(mv, _mm256_and_ps(_mm256_loadu_ps(x + c), abs_mask));
    }
    float m = hmax_avx2(mv);
    for (; c < cols; ++c) {
        m = std::max(m, std::fabs(x[c]));
    }
    if (!(m >= 0x1p-60f && m < 0x1p60f)) {
        return false;
    }
    const __m256 scale = _mm256_set1_ps(kFp8ShiftXScale);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t g = 0; g < cols / 32; ++g) {
        // Lane 0 of v_j holds columns 8j .. 8j + 3 (i = 2j), lane 1 columns 8j + 4 .. (i = 2j + 1).
        const float* xg = x + g * 32;
        const __m256 v0 = _mm256_loadu_ps(xg), v1 = _mm256_loadu_ps(xg + 8);
        const __m256 v2 = _mm256_loadu_ps(xg + 16), v3 = _mm256_loadu_ps(xg + 24);
        const __m256 t0 = _mm256_unpacklo_ps(v0, v1), t1 = _mm256_unpackhi_ps(v0, v1);
        const __m256 t2 = _mm256_unpacklo_ps(v2, v3), t3 = _mm256_unpackhi_ps(v2, v3);
        // Per lane, vector k: k of i = 0, 2, 4, 6 (lane 0) or 1, 3, 5, 7 (lane 1).
        const __m256 k0 = _mm256_shuffle_ps(t0, t2, 0x44), k1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        const __m256 k2 = _mm256_shuffle_ps(t1, t3, 0x44), k3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        float* out = chunks[g].x;
        _mm256_store_ps(out, _mm256_mul_ps(_mm256_permutevar8x32_ps(k0, order), scale));
        _mm256_store_ps(out + 8, _mm256_mul_ps(_mm256_permutevar8x32_ps(k1, order), scale));
        _mm256_store_ps(out + 16, _mm256_mul_ps(_mm256_permutevar8x32_ps(k2, order), scale));
        _mm256_store_ps(out + 24, _mm256_mul_ps(_mm256_permutevar8x32_ps(k3, order), scale));
    }
    return true;
}

// 32 E4M3 bytes as f32 values * 2^-120, columns 4i + k in vector k.
EDGE_AVX2 EDGE_INLINE void decode_fp8_shift32(const uint8_t* p, __m256* w) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i mask = _mm256_set1_epi32(static_cast<int32_t>(0x87F00000u));
    w[0] =
        _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(_mm256_slli_epi32(v, 24), 4), mask));
    w[1] =
        _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 4), mask));
    w[2] =
        _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(_mm256_slli_epi32(v, 8), 4), mask));
    w[3] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(v, 4), mask));
}

// Rows row_begin + i + s * q (s = 0..3, i < q) for one token. kShift: the 32-column steps decode
// with decode_fp8_shift32 against `shift` (x prepared as Fp8ShiftChunks), else through F16 as
// fp8_step32 does. The steps of 16 columns left in a block decode through F16 either way, the
// last few columns through the table.
template <bool kShift>
EDGE_AVX2 void fp8_rows_streams(const Weight& w, const float* x, const Fp8ShiftChunk* shift,
                                float* y, int64_t row_begin, int64_t q) {
    const int64_t cols = w.cols;
    const int64_t block_cols = (cols + 127) / 128;
    const auto* data = static_cast<const uint8_t*>(w.data);
    const float* table = fp8_e4m3_table();
    constexpr float step_scale = kShift ? kFp8ShiftBlockScale : 256.0f;
    prefetch_stream_heads(data, cols, row_begin, q);
    for (int64_t i = 0; i < q; ++i) {
        const uint8_t* row[4];
        const float* srow[4];
        __m256 acc[4];
        float tail[4] = {};
        for (int s = 0; s < 4; ++s) {
            const int64_t r = row_begin + i + s * q;
            row[s] = data + r * cols;
            srow[s] = w.scales + (r / 128) * block_cols;
            acc[s] = _mm256_setzero_ps();
        }
        for (int64_t b = 0; b < block_cols; ++b) {
            const int64_t c = b * 128;
            const int64_t n = std::min<int64_t>(128, cols - c);
            const float* xc = x + c;
            // Two partials per row, so that each row's FMAs form two chains.
            __m256 part[4][2];
            for (int s = 0; s < 4; ++s) {
                part[s][0] = _mm256_setzero_ps();
                part[s][1] = _mm256_setzero_ps();
            }
            int64_t j = 0;
            for (; j + 32 <= n; j += 32) {
#pragma GCC unroll 4
                for (int s = 0; s < 4; ++s) {
                    if (j % 64 == 0) {
                        prefetch_ahead(row[s] + c + j);
                    }
                    __m256 wv[4];
                    const float* xs;
                    if constexpr (kShift) {
                        decode_fp8_shift32(row[s] + c + j, wv);
                        xs = shift[(c + j) / 32].x;
                    } else {
                        decode_fp8_32(row[s] + c + j, wv);
                        xs = xc + j;
                    }
                    part[s][0] = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(xs), part[s][0]);
                    part[s][1] = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xs + 8), part[s][1]);
                    part[s][0] = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(xs + 16), part[s][0]);
                    part[s][1] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(xs + 24), part[s][1]);
                }
            }
#pragma GCC unroll 4
            for (int s = 0; s < 4; ++s) {
                const __m256 sum = _mm256_add_ps(part[s][0], part[s][1]);
                acc[s] = _mm256_fmadd_ps(sum, _mm256_set1_ps(srow[s][b] * step_scale), acc[s]);
            }
            if (j + 16 <= n) {
#pragma GCC unroll 4
                for (int s = 0; s < 4; ++s) {
                    __m256 w0, w1;
                    decode_fp8_16(row[s] + c + j, &w0, &w1);
                    const __m256 sum = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xc + j + 8),
                                                       _mm256_mul_ps(w0, _mm256_loadu_ps(xc + j)));
                    acc[s] = _mm256_fmadd_ps(sum, _mm256_set1_ps(srow[s][b] * 256.0f), acc[s]);
                }
                j += 16;
            }
            for (int s = 0; s < 4; ++s) {
                for (int64_t k = j; k < n; ++k) {
                    tail[s] += table[row[s][c + k]] * srow[s][b] * xc[k];
                }
            }
        }
        for (int s = 0; s < 4; ++s) {
            y[row_begin + i + s * q] = hsum_avx2(acc[s]) + tail[s];
        }
    }
}

// Columns [c, c + n) of one row (q = the row + c; n <= 128, one scale block) for T tokens with the
// shift decode, added to acc[t] times the block's scale (the last columns through the table into
// tail[t], as fp8_block). One or two tokens keep two partials each, so that at least four FMA
// chains are in flight.
template <int T>
EDGE_AVX2 EDGE_INLINE void fp8_block_shift(const uint8_t* q, const float* x,
                                           const Fp8ShiftChunk* chunks, int64_t cols, int64_t c,
                                           int64_t n, float scale, __m256* acc, float* tail) {
    const int64_t groups = cols / 32;
    constexpr int P = T <= 2 ? 2 : 1;
    __m256 part[T][P];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
        for (int p = 0; p < P; ++p) {
            part[t][p] = _mm256_setzero_ps();
        }
    }
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        if (j % 64 == 0) {
            prefetch_ahead(q + j);
        }
        __m256 wv[4];
        decode_fp8_shift32(q + j, wv);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            const float* xs = chunks[t * groups + (c + j) / 32].x;
            part[t][0] = _mm256_fmadd_ps(wv[0], _mm256_load_ps(xs), part[t][0]);
            part[t][P - 1] = _mm256_fmadd_ps(wv[1], _mm256_load_ps(xs + 8), part[t][P - 1]);
            part[t][0] = _mm256_fmadd_ps(wv[2], _mm256_load_ps(xs + 16), part[t][0]);
            part[t][P - 1] = _mm256_fmadd_ps(wv[3], _mm256_load_ps(xs + 24), part[t][P - 1]);
        }
    }
    const __m256 s = _mm256_set1_ps(scale * kFp8ShiftBlockScale);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
        const __m256 sum = P == 2 ? _mm256_add_ps(part[t][0], part[t][P - 1]) : part[t][0];
        acc[t] = _mm256_fmadd_ps(sum, s, acc[t]);
    }
    if (j + 16 <= n) {
        __m256 w0, w1;
        decode_fp8_16(q + j, &w0, &w1);
        const __m256 s256 = _mm256_set1_ps(scale * 256.0f);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            const float* xt = x + t * cols + c + j;
            const __m256 sum = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8),
                                               _mm256_mul_ps(w0, _mm256_loadu_ps(xt)));
            acc[t] = _mm256_fmadd_ps(sum, s256, acc[t]);
        }
        j += 16;
    }
    fp8_table_tail<T>(q, x, cols, c, j, n, scale, tail);
}

// Rows [row_begin, row_end) for T tokens, one row at a time, each 128-column block by
// fp8_block_shift (kShift: `chunks` holds every token's activations as Fp8ShiftChunks, cols / 32
// per token) or fp8_block (through F16: what matmul_fp8_avx2 runs when a token's activations are
// out of the shift decode's range).
template <int T, bool kShift>
EDGE_AVX2 void fp8_rows_impl(const Weight& w, const float* x, const Fp8ShiftChunk* chunks, float* y,
                             int64_t ldy, int64_t row_begin, int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t block_cols = (cols + 127) / 128;
    prefetch_start(static_cast<const uint8_t*>(w.data) + row_begin * cols,
                   (row_end - row_begin) * cols);
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols;
        const float* srow = w.scales + (r / 128) * block_cols;
        __m256 acc[T];
        float tail[T] = {};
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm256_setzero_ps();
        }
        for (int64_t b = 0; b < block_cols; ++b) {
            const int64_t c = b * 128;
            const int64_t n = std::min<int64_t>(128, cols - c);
            if constexpr (kShift) {
                fp8_block_shift<T>(q + c, x, chunks, cols, c, n, srow[b], acc, tail);
            } else {
                fp8_block<T>(q + c, x, cols, c, n, srow[b], acc, tail);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = hsum_avx2(acc[t]) + tail[t];
        }
    }
}

template <int T>
EDGE_AVX2 void fp8_rows(const Weight& w, const float* x, float* y, int64_t ldy, int64_t row_begin,
                        int64_t row_end) {
    fp8_rows_impl<T, false>(w, x, nullptr, y, ldy, row_begin, row_end);
}

template <int T>
EDGE_AVX2 void int8_rows(const Weight& w, const float* x, float* y, int64_t ldy, int64_t row_begin,
                         int64_t row_end) {
    const int64_t cols = w.cols;
    for (int64_t r = row_begin; r < row_end; ++r) {
        const int8_t* q = static_cast<const int8_t*>(w.data) + r * cols;
        __m256 acc[T][2];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            acc[t][0] = _mm256_setzero_ps();
            acc[t][1] = _mm256_setzero_ps();
        }
        int64_t c = 0;
        for (; c + 16 <= cols; c += 16) {
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c));
            const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
            const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) {
                const float* xt = x + t * cols + c;
                acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), acc[t][0]);
                acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), acc[t][1]);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            float sum = hsum_avx2(_mm256_add_ps(acc[t][0], acc[t][1]));
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
#pragma GCC unroll 4
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
#pragma GCC unroll 4
                for (int t = 0; t < T; ++t) {
                    const float* xt = x + t * cols + c;
                    acc[t][0] = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(xt), acc[t][0]);
                    acc[t][1] = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xt + 8), acc[t][1]);
                    acc[t][0] = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(xt + 16), acc[t][0]);
                    acc[t][1] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(xt + 24), acc[t][1]);
                }
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = hsum_avx2(_mm256_add_ps(acc[t][0], acc[t][1]));
        }
    }
}

// --- avx2-i8dot: activations rounded to int8, integer dot products. ---

// x[c .. c + 7] with columns past `cols` read as zero.
EDGE_AVX2 EDGE_INLINE __m256 load_cols8(const float* x, int64_t c, int64_t cols) {
    if (c + 8 <= cols) {
        return _mm256_loadu_ps(x + c);
    }
    if (c >= cols) {
        return _mm256_setzero_ps();
    }
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols - c)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(x + c, mask);
}

EDGE_AVX2 EDGE_INLINE float abs_max(const __m256* v, int n) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; ++i) {
        m = _mm256_max_ps(m, _mm256_and_ps(v[i], abs_mask));
    }
    return hmax_avx2(m);
}

// v[0..3] (32 floats) times `inv`, rounded to nearest even and saturated to int8, in order.
EDGE_AVX2 EDGE_INLINE __m256i round_to_int8_x32(const __m256* v, __m256 inv) {
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], inv));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], inv));
    const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], inv));
    const __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], inv));
    // The packs work per 128-bit lane: dwords come out as a0-3 b0-3 c0-3 d0-3 a4-7 b4-7 c4-7 d4-7.
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    return _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Sums of pairs of int16 lanes into int32 lanes.
EDGE_AVX2 EDGE_INLINE __m256i pair_sums(__m256i v) {
    return _mm256_madd_epi16(v, _mm256_set1_epi16(1));
}

// One token's activations for 64 columns, prepared for the INT8 kernel.
struct alignas(32) Int8DotChunk {
    int8_t x[64];  // x_q of the 64 columns.
    float scale;   // Activation scale of the 64 columns.
    float pad[7];
};
static_assert(sizeof(Int8DotChunk) == 96, "three 32-byte loads per 64 columns");

EDGE_AVX2 void prepare_int8_dot(const float* x, int64_t cols, Int8DotChunk* chunks) {
    for (int64_t k = 0; k < (cols + 63) / 64; ++k) {
        __m256 v[8];
        for (int i = 0; i < 8; ++i) {
            v[i] = load_cols8(x, k * 64 + i * 8, cols);
        }
        const float m = abs_max(v, 8);
        const __m256 inv = _mm256_set1_ps(int8_group_inverse(m));
        Int8DotChunk& ch = chunks[k];
        _mm256_store_si256(reinterpret_cast<__m256i*>(ch.x), round_to_int8_x32(v, inv));
        _mm256_store_si256(reinterpret_cast<__m256i*>(ch.x + 32), round_to_int8_x32(v + 4, inv));
        ch.scale = m / 127.0f;
    }
}

// 32 weight bytes times 32 activation bytes, summed per 4 columns into int32 lanes.
EDGE_AVX2 EDGE_INLINE __m256i int8_dot32(__m256i w_abs, __m256i w, const int8_t* xq) {
    const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq));
    return pair_sums(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w)));
}

template <int T>
EDGE_AVX2 void int8_dot_rows(const Weight& w, const Int8DotChunk* prepared, int64_t n_chunks,
                             float* y, int64_t ldy, int64_t row_begin, int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t full_chunks = cols / 64;
    prefetch_start(static_cast<const int8_t*>(w.data) + row_begin * cols,
                   (row_end - row_begin) * cols);
    for (int64_t r = row_begin; r < row_end; ++r) {
        const int8_t* q = static_cast<const int8_t*>(w.data) + r * cols;
        __m256 acc[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm256_setzero_ps();
        }
        for (int64_t k = 0; k < n_chunks; ++k) {
            __m256i w0, w1;
            if (k < full_chunks) {
                prefetch_ahead(q + k * 64);
                w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k * 64));
                w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k * 64 + 32));
            } else {  // The row's last 1..63 columns; x_q is zero past them.
                alignas(32) int8_t tail[64] = {};
                std::copy(q + k * 64, q + cols, tail);
                w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
                w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail + 32));
            }
            const __m256i a0 = _mm256_abs_epi8(w0);
            const __m256i a1 = _mm256_abs_epi8(w1);
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) {
                const Int8DotChunk& ch = prepared[t * n_chunks + k];
                const __m256i dot =
                    _mm256_add_epi32(int8_dot32(a0, w0, ch.x), int8_dot32(a1, w1, ch.x + 32));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(&ch.scale),
                                         acc[t]);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = hsum_avx2(acc[t]) * w.scales[r];
        }
    }
}

// One token over rows row_begin + i + s * q (s = 0..3, i < q), columns a multiple of 64: four
// row streams, as fp8_rows_streams, each activation chunk loaded once for the four rows. On
// expert-shaped matrices (512 x 1024, 1024 x 512) 1.21-1.28x the one-stream rows at 2 threads,
// 1.43x at 1. The same form for INT4 (int4_dot_rows) measured 1.12-1.37x there but no better in
// whole-model decode, where the noise of this VM hid any difference, and was left out.
EDGE_AVX2 void int8_dot_streams(const Weight& w, const Int8DotChunk* prepared, float* y,
                                int64_t row_begin, int64_t q) {
    const int64_t cols = w.cols;
    const auto* data = static_cast<const int8_t*>(w.data);
    prefetch_stream_heads(data, cols, row_begin, q);
    for (int64_t i = 0; i < q; ++i) {
        const int8_t* row[4];
        __m256 acc[4];
        for (int s = 0; s < 4; ++s) {
            row[s] = data + (row_begin + i + s * q) * cols;
            acc[s] = _mm256_setzero_ps();
        }
        for (int64_t k = 0; k < cols / 64; ++k) {
            const Int8DotChunk& ch = prepared[k];
            const __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(ch.x));
            const __m256i x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(ch.x + 32));
            const __m256 scale = _mm256_broadcast_ss(&ch.scale);
#pragma GCC unroll 4
            for (int s = 0; s < 4; ++s) {
                const int8_t* p = row[s] + k * 64;
                prefetch_ahead(p);
                const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
                const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
                const __m256i d0 =
                    _mm256_maddubs_epi16(_mm256_abs_epi8(w0), _mm256_sign_epi8(x0, w0));
                const __m256i d1 =
                    _mm256_maddubs_epi16(_mm256_abs_epi8(w1), _mm256_sign_epi8(x1, w1));
                // Each int16 lane is at most 2 * 128 * 127; two added could overflow, so each is
                // widened to int32 first (as int8_dot32).
                const __m256i dot = _mm256_add_epi32(pair_sums(d0), pair_sums(d1));
                acc[s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[s]);
            }
        }
        for (int s = 0; s < 4; ++s) {
            const int64_t r = row_begin + i + s * q;
            y[r] = hsum_avx2(acc[s]) * w.scales[r];
        }
    }
}

// One token's activations for 64 columns, prepared for the INT4 kernel: split into even and odd
// columns to match the low and high nibbles of the 32 packed weight bytes.
struct alignas(32) Int4DotChunk {
    int8_t even[32];      // x_q of columns 0, 2, ..., 62.
    int8_t odd[32];       // x_q of columns 1, 3, ..., 63.
    int32_t neg_corr[8];  // Lane j: -8 * sum of x_q over columns 8j .. 8j+7.
    float scale[8];       // Lane j: activation scale of the group holding columns 8j .. 8j+7.
};
static_assert(sizeof(Int4DotChunk) == 128, "two cache lines per 64 columns");

// Activations quantized per group of G columns (cols is a multiple of G, and of 32). A last chunk
// of 32 columns has zeros (and scale 0) in its upper half.
template <int G>
EDGE_AVX2 void prepare_int4_dot(const float* x, int64_t cols, Int4DotChunk* chunks) {
    static_assert(G == 32 || G == 128);
    // Within each 128-bit lane: the 8 even bytes, then the 8 odd ones.
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0,
                                           2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const int64_t n_chunks = (cols + 63) / 64;
    if (cols % 64 != 0) {
        std::fill_n(reinterpret_cast<uint8_t*>(&chunks[n_chunks - 1]), sizeof(Int4DotChunk), 0);
    }
    for (int64_t g0 = 0; g0 < cols; g0 += G) {
        __m256 v[G / 8];
        for (int i = 0; i < G / 8; ++i) {
            v[i] = _mm256_loadu_ps(x + g0 + i * 8);
        }
        const float m = abs_max(v, G / 8);
        const __m256 inv = _mm256_set1_ps(int8_group_inverse(m));
        for (int p = 0; p < G / 32; ++p) {  // Columns g0 + 32p .. + 31: half h of chunk k.
            const int64_t c = g0 + 32 * p;
            Int4DotChunk& ch = chunks[c / 64];
            const int h = static_cast<int>((c / 32) % 2);
            // Low 128 bits: the 16 even columns; high: the 16 odd ones.
            const __m256i eo = _mm256_permute4x64_epi64(
                _mm256_shuffle_epi8(round_to_int8_x32(v + 4 * p, inv), split),
                _MM_SHUFFLE(3, 1, 2, 0));
            _mm_store_si128(reinterpret_cast<__m128i*>(ch.even + 16 * h),
                            _mm256_castsi256_si128(eo));
            _mm_store_si128(reinterpret_cast<__m128i*>(ch.odd + 16 * h),
                            _mm256_extracti128_si256(eo, 1));
            for (int j = 0; j < 4; ++j) {
                ch.scale[4 * h + j] = m / 127.0f;
            }
        }
    }
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t k = 0; k < n_chunks; ++k) {
        Int4DotChunk& ch = chunks[k];
        const __m256i e = _mm256_load_si256(reinterpret_cast<const __m256i*>(ch.even));
        const __m256i o = _mm256_load_si256(reinterpret_cast<const __m256i*>(ch.odd));
        const __m256i sum = pair_sums(
            _mm256_add_epi16(_mm256_maddubs_epi16(ones, e), _mm256_maddubs_epi16(ones, o)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(ch.neg_corr),
                           _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 3)));
    }
}

// Chunk k of a row (packed bytes q, 64 columns or, at the end, 32) for T tokens: the integer
// dot products, offset removed, added to dot[t].
template <int T>
EDGE_AVX2 EDGE_INLINE void int4_dot_chunk(const uint8_t* q, int64_t k, bool half,
                                          const Int4DotChunk* prepared, int64_t n_chunks,
                                          __m256i* dot) {
    const __m256i wv =
        half ? _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k * 32)))
             : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k * 32));
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(wv, nib);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), nib);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
        const Int4DotChunk& ch = prepared[t * n_chunks + k];
        const __m256i e = _mm256_load_si256(reinterpret_cast<const __m256i*>(ch.even));
        const __m256i o = _mm256_load_si256(reinterpret_cast<const __m256i*>(ch.odd));
        const __m256i d =
            pair_sums(_mm256_add_epi16(_mm256_maddubs_epi16(lo, e), _mm256_maddubs_epi16(hi, o)));
        dot[t] = _mm256_add_epi32(
            dot[t],
            _mm256_add_epi32(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(ch.neg_corr))));
    }
}

// INT4 rows for T tokens. G = 128: the two chunks of a group are summed in int32 and scaled once.
template <int T, int G>
EDGE_AVX2 void int4_dot_rows(const Weight& w, const Int4DotChunk* prepared, int64_t n_chunks,
                             float* y, int64_t ldy, int64_t row_begin, int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t groups = cols / G;
    const int64_t full_chunks = cols / 64;
    prefetch_start(static_cast<const uint8_t*>(w.data) + row_begin * (cols / 2),
                   (row_end - row_begin) * (cols / 2));
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
        const float* srow = w.scales + r * groups;
        __m256 acc[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm256_setzero_ps();
        }
        if constexpr (G == 128) {
            for (int64_t gi = 0; gi < groups; ++gi) {
                prefetch_ahead(q + gi * 64);
                __m256i dot[T];
#pragma GCC unroll 4
                for (int t = 0; t < T; ++t) {
                    dot[t] = _mm256_setzero_si256();
                }
                int4_dot_chunk<T>(q, 2 * gi, false, prepared, n_chunks, dot);
                int4_dot_chunk<T>(q, 2 * gi + 1, false, prepared, n_chunks, dot);
                const __m256 ws = _mm256_set1_ps(srow[gi]);
#pragma GCC unroll 4
                for (int t = 0; t < T; ++t) {
                    const __m256 s =
                        _mm256_mul_ps(ws, _mm256_load_ps(prepared[t * n_chunks + 2 * gi].scale));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), s, acc[t]);
                }
            }
        } else {
            for (int64_t k = 0; k < n_chunks; ++k) {
                if (k % 2 == 0) {
                    prefetch_ahead(q + k * 32);
                }
                const bool half = k == full_chunks;
                __m256i dot[T];
#pragma GCC unroll 4
                for (int t = 0; t < T; ++t) {
                    dot[t] = _mm256_setzero_si256();
                }
                int4_dot_chunk<T>(q, k, half, prepared, n_chunks, dot);
                // Lanes 0-3: group 2k, lanes 4-7: group 2k + 1 (none in a half chunk).
                const __m256 ws = _mm256_set_m128(_mm_set1_ps(half ? 0.0f : srow[2 * k + 1]),
                                                  _mm_set1_ps(srow[2 * k]));
#pragma GCC unroll 4
                for (int t = 0; t < T; ++t) {
                    const __m256 s =
                        _mm256_mul_ps(ws, _mm256_load_ps(prepared[t * n_chunks + k].scale));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), s, acc[t]);
                }
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = hsum_avx2(acc[t]);
        }
    }
}

}  // namespace

void matmul_fp8_avx2(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy,
                     int64_t row_begin, int64_t row_end) {
    // Every token's activations prepared for the shift decode, unless one is out of its range.
    const int64_t groups = w.cols / 32;
    thread_local std::vector<Fp8ShiftChunk> chunks;
    chunks.resize(static_cast<size_t>(n_tokens * groups));
    bool shift = true;
    for (int64_t t = 0; t < n_tokens && shift; ++t) {
        shift = prepare_fp8_shift(x + t * w.cols, w.cols, chunks.data() + t * groups);
    }
    if (n_tokens == 1 && row_end - row_begin >= kStreamMinRows) {
        const int64_t q = (row_end - row_begin) / 4;
        if (shift) {
            fp8_rows_streams<true>(w, x, chunks.data(), y, row_begin, q);
        } else {
            fp8_rows_streams<false>(w, x, nullptr, y, row_begin, q);
        }
        row_begin += 4 * q;
    }
    if (shift) {
        for (int64_t t0 = 0; t0 < n_tokens; t0 += kMaxTile) {
            const float* xt = x + t0 * w.cols;
            const Fp8ShiftChunk* ct = chunks.data() + t0 * groups;
            switch (std::min<int64_t>(kMaxTile, n_tokens - t0)) {
                case 1:
                    fp8_rows_impl<1, true>(w, xt, ct, y + t0 * ldy, ldy, row_begin, row_end);
                    break;
                case 2:
                    fp8_rows_impl<2, true>(w, xt, ct, y + t0 * ldy, ldy, row_begin, row_end);
                    break;
                case 3:
                    fp8_rows_impl<3, true>(w, xt, ct, y + t0 * ldy, ldy, row_begin, row_end);
                    break;
                default:
                    fp8_rows_impl<4, true>(w, xt, ct, y + t0 * ldy, ldy, row_begin, row_end);
                    break;
            }
        }
        return;
    }
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

void matmul_int8_avx2_i8dot(const Weight& w, const float* x, int64_t n_tokens, float* y,
                            int64_t ldy, int64_t row_begin, int64_t row_end) {
    const int64_t n_chunks = (w.cols + 63) / 64;
    const Int8DotChunk* prepared =
        prepare_tokens<Int8DotChunk>(x, w.cols, n_tokens, n_chunks, prepare_int8_dot);
    if (n_tokens == 1 && w.cols % 64 == 0 && row_end - row_begin >= kStreamMinRows) {
        const int64_t q = (row_end - row_begin) / 4;
        int8_dot_streams(w, prepared, y, row_begin, q);
        int8_dot_rows<1>(w, prepared, n_chunks, y, ldy, row_begin + 4 * q, row_end);
        return;
    }
    static constexpr PreparedRowsFn<Int8DotChunk> kTiles[kMaxTile] = {
        int8_dot_rows<1>, int8_dot_rows<2>, int8_dot_rows<3>, int8_dot_rows<4>};
    run_prepared_tiles(kTiles, w, prepared, n_chunks, n_tokens, y, ldy, row_begin, row_end);
}

void matmul_int4_avx2_i8dot(const Weight& w, const float* x, int64_t n_tokens, float* y,
                            int64_t ldy, int64_t row_begin, int64_t row_end) {
    const int64_t n_chunks = (w.cols + 63) / 64;
    using Rows = PreparedRowsFn<Int4DotChunk>;
    static constexpr Rows kTiles32[kMaxTile] = {int4_dot_rows<1, 32>, int4_dot_rows<2, 32>,
                                                int4_dot_rows<3, 32>, int4_dot_rows<4, 32>};
    static constexpr Rows kTiles128[kMaxTile] = {int4_dot_rows<1, 128>, int4_dot_rows<2, 128>,
                                                 int4_dot_rows<3, 128>, int4_dot_rows<4, 128>};
    const bool g32 = w.format == WeightFormat::kInt4G32;
    const Int4DotChunk* prepared =
        g32 ? prepare_tokens<Int4DotChunk>(x, w.cols, n_tokens, n_chunks, prepare_int4_dot<32>)
            : prepare_tokens<Int4DotChunk>(x, w.cols, n_tokens, n_chunks, prepare_int4_dot<128>);
    run_prepared_tiles(g32 ? kTiles32 : kTiles128, w, prepared, n_chunks, n_tokens, y, ldy,
                       row_begin, row_end);
}

}  // namespace edge::engine::quant::detail

#endif  // defined(__x86_64__)
