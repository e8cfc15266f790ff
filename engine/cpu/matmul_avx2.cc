// AVX2+FMA float matmul kernels. This file is compiled with AVX2/FMA/F16C flags
// (engine/CMakeLists.txt) and is only called after cpuid says the CPU has them; everything in it
// has internal linkage so no AVX2 code leaks into shared inline functions.

#include <immintrin.h>

#include "engine/cpu/avx2_reduce.h"
#include "engine/cpu/convert.h"
#include "engine/cpu/matmul_kernels.h"

namespace edge::engine::cpu {
namespace {

// Bytes ahead of the current column that each row stream prefetches: into L1 a little ahead of
// the loads, into L2 far enough to cover memory latency and across 4 KiB pages (the four streams
// share L1 sets; see matmul_avx512_bf16.cc). Measured on a Zen 4, 2 threads: bench_matvec one
// token, six runs each, 0.61-0.91 of the probe with 8 KiB into L1 alone, 0.77-1.00 with 512 B /
// 8 KiB; bench_decode --cpu-kernels avx2 --profile batched32 258 / 261 -> 284 / 303 tokens/s.
constexpr int64_t kL1PrefetchBytes = 512;
constexpr int64_t kL2PrefetchBytes = 8192;
// Row ranges at least this long are read as four streams (matmul below).
constexpr int64_t kStreamMinRows = 64;
// Blocks of four rows in a multi-token tile (rows_tile).
constexpr int64_t kTileBlocks = 4;

// Blocks of the next tile when `left` blocks remain (a plain expression: this file calls no
// out-of-line template such as std::min, see tests/engine/isa_objects_check.sh).
constexpr int64_t tile_blocks(int64_t left) { return left < kTileBlocks ? left : kTileBlocks; }

struct LoadF32 {
    static __m256 load(const void* row, int64_t c) {
        return _mm256_loadu_ps(static_cast<const float*>(row) + c);
    }
    static float scalar(const void* row, int64_t c) { return load_f32(row, c); }
    template <int H>
    static __m256 half(const void* row, int64_t c) {
        return load(row, c + 8 * H);
    }
    static constexpr int64_t kBytes = 4;
    static constexpr bool kEvenOdd = false;
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
    // Of the 16 columns from c, H = 0: the even ones, H = 1: the odd ones. Each 32-bit lane holds
    // an even column's BF16 in its low half, which a shift turns into that float, and the next
    // column's in its high half, which a mask does: one integer operation per 8 weights, where
    // load's zero-extension and shift take two (and the extension a shuffle port).
    template <int H>
    static __m256 half(const void* row, int64_t c) {
        const __m256i v = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + c));
        return _mm256_castsi256_ps(H == 0 ? _mm256_slli_epi32(v, 16)
                                          : _mm256_and_si256(v, _mm256_set1_epi32(-65536)));
    }
    static constexpr int64_t kBytes = 2;
    static constexpr bool kEvenOdd = true;
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
    template <int H>
    static __m256 half(const void* row, int64_t c) {
        return load(row, c + 8 * H);
    }
    static constexpr int64_t kBytes = 2;
    static constexpr bool kEvenOdd = false;
};

