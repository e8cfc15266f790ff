// Multi-token products with BF16 weights on AMX tiles (Isa::kAmxBf16): each TDPBF16PS multiplies
// a 16 x 32 bf16 tile by a 32 x 16 one into a 16 x 16 f32 tile, 8192 products per instruction.
//
// The product is computed transposed, C^T = W . X^T, so the weights are read as they are stored:
// a tile of A is 16 weight rows x 32 columns, loaded straight from the row-major matrix with the
// row stride; B is the activations in the pair-interleaved ("VNNI") layout TDPBF16PS wants, 16
// column pairs x 16 tokens, made once per call by to_amx_layout (Bf16Activations::amx_hi/amx_lo)
// and shared by every row range. Per row range: pairs of 16-row blocks against pairs of 16-token
// groups (four accumulator tiles, two A and two B tiles: all eight tile registers), columns in
// chunks of 32 in order; with kExact activations (hi + lo) each chunk adds the lo product after
// the hi one. Every output element is the same sum whatever block or range it falls in (a block
// past the weight's last row, and a last chunk past its last column, are read from a zero-padded
// copy), so a split of the rows over the pool gives the same bits as one call.
//
// Error: as matmul_bf16_avx512bf16(_bf16act): products of bf16 values are exact in f32 and summed
// in f32 (the tile unit flushes denormals), so the same bounds hold (matmul_kernels.h).
//
// Needs the kernel's permission to use tile data (arch_prctl ARCH_REQ_XCOMP_PERM), which
// amx_bf16_usable() (matmul.cc) requests once; detect_isa() picks kAmxBf16 only when granted.

#include <immintrin.h>

#include <cstring>

#include "engine/cpu/matmul_kernels.h"
#include "engine/quant/quant_kernels.h"

