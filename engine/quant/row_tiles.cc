#include "engine/quant/row_tiles.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace edge::engine::quant {
namespace {

// Bytes of one row-major row (the B of weight.h's tile formula).
int64_t row_bytes(const Weight& w) { return weight_data_bytes(w.format, 1, w.cols); }

// Scales of one row for the tiled formats (INT4: one per group; INT8: one).
int64_t row_scales(const Weight& w) { return weight_scale_count(w.format, 1, w.cols); }

// The byte a padding row holds: a zero weight (INT4 nibbles store q + 8).
uint8_t zero_byte(WeightFormat format) {
    return format == WeightFormat::kInt8Row ? uint8_t{0} : uint8_t{0x88};
}

}  // namespace

bool row_tiles_support(WeightFormat format, int64_t cols) {
    switch (format) {
        case WeightFormat::kInt4G32:
        case WeightFormat::kInt4G128:
            return cols > 0 && cols % int4_group_size(format) == 0;
        case WeightFormat::kInt8Row:
            return cols > 0 && cols % 4 == 0;
        default:
            return false;  // FP8 and float formats have no tiled kernels (yet).
    }
}

bool row_tiles_by_default(WeightFormat format) {
    return format == WeightFormat::kInt8Row || format == WeightFormat::kInt4G32;
}

Result<QuantizedWeight> tile_rows(const Weight& w, WeightArena* arena) {
    if (w.layout != WeightLayout::kRows || !row_tiles_support(w.format, w.cols) || w.rows <= 0) {
        return invalid_argument_error(
            std::string("tile_rows: ") + weight_format_name(w.format) + " " +
            std::to_string(w.rows) + " x " + std::to_string(w.cols) +
            (w.layout != WeightLayout::kRows ? " is already tiled" : " cannot be tiled"));
    }
    const int64_t tiles = (w.rows + kRowTile - 1) / kRowTile;
    const int64_t bytes = row_bytes(w);  // A multiple of 4 (checked by row_tiles_support).
    const int64_t words = bytes / 4;
    const int64_t per_row = row_scales(w);
    const auto* src = static_cast<const uint8_t*>(w.data);
    // Every byte is written below (padding rows with zero weights): no fill first, which took
    // as long as the copy itself.
    const auto size = static_cast<size_t>(tiles * kRowTile * bytes);
    AlignedBytes data = arena != nullptr ? AlignedBytes(arena->allocate(size), size)
                                         : AlignedBytes(size, AlignedBytes::Uninitialized{});
    std::vector<float> scales(static_cast<size_t>(tiles * kRowTile * per_row), 0.0f);
    uint32_t zero_word;
    std::memset(&zero_word, zero_byte(w.format), 4);
    for (int64_t t = 0; t < tiles; ++t) {
        const int64_t r0 = t * kRowTile;
        const int64_t n = std::min<int64_t>(kRowTile, w.rows - r0);
        // Written in order, one 64-byte vector (word d of the tile's 16 rows) after another; the
        // tile's rows are read as 16 sequential streams.
        uint8_t* tile = data.data() + r0 * bytes;
        for (int64_t d = 0; d < words; ++d) {
            uint8_t* out = tile + d * 64;
            for (int64_t i = 0; i < n; ++i) {
                std::memcpy(out + i * 4, src + (r0 + i) * bytes + d * 4, 4);
            }
            for (int64_t i = n; i < kRowTile; ++i) {
                std::memcpy(out + i * 4, &zero_word, 4);
            }
        }
        // INT4: per group g, 16 scales of the tile; INT8 (one scale per row): the same formula.
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t g = 0; g < per_row; ++g) {
                scales[static_cast<size_t>((t * per_row + g) * kRowTile + i)] =
                    w.scales[(r0 + i) * per_row + g];
            }
        }
    }
    return QuantizedWeight(w.format, w.rows, w.cols, std::move(data), std::move(scales),
                           WeightLayout::kRowTiles16);
}

void untile_row(const Weight& w, int64_t r, uint8_t* bytes, float* scales) {
    const int64_t t = r / kRowTile;
    const int64_t i = r % kRowTile;
    const int64_t n = row_bytes(w);
    const int64_t per_row = row_scales(w);
    const uint8_t* tile = static_cast<const uint8_t*>(w.data) + t * kRowTile * n;
    for (int64_t d = 0; d < n / 4; ++d) {
        std::memcpy(bytes + d * 4, tile + d * 64 + i * 4, 4);
    }
    for (int64_t g = 0; g < per_row; ++g) {
        scales[g] = w.scales[(t * per_row + g) * kRowTile + i];
    }
}

}  // namespace edge::engine::quant