// Prefetches kL1PrefetchBytes and kL2PrefetchBytes ahead along each of R rows, once per 64-byte
// line (at column c).
template <typename L, int R>
__attribute__((always_inline)) inline void prefetch_lines(const char* w0, int64_t row_stride,
                                                          int64_t c) {
    if (c % (64 / L::kBytes) == 0) {
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const char* at = w0 + r * row_stride + c * L::kBytes;
            _mm_prefetch(at + kL1PrefetchBytes, _MM_HINT_T0);
            _mm_prefetch(at + kL2PrefetchBytes, _MM_HINT_T1);
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

// R rows (row_stride bytes apart; their outputs y_stride apart) by one token (decode): 32 columns
// per row per step in two accumulators, each row's stream prefetched ahead into L1 and L2 (as
// matmul_avx512.cc: the hardware prefetchers stop at 4 KiB pages).
template <typename L, int R>
__attribute__((always_inline)) inline void block_one(const char* w0, int64_t row_stride,
                                                     const float* x, int64_t k, float* y,
                                                     int64_t y_stride) {
    __m256 acc[R][1];
    __m256 acc2[R];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        acc[r][0] = _mm256_setzero_ps();
        acc2[r] = _mm256_setzero_ps();
    }
    int64_t c = 0;
    for (; c + 32 <= k; c += 32) {
        const __m256 x0 = _mm256_loadu_ps(x + c);
        const __m256 x1 = _mm256_loadu_ps(x + c + 8);
        const __m256 x2 = _mm256_loadu_ps(x + c + 16);
        const __m256 x3 = _mm256_loadu_ps(x + c + 24);
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const char* row = w0 + r * row_stride;
            for (int64_t line = 0; line < 32 * L::kBytes; line += 64) {
                const char* at = row + c * L::kBytes + line;
                _mm_prefetch(at + kL1PrefetchBytes, _MM_HINT_T0);
                _mm_prefetch(at + kL2PrefetchBytes, _MM_HINT_T1);
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
    for (; c + 8 <= k; c += 8) {
        const __m256 xv = _mm256_loadu_ps(x + c);
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            acc[r][0] = _mm256_fmadd_ps(L::load(w0 + r * row_stride, c), xv, acc[r][0]);
        }
    }
    store_rows<L, R, 1>(acc, w0, row_stride, x, k, c, y, 0, y_stride);
}

// Calls of two or more tokens read each row once for a group of up to kGroupMax tokens, two rows
// at a time (four at two tokens): the rows' weight vectors stay in registers while each
// activation vector, loaded once, meets all of them. The tokens are split into groups as equal as
// possible (32 tokens: 6, 6, 5, 5, 5, 5), and each group passes over a tile of rows (rows_tile)
// before the next. The activations are packed first (pack_group) so that a group's vectors of
// each 16 columns lie at one pointer (a pointer per token would take more address registers than
// x86-64 has), in the order the loader's half<H> yields the weights: for BF16 the even columns,
// then the odd ones, so widening 8 weights takes one integer operation instead of two. In-process
// against the form before (tiles of 3 tokens over four rows, and one pass for 4-6 tokens), BF16
// in L2 at 1 thread (128 x 1024, median of 9 alternating rounds): 7-64 tokens 1.09-1.20x (16: 75
// against 63 GFLOP/s), 4-6 tokens 0.99-1.01x, 3 tokens 0.93x, 2 tokens 1.17x; from L3 (16
// expert-sized matrices) 1.01-1.16x; F32 1.08-1.67x, F16 0.97-1.16x.
constexpr int64_t kGroupMax = 6;

struct Groups {
    int64_t count;
    int64_t base;  // Tokens in each group, plus one in each of the first `extra` groups.
    int64_t extra;
    int64_t size(int64_t g) const { return base + (g < extra ? 1 : 0); }
    int64_t first(int64_t g) const { return g * base + (g < extra ? g : extra); }
};

inline Groups groups_of(int64_t n) {
    const int64_t count = (n + kGroupMax - 1) / kGroupMax;
    return {count, n / count, n % count};
}

// Tokens [0, t) of x (t tokens of k floats) as blocks of 16 columns, each holding the tokens'
// 16 values in turn, in L's order: xp[(c / 16) * t * 16 + i * 16 + j]; columns past k rounded
// down to 16 are left to the scalar tail.
template <typename L>
inline void pack_group(const float* x, int64_t t, int64_t k, float* xp) {
    for (int64_t c = 0; c + 16 <= k; c += 16) {
        for (int64_t i = 0; i < t; ++i) {
            const __m256 a = _mm256_loadu_ps(x + i * k + c);
            const __m256 b = _mm256_loadu_ps(x + i * k + c + 8);
            float* out = xp + c * t + i * 16;
            if constexpr (L::kEvenOdd) {
                // shuffle_ps picks within 128-bit lanes: (a0 a2 b0 b2 | a4 a6 b4 b6); the
                // 64-bit permute puts the pairs in column order.
                const __m256 even = _mm256_shuffle_ps(a, b, 0x88);
                const __m256 odd = _mm256_shuffle_ps(a, b, 0xDD);
                _mm256_storeu_ps(
                    out, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), 0xD8)));
                _mm256_storeu_ps(
                    out + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), 0xD8)));
            } else {
                _mm256_storeu_ps(out, a);
                _mm256_storeu_ps(out + 8, b);
            }
        }
    }
}

