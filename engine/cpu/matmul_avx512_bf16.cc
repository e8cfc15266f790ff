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
#include <cstdlib>
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

// How a block prefetches its weights: kRowAhead, each row kPrefetchBytes ahead of itself (one
// matrix, rows in order); kCursor, a PrefetchCursor running ahead over a list of matrices (the
// expert kernel, whose gate, up and down and the next expert are separate tensors anywhere in the
// mapped file); kNone, nothing (a second pass over rows already in cache).
enum class Prefetch { kRowAhead, kCursor, kNone };

// A prefetch stream over up to kMaxSegments byte ranges read one after another, kept a fixed
// distance ahead of the reads: each block step prefetches as many lines as it consumes.
class PrefetchCursor {
public:
    static constexpr int kMaxSegments = 4;
    void add(const void* data, int64_t bytes) {
        if (count_ < kMaxSegments && bytes > 0) {
            const char* p = static_cast<const char*>(data);
            segs_[count_++] = {p, p + bytes};
        }
    }
    // Starts the stream `ahead` bytes into the segments (those are left to the previous job's
    // cursor and the hardware prefetchers).
    void start(int64_t ahead) {
        next_ = 0;
        p_ = end_ = nullptr;
        while (next_ < count_) {
            const int64_t len = segs_[next_].end - segs_[next_].p;
            if (ahead < len) {
                p_ = segs_[next_].p + ahead;
                end_ = segs_[next_].end;
                ++next_;
                return;
            }
            ahead -= len;
            ++next_;
        }
    }
    template <int Lines>
    __attribute__((always_inline)) void step() {
#pragma GCC unroll 8
        for (int l = 0; l < Lines; ++l) {
            if (p_ >= end_) {
                if (next_ >= count_) {
                    return;
                }
                p_ = segs_[next_].p;
                end_ = segs_[next_].end;
                ++next_;
            }
            _mm_prefetch(p_, _MM_HINT_T1);
            p_ += 64;
        }
    }

private:
    struct Segment {
        const char* p;
        const char* end;
    };
    Segment segs_[kMaxSegments] = {};
    int count_ = 0;
    int next_ = 0;
    const char* p_ = nullptr;
    const char* end_ = nullptr;
};

// R rows by T tokens. For one token, hi and lo products go to separate accumulators so each
// row has two independent dependency chains.
template <int R, int T, Prefetch P = Prefetch::kRowAhead>
__attribute__((always_inline)) inline void block(const uint16_t* w0, int64_t k, const uint16_t* hi,
                                                 const uint16_t* lo, int64_t kp, float* y,
                                                 int64_t ldy, PrefetchCursor* pf = nullptr) {
    constexpr int A = T == 1 ? 2 : 1;  // Accumulators per (row, token).
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
    int64_t c = 0;
    for (; c + 32 <= k; c += 32) {
        __m512bh xh[T], xl[T];
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            xh[t] = as_bh(_mm512_loadu_si512(hi + t * kp + c));
            xl[t] = as_bh(_mm512_loadu_si512(lo + t * kp + c));
        }
        if constexpr (P == Prefetch::kCursor) {
            pf->step<R>();  // The R 64-byte lines this step reads, one stream further on.
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const uint16_t* row = w0 + r * k + c;
            if constexpr (P == Prefetch::kRowAhead) {
                _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes, _MM_HINT_T0);
            }
            const __m512bh wv = as_bh(_mm512_loadu_si512(row));
#pragma GCC unroll 16
            for (int t = 0; t < T; ++t) {
                acc[r][t][0] = _mm512_dpbf16_ps(acc[r][t][0], wv, xh[t]);
                acc[r][t][A - 1] = _mm512_dpbf16_ps(acc[r][t][A - 1], wv, xl[t]);
            }
        }
    }
    if (c < k) {
        const __mmask32 m = mask32(k - c);
        __m512bh xh[T], xl[T];
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            xh[t] = as_bh(_mm512_loadu_si512(hi + t * kp + c));  // Zero padded to kp.
            xl[t] = as_bh(_mm512_loadu_si512(lo + t * kp + c));
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const __m512bh wv = as_bh(_mm512_maskz_loadu_epi16(m, w0 + r * k + c));
#pragma GCC unroll 16
            for (int t = 0; t < T; ++t) {
                acc[r][t][0] = _mm512_dpbf16_ps(acc[r][t][0], wv, xh[t]);
                acc[r][t][A - 1] = _mm512_dpbf16_ps(acc[r][t][A - 1], wv, xl[t]);
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
            y[t * ldy + r] = _mm512_reduce_add_ps(s);
        }
    }
}

