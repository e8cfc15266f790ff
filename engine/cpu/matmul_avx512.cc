// AVX-512 float matmul kernels. This file is compiled with AVX-512 flags (engine/CMakeLists.txt)
// and is only called after cpuid says the CPU has AVX-512F/BW/VL; everything in it has internal
// linkage so no AVX-512 code leaks into shared inline functions.

#include <immintrin.h>

#include "engine/cpu/matmul_kernels.h"

namespace edge::engine::cpu {
namespace {

// Bytes ahead of the current column that each row prefetches in the one-token (decode) loop: into
// L1 a little ahead of the loads, into L2 far enough to cover memory latency and across 4 KiB
// pages (as matmul_avx512_bf16.cc's streams, see there). bench_matvec, 2 threads, three runs:
// 8 KiB into L1 alone 0.68-0.69 of the probe, 512 B into L1 and 8 KiB into L2 0.77-0.91.
constexpr int64_t kL1PrefetchBytes = 512;
constexpr int64_t kL2PrefetchBytes = 8192;

// Loads 16 weights starting at element `c` of a row as f32; the masked form reads only `m` lanes.
struct LoadF32 {
    static __m512 load(const void* row, int64_t c) {
        return _mm512_loadu_ps(static_cast<const float*>(row) + c);
    }
    static __m512 load_mask(const void* row, int64_t c, __mmask16 m) {
        return _mm512_maskz_loadu_ps(m, static_cast<const float*>(row) + c);
    }
    static constexpr int64_t kBytes = 4;
};

struct LoadBF16 {
    // bf16 is the top half of an f32: widen to 32 bits and shift into place.
    static __m512 load(const void* row, int64_t c) {
        __m256i h = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + c));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static __m512 load_mask(const void* row, int64_t c, __mmask16 m) {
        __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(row) + c);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static constexpr int64_t kBytes = 2;
};

struct LoadF16 {
    static __m512 load(const void* row, int64_t c) {
        __m256i h = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + c));
        return _mm512_cvtph_ps(h);
    }
    static __m512 load_mask(const void* row, int64_t c, __mmask16 m) {
        __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(row) + c);
        return _mm512_cvtph_ps(h);
    }
    static constexpr int64_t kBytes = 2;
};

// R rows by T tokens: R*T accumulators; each weight vector loaded once is used for T tokens.
template <typename L, int R, int T>
__attribute__((always_inline)) inline void block(const char* w0, int64_t row_bytes, const float* x, int64_t k, float* y,
                  int64_t ldy) {
    __m512 acc[R][T];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        #pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            acc[r][t] = _mm512_setzero_ps();
        }
    }
    int64_t c = 0;
    if constexpr (T == 1) {
        // Decode: two vectors per row per step, more loads in flight for the memory system.
        __m512 acc2[R];
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            acc2[r] = _mm512_setzero_ps();
        }
        for (; c + 32 <= k; c += 32) {
            __m512 xa = _mm512_loadu_ps(x + c);
            __m512 xb = _mm512_loadu_ps(x + c + 16);
            #pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                const char* row = w0 + r * row_bytes;
                // One 64-byte line per row per 32 columns (two for f32), fetched ahead and across
                // 4 KiB pages, where the hardware prefetchers stop.
                const char* at = row + c * L::kBytes;
                _mm_prefetch(at + kL1PrefetchBytes, _MM_HINT_T0);
                _mm_prefetch(at + kL2PrefetchBytes, _MM_HINT_T1);
                if constexpr (L::kBytes == 4) {
                    _mm_prefetch(at + kL1PrefetchBytes + 64, _MM_HINT_T0);
                    _mm_prefetch(at + kL2PrefetchBytes + 64, _MM_HINT_T1);
                }
                acc[r][0] = _mm512_fmadd_ps(L::load(row, c), xa, acc[r][0]);
                acc2[r] = _mm512_fmadd_ps(L::load(row, c + 16), xb, acc2[r]);
            }
        }
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            acc[r][0] = _mm512_add_ps(acc[r][0], acc2[r]);
        }
    }
    for (; c + 16 <= k; c += 16) {
        __m512 xv[T];
        #pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            xv[t] = _mm512_loadu_ps(x + t * k + c);
        }
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            __m512 wv = L::load(w0 + r * row_bytes, c);
            #pragma GCC unroll 16
            for (int t = 0; t < T; ++t) {
                acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
    }
    if (c < k) {
        __mmask16 m = static_cast<__mmask16>((1u << (k - c)) - 1u);
        __m512 xv[T];
        #pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            xv[t] = _mm512_maskz_loadu_ps(m, x + t * k + c);
        }
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            __m512 wv = L::load_mask(w0 + r * row_bytes, c, m);
            #pragma GCC unroll 16
            for (int t = 0; t < T; ++t) {
                acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        #pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}

template <typename L, int R>
inline void rows_block(const char* w0, int64_t row_bytes, const float* x, int64_t n, int64_t k,
                       float* y, int64_t ldy) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
        block<L, R, 4>(w0, row_bytes, x + t * k, k, y + t * ldy, ldy);
    }
    switch (n - t) {
        case 3:
            block<L, R, 3>(w0, row_bytes, x + t * k, k, y + t * ldy, ldy);
            break;
        case 2:
            block<L, R, 2>(w0, row_bytes, x + t * k, k, y + t * ldy, ldy);
            break;
        case 1:
            block<L, R, 1>(w0, row_bytes, x + t * k, k, y + t * ldy, ldy);
            break;
        default:
            break;
    }
}

template <typename L>
void matmul(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy, int64_t r0,
            int64_t r1) {
    const int64_t k = w.cols;
    const int64_t row_bytes = k * L::kBytes;
    const char* base = static_cast<const char*>(w.data);
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        rows_block<L, 4>(base + r * row_bytes, row_bytes, x, n, k, y + r, ldy);
    }
    for (; r < r1; ++r) {
        rows_block<L, 1>(base + r * row_bytes, row_bytes, x, n, k, y + r, ldy);
    }
}

}  // namespace

void matmul_f32_avx512(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                       int64_t r0, int64_t r1) {
    matmul<LoadF32>(w, x, n, y, ldy, r0, r1);
}

void matmul_bf16_avx512(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                        int64_t r0, int64_t r1) {
    matmul<LoadBF16>(w, x, n, y, ldy, r0, r1);
}

void matmul_f16_avx512(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                       int64_t r0, int64_t r1) {
    matmul<LoadF16>(w, x, n, y, ldy, r0, r1);
}

}  // namespace edge::engine::cpu
