// FP8 E4M3 (128 x 128 block scales) with AVX512_BF16 dot products. Every finite E4M3 value is
// exactly a bf16 (3 mantissa bits), so 32 weights are converted to bf16 with a few integer ops
// and go straight into vdpbf16ps against the activations split into hi + lo bf16 pairs
// (engine/cpu/bf16_split.h): per 32 weights, ~8 integer ops and two dot products per token,
// against two F16 conversions and two f32 FMAs per token for the F16-decode kernel, so decode is
// memory-bound again. Functions carry target attributes; quant_kernels.cc calls them only after
// cpuid reports avx512_bf16.

#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/cpu/bf16_split.h"
#include "engine/quant/fp8.h"
#include "engine/quant/kernels_internal.h"
#include "engine/quant/kernels_x86.h"
#include "engine/quant/quant_kernels.h"
#include "engine/quant/quantized_weight.h"

#define EDGE_AVX512_BF16 \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c,avx2")))
#define EDGE_AVX512_BF16_VBMI                                                       \
    __attribute__((                                                                 \
        target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,fma,f16c," \
               "avx2")))

namespace edge::engine::quant::detail {
namespace {

// bf16 bits of the E4M3 subnormals (magnitude codes 0..7: m * 2^-9), indexed by code; the other
// 24 entries are unused. Normal codes (8..126) are converted arithmetically: the bf16 exponent is
// the E4M3 exponent + 120 and the 3 mantissa bits move up by 4.
struct SubnormalTable {
    alignas(64) uint16_t bits[32];
};

const SubnormalTable& subnormal_table() {
    static const SubnormalTable table = [] {
        SubnormalTable t{};
        const float* decode = fp8_e4m3_table();
        for (int m = 0; m < 8; ++m) {
            t.bits[m] = static_cast<uint16_t>(std::bit_cast<uint32_t>(decode[m]) >> 16);
        }
        return t;
    }();
    return table;
}

// 32 E4M3 bytes -> 32 bf16 of the same values (NaN codes never reach a kernel: load rejects them).
EDGE_AVX512_BF16 EDGE_INLINE void fp8x32_to_bf16(__m256i bytes, __m512i subnormals, __m512bh* out) {
    const __m512i v = _mm512_cvtepu8_epi16(bytes);
    const __m512i mag = _mm512_and_si512(v, _mm512_set1_epi16(0x7F));
    __m512i bits = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(120 << 7));
    const __mmask32 sub = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8));
    bits = _mm512_mask_permutexvar_epi16(bits, sub, mag, subnormals);
    // bits | (v << 8 & 0x8000): the byte's sign bit to the bf16's.
    bits = _mm512_ternarylogic_epi32(bits, _mm512_slli_epi16(v, 8),
                                     _mm512_set1_epi16(static_cast<int16_t>(0x8000)), 0xF8);
    *out = reinterpret_cast<__m512bh>(bits);  // A vector cast: the same 64 bytes.
}

// Rows [row_begin, row_end) for T tokens whose activations are split into hi/lo (rows of kp).
template <int T>
EDGE_AVX512_BF16 void fp8_bf16_rows(const Weight& w, const uint16_t* hi, const uint16_t* lo,
                                    int64_t kp, float* y, int64_t ldy, int64_t row_begin,
                                    int64_t row_end) {
    const int64_t cols = w.cols;
    const int64_t block_cols = (cols + 127) / 128;
    const __m512i subnormals = _mm512_load_si512(subnormal_table().bits);
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols;
        const float* srow = w.scales + (r / 128) * block_cols;
        __m512 acc[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            acc[t] = _mm512_setzero_ps();
        }
        for (int64_t b = 0; b < block_cols; ++b) {
            const int64_t c0 = b * 128;
            const int64_t end = c0 + 128 < cols ? c0 + 128 : cols;
            prefetch_ahead(q + c0);
            prefetch_ahead(q + c0 + 64);
            // Two chains per token (hi and lo products) for latency.
            __m512 ph[T], pl[T];
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) {
                ph[t] = _mm512_setzero_ps();
                pl[t] = _mm512_setzero_ps();
            }
            for (int64_t c = c0; c < end; c += 32) {
                const __m256i raw =
                    end - c >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + c))
                                  : _mm256_maskz_loadu_epi8(mask32(end - c), q + c);  // Zero: +0.0.
                __m512bh wv;
                fp8x32_to_bf16(raw, subnormals, &wv);
#pragma GCC unroll 4
                for (int t = 0; t < T; ++t) {
                    // hi/lo are zero padded to kp, so a tail's extra lanes add 0 * 0.
                    ph[t] = _mm512_dpbf16_ps(
                        ph[t], wv, reinterpret_cast<__m512bh>(_mm512_loadu_si512(hi + t * kp + c)));
                    pl[t] = _mm512_dpbf16_ps(
                        pl[t], wv, reinterpret_cast<__m512bh>(_mm512_loadu_si512(lo + t * kp + c)));
                }
            }
            const __m512 scale = _mm512_set1_ps(srow[b]);
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) {
                acc[t] = _mm512_fmadd_ps(_mm512_add_ps(ph[t], pl[t]), scale, acc[t]);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
        }
    }
}

