#pragma once

// Validation and in-place viewing of quantized tensors as real checkpoints store them; the model
// loader calls these with the tensors it found in safetensors files:
//  - DeepSeek-V3 / Kimi K2 FP8: `weight` (F8_E4M3, [rows, cols]) plus `weight_scale_inv` (F32,
//    [ceil(rows/128), ceil(cols/128)]), with quantization_config
//    {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}.
//  - compressed-tensors `pack-quantized` INT4 (Kimi K2 Thinking): `weight_packed` (I32,
//    [rows, ceil(cols/8)], eight 4-bit values per word, element 8j+i in bits 4i..4i+3 of word j,
//    stored as q + 8), `weight_scale` (BF16/F16/F32, [rows, cols/group]) and `weight_shape`
//    (I32/I64, [2] = {rows, cols}); symmetric only (no `weight_zero_point`).
// Weight bytes are viewed in place (no copy); scales are copied into f32. Everything here reads
// untrusted shapes and sizes and answers bad ones with kInvalidArgument / kDataLoss naming the
// tensor. Pure functions; thread-safe. The returned QuantizedWeight views the tensor's bytes, which
// must outlive it.

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine::quant {

// Element types of safetensors tensors that matter here.
enum class TensorDType { kF32, kF16, kBF16, kF8E4M3, kI8, kU8, kI32, kI64 };

// One tensor as the loader found it. The view does not own `data`.
struct TensorRef {
    std::string_view name;                  // Full tensor name, for errors.
    TensorDType dtype = TensorDType::kF32;  // Element type.
    std::vector<int64_t> shape;             // Dimensions, outermost first.
    const void* data = nullptr;             // First byte of the tensor.
    int64_t size_bytes = 0;                 // Bytes available at `data`.
};

const char* tensor_dtype_name(TensorDType dtype);

// The largest scale a stored quantized weight may have, in every format (FP8, INT8, INT4). No
// real checkpoint comes near it (scales are ~max|w| / 448, / 127 or / 7), and kernels that scale
// a block by 2^56 before use (kernels_avx2.cc) would overflow to inf above it. The loader refuses
// larger scales, and `edgeserve quantize` refuses an input that would get them.
inline constexpr float kMaxScale = 0x1p64f;
// True for a scale the loader takes: finite and in 0..kMaxScale.
inline bool scale_in_range(float v) { return v >= 0.0f && v <= kMaxScale; }

// Scales of shape `expected` stored as BF16, F16 or F32 (checkpoints differ: DeepSeek-V3's FP8
// block scales are F32, Qwen3's FP8 ones BF16 or F16, compressed-tensors' INT4 group scales
// BF16), as f32; a wrong dtype, shape or byte count, or a scale out of 0..kMaxScale (by index),
// is an error naming the tensor and `role`.
Result<std::vector<float>> read_float_scales(const TensorRef& t,
                                             const std::vector<int64_t>& expected,
                                             std::string_view role);

// Checks an FP8 block-scaled pair: 2-D F8_E4M3 weight, BF16/F16/F32 scales of shape
// [ceil(rows/128), ceil(cols/128)], byte sizes matching the shapes, finite non-negative scales;
// when `scan_for_nan` also that no weight byte is a NaN encoding (0x7F / 0xFF), one pass over the
// weight. Returns the scales as f32 (read once: the checked values are the ones used).
Result<std::vector<float>> read_fp8_block_scales(const TensorRef& weight,
                                                 const TensorRef& scale_inv, bool scan_for_nan);

// read_fp8_block_scales, then a kFP8E4M3Block128 view of the weight bytes in place.
Result<QuantizedWeight> from_fp8_block(const TensorRef& weight, const TensorRef& scale_inv,
                                       bool scan_for_nan);

// Checks a compressed-tensors pack-quantized INT4 triple for `group_size` (32 or 128; from the
// config's `weights.group_size`) and returns a kInt4G32/kInt4G128 view of the packed words in place
// with the scales converted to f32. `weight_shape`'s cols must be a multiple of group_size. With
// `expected_rows`/`expected_cols` (> 0: the shape the model's architecture wants), a weight_shape
// that disagrees is refused as such, before the packed words are checked against it.
Result<QuantizedWeight> from_compressed_tensors(const TensorRef& weight_packed,
                                                const TensorRef& weight_scale,
                                                const TensorRef& weight_shape, int64_t group_size,
                                                int64_t expected_rows = 0,
                                                int64_t expected_cols = 0);

// compressed-tensors packing of signed 4-bit values (q in [-8, 7], rows x cols, row-major) into
// int32 words [rows, ceil(cols/8)]; a padded tail nibble holds 0 (the packed form of -8 + 8 = 0,
// as compressed-tensors pads after offsetting). Values outside [-8, 7] -> kInvalidArgument.
Result<std::vector<int32_t>> pack_int4_to_int32(const int8_t* q, int64_t rows, int64_t cols);

// The inverse: rows x cols signed values from words [rows, ceil(cols/8)] (`words` holds
// `word_count` words; too few -> kInvalidArgument).
Result<std::vector<int8_t>> unpack_int32_to_int4(const int32_t* words, int64_t word_count,
                                                 int64_t rows, int64_t cols);

}  // namespace edge::engine::quant
