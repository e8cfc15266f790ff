// AVX2+FMA float matmul kernels. This file is compiled with AVX2/FMA/F16C flags
// (engine/CMakeLists.txt) and is only called after cpuid says the CPU has them; everything in it
// has internal linkage so no AVX2 code leaks into shared inline functions.

#include <immintrin.h>

#include "engine/cpu/avx2_reduce.h"
#include "engine/cpu/convert.h"
#include "engine/cpu/matmul_kernels.h"

namespace edge::engine::cpu {
namespace {

// Bytes ahead of the current column that each row stream prefetches in the one-token (decode)
// loop (the same distance as matmul_avx512.cc).
constexpr int64_t kPrefetchBytes = 8192;
// Row ranges at least this long are read as four streams (matmul below).
constexpr int64_t kStreamMinRows = 64;

struct LoadF32 {
    static __m256 load(const void* row, int64_t c) {
        return _mm256_loadu_ps(static_cast<const float*>(row) + c);
    }
    static float scalar(const void* row, int64_t c) { return load_f32(row, c); }
    static constexpr int64_t kBytes = 4;
};

struct LoadBF16 {
    static __m256 load(const void* row, int64_t c) {
        __m128i h = _mm_loadu_si128(
            reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    static float scalar(const void* row, int64_t c) {
        return bf16_to_f32(load_u16(row, c));
    }
    static constexpr int64_t kBytes = 2;
};

struct LoadF16 {
    static __m256 load(const void* row, int64_t c) {
        __m128i h = _mm_loadu_si128(
            reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + c));
        return _mm256_cvtph_ps(h);
    }
    static float scalar(const void* row, int64_t c) {
        return f16_to_f32(load_u16(row, c));
    }
    static constexpr int64_t kBytes = 2;
};

// Prefetches kPrefetchBytes ahead along each of R rows, once per 64-byte line (at column c).
template <typename L, int R>
__attribute__((always_inline)) inline void prefetch_lines(const char* w0, int64_t row_stride,
                                                          int64_t c) {
    if (c % (64 / L::kBytes) == 0) {
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            _mm_prefetch(w0 + r * row_stride + c * L::kBytes + kPrefetchBytes, _MM_HINT_T0);
        }
    }
}

// The R x T outputs of a block: each accumulator summed, plus columns [c, k) in scalar.
template <typename L, int R, int T>
__attribute__((always_inline)) inline void store_rows(const __m256 (&acc)[R][T], const char* w0,
                                                      int64_t row_stride, const float* x, int64_t k,
                                                      int64_t c, float* y, int64_t ldy,
                                                      int64_t y_stride) {
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        #pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            float s = hsum_avx2(acc[r][t]);
            for (int64_t cc = c; cc < k; ++cc) {
                s += L::scalar(w0 + r * row_stride, cc) * x[t * k + cc];
            }
            y[t * ldy + r * y_stride] = s;
        }
    }
}

// R rows (row_stride bytes apart; their outputs y_stride apart) by T tokens: R*T accumulators;
// each weight vector loaded once is used for T tokens. kFirst: the first token tile over these
// rows, which reads them from memory; it prefetches kPrefetchBytes ahead along each row's stream,
// as the one-token loop does.
template <typename L, int R, int T, bool kFirst = true>
__attribute__((always_inline)) inline void block(const char* w0, int64_t row_stride, const float* x,
                                                 int64_t k, float* y, int64_t ldy,
                                                 int64_t y_stride) {
    __m256 acc[R][T];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        #pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            acc[r][t] = _mm256_setzero_ps();
        }
    }
    int64_t c = 0;
    if constexpr (T == 1) {
        // Decode: 32 columns per row per step in two accumulators, each row's stream prefetched
        // kPrefetchBytes ahead (as matmul_avx512.cc: the hardware prefetchers stop at 4 KiB
        // pages).
        __m256 acc2[R];
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            acc2[r] = _mm256_setzero_ps();
        }
        for (; c + 32 <= k; c += 32) {
            const __m256 x0 = _mm256_loadu_ps(x + c);
            const __m256 x1 = _mm256_loadu_ps(x + c + 8);
            const __m256 x2 = _mm256_loadu_ps(x + c + 16);
            const __m256 x3 = _mm256_loadu_ps(x + c + 24);
            #pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                const char* row = w0 + r * row_stride;
                for (int64_t line = 0; line < 32 * L::kBytes; line += 64) {
                    _mm_prefetch(row + c * L::kBytes + kPrefetchBytes + line, _MM_HINT_T0);
                }
                acc[r][0] = _mm256_fmadd_ps(L::load(row, c), x0, acc[r][0]);
                acc2[r] = _mm256_fmadd_ps(L::load(row, c + 8), x1, acc2[r]);
                acc[r][0] = _mm256_fmadd_ps(L::load(row, c + 16), x2, acc[r][0]);
                acc2[r] = _mm256_fmadd_ps(L::load(row, c + 24), x3, acc2[r]);
            }
        }
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            acc[r][0] = _mm256_add_ps(acc[r][0], acc2[r]);
        }
    }
    for (; c + 8 <= k; c += 8) {
        if constexpr (kFirst && T > 1) {
            prefetch_lines<L, R>(w0, row_stride, c);
        }
        __m256 xv[T];
        #pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            xv[t] = _mm256_loadu_ps(x + t * k + c);
        }
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            __m256 wv = L::load(w0 + r * row_stride, c);
            #pragma GCC unroll 16
            for (int t = 0; t < T; ++t) {
                acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
    }
    store_rows<L, R, T>(acc, w0, row_stride, x, k, c, y, ldy, y_stride);
}