using Bf16RowsFn = void (*)(const Weight&, const uint16_t*, const uint16_t*, int64_t, float*,
                            int64_t, int64_t, int64_t);

// --- Table decode (VBMI) against single-bf16 activations. ---
//
// Every finite E4M3 value is exactly a bf16, so the bf16's high and low bytes are two functions of
// the byte's 7 magnitude bits: two vpermi2b lookups in 128-entry tables give them for 64 weights
// (subnormals exact, vpermi2b ignores bit 7), one ternary-logic op ORs the sign bit into the high
// byte, and two byte unpacks make the 16-bit words. The unpacks work inside 128-bit lanes, so
// word vector w0 holds columns 16L + 0..7 and w1 columns 16L + 8..15 of 128-bit lane L; the
// activations are reordered to match once per call (Bf16Chunk). ~6 integer ops and two dot
// products per 64 weights and token, against ~16 and four for the hi + lo kernel above.

struct Fp8Bf16Tables {
    alignas(64) uint8_t hi[128];  // High byte of the bf16 of magnitude code m (sign clear).
    alignas(64) uint8_t lo[128];  // Low byte.
};

const Fp8Bf16Tables& fp8_bf16_tables() {
    static const Fp8Bf16Tables tables = [] {
        Fp8Bf16Tables t{};
        const float* decode = fp8_e4m3_table();
        for (int m = 0; m < 127; ++m) {  // 0x7F is NaN (rejected on load): left 0.
            const auto bits = static_cast<uint16_t>(std::bit_cast<uint32_t>(decode[m]) >> 16);
            t.hi[m] = static_cast<uint8_t>(bits >> 8);
            t.lo[m] = static_cast<uint8_t>(bits & 0xFF);
        }
        return t;
    }();
    return tables;
}

// One token's activations for 64 columns as bf16 in the order of the decoded weight words.
struct alignas(64) Bf16Chunk {
    uint16_t w0[32];  // Word 8L + j: column 16L + j (L = 0..3, j = 0..7).
    uint16_t w1[32];  // Word 8L + j: column 16L + 8 + j.
};
static_assert(sizeof(Bf16Chunk) == 128, "two cache lines per 64 columns");

