#include "engine/quant/row_tiles.h"

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

Result<QuantizedWeight> tile_rows(const Weight& w) {
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
    AlignedBytes data(static_cast<size_t>(tiles * kRowTile * bytes), zero_byte(w.format));
    std::vector<float> scales(static_cast<size_t>(tiles * kRowTile * per_row), 0.0f);
    for (int64_t r = 0; r < w.rows; ++r) {
        const int64_t t = r / kRowTile;
        const int64_t i = r % kRowTile;
        uint8_t* tile = data.data() + t * kRowTile * bytes;
        for (int64_t d = 0; d < words; ++d) {
            std::memcpy(tile + d * 64 + i * 4, src + r * bytes + d * 4, 4);
        }
        // INT4: per group g, 16 scales of the tile; INT8 (one scale per row): the same formula.
        for (int64_t g = 0; g < per_row; ++g) {
            scales[static_cast<size_t>((t * per_row + g) * kRowTile + i)] =
                w.scales[r * per_row + g];
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