// Calls of kPackedMinTokens to kPackedMaxTokens tokens (an expert's share of a batched decode
// step: 4 on average at 32 sequences, top-8 of 64 experts) read each row once, all the tokens in
// that pass, two rows at a time. block's tiles of 3 tokens over four rows instead spend 8 of 20
// vector operations per 8 columns widening weights, and the tiles after the first compute from L1
// while nothing is read. The activations are packed first (pack_tokens) so that the tokens'
// vectors of 8 columns lie at one pointer: a pointer per token would take more address registers
// than x86-64 has. In-L2 BF16 GFLOP/s at 1 thread (128 x 1024, median of 9): 4 tokens 70-71
// against 56, 5: 67-70 against 59-62, 6: 69-70 against 66-68. 7 or more tokens in passes of up to
// 6 ran slower than the tiles of 3 (48-55 against 58-69) and keep them.
constexpr int64_t kPackedMinTokens = 4;
constexpr int64_t kPackedMaxTokens = 6;

// x (n tokens of k floats) as blocks of 8 columns, each holding the n tokens' 8 values in turn:
// xp[(c / 8) * n * 8 + t * 8 + j] = x[t * k + c + j] for the columns below k rounded down to 8.
inline const float* pack_tokens(const float* x, int64_t n, int64_t k) {
    const int64_t k8 = k / 8 * 8;
    auto* xp = static_cast<float*>(kernel_scratch(0, n * k8 * 4));
    for (int64_t c = 0; c < k8; c += 8) {
        for (int64_t t = 0; t < n; ++t) {
            _mm256_storeu_ps(xp + c * n + t * 8, _mm256_loadu_ps(x + t * k + c));
        }
    }
    return xp;
}

// R rows by T packed tokens in one pass: the R weight vectors of 8 columns in registers, each
// activation vector loaded once for the R rows; prefetching ahead along each row as block does.
template <typename L, int R, int T>
__attribute__((always_inline)) inline void block_packed(const char* w0, int64_t row_stride,
                                                        const float* xp, const float* x, int64_t k,
                                                        float* y, int64_t ldy, int64_t y_stride) {
    __m256 acc[R][T];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        #pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            acc[r][t] = _mm256_setzero_ps();
        }
    }
    int64_t c = 0;
    for (; c + 8 <= k; c += 8) {
        prefetch_lines<L, R>(w0, row_stride, c);
        __m256 wv[R];
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            wv[r] = L::load(w0 + r * row_stride, c);
        }
        const float* xc = xp + c * T;
        #pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            __m256 xv = _mm256_loadu_ps(xc + t * 8);
            // Kept in a register for the R rows: GCC would otherwise fold the load into each
            // FMA, and R loads per activation vector make the loop load-bound (Zen 3 does two
            // 256-bit loads a cycle); 4 tokens ran at 50 GFLOP/s so.
            asm("" : "+x"(xv));
            #pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
    }
    store_rows<L, R, T>(acc, w0, row_stride, x, k, c, y, ldy, y_stride);
}