// x (cols floats) -> ceil(cols / 64) chunks, each activation rounded to the nearest bf16; columns
// past `cols` are zero.
EDGE_AVX512_BF16_VBMI void prepare_bf16_chunks(const float* x, int64_t cols, Bf16Chunk* chunks) {
    alignas(64) uint16_t idx0[32], idx1[32];
    for (int l = 0; l < 4; ++l) {
        for (int j = 0; j < 8; ++j) {
            idx0[8 * l + j] = static_cast<uint16_t>(16 * l + j);
            idx1[8 * l + j] = static_cast<uint16_t>(16 * l + 8 + j);
        }
    }
    const __m512i order0 = _mm512_load_si512(idx0);
    const __m512i order1 = _mm512_load_si512(idx1);
    const int64_t n_chunks = (cols + 63) / 64;
    for (int64_t k = 0; k < n_chunks; ++k) {
        __m512 v[4];
        for (int i = 0; i < 4; ++i) {
            const int64_t c = k * 64 + i * 16;
            v[i] = c < cols ? _mm512_maskz_loadu_ps(mask16(cols - c), x + c) : _mm512_setzero_ps();
        }
        // Vector casts below: the same 64 bytes.
        const auto a = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v[1], v[0]));  // Cols 0..31.
        const auto b = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v[3], v[2]));  // 32..63.
        _mm512_store_si512(chunks[k].w0, _mm512_permutex2var_epi16(a, order0, b));
        _mm512_store_si512(chunks[k].w1, _mm512_permutex2var_epi16(a, order1, b));
    }
}

// Table registers of the decode.
struct Fp8Bf16Regs {
    __m512i hi0, hi1, lo0, lo1, sign;
};

// 64 weight bytes of chunk k (zeros past the row: code 0 is +0.0) into T tokens' dot products.
template <int T>
EDGE_AVX512_BF16_VBMI EDGE_INLINE void fp8_table_chunk(const Fp8Bf16Regs& g, __m512i raw,
                                                       const Bf16Chunk* prepared, int64_t n_chunks,
                                                       int64_t k, __m512* p0, __m512* p1) {
    const __m512i hb = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(g.hi0, raw, g.hi1), raw,
                                                 g.sign, 0xF8);  // table | (raw & 0x80)
    const __m512i lb = _mm512_permutex2var_epi8(g.lo0, raw, g.lo1);
    const auto w0 = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi8(lb, hb));
    const auto w1 = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi8(lb, hb));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        const Bf16Chunk& a = prepared[t * n_chunks + k];
        p0[t] = _mm512_dpbf16_ps(p0[t], w0, reinterpret_cast<__m512bh>(_mm512_load_si512(a.w0)));
        p1[t] = _mm512_dpbf16_ps(p1[t], w1, reinterpret_cast<__m512bh>(_mm512_load_si512(a.w1)));
    }
}

// Row r for T tokens into acc[T] (not yet reduced).
template <int T>
EDGE_AVX512_BF16_VBMI EDGE_INLINE void fp8_table_row(const Weight& w, const Fp8Bf16Regs& g,
                                                     const Bf16Chunk* prepared, int64_t n_chunks,
                                                     int64_t r, __m512* acc) {
    const int64_t cols = w.cols;
    const int64_t block_cols = (cols + 127) / 128;
    const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols;
    const float* srow = w.scales + (r / 128) * block_cols;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        acc[t] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < block_cols; ++b) {
        const int64_t c0 = b * 128;
        prefetch_ahead(q + c0);
        prefetch_ahead(q + c0 + 64);
        // Two dot-product chains per token for latency; above two tokens the tokens give enough
        // independent chains, and one per token keeps an 8-token tile in registers.
        constexpr int kChains = T <= 2 ? 2 : 1;
        __m512 part[kChains][T];
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            part[0][t] = _mm512_setzero_ps();
            part[kChains - 1][t] = _mm512_setzero_ps();
        }
        __m512* p0 = part[0];
        __m512* p1 = part[kChains - 1];
        if (c0 + 128 <= cols) {
            fp8_table_chunk<T>(g, _mm512_loadu_si512(q + c0), prepared, n_chunks, 2 * b, p0, p1);
            fp8_table_chunk<T>(g, _mm512_loadu_si512(q + c0 + 64), prepared, n_chunks, 2 * b + 1,
                               p0, p1);
        } else {
            fp8_table_chunk<T>(g, _mm512_maskz_loadu_epi8(mask64(cols - c0), q + c0), prepared,
                               n_chunks, 2 * b, p0, p1);
            if (c0 + 64 < cols) {
                fp8_table_chunk<T>(g, _mm512_maskz_loadu_epi8(mask64(cols - c0 - 64), q + c0 + 64),
                                   prepared, n_chunks, 2 * b + 1, p0, p1);
            }
        }
        const __m512 scale = _mm512_set1_ps(srow[b]);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            const __m512 sum = kChains == 2 ? _mm512_add_ps(p0[t], p1[t]) : p0[t];
            acc[t] = _mm512_fmadd_ps(sum, scale, acc[t]);
        }
    }
}

