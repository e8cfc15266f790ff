// BF16 matmul with AVX-512 BF16 dot products (vdpbf16ps). This file is compiled with AVX-512 and
// AVX512_BF16 flags (engine/CMakeLists.txt) and is only called after cpuid reports avx512_bf16;
// everything in it has internal linkage except the kernel itself.
//
// vdpbf16ps multiplies bf16 pairs, so the activations are split once per call into two bf16
// arrays (engine/cpu/bf16_split.h): w * hi + w * lo carries about 16 mantissa bits of each
// activation (relative error about 2^-17 per product, against 2^-24 for the f32 FMA kernel),
// and the weights go straight from memory into the dot product with no widening. Each dot product
// of bf16 pairs is exact in f32 before the add. Tolerance against the scalar reference:
// |simd - scalar| <= 2e-5 * sum_c |w*x| + 1e-6 (tests/engine/cpu/matmul_test.cc).

#include <immintrin.h>

#include <cstdint>

#include "engine/cpu/bf16_split.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/cpu/ops.h"

namespace edge::engine::cpu {
namespace {

// Bytes ahead of the current column that each row stream prefetches: far enough to cover memory
// latency with two threads streaming, and across 4 KiB pages, where the hardware prefetchers stop.
// With 2 KiB rows in blocks of 4 this reaches about one block ahead. 8 KiB measured best on this
// machine's 2 cores (bench_matvec: 1 KiB gave 0.65 of the 2-thread probe, 8 KiB 0.73-0.81).
constexpr int64_t kPrefetchBytes = 8192;

// The same 512 bits as bf16 pairs (a GCC vector cast: std::bit_cast would be an out-of-line
// template at -O0, compiled here with AVX-512 flags; see tests/engine/isa_objects_check.sh).
inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }

// std::min for this file, for the same reason.
constexpr int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

inline __mmask32 mask32(int64_t n) {
    return n >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu) : static_cast<__mmask32>((1u << n) - 1u);
}

