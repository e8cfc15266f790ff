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

// Where one 16-row block's A tiles come from: the weight itself, or a zero-padded copy.
struct RowSource {
    const uint16_t* rows = nullptr;  // Row r of the block at rows + r * stride.
    int64_t stride = 0;              // Elements.
    const uint16_t* tail = nullptr;  // The last chunk (16 x 32, stride 32) when k % 32 != 0.
};

// Loads chunk c of a row block into A tile kReg (the last chunk from its padded copy, if any).
// (The intrinsics take the register as a literal: it is spelled out for each.)
template <int kReg>
inline __attribute__((always_inline)) void load_rows(const RowSource& src, int64_t c,
                                                     int64_t chunks) {
    const bool tail = c == chunks - 1 && src.tail != nullptr;
    const uint16_t* from = tail ? src.tail : src.rows + c * kChunk;
    const int64_t stride = (tail ? kChunk : src.stride) * 2;
    static_assert(kReg == 4 || kReg == 5, "A tiles are tmm4 and tmm5");
    if constexpr (kReg == 4) {
        _tile_loadd(4, from, stride);
    } else {
        _tile_loadd(5, from, stride);
    }
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
template <int kBlocks, int kGroups, bool kLo>
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

template <bool kLo>
void dispatch_block(int blocks, int groups, const RowSource* src, const Bf16Activations& a,
                    int64_t g0, float* out) {
    if (blocks == 2) {
        groups == 2 ? tile_block<2, 2, kLo>(src, a, g0, out)
                    : tile_block<2, 1, kLo>(src, a, g0, out);
    } else {
        groups == 2 ? tile_block<1, 2, kLo>(src, a, g0, out)
                    : tile_block<1, 1, kLo>(src, a, g0, out);
    }
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
        for (int64_t c = 0; c < chunks; ++c) {
            uint16_t* block = out + (g * chunks + c) * kBlockElems;
            for (int64_t tl = 0; tl < kTile; ++tl) {
                const int64_t t = g * kTile + tl;
                for (int64_t p = 0; p < kChunk / 2; ++p) {
                    uint32_t pair = 0;
                    if (t < n) {
                        std::memcpy(&pair, rows + t * kp + c * kChunk + 2 * p, 4);
                    }
                    std::memcpy(block + p * kTile * 2 + tl * 2, &pair, 4);
                }
            }
        }
    }
}

void matmul_bf16_amx_prepared(const Weight& w, const Bf16Activations& a, float* y, int64_t ldy,
                              int64_t r0, int64_t r1) {
    if (a.n <= 0 || a.k <= 0 || r0 >= r1) {
        return;
    }
    TileConfig cfg;
    std::memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = kTile;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    const auto* base = static_cast<const uint16_t*>(w.data);
    const int64_t k = a.k;
    const int64_t kp = a.kp;
    const int64_t groups = (a.n + kTile - 1) / kTile;
    const bool tail_cols = k % kChunk != 0;
    // Per block: a zero-padded copy of rows past the weight's end (16 x kp) and of the last chunk.
    auto* pad = static_cast<uint16_t*>(kernel_scratch(0, 2 * (kTile * kp + kTile * kChunk) * 2));
    alignas(64) float out[4 * kTile * kTile];
    for (int64_t rb = r0; rb < r1; rb += 2 * kTile) {
        const int blocks = rb + kTile < r1 ? 2 : 1;
        RowSource src[2];
        for (int b = 0; b < blocks; ++b) {
            const int64_t first = rb + b * kTile;
            uint16_t* padded = pad + b * (kTile * kp + kTile * kChunk);
            uint16_t* tail = padded + kTile * kp;
            if (first + kTile <= w.rows) {
                src[b].rows = base + first * k;
                src[b].stride = k;
                if (tail_cols) {
                    const int64_t c0 = kp - kChunk;
                    for (int64_t r = 0; r < kTile; ++r) {
                        std::memset(tail + r * kChunk, 0, kChunk * 2);
                        std::memcpy(tail + r * kChunk, src[b].rows + r * k + c0, (k - c0) * 2);
                    }
                    src[b].tail = tail;
                }
            } else {
                // The weight's last rows: zero-padded to 16 rows and kp columns.
                std::memset(padded, 0, kTile * kp * 2);
                for (int64_t r = 0; first + r < w.rows; ++r) {
                    std::memcpy(padded + r * kp, base + (first + r) * k, k * 2);
                }
                src[b].rows = padded;
                src[b].stride = kp;
            }
        }
        for (int64_t g = 0; g < groups; g += 2) {
            const int g_count = g + 1 < groups ? 2 : 1;
            if (a.amx_lo != nullptr) {
                dispatch_block<true>(blocks, g_count, src, a, g, out);
            } else {
                dispatch_block<false>(blocks, g_count, src, a, g, out);
            }
            for (int b = 0; b < blocks; ++b) {
                for (int gi = 0; gi < g_count; ++gi) {
                    const float* tile = out + (b * 2 + gi) * kTile * kTile;
                    const int64_t row0 = rb + b * kTile;
                    const int64_t rows = min_i64(kTile, r1 - row0);
                    const int64_t t0 = (g + gi) * kTile;
                    const int64_t toks = min_i64(kTile, a.n - t0);
                    for (int64_t i = 0; i < rows; ++i) {
                        for (int64_t t = 0; t < toks; ++t) {
                            y[(t0 + t) * ldy + row0 + i] = tile[i * kTile + t];
                        }
                    }
                }
            }
        }
    }
    _tile_release();
}

}  // namespace edge::engine::cpu