// One token, rows r, r + q, r + 2q and r + 3q at once into acc[4] (not yet reduced): each block's
// chunks of the four rows are interleaved, so eight dot-product chains (two per row) overlap and
// four memory streams run at once. One row at a time the two chains of a row and one stream left
// the kernel at ~21 GB/s per core when streaming, against ~43 in cache.
EDGE_AVX512_BF16_VBMI EDGE_INLINE void fp8_table_four_rows(const Weight& w, const Fp8Bf16Regs& g,
                                                           const Bf16Chunk* prepared,
                                                           int64_t n_chunks, int64_t r, int64_t q,
                                                           __m512* acc) {
    const int64_t cols = w.cols;
    const int64_t block_cols = (cols + 127) / 128;
    const uint8_t* rows[4];
    const float* srow[4];
#pragma GCC unroll 4
    for (int s = 0; s < 4; ++s) {
        rows[s] = static_cast<const uint8_t*>(w.data) + (r + s * q) * cols;
        srow[s] = w.scales + ((r + s * q) / 128) * block_cols;
        acc[s] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < block_cols; ++b) {
        const int64_t c0 = b * 128;
        __m512 p0[4], p1[4];
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
            prefetch_ahead(rows[s] + c0);
            prefetch_ahead(rows[s] + c0 + 64);
            p0[s] = _mm512_setzero_ps();
            p1[s] = _mm512_setzero_ps();
        }
        if (c0 + 128 <= cols) {
#pragma GCC unroll 4
            for (int s = 0; s < 4; ++s) {
                fp8_table_chunk<1>(g, _mm512_loadu_si512(rows[s] + c0), prepared, n_chunks, 2 * b,
                                   &p0[s], &p1[s]);
                fp8_table_chunk<1>(g, _mm512_loadu_si512(rows[s] + c0 + 64), prepared, n_chunks,
                                   2 * b + 1, &p0[s], &p1[s]);
            }
        } else {
            for (int s = 0; s < 4; ++s) {
                fp8_table_chunk<1>(g, _mm512_maskz_loadu_epi8(mask64(cols - c0), rows[s] + c0),
                                   prepared, n_chunks, 2 * b, &p0[s], &p1[s]);
                if (c0 + 64 < cols) {
                    fp8_table_chunk<1>(
                        g, _mm512_maskz_loadu_epi8(mask64(cols - c0 - 64), rows[s] + c0 + 64),
                        prepared, n_chunks, 2 * b + 1, &p0[s], &p1[s]);
                }
            }
        }
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
            acc[s] =
                _mm512_fmadd_ps(_mm512_add_ps(p0[s], p1[s]), _mm512_set1_ps(srow[s][b]), acc[s]);
        }
    }
}