// Sums of 16 vectors at once: lane j of the result is the sum of v[j]'s 16 lanes. A tree of
// unpacks and 128-bit lane shuffles, 45 instructions for the 16 sums against ~8 per sum for
// _mm512_reduce_add_ps one vector at a time (at 4 rows x 4 tokens over 1024 columns the separate
// reductions cost about a fifth as many instructions as the dot products). The additions pair up
// differently from _mm512_reduce_add_ps, so sums may differ from it in the last bits.
inline __m512 reduce16(const __m512* v) {
    __m512 a[8], b[4], c[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        // Per 128-bit lane: (v0+v2, w0+w2, v1+v3, w1+w3) of v = v[2i], w = v[2i + 1].
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
        // Per 128-bit lane: one partial sum each of v[4i] .. v[4i + 3].
        const __m512d x = _mm512_castps_pd(a[2 * i]);
        const __m512d y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i) {
        // 128-bit lanes: b[2i] (lanes 0+1, 2+3), b[2i + 1] (lanes 0+1, 2+3).
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    }
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                         _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

// How a block prefetches its weights: kRowAhead, each row kPrefetchBytes ahead of itself (rows in
// order, one matrix); kStream, the block's rows are far apart, each the head of a long sequential
// stream, and each prefetches further along itself (rows_stream); kNone, nothing.
enum class Prefetch { kRowAhead, kNone, kStream };

// How far ahead along its own stream each of rows_stream's four streams prefetches: into L2 far
// enough to cover memory latency, into L1 only a little ahead of the loads. The four streams are
// q x k x 2 bytes apart, a multiple of 4 KiB in the bench preset's experts (q = 128 rows of 2 KiB,
// 256 of 1 KiB), so their lines fall in the same L1 sets as each other, and the
// activations (4 tokens x 2 KiB, twice in exact mode) fill the rest of the 8 ways: 2 KiB ahead
// into L1 alone evicted lines before they were read (perf: the weight loads' dot products held
// most of rows_stream's samples). Measured with bench_matvec --experts (2 threads, fraction of
// the probe, three runs each), 32 sequences exact / bf16 activations: 2 KiB into L1 0.43-0.71 /
// 0.49-0.79, 256 B into L1 and 8 KiB into L2 0.87-0.92 / 0.89-0.93; 64 sequences 0.29-0.51 /
// 0.38-0.63 against 0.47-0.68 / 0.77-0.81; one token (bench_matvec) 0.56-0.90 against
// 0.85-1.13. 128 B / 4 KiB, 192 B / 8 KiB and 256 B / 10 KiB measured within the noise of it,
// 512 B into L1 lower, and 16 KiB into L2 lower.
constexpr int64_t kStreamL1Bytes = 256;
constexpr int64_t kStreamL2Bytes = 8192;

// R rows by T tokens. For one or two tokens, hi and lo products go to separate accumulators:
// vdpbf16ps has a 6-cycle latency at two per cycle, so it needs about 12 independent chains, and
// 4 x 2 accumulators with two dependent products each per step run latency-bound (in L1, 4 rows
// x 2 tokens: 5.0 G products/s with two accumulators against 3.8 with one; 4 x 4 reaches 5.4).
// L false (engine.activation_precision: bf16): the activations are one bf16 row each (`lo` is
// unused), one product per weight; with one or two tokens alternate 32-column steps go to the
// two accumulators instead.
template <int R, int T, Prefetch P = Prefetch::kRowAhead, bool L = true>
__attribute__((always_inline)) inline void block(const uint16_t* w0, int64_t k, const uint16_t* hi,
                                                 const uint16_t* lo, int64_t kp, float* y,
                                                 int64_t ldy, int64_t rs = 0, int64_t ys = 1,
                                                 bool stream_prefetch = false) {
    // kStream: the R rows are rs elements apart (each the head of a long sequential stream) and
    // their outputs ys apart; with stream_prefetch each prefetches further along its own stream
    // (kStreamL1Bytes, kStreamL2Bytes).
    if constexpr (P != Prefetch::kStream) {
        rs = k;
        ys = 1;
    }
    constexpr int A = T <= 2 ? 2 : 1;  // Accumulators per (row, token).
    __m512 acc[R][T][A];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
#pragma GCC unroll 2
            for (int a = 0; a < A; ++a) {
                acc[r][t][a] = _mm512_setzero_ps();
            }
        }
    }
    // One 32-column step; `a` picks the accumulator of a single-product step.
    auto step = [&](int64_t c, int a) __attribute__((always_inline)) {
        __m512bh xh[T], xl[T];
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            xh[t] = as_bh(_mm512_loadu_si512(hi + t * kp + c));
            if constexpr (L) {
                xl[t] = as_bh(_mm512_loadu_si512(lo + t * kp + c));
            }
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const uint16_t* row = w0 + r * rs + c;
            if constexpr (P == Prefetch::kRowAhead) {
                _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes, _MM_HINT_T0);
            } else if constexpr (P == Prefetch::kStream) {
                if (stream_prefetch) {
                    const char* p = reinterpret_cast<const char*>(row);
                    _mm_prefetch(p + kStreamL1Bytes, _MM_HINT_T0);
                    _mm_prefetch(p + kStreamL2Bytes, _MM_HINT_T1);
                }
            }
            const __m512bh wv = as_bh(_mm512_loadu_si512(row));