// R rows by T packed tokens in one pass; kFirst: prefetch ahead along each row, as block_one does
// (the first group's pass reads the rows from memory; the later groups find them in cache).
template <typename L, int R, int T, bool kFirst>
__attribute__((always_inline)) inline void block_group(const char* w0, int64_t row_stride,
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
    for (; c + 16 <= k; c += 16) {
        if constexpr (kFirst) {
            prefetch_lines<L, R>(w0, row_stride, c);
        }
        const float* xc = xp + c * T;
        #pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
            __m256 wv[R];
            #pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                wv[r] = h == 0 ? L::template half<0>(w0 + r * row_stride, c)
                               : L::template half<1>(w0 + r * row_stride, c);
            }
            #pragma GCC unroll 16
            for (int t = 0; t < T; ++t) {
                __m256 xv = _mm256_loadu_ps(xc + t * 16 + h * 8);
                // Kept in a register for the R rows: GCC would otherwise fold the load into each
                // FMA, and R loads per activation vector make the loop load-bound (Zen 3 does two
                // 256-bit loads a cycle).
                asm("" : "+x"(xv));
                #pragma GCC unroll 16
                for (int r = 0; r < R; ++r) {
                    acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
                }
            }
        }
    }
    store_rows<L, R, T>(acc, w0, row_stride, x, k, c, y, ldy, y_stride);
}

// T packed tokens over the R rows, S at a time (at most 12 accumulator, 4 weight and 1
// activation registers of the 16).
template <typename L, int R, int T, bool kFirst>
inline void group_rows(const char* w0, int64_t row_stride, const float* xp, const float* x,
                       int64_t k, float* y, int64_t ldy, int64_t y_stride) {
    constexpr int S = R < 2 ? R : T == 2 && R % 4 == 0 ? 4 : 2;
    static_assert(R % S == 0);
    #pragma GCC unroll 4
    for (int s = 0; s < R; s += S) {
        block_group<L, S, T, kFirst>(w0 + s * row_stride, row_stride, xp, x, k, y + s * y_stride,
                                     ldy, y_stride);
    }
}

template <typename L, int R, bool kFirst>
inline void group_pass(int64_t t, const char* w0, int64_t row_stride, const float* xp,
                       const float* x, int64_t k, float* y, int64_t ldy, int64_t y_stride) {
    static_assert(kGroupMax <= 6);
    switch (t) {
        case 2:
            return group_rows<L, R, 2, kFirst>(w0, row_stride, xp, x, k, y, ldy, y_stride);
        case 3:
            return group_rows<L, R, 3, kFirst>(w0, row_stride, xp, x, k, y, ldy, y_stride);
        case 4:
            return group_rows<L, R, 4, kFirst>(w0, row_stride, xp, x, k, y, ldy, y_stride);
        case 5:
            return group_rows<L, R, 5, kFirst>(w0, row_stride, xp, x, k, y, ldy, y_stride);
        default:
            return group_rows<L, R, 6, kFirst>(w0, row_stride, xp, x, k, y, ldy, y_stride);
    }
}

// A tile of `blocks` blocks of R rows (block b's rows start block_bytes * b after w0, row_stride
// apart; its outputs block_y * b after y, y_stride apart) for all n tokens: block_one for one
// token, else each group of the packed activations xp over the whole tile in turn. The first
// group's pass reads the tile's rows from memory and the later ones find them in L2, while the
// group's activations stay in L1 across the tile's blocks.
template <typename L, int R>
inline void rows_tile(const char* w0, int64_t row_stride, int64_t blocks, int64_t block_bytes,
                      int64_t block_y, const float* x, const float* xp, int64_t n, int64_t k,
                      float* y, int64_t ldy, int64_t y_stride) {
    if (n == 1) {
        for (int64_t b = 0; b < blocks; ++b) {
            block_one<L, R>(w0 + b * block_bytes, row_stride, x, k, y + b * block_y, y_stride);
        }
        return;
    }
    const Groups groups = groups_of(n);
    const int64_t k16 = k / 16 * 16;
    for (int64_t g = 0; g < groups.count; ++g) {
        const int64_t t0 = groups.first(g);
        const int64_t t = groups.size(g);
        const float* xg = xp + t0 * k16;
        for (int64_t b = 0; b < blocks; ++b) {
            const char* wb = w0 + b * block_bytes;
            float* yb = y + t0 * ldy + b * block_y;
            if (g == 0) {
                group_pass<L, R, true>(t, wb, row_stride, xg, x + t0 * k, k, yb, ldy, y_stride);
            } else {
                group_pass<L, R, false>(t, wb, row_stride, xg, x + t0 * k, k, yb, ldy, y_stride);
            }
        }
    }
}