// T packed tokens over the R rows, two rows at a time (2 weight, at most 12 accumulator and 1
// activation registers).
template <typename L, int R, int T>
inline void packed_rows(const char* w0, int64_t row_stride, const float* xp, const float* x,
                        int64_t k, float* y, int64_t ldy, int64_t y_stride) {
    constexpr int S = R >= 2 ? 2 : 1;
    static_assert(R % S == 0);
    #pragma GCC unroll 4
    for (int s = 0; s < R; s += S) {
        block_packed<L, S, T>(w0 + s * row_stride, row_stride, xp, x, k, y + s * y_stride, ldy,
                              y_stride);
    }
}

template <typename L, int R>
inline void rows_block(const char* w0, int64_t row_stride, const float* x, const float* xp,
                       int64_t n, int64_t k, float* y, int64_t ldy, int64_t y_stride) {
    static_assert(kPackedMinTokens == 4 && kPackedMaxTokens == 6);
    switch (xp != nullptr ? n : 0) {
        case 4:
            packed_rows<L, R, 4>(w0, row_stride, xp, x, k, y, ldy, y_stride);
            return;
        case 5:
            packed_rows<L, R, 5>(w0, row_stride, xp, x, k, y, ldy, y_stride);
            return;
        case 6:
            packed_rows<L, R, 6>(w0, row_stride, xp, x, k, y, ldy, y_stride);
            return;
        default:
            break;
    }
    int64_t t = 0;
    if (n >= 3) {
        block<L, R, 3, true>(w0, row_stride, x, k, y, ldy, y_stride);
        t = 3;
    }
    for (; t + 3 <= n; t += 3) {
        block<L, R, 3, false>(w0, row_stride, x + t * k, k, y + t * ldy, ldy, y_stride);
    }
    switch (n - t) {
        case 2:
            block<L, R, 2>(w0, row_stride, x + t * k, k, y + t * ldy, ldy, y_stride);
            break;
        case 1:
            block<L, R, 1>(w0, row_stride, x + t * k, k, y + t * ldy, ldy, y_stride);
            break;
        default:
            break;
    }
}

// Rows [r0, r1) of w. From kStreamMinRows rows up, as four long sequential streams: a block
// takes rows i, i + q, i + 2q and i + 3q (q = a quarter of the range), so each stream walks q
// consecutive rows and each row's prefetch lands on the same stream's next rows. Blocks of four
// adjacent rows instead give four 2 KiB-apart reads that jump on every 4 rows, which Zen 3's
// prefetchers follow poorly: one BF16 matrix-vector product of 64 Ki x 1 Ki read 12-15 GB/s as
// streams against 8.3-9.2 GB/s as adjacent blocks at 1 thread (matmul_avx512_bf16.cc does the
// same for the AVX512_BF16 kernel). Rows left past 4q, and shorter ranges, go in adjacent blocks.
template <typename L>
void matmul(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy, int64_t r0,
            int64_t r1) {
    const int64_t k = w.cols;
    const int64_t row_bytes = k * L::kBytes;
    const char* base = static_cast<const char*>(w.data);
    const float* xp =
        n >= kPackedMinTokens && n <= kPackedMaxTokens ? pack_tokens(x, n, k) : nullptr;
    int64_t r = r0;
    if (r1 - r0 >= kStreamMinRows) {
        const int64_t q = (r1 - r0) / 4;
        for (int64_t i = 0; i < q; ++i) {
            rows_block<L, 4>(base + (r0 + i) * row_bytes, q * row_bytes, x, xp, n, k, y + r0 + i,
                             ldy, q);
        }
        r = r0 + 4 * q;
    }
    for (; r + 4 <= r1; r += 4) {
        rows_block<L, 4>(base + r * row_bytes, row_bytes, x, xp, n, k, y + r, ldy, 1);
    }
    for (; r < r1; ++r) {
        rows_block<L, 1>(base + r * row_bytes, row_bytes, x, xp, n, k, y + r, ldy, 1);
    }
}

}  // namespace

void matmul_f32_avx2(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy, int64_t r0,
                     int64_t r1) {
    matmul<LoadF32>(w, x, n, y, ldy, r0, r1);
}

void matmul_bf16_avx2(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                      int64_t r0, int64_t r1) {
    matmul<LoadBF16>(w, x, n, y, ldy, r0, r1);
}

void matmul_f16_avx2(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy, int64_t r0,
                     int64_t r1) {
    matmul<LoadF16>(w, x, n, y, ldy, r0, r1);
}

}  // namespace edge::engine::cpu