#pragma GCC unroll 16
            for (int t = 0; t < T; ++t) {
                if constexpr (L) {
                    acc[r][t][0] = _mm512_dpbf16_ps(acc[r][t][0], wv, xh[t]);
                    acc[r][t][A - 1] = _mm512_dpbf16_ps(acc[r][t][A - 1], wv, xl[t]);
                } else {
                    acc[r][t][a] = _mm512_dpbf16_ps(acc[r][t][a], wv, xh[t]);
                }
            }
        }
    };
    int64_t c = 0;
    if constexpr (!L && A == 2) {
        for (; c + 64 <= k; c += 64) {
            step(c, 0);
            step(c + 32, 1);
        }
    }
    for (; c + 32 <= k; c += 32) {
        step(c, 0);
    }
    if (c < k) {
        const __mmask32 m = mask32(k - c);
        __m512bh xh[T], xl[T];
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            xh[t] = as_bh(_mm512_loadu_si512(hi + t * kp + c));  // Zero padded to kp.
            if constexpr (L) {
                xl[t] = as_bh(_mm512_loadu_si512(lo + t * kp + c));
            }
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const __m512bh wv = as_bh(_mm512_maskz_loadu_epi16(m, w0 + r * rs + c));
#pragma GCC unroll 16
            for (int t = 0; t < T; ++t) {
                acc[r][t][0] = _mm512_dpbf16_ps(acc[r][t][0], wv, xh[t]);
                if constexpr (L) {
                    acc[r][t][A - 1] = _mm512_dpbf16_ps(acc[r][t][A - 1], wv, xl[t]);
                }
            }
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            __m512 s = acc[r][t][0];
            if constexpr (A == 2) {
                s = _mm512_add_ps(s, acc[r][t][1]);
            }
            y[t * ldy + r * ys] = _mm512_reduce_add_ps(s);
        }
    }
}

template <int R, bool L>
inline void rows_block(const uint16_t* w0, int64_t k, const uint16_t* hi, const uint16_t* lo,
                       int64_t kp, int64_t n, float* y, int64_t ldy) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
        block<R, 4, Prefetch::kRowAhead, L>(w0, k, hi + t * kp, lo + t * kp, kp, y + t * ldy, ldy);
    }
    switch (n - t) {
        case 3:
            block<R, 3, Prefetch::kRowAhead, L>(w0, k, hi + t * kp, lo + t * kp, kp, y + t * ldy,
                                                ldy);
            break;
        case 2:
            block<R, 2, Prefetch::kRowAhead, L>(w0, k, hi + t * kp, lo + t * kp, kp, y + t * ldy,
                                                ldy);
            break;
        case 1:
            block<R, 1, Prefetch::kRowAhead, L>(w0, k, hi + t * kp, lo + t * kp, kp, y + t * ldy,
                                                ldy);
            break;
        default:
            break;
    }
}

// One token: the rows one after another, each read start to end, so the weight is one sequential
// stream. With one token a weight line feeds one product (two in exact mode), so the four
// streams' shared activation loads buy nothing, and on the Zen 4 host of docs/benchmarks.md one
// core reads one stream faster than four (the probe: 31-35 against ~25 GB/s). Four accumulators
// (eight in exact mode) per row keep vdpbf16ps's latency covered; no software prefetch (the
// hardware prefetchers follow one stream; 512 B into L1 or 4-8 KiB into L2 measured slower).
// bench_matvec --experts --tokens 1, fraction of the probe, two interleaved rounds: one thread
// 0.79-0.80 against 0.69-0.75, two threads 0.88-0.92 against 0.74-0.78; two and three tokens
// this way read slower in exact mode (0.62 against 0.75 at two), so they keep the four streams.
template <bool L>
inline void rows_one_token(const uint16_t* w, int64_t rows, int64_t k, const uint16_t* hi,
                           const uint16_t* lo, float* y) {
    constexpr int kUnroll = 4;
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* row = w + r * k;
        __m512 a[kUnroll], b[kUnroll];
#pragma GCC unroll 4
        for (int u = 0; u < kUnroll; ++u) {
            a[u] = _mm512_setzero_ps();
            b[u] = _mm512_setzero_ps();
        }
        int64_t c = 0;
        for (; c + 32 * kUnroll <= k; c += 32 * kUnroll) {
#pragma GCC unroll 4
            for (int u = 0; u < kUnroll; ++u) {
                const __m512bh wv = as_bh(_mm512_loadu_si512(row + c + 32 * u));
                a[u] = _mm512_dpbf16_ps(a[u], wv, as_bh(_mm512_loadu_si512(hi + c + 32 * u)));
                if constexpr (L) {
                    b[u] = _mm512_dpbf16_ps(b[u], wv, as_bh(_mm512_loadu_si512(lo + c + 32 * u)));
                }
            }
        }
        for (; c < k; c += 32) {
            // Activations are zero padded to a multiple of 32 columns.
            const __m512bh wv = as_bh(_mm512_maskz_loadu_epi16(mask32(k - c), row + c));
            a[0] = _mm512_dpbf16_ps(a[0], wv, as_bh(_mm512_loadu_si512(hi + c)));
            if constexpr (L) {
                b[0] = _mm512_dpbf16_ps(b[0], wv, as_bh(_mm512_loadu_si512(lo + c)));
            }
        }
        __m512 sum = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
        if constexpr (L) {
            sum = _mm512_add_ps(
                sum, _mm512_add_ps(_mm512_add_ps(b[0], b[1]), _mm512_add_ps(b[2], b[3])));
        }
        y[r] = _mm512_reduce_add_ps(sum);
    }
}

