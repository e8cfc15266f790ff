#pragma once

// QuantizedWeight owns the bytes of one quantized matrix (or only its scales, when the data is
// viewed in place in a mapped checkpoint) and hands out a `Weight` view over them; the quantize_*
// functions build one from f32 or bf16 weights. A QuantizedWeight is immutable after construction
// and may be read from any number of threads; moving it keeps the view's pointers valid (vector
// buffers move), copying is disabled. Views handed out must not outlive the owner (or, for data
// viewed in place, the mapped checkpoint).

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/cpu/weight.h"

namespace edge::engine::quant {

// A row-major source matrix to quantize: `rows` x `cols` elements of f32 or bf16 (raw uint16 bits).
struct SourceMatrix {
    enum class Type { kF32, kBF16 };
    Type type = Type::kF32;      // Element type of `data`.
    const void* data = nullptr;  // rows * cols elements, row-major.
    int64_t rows = 0;            // Output features.
    int64_t cols = 0;            // Input features.

    static SourceMatrix f32(const float* d, int64_t r, int64_t c) { return {Type::kF32, d, r, c}; }
    static SourceMatrix bf16(const uint16_t* d, int64_t r, int64_t c) {
        return {Type::kBF16, d, r, c};
    }
};

// AlignedBytes' deleter: free(), or nothing for an arena's bytes.
struct AlignedBytesFree {
    bool owned = true;
    void operator()(uint8_t* p) const {
        if (owned) {
            std::free(p);
        }
    }
};

// Owned bytes of a quantized matrix on a 64-byte boundary, so that the kernels' 64-byte loads
// never straddle two cache lines (a malloc'd std::vector starts 16 bytes past one). Filled with
// `fill` on construction, or left as allocated for a writer of every byte; or `size` bytes an
// arena owns (WeightArena: 64-byte aligned, outliving this object), not freed here. Move-only.
class AlignedBytes {
  public:
    struct Uninitialized {};

    AlignedBytes() = default;
    explicit AlignedBytes(size_t size, uint8_t fill = 0);
    AlignedBytes(size_t size, Uninitialized);
    AlignedBytes(uint8_t* arena_bytes, size_t size)
        : data_(arena_bytes, AlignedBytesFree{false}), size_(size) {}

    uint8_t* data() { return data_.get(); }
    const uint8_t* data() const { return data_.get(); }
    size_t size() const { return size_; }
    uint8_t& operator[](size_t i) { return data_[i]; }

  private:
    std::unique_ptr<uint8_t[], AlignedBytesFree> data_;
    size_t size_ = 0;
};

class QuantizedWeight {
  public:
    QuantizedWeight() = default;
    // Owns both data and scales, ordered as `layout` says (engine/cpu/weight.h).
    QuantizedWeight(WeightFormat format, int64_t rows, int64_t cols, AlignedBytes data,
                    std::vector<float> scales, WeightLayout layout = WeightLayout::kRows);
    // Views `data` in place (owned elsewhere, e.g. a mapped checkpoint) and owns the scales.
    QuantizedWeight(WeightFormat format, int64_t rows, int64_t cols, const void* external_data,
                    std::vector<float> scales);

    QuantizedWeight(QuantizedWeight&&) noexcept = default;
    QuantizedWeight& operator=(QuantizedWeight&&) noexcept = default;
    QuantizedWeight(const QuantizedWeight&) = delete;
    QuantizedWeight& operator=(const QuantizedWeight&) = delete;

    const Weight& view() const { return view_; }
    // Bytes of data plus scales this weight's format and layout take (whether owned or viewed;
    // row tiles count their padding rows).
    int64_t size_bytes() const;
    bool owns_data() const { return data_.data() != nullptr; }
    std::span<const float> scales() const { return scales_; }

  private:
    Weight view_;
    AlignedBytes data_;  // Empty when the data is viewed in place.
    std::vector<float> scales_;
};

// Bytes of `data` for a rows x cols matrix in `format` (0 for overflow or bad shapes).
int64_t weight_data_bytes(WeightFormat format, int64_t rows, int64_t cols);
// Number of f32 scales `format` keeps for a rows x cols matrix (0 for float formats).
int64_t weight_scale_count(WeightFormat format, int64_t rows, int64_t cols);
// Group size along the input dimension of an int4 format (32 or 128), 0 for other formats.
int64_t int4_group_size(WeightFormat format);
// "fp8-block128", "int8-row", "int4-g32", ...
const char* weight_format_name(WeightFormat format);

// FP8 E4M3 with one f32 scale per 128x128 block (scale = max|w| / 448 of the block, 1 for an
// all-zero block). `name` names the tensor in errors. NaN or Inf anywhere, or a scale above
// kMaxScale (checkpoint_formats.h; all three formats) -> kInvalidArgument.
Result<QuantizedWeight> quantize_fp8_block(const SourceMatrix& src, std::string_view name = "");
// INT8 symmetric per output row (scale = max|w| / 127, q in [-127, 127]).
Result<QuantizedWeight> quantize_int8_row(const SourceMatrix& src, std::string_view name = "");
// INT4 symmetric, one scale per `group_size` (32 or 128) inputs of a row (scale = max|w| / 7,
// q in [-7, 7]); cols must be a multiple of group_size.
Result<QuantizedWeight> quantize_int4_group(const SourceMatrix& src, int64_t group_size,
                                            std::string_view name = "");
// Dispatches on a quantized format.
Result<QuantizedWeight> quantize(const SourceMatrix& src, WeightFormat format,
                                 std::string_view name = "");
// What quantize() refuses of a matrix `name` of `cols` input features for `format` by its shape
// alone (an INT4 group that does not divide cols). The loader's header check (check_model_files)
// asks this, so it refuses the policies the load would, without reading a weight.
Status check_quantizable_shape(WeightFormat format, int64_t cols, std::string_view name = "");

// Reference dequantization of row `r` of a quantized view (either layout) into `out` (w.cols
// floats). For tests, tools and embedding lookups (embedding_row), not for matrix products.
void dequantize_row(const Weight& w, int64_t r, float* out);

// Whether a policy format `target` applies to a matrix stored in `stored` (a quantized format):
// FP8 to INT8 or INT4, a smaller format (Kimi K2's and DeepSeek-V3's FP8 releases, their routed
// experts made INT4). Other stored formats stay as stored (to a larger one there is nothing to
// gain; INT8 to INT4 would round twice on a grid no release ships).
bool requantizes(WeightFormat stored, WeightFormat target);
// `w` (FP8) dequantized and quantized to `target` as quantize() quantizes a float matrix; the
// result owns its bytes. kInvalidArgument when !requantizes(w.format, target), and for what
// quantize() refuses.
Result<QuantizedWeight> requantize(const Weight& w, WeightFormat target,
                                   std::string_view name = "");

}  // namespace edge::engine::quant
