#pragma once

// Helpers shared by the x86 kernel files (kernels_avx2.cc, kernels_avx512.cc,
// kernels_avx512_vnni.cc): target-attribute macros, tail masks and the token-tile driver. Only
// included by those files; plain functions, thread-safe.

#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/cpu/weight.h"

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsic headers as
// "may be used uninitialized" (a known false positive of the reduce/convert intrinsics).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define EDGE_AVX2 __attribute__((target("avx2,fma,f16c")))
#define EDGE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2")))
#define EDGE_AVX512_VBMI \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,fma,f16c,avx2")))
#define EDGE_AVX512_VNNI \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c,avx2")))
// VNNI plus GFNI (the INT4 kernels' one-instruction nibble shift).
#define EDGE_AVX512_VNNI_GFNI                                                 \
    __attribute__((                                                           \
        target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,gfni,fma,f16c," \
               "avx2")))
#define EDGE_INLINE inline __attribute__((always_inline))

namespace edge::engine::quant::detail {

// Tokens one pass over a row serves; each weight chunk is decoded once per tile.
inline constexpr int kMaxTile = 4;

// Bytes ahead of the current weight address that the row loops prefetch: far enough to cover memory
// latency at two threads, and across 4 KiB pages, where the hardware prefetchers stop (the rows
// of a matrix are contiguous, so "ahead" runs on into the next rows). Tuned with bench_matvec /
// bench_decode_quant. engine/cpu's BF16 kernels prefetch a few hundred bytes into L1 and 8 KiB
// into L2 instead (their four streams share L1 sets); that split measured no different here
// (bench_decode_quant on a Zen 4, two runs of 256 B or 512 B / 8 KiB against 8 KiB into L1:
// every format within the runs' spread).
inline constexpr int64_t kPrefetchBytes = 8192;

// Prefetches the cache line kPrefetchBytes past p (a hint: past the mapping it is dropped).
inline __attribute__((always_inline)) void prefetch_ahead(const void* p) {
    _mm_prefetch(static_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}

// Prefetches every cache line of [p, p + bytes) (a side stream, e.g. the scales of a row ahead).
inline __attribute__((always_inline)) void prefetch_span(const void* p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) {
        _mm_prefetch(static_cast<const char*>(p) + b, _MM_HINT_T0);
    }
}

// Prefetches the first kPrefetchBytes of a row range that starts a kernel call: prefetch_ahead
// keeps the lines kPrefetchBytes ahead in flight, but each call starts cold (its first lines
// would otherwise be demand misses one after another while the hardware prefetcher trains).
inline __attribute__((always_inline)) void prefetch_start(const void* p, int64_t bytes) {
    prefetch_span(p, bytes < kPrefetchBytes ? bytes : kPrefetchBytes);
}

// Prefetches the first 2 KiB of each of the four streams of a one-token call (rows row_begin +
// s * q, s = 0..3, of `row_bytes` each): every call starts cold.
inline void prefetch_stream_heads(const void* data, int64_t row_bytes, int64_t row_begin,
                                  int64_t q) {
    for (int s = 0; s < 4 && q > 0; ++s) {
        prefetch_span(static_cast<const uint8_t*>(data) + (row_begin + s * q) * row_bytes,
                      std::min<int64_t>(q * row_bytes, 2048));
    }
}

// Each token's activations prepared by prepare(x_t, cols, chunks_t) into `chunks_per_token` Chunks
// per token, in this thread's scratch (valid until the thread's next call for the same Chunk).
template <typename Chunk, typename Prepare>
const Chunk* prepare_tokens(const float* x, int64_t cols, int64_t n_tokens,
                            int64_t chunks_per_token, Prepare&& prepare) {
    thread_local std::vector<Chunk> scratch;
    if (scratch.size() < static_cast<size_t>(n_tokens * chunks_per_token)) {
        scratch.resize(static_cast<size_t>(n_tokens * chunks_per_token));
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
        prepare(x + t * cols, cols, scratch.data() + t * chunks_per_token);
    }
    return scratch.data();
}

// Masks of the first n lanes (all lanes for n at or above the width).
inline __mmask16 mask16(int64_t n) {
    return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}
inline __mmask32 mask32(int64_t n) {
    return n >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu) : static_cast<__mmask32>((1u << n) - 1);
}
inline __mmask64 mask64(int64_t n) {
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

// Horizontal sums of four vectors: lane i of the result is the sum of the 16 lanes of the i-th
// argument (one reduction tree for four rows instead of four _mm512_reduce_add_ps).
EDGE_AVX512 EDGE_INLINE __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    // 128-bit lanes: [a0+a2, a1+a3, b0+b2, b1+b3] and the same for c, d.
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
    // Lane L holds four partial sums of the L-th argument.
    const __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    // 4x4 transpose-and-add inside the lanes: element 0 of lane L becomes its sum.
    const __m512 s2 = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 s3 = _mm512_add_ps(s2, _mm512_permute_ps(s2, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), s3));
}

// Row r's sums for T tokens (acc[t] reduced, four tokens per reduction) into y[t * ldy + r].
template <int T>
EDGE_AVX512 EDGE_INLINE void store_token_sums(const __m512* acc, float* y, int64_t ldy, int64_t r) {
    int t = 0;
    for (; t + 4 <= T; t += 4) {
        alignas(16) float sums[4];
        _mm_store_ps(sums, reduce4(acc[t], acc[t + 1], acc[t + 2], acc[t + 3]));
        for (int i = 0; i < 4; ++i) {
            y[(t + i) * ldy + r] = sums[i];
        }
    }
    for (; t < T; ++t) {
        y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
    }
}

// One token's sums of four stream rows r, r + q, r + 2q, r + 3q (acc[4], one reduction) into y.
EDGE_AVX512 EDGE_INLINE void store_stream_sums(const __m512* acc, float* y, int64_t r, int64_t q) {
    alignas(16) float out[4];
    _mm_store_ps(out, reduce4(acc[0], acc[1], acc[2], acc[3]));
    for (int s = 0; s < 4; ++s) {
        y[r + s * q] = out[s];
    }
}

// 127 / max|x| of an int8 activation group: 0 for a group under 2^-100 (all but zero), whose
// 127 / m would overflow to inf (0 * inf = NaN, saturating to -128) below about 3.7e-37.
inline float int8_group_inverse(float m) { return m > 0x1p-100f ? 127.0f / m : 0.0f; }

// Bit matrix of vgf2p8affineqb for "byte >> 4": result bit i (i < 4) is input bit i + 4; the
// matrix byte 7 - i selects the input bits of result bit i.
inline constexpr long long kShiftRight4Matrix = 0x1020408000000000LL;

// The VNNI kernels' activations: a token's floats rounded to int8 per group, scale = max|x| / 127
// and x_q = round-to-nearest-even(x * 127 / max|x|) (0 for an all-zero group); columns past
// `cols` read as zero. Vectorized because it runs once per kernel call and thread (a scalar
// version took half the time of a 256-row slice of a 1024-column matrix).

// Columns c0 .. c0 + 63 as one group into q (64 bytes, 64-byte aligned); returns the scale and,
// in *quad_sums, lane j = the sum of x_q over columns 4j .. 4j+3.
EDGE_AVX512_VNNI EDGE_INLINE float quantize_int8_x64(const float* x, int64_t c0, int64_t cols,
                                                     int8_t* q, __m512i* quad_sums) {
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    __m512 v[4];
    __m512 amax = _mm512_setzero_ps();
    for (int i = 0; i < 4; ++i) {
        const int64_t c = c0 + i * 16;
        v[i] = c < cols ? _mm512_maskz_loadu_ps(mask16(cols - c), x + c) : _mm512_setzero_ps();
        amax = _mm512_max_ps(amax, _mm512_and_ps(v[i], abs_mask));
    }
    const float m = _mm512_reduce_max_ps(amax);
    const __m512 inv = _mm512_set1_ps(int8_group_inverse(m));
    for (int i = 0; i < 4; ++i) {
        _mm_store_si128(reinterpret_cast<__m128i*>(q + 16 * i),
                        _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v[i], inv))));
    }
    *quad_sums =
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), _mm512_load_si512(q));
    return m / 127.0f;
}