// Rows [0, rows) of one weight for n tokens as four long sequential streams (one token:
// rows_one_token): a block takes rows i, i + q, i + 2q, i + 3q (q = rows / 4), so each stream
// walks q consecutive rows and the hardware prefetchers see four long sequential reads instead of
// many 2 KiB ones, and a weight line loaded feeds the block's tokens from activations loaded once
// per four rows; each stream also prefetches further along itself (kStreamL1Bytes,
// kStreamL2Bytes). The first token group streams from memory, later groups re-read the same rows
// from cache.
template <bool L>
inline void rows_stream(const uint16_t* w, int64_t rows, int64_t k, const uint16_t* hi,
                        const uint16_t* lo, int64_t kp, int64_t n, float* y, int64_t ldy) {
    constexpr auto kS = Prefetch::kStream;
    if (n == 1) {
        rows_one_token<L>(w, rows, k, hi, lo, y);
        return;
    }
    const int64_t q = rows / 4;
    const int64_t rs = q * k;
    const int64_t t1 = n < 4 ? n : 4;
    for (int64_t i = 0; i < q; ++i) {
        const uint16_t* w0 = w + i * k;
        float* yr = y + i;
        switch (t1) {
            case 4:
                block<4, 4, kS, L>(w0, k, hi, lo, kp, yr, ldy, rs, q, true);
                break;
            case 3:
                block<4, 3, kS, L>(w0, k, hi, lo, kp, yr, ldy, rs, q, true);
                break;
            case 2:
                block<4, 2, kS, L>(w0, k, hi, lo, kp, yr, ldy, rs, q, true);
                break;
            default:
                block<4, 1, kS, L>(w0, k, hi, lo, kp, yr, ldy, rs, q, true);
                break;
        }
        int64_t t = t1;
        for (; t + 4 <= n; t += 4) {
            block<4, 4, kS, L>(w0, k, hi + t * kp, lo + t * kp, kp, yr + t * ldy, ldy, rs, q);
        }
        switch (n - t) {
            case 3:
                block<4, 3, kS, L>(w0, k, hi + t * kp, lo + t * kp, kp, yr + t * ldy, ldy, rs, q);
                break;
            case 2:
                block<4, 2, kS, L>(w0, k, hi + t * kp, lo + t * kp, kp, yr + t * ldy, ldy, rs, q);
                break;
            case 1:
                block<4, 1, kS, L>(w0, k, hi + t * kp, lo + t * kp, kp, yr + t * ldy, ldy, rs, q);
                break;
            default:
                break;
        }
    }
    for (int64_t r = 4 * q; r < rows; ++r) {
        rows_block<1, L>(w + r * k, k, hi, lo, kp, n, y + r, ldy);
    }
}