// x's n tokens packed group by group (pack_group) into xp: group g's block starts at token
// groups_of(n).first(g) times k rounded down to 16.
template <typename L>
void pack_tokens(const float* x, int64_t n, int64_t k, float* xp) {
    const int64_t k16 = k / 16 * 16;
    const Groups groups = groups_of(n);
    for (int64_t g = 0; g < groups.count; ++g) {
        const int64_t t0 = groups.first(g);
        pack_group<L>(x + t0 * k, groups.size(g), k, xp + t0 * k16);
    }
}

// Rows [r0, r1) of w. From kStreamMinRows rows up, as four long sequential streams: a block
// takes rows i, i + q, i + 2q and i + 3q (q = a quarter of the range), so each stream walks q
// consecutive rows and each row's prefetch lands on the same stream's next rows. Blocks of four
// adjacent rows instead give four 2 KiB-apart reads that jump on every 4 rows, which Zen 3's
// prefetchers follow poorly: one BF16 matrix-vector product of 64 Ki x 1 Ki read 12-15 GB/s as
// streams against 8.3-9.2 GB/s as adjacent blocks at 1 thread (matmul_avx512_bf16.cc does the
// same for the AVX512_BF16 kernel). Rows left past 4q, and shorter ranges, go in adjacent blocks.
// xp: x packed by pack_tokens<L> (unused for one token).
template <typename L>
void matmul(const Weight& w, const float* x, const float* xp, int64_t n, float* y, int64_t ldy,
            int64_t r0, int64_t r1) {
    const int64_t k = w.cols;
    const int64_t row_bytes = k * L::kBytes;
    const char* base = static_cast<const char*>(w.data);
    int64_t r = r0;
    if (r1 - r0 >= kStreamMinRows) {
        const int64_t q = (r1 - r0) / 4;
        for (int64_t i = 0; i < q; i += kTileBlocks) {
            rows_tile<L, 4>(base + (r0 + i) * row_bytes, q * row_bytes, tile_blocks(q - i),
                            row_bytes, 1, x, xp, n, k, y + r0 + i, ldy, q);
        }
        r = r0 + 4 * q;
    }
    while (r + 4 <= r1) {
        const int64_t blocks = tile_blocks((r1 - r) / 4);
        rows_tile<L, 4>(base + r * row_bytes, row_bytes, blocks, 4 * row_bytes, 4, x, xp, n, k,
                        y + r, ldy, 1);
        r += 4 * blocks;
    }
    for (; r < r1; ++r) {
        rows_tile<L, 1>(base + r * row_bytes, row_bytes, 1, 0, 0, x, xp, n, k, y + r, ldy, 1);
    }
}

// The kernel contract's form: x packed here, in this thread's scratch, for each call.
template <typename L>
void matmul(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy, int64_t r0,
            int64_t r1) {
    float* xp = nullptr;
    if (n > 1) {
        xp = static_cast<float*>(kernel_scratch(0, packed_activation_floats(n, w.cols) * 4));
        pack_tokens<L>(x, n, w.cols, xp);
    }
    matmul<L>(w, x, xp, n, y, ldy, r0, r1);
}

}  // namespace

PackedActivations pack_activations_avx2(WeightFormat format, const float* x, int64_t n,
                                        int64_t k, float* scratch) {
    if (format == WeightFormat::kBF16) {
        pack_tokens<LoadBF16>(x, n, k, scratch);
    } else {
        static_assert(!LoadF32::kEvenOdd && !LoadF16::kEvenOdd);
        pack_tokens<LoadF32>(x, n, k, scratch);  // F32 and F16: the columns in order.
    }
    return {x, scratch, n, k};
}

void matmul_avx2_packed(const Weight& w, const PackedActivations& a, float* y, int64_t ldy,
                        int64_t r0, int64_t r1) {
    switch (w.format) {
        case WeightFormat::kF32:
            return matmul<LoadF32>(w, a.x, a.packed, a.n, y, ldy, r0, r1);
        case WeightFormat::kBF16:
            return matmul<LoadBF16>(w, a.x, a.packed, a.n, y, ldy, r0, r1);
        case WeightFormat::kF16:
            return matmul<LoadF16>(w, a.x, a.packed, a.n, y, ldy, r0, r1);
        default:
            // matmul.cc packs only for these formats; anything else would leave y unwritten.
            __builtin_trap();
    }
}

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