// Columns c0 .. c0 + 127 in groups of G (32 or 128), split into even columns (0, 2, .., 126: the
// low nibbles of the INT4 layout) and odd ones (64 bytes each, 64-byte aligned); scale[p] is the
// scale of columns 32p .. 32p + 31 (for G = 128 all four equal). Returns lane j = the sum of x_q
// over columns 8j .. 8j+7 (four even and four odd bytes).
template <int G>
EDGE_AVX512_VNNI EDGE_INLINE __m512i quantize_int4_x128(const float* x, int64_t c0, int64_t cols,
                                                        int8_t* even, int8_t* odd,
                                                        float* scale) {
    static_assert(G == 32 || G == 128);
    const __m512i even_idx =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd_idx =
        _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    __m512 v[8];
    for (int i = 0; i < 8; ++i) {
        const int64_t c = c0 + i * 16;
        v[i] = c < cols ? _mm512_maskz_loadu_ps(mask16(cols - c), x + c) : _mm512_setzero_ps();
    }
    __m512 amax[4];
    for (int p = 0; p < 4; ++p) {
        amax[p] = _mm512_max_ps(_mm512_and_ps(v[2 * p], abs_mask),
                                _mm512_and_ps(v[2 * p + 1], abs_mask));
    }
    float m[4];
    if constexpr (G == 32) {
        for (int p = 0; p < 4; ++p) {
            m[p] = _mm512_reduce_max_ps(amax[p]);
        }
    } else {
        m[0] = _mm512_reduce_max_ps(
            _mm512_max_ps(_mm512_max_ps(amax[0], amax[1]), _mm512_max_ps(amax[2], amax[3])));
        m[1] = m[2] = m[3] = m[0];
    }
    for (int p = 0; p < 4; ++p) {  // Columns 32p .. 32p+31 of the chunk.
        scale[p] = m[p] / 127.0f;
        const __m512 s = _mm512_set1_ps(int8_group_inverse(m[p]));
        const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(v[2 * p], s));
        const __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(v[2 * p + 1], s));
        _mm_store_si128(reinterpret_cast<__m128i*>(even + 16 * p),
                        _mm512_cvtsepi32_epi8(_mm512_permutex2var_epi32(a, even_idx, b)));
        _mm_store_si128(reinterpret_cast<__m128i*>(odd + 16 * p),
                        _mm512_cvtsepi32_epi8(_mm512_permutex2var_epi32(a, odd_idx, b)));
    }
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_load_si512(even));
    return _mm512_dpbusd_epi32(sum, ones, _mm512_load_si512(odd));
}