// Multi-token blocks for calls of kGemmMinTokens or more tokens (batched decode's attention
// projections and lm_head, prefill, experts that got many tokens), where the products, not the
// weight bytes, bound the time. R rows by T tokens with the R weight vectors of a 32-column step
// held in registers and the T tokens' activations loaded one at a time (R * T accumulators + R + 2
// registers: 3 x 8 uses 29 of the 32, 4 x 6 30), so a step issues R + T loads (R + 2T in exact
// mode) for R * T dot products (2 R T).
// rows_gemm keeps a group of tokens' activations in L1 and a panel of rows in L2 while the groups
// pass over it (kGemmTokens, kGemmRows). The 24 sums are reduced with reduce16.
// Measured with bench_matvec --gemm --tokens 32 (2 threads, bf16 activations): 4 x 4 blocks over
// all 32 tokens per row block, activations re-read from L2 on every step, ran at 0.43-0.46 of the
// vdpbf16ps peak.
template <int R, int T, bool L>
__attribute__((always_inline)) inline void gemm_block(const uint16_t* w0, int64_t k,
                                                      const uint16_t* hi, const uint16_t* lo,
                                                      int64_t kp, float* y, int64_t ldy,
                                                      const char* prefetch) {
    static_assert(R * T <= 24, "gemm_block: too many accumulators for 32 registers");
    __m512 acc[R * T];
#pragma GCC unroll 24
    for (int i = 0; i < R * T; ++i) {
        acc[i] = _mm512_setzero_ps();
    }
    auto step = [&](int64_t c, __mmask32 m, bool masked) __attribute__((always_inline)) {
        __m512bh wv[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const uint16_t* row = w0 + r * k + c;
            wv[r] = masked ? as_bh(_mm512_maskz_loadu_epi16(m, row))
                           : as_bh(_mm512_loadu_si512(row));
            // The same column of the next block's rows, into L1 a block ahead (from L2 the
            // weight loads stalled the loop: ~15% of its samples).
            _mm_prefetch(reinterpret_cast<const char*>(row + R * k), _MM_HINT_T0);
        }
        if (prefetch != nullptr) {
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                _mm_prefetch(prefetch + (r * k + c) * 2, _MM_HINT_T1);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            const __m512bh xh = as_bh(_mm512_loadu_si512(hi + t * kp + c));
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                acc[r * T + t] = _mm512_dpbf16_ps(acc[r * T + t], wv[r], xh);
            }
            if constexpr (L) {
                const __m512bh xl = as_bh(_mm512_loadu_si512(lo + t * kp + c));
#pragma GCC unroll 4
                for (int r = 0; r < R; ++r) {
                    acc[r * T + t] = _mm512_dpbf16_ps(acc[r * T + t], wv[r], xl);
                }
            }
        }
    };
    int64_t c = 0;
    for (; c + 32 <= k; c += 32) {
        step(c, 0, false);
    }
    if (c < k) {
        step(c, mask32(k - c), true);  // Activations are zero padded to kp.
    }
    // Sums: reduce16 over groups of 16 accumulators (the last group zero padded).
    alignas(64) float out[32];
    for (int g = 0; g * 16 < R * T; ++g) {
        __m512 v[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) {
            v[i] = g * 16 + i < R * T ? acc[g * 16 + i] : _mm512_setzero_ps();
        }
        _mm512_store_ps(out + g * 16, reduce16(v));
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = out[r * T + t];
        }
    }
}

// Tokens in a group and rows in a block of the panel form. With bf16 activations 8 tokens by 3
// rows (a group's activations take 16 KiB of the 32 KiB L1); in exact mode (hi + lo) 6 tokens by
// 4 rows, since 8 tokens' hi + lo would fill L1 alone and evict the weights the next block
// prefetched. bench_matvec --gemm --tokens 32, 2 threads, three runs, exact activations: 3 x 8
// 0.68-0.77 (q/k/v, o) and 0.80 (lm_head) of the vdpbf16ps peak, 4 x 6 0.75-0.86 and 0.92-0.93;
// with bf16 activations 4 x 6 measured no better (0.65-0.73 and 0.73-0.86 against 0.67-0.76 and
// 0.80-0.87).
template <bool L>
constexpr int kGemmTokens = L ? 6 : 8;
template <bool L>
constexpr int kGemmRows = L ? 4 : 3;

