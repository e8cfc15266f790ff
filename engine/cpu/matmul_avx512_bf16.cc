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

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

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

inline __m512bh as_bh(__m512i v) { return std::bit_cast<__m512bh>(v); }

inline __mmask32 mask32(int64_t n) {
    return n >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu) : static_cast<__mmask32>((1u << n) - 1u);
}

// How a block prefetches its weights: kRowAhead, each row kPrefetchBytes ahead of itself (rows in
// order, one matrix); kStream, the block's rows are far apart, each the head of a long sequential
// stream, and each prefetches a given distance further along itself (the expert kernel); kNone,
// nothing.
enum class Prefetch { kRowAhead, kNone, kStream };

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
                                                 int64_t ahead = 0) {
    // kStream: the R rows are rs elements apart (each the head of a long sequential stream) and
    // their outputs ys apart; each prefetches `ahead` bytes further along its own stream.
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
                if (ahead != 0) {
                    _mm_prefetch(reinterpret_cast<const char*>(row) + ahead, _MM_HINT_T0);
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

// Rows [0, rows) of one weight for n tokens, as four long sequential streams: a block takes rows
// i, i + q, i + 2q, i + 3q (q = rows / 4), so each stream walks q consecutive rows and the hardware
// prefetchers see four long sequential reads instead of many 2 KiB ones; each stream also
// prefetches `ahead` bytes further along itself. The first token group streams from memory,
// later groups re-read the same rows from cache.
template <bool L>
inline void rows_stream(const uint16_t* w, int64_t rows, int64_t k, const uint16_t* hi,
                        const uint16_t* lo, int64_t kp, int64_t n, float* y, int64_t ldy,
                        int64_t ahead) {
    constexpr auto kS = Prefetch::kStream;
    const int64_t q = rows / 4;
    const int64_t rs = q * k;
    const int64_t t1 = n < 4 ? n : 4;
    for (int64_t i = 0; i < q; ++i) {
        const uint16_t* w0 = w + i * k;
        float* yr = y + i;
        switch (t1) {
            case 4:
                block<4, 4, kS, L>(w0, k, hi, lo, kp, yr, ldy, rs, q, ahead);
                break;
            case 3:
                block<4, 3, kS, L>(w0, k, hi, lo, kp, yr, ldy, rs, q, ahead);
                break;
            case 2:
                block<4, 2, kS, L>(w0, k, hi, lo, kp, yr, ldy, rs, q, ahead);
                break;
            default:
                block<4, 1, kS, L>(w0, k, hi, lo, kp, yr, ldy, rs, q, ahead);
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

// How far ahead along its own stream each of rows_stream's four streams prefetches. Measured on
// this machine's 2 cores (bench_decode --profile batched32): 0 B 286 tokens/s, 1-2 KiB 308-313,
// 4 KiB 288, 8 KiB 299; the hardware prefetchers do most of the work once the streams are long.
constexpr int64_t kStreamPrefetchBytes = 2048;

// The activations as the kernels take them: hi + lo (L) or one rounded bf16 row per token.
template <bool L>
inline void prepare(const float* x, int64_t n, int64_t k, int64_t kp, uint16_t* hi, uint16_t* lo) {
    if constexpr (L) {
        split_activations_bf16(x, n, k, kp, hi, lo);
    } else {
        round_activations_bf16(x, n, k, kp, hi);
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
    constexpr int64_t kTokenGroup = 64;
    const int64_t group = j.n < kTokenGroup ? j.n : kTokenGroup;
    thread_local std::vector<uint16_t> split;
    thread_local std::vector<float> buf;
    const size_t split_need = static_cast<size_t>(2 * group * (inp > interp ? inp : interp));
    const size_t buf_need = static_cast<size_t>(3 * group * inter);
    if (split.size() < split_need) {
        split.resize(split_need);
    }
    if (buf.size() < buf_need) {
        buf.resize(buf_need);
    }
    const auto* gate = static_cast<const uint16_t*>(j.gate->data);
    const auto* up = static_cast<const uint16_t*>(j.up->data);
    const auto* down = static_cast<const uint16_t*>(j.down->data);
    constexpr int64_t ahead = kStreamPrefetchBytes;
    float* g = buf.data();
    float* u = g + group * inter;
    float* act = u + group * inter;
    for (int64_t t0 = 0; t0 < j.n; t0 += group) {
        const int64_t nt = j.n - t0 < group ? j.n - t0 : group;
        uint16_t* hi = split.data();
        uint16_t* lo = hi + nt * inp;
        prepare<L>(j.x + t0 * in, nt, in, inp, hi, lo);
        rows_stream<L>(gate, inter, in, hi, lo, inp, nt, g, inter, ahead);
        rows_stream<L>(up, inter, in, hi, lo, inp, nt, u, inter, ahead);
        silu_mul(g, u, nt * inter, act);
        lo = hi + nt * interp;
        prepare<L>(act, nt, inter, interp, hi, lo);
        rows_stream<L>(down, out, inter, hi, lo, interp, nt, j.y + t0 * j.ldy, j.ldy, ahead);
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
    constexpr int64_t kTokenGroup = 64;
    thread_local std::vector<uint16_t> scratch;
    const int64_t group = n < kTokenGroup ? n : kTokenGroup;
    if (scratch.size() < static_cast<size_t>(2 * group * kp)) {
        scratch.resize(static_cast<size_t>(2 * group * kp));
    }
    uint16_t* hi = scratch.data();
    uint16_t* lo = hi + group * kp;
    const auto* base = static_cast<const uint16_t*>(w.data);
    for (int64_t t0 = 0; t0 < n; t0 += group) {
        const int64_t nt = n - t0 < group ? n - t0 : group;
        prepare<L>(x + t0 * k, nt, k, kp, hi, lo);
        float* yt = y + t0 * ldy;
        if (r1 - r0 >= 64) {
            // Four long streams (see rows_stream) keep the memory system ahead: with several
            // tokens compute takes long enough per row that short row streams starve, and with
            // one token (decode) they read faster than the widen + FMA kernel's blocks of four
            // adjacent rows (bench_decode --profile single --threads 2, experts already streamed:
            // 107.2 / 111.1 / 107.7 against 104.0 / 104.9 / 100.8 tokens/s, interleaved).
            rows_stream<L>(base + r0 * k, r1 - r0, k, hi, lo, kp, nt, yt + r0, ldy,
                           kStreamPrefetchBytes);
            continue;
        }
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) {
            rows_block<4, L>(base + r * k, k, hi, lo, kp, nt, yt + r, ldy);
        }
        for (; r < r1; ++r) {
            rows_block<1, L>(base + r * k, k, hi, lo, kp, nt, yt + r, ldy);
        }
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

}  // namespace edge::engine::cpu