template <int R>
inline void rows_block(const uint16_t* w0, int64_t k, const uint16_t* hi, const uint16_t* lo,
                       int64_t kp, int64_t n, float* y, int64_t ldy) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
        block<R, 4>(w0, k, hi + t * kp, lo + t * kp, kp, y + t * ldy, ldy);
    }
    switch (n - t) {
        case 3:
            block<R, 3>(w0, k, hi + t * kp, lo + t * kp, kp, y + t * ldy, ldy);
            break;
        case 2:
            block<R, 2>(w0, k, hi + t * kp, lo + t * kp, kp, y + t * ldy, ldy);
            break;
        case 1:
            block<R, 1>(w0, k, hi + t * kp, lo + t * kp, kp, y + t * ldy, ldy);
            break;
        default:
            break;
    }
}

// Rows [0, rows) of one weight for n tokens (split activations hi/lo with stride kp): the first
// token group streams the rows with the cursor, later groups re-read them from cache.
inline void rows_cursor(const uint16_t* w, int64_t rows, int64_t k, const uint16_t* hi,
                        const uint16_t* lo, int64_t kp, int64_t n, float* y, int64_t ldy,
                        PrefetchCursor* pf) {
    constexpr auto kC = Prefetch::kCursor;
    constexpr auto kN = Prefetch::kNone;
    const int64_t t1 = n < 4 ? n : 4;
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        const uint16_t* w0 = w + r * k;
        float* yr = y + r;
        switch (t1) {
            case 4:
                block<4, 4, kC>(w0, k, hi, lo, kp, yr, ldy, pf);
                break;
            case 3:
                block<4, 3, kC>(w0, k, hi, lo, kp, yr, ldy, pf);
                break;
            case 2:
                block<4, 2, kC>(w0, k, hi, lo, kp, yr, ldy, pf);
                break;
            default:
                block<4, 1, kC>(w0, k, hi, lo, kp, yr, ldy, pf);
                break;
        }
        int64_t t = t1;
        for (; t + 4 <= n; t += 4) {
            block<4, 4, kN>(w0, k, hi + t * kp, lo + t * kp, kp, yr + t * ldy, ldy);
        }
        switch (n - t) {
            case 3:
                block<4, 3, kN>(w0, k, hi + t * kp, lo + t * kp, kp, yr + t * ldy, ldy);
                break;
            case 2:
                block<4, 2, kN>(w0, k, hi + t * kp, lo + t * kp, kp, yr + t * ldy, ldy);
                break;
            case 1:
                block<4, 1, kN>(w0, k, hi + t * kp, lo + t * kp, kp, yr + t * ldy, ldy);
                break;
            default:
                break;
        }
    }
    for (; r < rows; ++r) {
        rows_block<1>(w + r * k, k, hi, lo, kp, n, y + r, ldy);
    }
}

// Distance the expert kernel's prefetch cursor runs ahead of the weight reads. A 4-row block of a
// 1024-wide BF16 matrix is 8 KiB read in parallel, so the lead over a block's last row is this
// minus about 6 KiB.
int64_t expert_prefetch_bytes() {
    static const int64_t bytes = [] {
        const char* e = std::getenv("EDGE_EXPERT_PREFETCH");
        return e != nullptr ? std::atoll(e) : int64_t{16384};
    }();
    return bytes;
}

}  // namespace

void swiglu_bf16_avx512bf16(const SwiGluJob& j, const SwiGluJob* next) {
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
    const int64_t ahead = expert_prefetch_bytes();
    PrefetchCursor pf;
    pf.add(gate, inter * in * 2);
    pf.add(up, inter * in * 2);
    pf.add(down, out * inter * 2);
    if (next != nullptr) {
        pf.add(next->gate->data, std::min<int64_t>(ahead, next->gate->rows * next->gate->cols * 2));
    }
    pf.start(ahead);
    float* g = buf.data();
    float* u = g + group * inter;
    float* act = u + group * inter;
    for (int64_t t0 = 0; t0 < j.n; t0 += group) {
        const int64_t nt = j.n - t0 < group ? j.n - t0 : group;
        uint16_t* hi = split.data();
        uint16_t* lo = hi + nt * inp;
        split_activations_bf16(j.x + t0 * in, nt, in, inp, hi, lo);
        rows_cursor(gate, inter, in, hi, lo, inp, nt, g, inter, &pf);
        rows_cursor(up, inter, in, hi, lo, inp, nt, u, inter, &pf);
        silu_mul(g, u, nt * inter, act);
        lo = hi + nt * interp;
        split_activations_bf16(act, nt, inter, interp, hi, lo);
        rows_cursor(down, out, inter, hi, lo, interp, nt, j.y + t0 * j.ldy, j.ldy, &pf);
    }
}

void matmul_bf16_avx512bf16(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                            int64_t r0, int64_t r1) {
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
        split_activations_bf16(x + t0 * k, nt, k, kp, hi, lo);
        float* yt = y + t0 * ldy;
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) {
            rows_block<4>(base + r * k, k, hi, lo, kp, nt, yt + r, ldy);
        }
        for (; r < r1; ++r) {
            rows_block<1>(base + r * k, k, hi, lo, kp, nt, yt + r, ldy);
        }
    }
}

}  // namespace edge::engine::cpu