// gemm_block over rows [0, rows) for T tokens; `next` (may be null) is the same row's data one
// panel further on, prefetched into L2 while this panel is computed.
template <int T, bool L>
inline void gemm_rows(const uint16_t* w, int64_t rows, int64_t k, const uint16_t* hi,
                      const uint16_t* lo, int64_t kp, float* y, int64_t ldy, const char* next) {
    constexpr int R = kGemmRows<L>;
    int64_t r = 0;
    for (; r + R <= rows; r += R) {
        gemm_block<R, T, L>(w + r * k, k, hi, lo, kp, y + r, ldy,
                            next != nullptr ? next + r * k * 2 : nullptr);
    }
    for (; r < rows; ++r) {
        gemm_block<1, T, L>(w + r * k, k, hi, lo, kp, y + r, ldy,
                            next != nullptr ? next + r * k * 2 : nullptr);
    }
}

using GemmRowsFn = void (*)(const uint16_t*, int64_t, int64_t, const uint16_t*, const uint16_t*,
                           int64_t, float*, int64_t, const char*);

// gemm_rows for `tokens` (1..kGemmTokens<L>) tokens.
template <bool L>
GemmRowsFn gemm_rows_for(int64_t tokens) {
    if constexpr (L) {
        static constexpr GemmRowsFn kByTokens[kGemmTokens<L>] = {
            &gemm_rows<1, L>, &gemm_rows<2, L>, &gemm_rows<3, L>,
            &gemm_rows<4, L>, &gemm_rows<5, L>, &gemm_rows<6, L>};
        return kByTokens[tokens - 1];
    } else {
        static constexpr GemmRowsFn kByTokens[kGemmTokens<L>] = {
            &gemm_rows<1, L>, &gemm_rows<2, L>, &gemm_rows<3, L>, &gemm_rows<4, L>,
            &gemm_rows<5, L>, &gemm_rows<6, L>, &gemm_rows<7, L>, &gemm_rows<8, L>};
        return kByTokens[tokens - 1];
    }
}

// From this many tokens a pass over a weight takes the panel form (rows_gemm) instead of the four
// streams (rows_stream). Below it the weights' bytes bound the time (an expert of the bench preset
// at 8 tokens: ~57 us of products per thread against ~120 us to read its 3 MiB), and the four
// streams read faster: bench_matvec --experts --sequences 64 (~8 tokens per expert) read at
// 0.18 of the probe with the panels from 8 tokens on in the two-step form, 0.28 with the streams.
constexpr int64_t kGemmMinTokens = 16;

// Rows [0, rows) of one weight for n >= kGemmMinTokens tokens: panels of kGemmPanelRows rows
// (96 KiB at k = 1024, in L2), each multiplied by groups of kGemmTokens tokens; the first group
// of a panel prefetches the next panel. A multiple of both kGemmRows.
constexpr int64_t kGemmPanelRows = 48;

template <bool L>
inline void rows_gemm(const uint16_t* w, int64_t rows, int64_t k, const uint16_t* hi,
                      const uint16_t* lo, int64_t kp, int64_t n, float* y, int64_t ldy) {
    for (int64_t p = 0; p < rows; p += kGemmPanelRows) {
        const int64_t pr = min_i64(kGemmPanelRows, rows - p);
        const uint16_t* wp = w + p * k;
        const int64_t next_rows = min_i64(kGemmPanelRows, rows - p - pr);
        const char* next = next_rows > 0 ? reinterpret_cast<const char*>(wp + pr * k) : nullptr;
        for (int64_t t = 0; t < n; t += kGemmTokens<L>) {
            const uint16_t* h = hi + t * kp;
            const uint16_t* l = lo + t * kp;
            float* yt = y + t * ldy + p;
            // Prefetch only as many rows as the next panel has (the first group of a panel is
            // always a full group: n >= kGemmMinTokens).
            const char* nx = t == 0 ? next : nullptr;
            const int64_t rr = nx != nullptr ? min_i64(pr, next_rows) : pr;
            const GemmRowsFn fn = gemm_rows_for<L>(min_i64(n - t, kGemmTokens<L>));
            fn(wp, rr, k, h, l, kp, yt, ldy, nx);
            if (rr < pr) {
                fn(wp + rr * k, pr - rr, k, h, l, kp, yt + rr, ldy, nullptr);
            }
        }
    }
}

