#pragma once

// Row tiles (WeightLayout::kRowTiles16, described in engine/cpu/weight.h): the CPU's INT4 and
// INT8 kernels for this layout keep one row per vector lane, so they need no horizontal sums and
// read each 16-row tile as one sequential stream. tile_rows makes the tiled copy of a row-major
// quantized weight once, at load time (WeightLoader, when its creator asks for it). Plain
// functions, thread-safe; the result owns its bytes and does not refer to the source.

#include <cstdint>

#include "common/result.h"
#include "engine/cpu/weight.h"
#include "engine/quant/quantized_weight.h"
#include "engine/quant/weight_arena.h"

namespace edge::engine::quant {

// True if tile_rows can tile a rows x cols matrix of `format` (INT4 G32/G128; INT8 with cols a
// multiple of 4). FP8 and float formats: false (a new format adds its case in row_tiles.cc).
bool row_tiles_support(WeightFormat format, int64_t cols);

// Whether a loader asked for row tiles (WeightLoader::use_row_tiles) tiles `format`: INT8 and
// INT4-G32. INT4-G128 stays row-major for now: its tiled kernel is faster in bench_quant_kernels,
// but single-stream decode on the bench preset measured 0.787 against 0.841 of the bandwidth probe
// (medians of five interleaved runs, docs/quantization.md), so it is not yet the default.
bool row_tiles_by_default(WeightFormat format);

// The kRowTiles16 copy of row-major quantized weight `w` (owned, or with its data in `arena`
// when given; `w`'s memory, e.g. a mapped checkpoint, is no longer needed afterwards).
// kInvalidArgument for a format or shape that row_tiles_support rejects or a weight already tiled.
Result<QuantizedWeight> tile_rows(const Weight& w, WeightArena* arena = nullptr);

// Row r of tiled weight `w` back in the row-major layout: `bytes` receives the row's
// weight_data_bytes(w.format, 1, w.cols) bytes and `scales` its weight_scale_count(w.format, 1,
// w.cols) scales. For dequantize_row and tests, not the inference path.
void untile_row(const Weight& w, int64_t r, uint8_t* bytes, float* scales);

}  // namespace edge::engine::quant