// Rows [row_begin, row_end) for T tokens; `prepared` holds n_chunks chunks per token. Four rows
// at a time share one horizontal reduction.
template <int T>
EDGE_AVX512_BF16_VBMI void fp8_table_rows(const Weight& w, const Bf16Chunk* prepared,
                                          int64_t n_chunks, float* y, int64_t ldy,
                                          int64_t row_begin, int64_t row_end) {
    const Fp8Bf16Tables& tab = fp8_bf16_tables();
    const Fp8Bf16Regs g{_mm512_load_si512(tab.hi), _mm512_load_si512(tab.hi + 64),
                        _mm512_load_si512(tab.lo), _mm512_load_si512(tab.lo + 64),
                        _mm512_set1_epi8(static_cast<char>(0x80))};
    int64_t r = row_begin;
    if constexpr (T == 1) {  // Four streams (rows r + i, r + q + i, ...), one reduction.
        const int64_t q = (row_end - row_begin) / 4;
        prefetch_stream_heads(w.data, w.cols, row_begin, q);
        for (int64_t i = 0; i < q; ++i) {
            __m512 acc[4];
            fp8_table_four_rows(w, g, prepared, n_chunks, row_begin + i, q, acc);
            store_stream_sums(acc, y, row_begin + i, q);
        }
        r = row_begin + 4 * q;
    } else {
        prefetch_start(static_cast<const uint8_t*>(w.data) + row_begin * w.cols,
                       (row_end - row_begin) * w.cols);
    }
    if constexpr (T == 2) {  // Four rows per reduction.
        for (; r + 4 <= row_end; r += 4) {
            __m512 acc[4][T];
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                fp8_table_row<T>(w, g, prepared, n_chunks, r + i, acc[i]);
            }
#pragma GCC unroll 2
            for (int t = 0; t < T; ++t) {
                _mm_storeu_ps(y + t * ldy + r, reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
            }
        }
    }
    for (; r < row_end; ++r) {
        __m512 acc[T];
        fp8_table_row<T>(w, g, prepared, n_chunks, r, acc);
        store_token_sums<T>(acc, y, ldy, r);
    }
}

using TableRowsFn = PreparedRowsFn<Bf16Chunk>;

}  // namespace

void matmul_fp8_avx512_bf16(const Weight& w, const float* x, int64_t n_tokens, float* y,
                            int64_t ldy, int64_t row_begin, int64_t row_end) {
    static constexpr Bf16RowsFn kTiles[kMaxTile] = {fp8_bf16_rows<1>, fp8_bf16_rows<2>,
                                                    fp8_bf16_rows<3>, fp8_bf16_rows<4>};
    const int64_t k = w.cols;
    const int64_t kp = (k + 31) / 32 * 32;
    thread_local std::vector<uint16_t> scratch;
    if (scratch.size() < static_cast<size_t>(2 * kMaxTile * kp)) {
        scratch.resize(static_cast<size_t>(2 * kMaxTile * kp));
    }
    uint16_t* hi = scratch.data();
    uint16_t* lo = hi + kMaxTile * kp;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kMaxTile) {
        const int64_t nt = n_tokens - t0 < kMaxTile ? n_tokens - t0 : kMaxTile;
        cpu::split_activations_bf16(x + t0 * k, nt, k, kp, hi, lo);
        kTiles[nt - 1](w, hi, lo, kp, y + t0 * ldy, ldy, row_begin, row_end);
    }
}

void matmul_fp8_avx512_bf16_vbmi(const Weight& w, const float* x, int64_t n_tokens, float* y,
                                 int64_t ldy, int64_t row_begin, int64_t row_end) {
    constexpr int kTile = 8;  // Tokens one pass over the weights serves.
    static constexpr TableRowsFn kTiles[kTile] = {
        fp8_table_rows<1>, fp8_table_rows<2>, fp8_table_rows<3>, fp8_table_rows<4>,
        fp8_table_rows<5>, fp8_table_rows<6>, fp8_table_rows<7>, fp8_table_rows<8>};
    const int64_t n_chunks = (w.cols + 63) / 64;
    const Bf16Chunk* prepared =
        prepare_tokens<Bf16Chunk>(x, w.cols, n_tokens, n_chunks, prepare_bf16_chunks);
    run_prepared_tiles(kTiles, w, prepared, n_chunks, n_tokens, y, ldy, row_begin, row_end);
}

}  // namespace edge::engine::quant::detail