// The activations as the kernels take them: hi + lo (L) or one rounded bf16 row per token.
template <bool L>
inline void prepare(const float* x, int64_t n, int64_t k, int64_t kp, uint16_t* hi, uint16_t* lo) {
    if constexpr (L) {
        split_activations_bf16(x, n, k, kp, hi, lo);
    } else {
        round_activations_bf16(x, n, k, kp, hi);
    }
}

// The most tokens one pass over a weight's rows multiplies: longer calls (prefill) take the rows
// once per group of this many tokens, bounding the activations one pass reads.
constexpr int64_t kTokenGroup = 64;

// A whole weight for nt tokens as the expert kernel runs it: four streams (rows_stream) below
// kGemmMinTokens tokens, the panel form (rows_gemm) from there on, the same choice and sums as
// matmul_bf16_avx512bf16_prepared over all rows.
template <bool L>
inline void rows_whole(const uint16_t* w, int64_t rows, int64_t k, const uint16_t* hi,
                       const uint16_t* lo, int64_t kp, int64_t nt, float* y, int64_t ldy) {
    if (nt >= kGemmMinTokens) {
        rows_gemm<L>(w, rows, k, hi, lo, kp, nt, y, ldy);
    } else {
        rows_stream<L>(w, rows, k, hi, lo, kp, nt, y, ldy);
    }
}

// One SwiGLU job; L: activations as bf16 hi + lo (exact mode), else one bf16 each.
template <bool L>
void swiglu_impl(const SwiGluJob& j) {
    const int64_t in = j.gate->cols;
    const int64_t inter = j.gate->rows;
    const int64_t out = j.down->rows;
    if (j.n <= 0) {
        return;
    }
    const int64_t inp = (in + 31) / 32 * 32;
    const int64_t interp = (inter + 31) / 32 * 32;
    const int64_t group = j.n < kTokenGroup ? j.n : kTokenGroup;
    auto* split = static_cast<uint16_t*>(
        kernel_scratch(0, 2 * group * (inp > interp ? inp : interp) * sizeof(uint16_t)));
    float* g = static_cast<float*>(kernel_scratch(1, 3 * group * inter * sizeof(float)));
    const auto* gate = static_cast<const uint16_t*>(j.gate->data);
    const auto* up = static_cast<const uint16_t*>(j.up->data);
    const auto* down = static_cast<const uint16_t*>(j.down->data);
    float* u = g + group * inter;
    float* act = u + group * inter;
    for (int64_t t0 = 0; t0 < j.n; t0 += group) {
        const int64_t nt = j.n - t0 < group ? j.n - t0 : group;
        uint16_t* hi = split;
        uint16_t* lo = hi + nt * inp;
        prepare<L>(j.x + t0 * in, nt, in, inp, hi, lo);
        rows_whole<L>(gate, inter, in, hi, lo, inp, nt, g, inter);
        rows_whole<L>(up, inter, in, hi, lo, inp, nt, u, inter);
        silu_mul(g, u, nt * inter, act);
        lo = hi + nt * interp;
        prepare<L>(act, nt, inter, interp, hi, lo);
        rows_whole<L>(down, out, inter, hi, lo, interp, nt, j.y + t0 * j.ldy, j.ldy);
    }
}

// Rows [r0, r1) for nt prepared tokens.
template <bool L>
void rows_prepared(const uint16_t* base, int64_t k, const uint16_t* hi, const uint16_t* lo,
                   int64_t kp, int64_t nt, float* yt, int64_t ldy, int64_t r0, int64_t r1) {
    if (nt >= kGemmMinTokens) {
        rows_gemm<L>(base + r0 * k, r1 - r0, k, hi, lo, kp, nt, yt + r0, ldy);
        return;
    }
    if (r1 - r0 >= 64) {
        // Long streams (see rows_stream) keep the memory system ahead: with several tokens
        // compute takes long enough per row that short row streams starve, and with one token
        // (decode; one stream, rows_one_token) they read faster than the widen + FMA kernel's
        // blocks of four adjacent rows (bench_decode --profile single --threads 2, experts
        // already streamed, with four streams then: 107.2 / 111.1 / 107.7 against 104.0 /
        // 104.9 / 100.8 tokens/s, interleaved).
        rows_stream<L>(base + r0 * k, r1 - r0, k, hi, lo, kp, nt, yt + r0, ldy);
        return;
    }
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        rows_block<4, L>(base + r * k, k, hi, lo, kp, nt, yt + r, ldy);
    }
    for (; r < r1; ++r) {
        rows_block<1, L>(base + r * k, k, hi, lo, kp, nt, yt + r, ldy);
    }
}