// A kernel body for a fixed tile of tokens over activations prepared per token (n_chunks chunks
// each): the tile's first chunk, n_chunks, y of the tile, ldy, rows [row_begin, row_end).
template <typename Chunk>
using PreparedRowsFn = void (*)(const Weight&, const Chunk*, int64_t, float*, int64_t, int64_t,
                                int64_t);

// Runs tiles[nt - 1] over the tokens in tiles of up to N, each on its tokens' prepared chunks.
template <typename Chunk, size_t N>
inline void run_prepared_tiles(const PreparedRowsFn<Chunk> (&tiles)[N], const Weight& w,
                               const Chunk* prepared, int64_t n_chunks, int64_t n_tokens, float* y,
                               int64_t ldy, int64_t row_begin, int64_t row_end) {
    for (int64_t t0 = 0; t0 < n_tokens; t0 += static_cast<int64_t>(N)) {
        const int64_t nt = std::min<int64_t>(static_cast<int64_t>(N), n_tokens - t0);
        tiles[nt - 1](w, prepared + t0 * n_chunks, n_chunks, y + t0 * ldy, ldy, row_begin,
                      row_end);
    }
}

// A kernel body for a fixed tile of T tokens: rows [row_begin, row_end), x and y of the tile.
using RowsFn = void (*)(const Weight&, const float*, float*, int64_t, int64_t, int64_t);

// Runs `tiles[T-1]` over the tokens in tiles of up to kMaxTile.
inline void run_tiles(const RowsFn (&tiles)[kMaxTile], const Weight& w, const float* x,
                      int64_t n_tokens, float* y, int64_t ldy, int64_t row_begin, int64_t row_end) {
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kMaxTile) {
        const int64_t nt = std::min<int64_t>(kMaxTile, n_tokens - t0);
        tiles[nt - 1](w, x + t0 * w.cols, y + t0 * ldy, ldy, row_begin, row_end);
    }
}

}  // namespace edge::engine::quant::detail

#endif  // defined(__x86_64__)