namespace edge::engine::cpu {
namespace {

constexpr int64_t kTile = kAmxGroup;  // Weight rows per A tile, tokens per B tile.
constexpr int64_t kChunk = 32;      // Columns per tile step (16 pairs).
constexpr int64_t kBlockElems = kTile * kChunk;  // bf16 elements of one B tile (1 KiB).

// LDTILECFG's 64 bytes (palette 1). No member initializers: a constructor could be emitted as a
// weak symbol (isa_objects_check.sh).
struct alignas(64) TileConfig {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

// Where one 16-row block's A tiles come from: the weight itself, a zero-padded copy, or a
// quantized weight's rows decoded to bf16 (hi, and lo with exact activations).
struct RowSource {
    const uint16_t* rows = nullptr;  // Row r of the block at rows + r * stride.
    int64_t stride = 0;              // Elements.
    const uint16_t* tail = nullptr;  // The last chunk (16 x 32, stride 32) when k % 32 != 0.
    const uint16_t* lo = nullptr;    // Decoded weights' residual rows (same stride, no tail).
};

// Loads A tile kReg (tmm4 or tmm5) from `from`, rows `stride_bytes` apart. (The intrinsics take
// the register as a literal: it is spelled out for each.)
template <int kReg>
inline __attribute__((always_inline)) void load_a(const uint16_t* from, int64_t stride_bytes) {
    static_assert(kReg == 4 || kReg == 5, "A tiles are tmm4 and tmm5");
    if constexpr (kReg == 4) {
        _tile_loadd(4, from, stride_bytes);
    } else {
        _tile_loadd(5, from, stride_bytes);
    }
}

// Loads chunk c of a row block into A tile kReg (the last chunk from its padded copy, if any).
template <int kReg>
inline __attribute__((always_inline)) void load_rows(const RowSource& src, int64_t c,
                                                     int64_t chunks) {
    const bool tail = c == chunks - 1 && src.tail != nullptr;
    load_a<kReg>(tail ? src.tail : src.rows + c * kChunk, (tail ? kChunk : src.stride) * 2);
}

// Loads chunk c of a decoded block's residual rows (RowSource::lo) into A tile kReg.
template <int kReg>
inline __attribute__((always_inline)) void load_lo_rows(const RowSource& src, int64_t c) {
    load_a<kReg>(src.lo + c * kChunk, src.stride * 2);
}

// Loads the B tiles (tmm6/7) of chunk c for token groups g0 (and g0 + 1) from `layout`
// (amx_hi or amx_lo) and adds their products with the A tiles (tmm4/5) to the accumulators.
template <int kBlocks, int kGroups>
inline __attribute__((always_inline)) void products(const uint16_t* layout, int64_t chunks,
                                                    int64_t g0, int64_t c) {
    const uint16_t* b = layout + (g0 * chunks + c) * kBlockElems;
    _tile_loadd(6, b, kTile * 4);
    if constexpr (kGroups > 1) {
        _tile_loadd(7, b + chunks * kBlockElems, kTile * 4);  // Group g0 + 1, same chunk.
    }
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kGroups > 1) {
        _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (kBlocks > 1) {
        _tile_dpbf16ps(2, 5, 6);
        if constexpr (kGroups > 1) {
            _tile_dpbf16ps(3, 5, 7);
        }
    }
}

// 4 accumulators (C0..C3), A in tmm4/5, B in tmm6/7. kBlocks row blocks x kGroups token groups.
// kLo: the activations' lo product too; kWeightLo: the weights' residual rows times the hi
// activations too (the lo x lo product, up to 2^-16 of each term, is left out).
template <int kBlocks, int kGroups, bool kLo, bool kWeightLo>
void tile_block(const RowSource* src, const Bf16Activations& a, int64_t g0, float* out) {
    const int64_t chunks = a.kp / kChunk;
    _tile_zero(0);
    if constexpr (kGroups > 1) {
        _tile_zero(1);
    }
    if constexpr (kBlocks > 1) {
        _tile_zero(2);
        if constexpr (kGroups > 1) {
            _tile_zero(3);
        }
    }
    for (int64_t c = 0; c < chunks; ++c) {
        load_rows<4>(src[0], c, chunks);
        if constexpr (kBlocks > 1) {
            load_rows<5>(src[1], c, chunks);
        }
        products<kBlocks, kGroups>(a.amx_hi, chunks, g0, c);
        if constexpr (kLo) {
            products<kBlocks, kGroups>(a.amx_lo, chunks, g0, c);
        }
        if constexpr (kWeightLo) {
            load_lo_rows<4>(src[0], c);
            if constexpr (kBlocks > 1) {
                load_lo_rows<5>(src[1], c);
            }
            products<kBlocks, kGroups>(a.amx_hi, chunks, g0, c);
        }
    }
    // out: [block][group][16 rows][16 tokens].
    _tile_stored(0, out, kTile * 4);
    if constexpr (kGroups > 1) {
        _tile_stored(1, out + kTile * kTile, kTile * 4);
    }
    if constexpr (kBlocks > 1) {
        _tile_stored(2, out + 2 * kTile * kTile, kTile * 4);
        if constexpr (kGroups > 1) {
            _tile_stored(3, out + 3 * kTile * kTile, kTile * 4);
        }
    }
}

// r[i] (16 floats, or 16 32-bit pairs) as row i of a 16 x 16 matrix -> out[j] = its column j.
// 32-bit then 64-bit unpacks within 128-bit lanes, then lane shuffles.
inline void transpose16(__m512* r, __m512* out) {
    // out[2j], out[2j + 1]: rows 2j and 2j + 1 interleaved (columns 4L, 4L + 1 and 4L + 2,
    // 4L + 3 of each 128-bit lane L).
    for (int j = 0; j < 8; ++j) {
        out[2 * j] = _mm512_unpacklo_ps(r[2 * j], r[2 * j + 1]);
        out[2 * j + 1] = _mm512_unpackhi_ps(r[2 * j], r[2 * j + 1]);
    }
    // r[4g + m], lane L: column 4L + m of rows 4g .. 4g + 3.
    for (int g = 0; g < 4; ++g) {
        const __m512d a = _mm512_castps_pd(out[4 * g]), b = _mm512_castps_pd(out[4 * g + 2]);
        const __m512d c = _mm512_castps_pd(out[4 * g + 1]), d = _mm512_castps_pd(out[4 * g + 3]);
        r[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    // Column 4L + m gathers lane L of r[m], r[4 + m], r[8 + m], r[12 + m].
    for (int m = 0; m < 4; ++m) {
        const __m512 p01 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x44);
        const __m512 q01 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x44);
        const __m512 p23 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xEE);
        const __m512 q23 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xEE);
        out[m] = _mm512_shuffle_f32x4(p01, q01, 0x88);
        out[4 + m] = _mm512_shuffle_f32x4(p01, q01, 0xDD);
        out[8 + m] = _mm512_shuffle_f32x4(p23, q23, 0x88);
        out[12 + m] = _mm512_shuffle_f32x4(p23, q23, 0xDD);
    }
}

inline __mmask16 first_lanes(int64_t n) {
    return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// Copies one 16 x 16 accumulator tile (row i: weight row row0 + i for 16 tokens) into y
// transposed: token t0 + t's `rows` outputs at y + (t0 + t) * ldy + row0, for t < toks.
inline void store_transposed(const float* tile, float* y, int64_t ldy, int64_t row0, int64_t rows,
                             int64_t t0, int64_t toks) {
    __m512 r[16], cols[16];
    for (int i = 0; i < 16; ++i) {
        r[i] = _mm512_load_ps(tile + i * kTile);
    }
    transpose16(r, cols);
    const __mmask16 mask = first_lanes(rows);
    for (int64_t t = 0; t < toks; ++t) {
        _mm512_mask_storeu_ps(y + (t0 + t) * ldy + row0, mask, cols[t]);
    }
}

template <bool kLo, bool kWeightLo>
void dispatch_block(int blocks, int groups, const RowSource* src, const Bf16Activations& a,
                    int64_t g0, float* out) {
    if (blocks == 2) {
        groups == 2 ? tile_block<2, 2, kLo, kWeightLo>(src, a, g0, out)
                    : tile_block<2, 1, kLo, kWeightLo>(src, a, g0, out);
    } else {
        groups == 2 ? tile_block<1, 2, kLo, kWeightLo>(src, a, g0, out)
                    : tile_block<1, 1, kLo, kWeightLo>(src, a, g0, out);
    }
}

// Rows [r0, r1) of the product in pairs of 16-row blocks: fill(first, b, &src) says where block
// b (0 or 1) of a pair, starting at row `first`, has its A tiles, then each pair of token groups
// runs on the tiles and is copied out to y. `weight_lo`: every block has RowSource::lo.
template <class Fill>
void run_row_blocks(const Bf16Activations& a, bool weight_lo, float* y, int64_t ldy, int64_t r0,
                    int64_t r1, Fill&& fill) {
    TileConfig cfg;
    std::memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = kTile;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    const int64_t groups = (a.n + kTile - 1) / kTile;
    alignas(64) float out[4 * kTile * kTile];
    for (int64_t rb = r0; rb < r1; rb += 2 * kTile) {
        const int blocks = rb + kTile < r1 ? 2 : 1;
        RowSource src[2];
        for (int b = 0; b < blocks; ++b) {
            fill(rb + b * kTile, b, &src[b]);
        }
        for (int64_t g = 0; g < groups; g += 2) {
            const int g_count = g + 1 < groups ? 2 : 1;
            if (a.amx_lo == nullptr) {
                dispatch_block<false, false>(blocks, g_count, src, a, g, out);
            } else if (weight_lo) {
                dispatch_block<true, true>(blocks, g_count, src, a, g, out);
            } else {
                dispatch_block<true, false>(blocks, g_count, src, a, g, out);
            }
            for (int b = 0; b < blocks; ++b) {
                for (int gi = 0; gi < g_count; ++gi) {
                    const float* tile = out + (b * 2 + gi) * kTile * kTile;
                    const int64_t row0 = rb + b * kTile;
                    const int64_t rows = min_i64(kTile, r1 - row0);
                    const int64_t t0 = (g + gi) * kTile;
                    store_transposed(tile, y, ldy, row0, rows, t0, min_i64(kTile, a.n - t0));
                }
            }
        }
    }
    _tile_release();
}

}  // namespace

int64_t amx_activation_elements(int64_t n, int64_t k) {
    const int64_t kp = (k + kChunk - 1) / kChunk * kChunk;
    const int64_t groups = (n + kTile - 1) / kTile;
    return groups * (kp / kChunk) * kBlockElems;
}

void to_amx_layout(const uint16_t* rows, int64_t n, int64_t kp, uint16_t* out) {
    const int64_t chunks = kp / kChunk;
    const int64_t groups = (n + kTile - 1) / kTile;
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t tokens = min_i64(kTile, n - g * kTile);
        for (int64_t c = 0; c < chunks; ++c) {
            // Token tl's 16 column pairs of the chunk as row tl; its transpose is the block:
            // row p holds pair p of the 16 tokens (zero past n).
            __m512 r[16], pairs[16];
            for (int64_t tl = 0; tl < kTile; ++tl) {
                r[tl] = tl < tokens ? _mm512_loadu_ps(rows + (g * kTile + tl) * kp + c * kChunk)
                                    : _mm512_setzero_ps();
            }
            transpose16(r, pairs);
            float* block = reinterpret_cast<float*>(out + (g * chunks + c) * kBlockElems);
            for (int p = 0; p < 16; ++p) {
                _mm512_storeu_ps(block + p * kTile, pairs[p]);
            }
        }
    }
}