namespace edge::engine::quant {
namespace {

// Row r of row-major `w` (FP8 block, INT8 row or INT4 group) as f32 values, each the stored value
// times its scale rounded once, as the scalar kernels compute them, into out[0, w.cols).
EDGE_AVX512_BF16 void decode_row_f32(const Weight& w, int64_t r, float* out) {
    const int64_t cols = w.cols;
    switch (w.format) {
        case WeightFormat::kFP8E4M3Block128: {
            const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols;
            const float* block_scales = w.scales + (r / 128) * ((cols + 127) / 128);
            for (int64_t c = 0; c < cols; c += 32) {  // 32 columns never straddle a block.
                const int64_t n = cols - c;
                const __m512i v =
                    _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(detail::mask32(n), q + c));
                __m512 first, second;
                detail::fp8_words_to_f32(v, &first, &second);  // value / 256: exact.
                const __m512 s = _mm512_set1_ps(block_scales[c / 128] * 256.0f);
                _mm512_mask_storeu_ps(out + c, detail::mask16(n), _mm512_mul_ps(first, s));
                if (n > 16) {
                    _mm512_mask_storeu_ps(out + c + 16, detail::mask16(n - 16),
                                          _mm512_mul_ps(second, s));
                }
            }
            return;
        }
        case WeightFormat::kInt8Row: {
            const int8_t* q = static_cast<const int8_t*>(w.data) + r * cols;
            const __m512 s = _mm512_set1_ps(w.scales[r]);
            for (int64_t c = 0; c < cols; c += 16) {
                const __mmask16 m = detail::mask16(cols - c);
                const __m512i v = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, q + c));
                _mm512_mask_storeu_ps(out + c, m, _mm512_mul_ps(_mm512_cvtepi32_ps(v), s));
            }
            return;
        }
        case WeightFormat::kInt4G32:
        case WeightFormat::kInt4G128: {
            // cols is a multiple of the group (32 or 128): 32 columns are one group's.
            const int64_t group = int4_group_size(w.format);
            const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
            const float* group_scales = w.scales + r * (cols / group);
            // Column 2i is byte i's low nibble, 2i + 1 its high one: interleave the two.
            const __m512i first_idx =
                _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
            const __m512i second_idx =
                _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
            const __m512i eight = _mm512_set1_epi32(8);
            for (int64_t c = 0; c < cols; c += 32) {
                const __m512i b = _mm512_cvtepu8_epi32(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c / 2)));
                const __m512 even = _mm512_cvtepi32_ps(
                    _mm512_sub_epi32(_mm512_and_si512(b, _mm512_set1_epi32(15)), eight));
                const __m512 odd =
                    _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(b, 4), eight));
                const __m512 s = _mm512_set1_ps(group_scales[c / group]);
                _mm512_storeu_ps(out + c,
                                 _mm512_mul_ps(_mm512_permutex2var_ps(even, first_idx, odd), s));
                _mm512_storeu_ps(out + c + 16,
                                 _mm512_mul_ps(_mm512_permutex2var_ps(even, second_idx, odd), s));
            }
            return;
        }
        default:
            return;
    }
}

}  // namespace

void decode_rows_bf16(const Weight& w, int64_t r0, int64_t rows, int64_t kp, uint16_t* hi,
                      uint16_t* lo) {
    thread_local std::vector<float> values;
    if (values.size() < static_cast<size_t>(w.cols)) {
        values.resize(static_cast<size_t>(w.cols));
    }
    for (int64_t i = 0; i < rows; ++i) {
        uint16_t* h = hi + i * kp;
        uint16_t* l = lo != nullptr ? lo + i * kp : nullptr;
        if (r0 + i >= w.rows) {
            std::memset(h, 0, static_cast<size_t>(kp) * 2);
            if (l != nullptr) {
                std::memset(l, 0, static_cast<size_t>(kp) * 2);
            }
            continue;
        }
        decode_row_f32(w, r0 + i, values.data());
        if (l != nullptr) {
            cpu::split_activations_bf16(values.data(), 1, w.cols, kp, h, l);
        } else {
            cpu::round_activations_bf16(values.data(), 1, w.cols, kp, h);
        }
    }
}

}  // namespace edge::engine::quant

#endif  // defined(__x86_64__)
