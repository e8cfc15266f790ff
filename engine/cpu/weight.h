#pragma once

// Weight is a read-only view of one linear layer's matrix in whatever format it is stored:
// `rows` outputs by `cols` inputs, row-major (a row is one output's weights, as in Hugging Face
// checkpoints). Quantized formats carry their scales. Kernels (engine/cpu/matmul.h) read the stored
// bytes directly and dequantize in registers; there is never a full-precision copy.
// The memory behind `data`/`scales` is owned elsewhere (the mapped checkpoint, or `owned` buffers
// of the quantized weight) and must outlive the view.

#include <cstddef>
#include <cstdint>

namespace edge::engine {

enum class WeightFormat {
    kF32,
    kBF16,
    kF16,
    kFP8E4M3Block128,  // E4M3 bytes, one f32 scale per 128x128 block (DeepSeek-V3 layout).
    kInt8Row,          // int8, one f32 scale per row.
    kInt4G32,          // Symmetric int4, one scale per 32 inputs of a row.
    kInt4G128,         // Symmetric int4, one scale per 128 inputs of a row.
};

// Memory layout of `data` and `scales` per format (all little-endian, rows row-major):
//  kF32 / kBF16 / kF16: data = rows * cols elements; scales = nullptr.
//  kFP8E4M3Block128: data = rows * cols bytes, one E4M3 "fn" byte per weight (sign, 4 exponent
//      bits with bias 7, 3 mantissa bits; no infinities; 0x7F/0xFF are NaN and never stored).
//      scales = ceil(rows/128) * ceil(cols/128) f32, row-major over blocks: the scale of block
//      (r / 128, c / 128) is scales[(r / 128) * ceil(cols / 128) + c / 128]. Edge blocks may be
//      partial. Value = decode(byte) * scale (DeepSeek-V3 `weight_scale_inv`, used as stored).
//  kInt8Row: data = rows * cols int8 in [-127, 127]; scales = rows f32; value = q * scales[r].
//  kInt4G32 / kInt4G128 (G = 32 or 128; cols must be a multiple of G): data = rows * cols / 2
//      bytes; row r starts at byte r * cols / 2; element c of a row is in byte c / 2, in the low
//      nibble when c is even and the high nibble when c is odd, stored as q + 8 with q in
//      [-8, 7]. This is byte for byte the compressed-tensors `pack-quantized` layout (int32
//      words of eight nibbles, lowest nibble first, packed along the input dimension) on a
//      little-endian machine, so such checkpoints are viewed as is. scales = rows * (cols / G)
//      f32, row-major: value = q * scales[r * (cols / G) + c / G].
// No extra fields are needed: strides and group sizes follow from `format`, `rows` and `cols`.
//
// Row tiles (layout kRowTiles16, only kInt8Row and kInt4G32 / kInt4G128; built on load for the CPU
// kernels by quant::tile_rows, never stored in a checkpoint): rows are taken 16 at a time (tile
// t = rows 16t .. 16t+15; ceil(rows / 16) tiles, a last partial tile padded with zero weights and
// zero scales), and a tile's bytes are interleaved so that one 64-byte vector holds the same
// 4-byte word of each of its 16 rows: byte b (0..3) of word d of tile row i (0..15) is at
//      data[t * 16 * B + d * 64 + i * 4 + b],   B = bytes of one row-major row (cols / 2 for INT4,
//      cols for INT8, which must then be a multiple of 4),
// i.e. word d of a row is its row-major bytes 4d .. 4d+3 (INT4: columns 8d .. 8d+7, nibbles as in
// the row layout, a zero weight stored as 0x8 per nibble; INT8: columns 4d .. 4d+3). A tile is one
// contiguous run of 16 * B bytes, so a kernel reads each tile as a single sequential stream and
// gets one row per vector lane (no horizontal sums).
//  scales: INT4: for tile t and group g (of G columns), 16 f32 (one per tile row) at
//      scales[(t * (cols / G) + g) * 16 + i]; INT8: 16 f32 per tile, scales[t * 16 + i].
//  Sizes: ceil(rows / 16) * 16 rows' worth of data and scales (the padding counts).
// Kernels are chosen by (format, layout); a kernel for one layout never receives the other.
enum class WeightLayout {
    kRows,        // Row-major, as described above the format list (every format, every backend).
    kRowTiles16,  // Tiles of 16 interleaved rows (CPU only, INT8 and INT4).
};

// Rows of one row tile.
inline constexpr int64_t kRowTile = 16;

struct Weight {
    WeightFormat format = WeightFormat::kF32;
    int64_t rows = 0;
    int64_t cols = 0;
    const void* data = nullptr;    // Stored elements.
    const float* scales = nullptr; // Format-specific scales; nullptr for float formats.
    WeightLayout layout = WeightLayout::kRows;  // How `data` and `scales` are ordered.
};

}  // namespace edge::engine