void matmul_bf16_amx_prepared(const Weight& w, const Bf16Activations& a, float* y, int64_t ldy,
                              int64_t r0, int64_t r1) {
    if (a.n <= 0 || a.k <= 0 || r0 >= r1) {
        return;
    }
    const auto* base = static_cast<const uint16_t*>(w.data);
    const int64_t k = a.k;
    const int64_t kp = a.kp;
    const bool tail_cols = k % kChunk != 0;
    // Per block: a zero-padded copy of rows past the weight's end (16 x kp) and of the last chunk.
    auto* pad = static_cast<uint16_t*>(kernel_scratch(0, 2 * (kTile * kp + kTile * kChunk) * 2));
    run_row_blocks(a, false, y, ldy, r0, r1, [&](int64_t first, int b, RowSource* src) {
        uint16_t* padded = pad + b * (kTile * kp + kTile * kChunk);
        uint16_t* tail = padded + kTile * kp;
        if (first + kTile <= w.rows) {
            src->rows = base + first * k;
            src->stride = k;
            if (tail_cols) {
                const int64_t c0 = kp - kChunk;
                for (int64_t r = 0; r < kTile; ++r) {
                    std::memset(tail + r * kChunk, 0, kChunk * 2);
                    std::memcpy(tail + r * kChunk, src->rows + r * k + c0, (k - c0) * 2);
                }
                src->tail = tail;
            }
        } else {
            // The weight's last rows: zero-padded to 16 rows and kp columns.
            std::memset(padded, 0, kTile * kp * 2);
            for (int64_t r = 0; first + r < w.rows; ++r) {
                std::memcpy(padded + r * kp, base + (first + r) * k, k * 2);
            }
            src->rows = padded;
            src->stride = kp;
        }
    });
}

void matmul_quant_amx_prepared(const Weight& w, const Bf16Activations& a, float* y, int64_t ldy,
                               int64_t r0, int64_t r1) {
    if (a.n <= 0 || a.k <= 0 || r0 >= r1) {
        return;
    }
    const bool split = a.amx_lo != nullptr;
    const int64_t kp = a.kp;
    const int64_t block_elems = (split ? 2 : 1) * kTile * kp;  // One block's hi (and lo) rows.
    auto* decoded = static_cast<uint16_t*>(kernel_scratch(0, 2 * block_elems * 2));
    run_row_blocks(a, split, y, ldy, r0, r1, [&](int64_t first, int b, RowSource* src) {
        uint16_t* hi = decoded + b * block_elems;
        uint16_t* lo = split ? hi + kTile * kp : nullptr;
        quant::decode_rows_bf16(w, first, kTile, kp, hi, lo);
        src->rows = hi;
        src->stride = kp;
        src->lo = lo;
    });
}

}  // namespace edge::engine::cpu