template <bool L>
void matmul_impl(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy, int64_t r0,
                 int64_t r1) {
    const int64_t k = w.cols;
    if (n <= 0 || k <= 0 || r0 >= r1) {
        return;
    }
    const int64_t kp = (k + 31) / 32 * 32;
    // Per-thread scratch for the split activations of up to kTokenGroup tokens (bounded: a long
    // prefill is taken a group at a time, each group reading the rows once).
    const int64_t group = n < kTokenGroup ? n : kTokenGroup;
    auto* hi = static_cast<uint16_t*>(kernel_scratch(0, 2 * group * kp * sizeof(uint16_t)));
    uint16_t* lo = hi + group * kp;
    const auto* base = static_cast<const uint16_t*>(w.data);
    for (int64_t t0 = 0; t0 < n; t0 += group) {
        const int64_t nt = n - t0 < group ? n - t0 : group;
        prepare<L>(x + t0 * k, nt, k, kp, hi, lo);
        rows_prepared<L>(base, k, hi, lo, kp, nt, y + t0 * ldy, ldy, r0, r1);
    }
}

}  // namespace

void swiglu_bf16_avx512bf16(const SwiGluJob& j, ActivationPrecision precision) {
    if (precision == ActivationPrecision::kBf16) {
        swiglu_impl<false>(j);
    } else {
        swiglu_impl<true>(j);
    }
}

void matmul_bf16_avx512bf16(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                            int64_t r0, int64_t r1) {
    matmul_impl<true>(w, x, n, y, ldy, r0, r1);
}

void matmul_bf16_avx512bf16_bf16act(const Weight& w, const float* x, int64_t n, float* y,
                                    int64_t ldy, int64_t r0, int64_t r1) {
    matmul_impl<false>(w, x, n, y, ldy, r0, r1);
}

int64_t bf16_activation_elements(int64_t n, int64_t k, ActivationPrecision precision) {
    const int64_t kp = (k + 31) / 32 * 32;
    return (precision == ActivationPrecision::kExact ? 2 : 1) * n * kp;
}

Bf16Activations prepare_bf16_activations(const float* x, int64_t n, int64_t k,
                                         ActivationPrecision precision, uint16_t* scratch) {
    Bf16Activations a;
    a.n = n;
    a.k = k;
    a.kp = (k + 31) / 32 * 32;
    a.hi = scratch;
    if (precision == ActivationPrecision::kExact) {
        a.lo = scratch + n * a.kp;
        prepare<true>(x, n, k, a.kp, scratch, scratch + n * a.kp);
    } else {
        prepare<false>(x, n, k, a.kp, scratch, nullptr);
    }
    return a;
}

void matmul_bf16_avx512bf16_prepared(const Weight& w, const Bf16Activations& a, float* y,
                                     int64_t ldy, int64_t r0, int64_t r1) {
    if (a.n <= 0 || a.k <= 0 || r0 >= r1) {
        return;
    }
    const auto* base = static_cast<const uint16_t*>(w.data);
    // Groups of kTokenGroup tokens, as matmul_impl and swiglu_impl take them (same sums).
    for (int64_t t0 = 0; t0 < a.n; t0 += kTokenGroup) {
        const int64_t nt = min_i64(kTokenGroup, a.n - t0);
        const uint16_t* hi = a.hi + t0 * a.kp;
        if (a.lo != nullptr) {
            rows_prepared<true>(base, a.k, hi, a.lo + t0 * a.kp, a.kp, nt, y + t0 * ldy, ldy, r0,
                                r1);
        } else {
            rows_prepared<false>(base, a.k, hi, hi, a.kp, nt, y + t0 * ldy, ldy, r0, r1);
        }
    }
}

}  // namespace edge::engine::cpu
