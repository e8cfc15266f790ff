#include "engine/quant/quantized_weight.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "common/arith.h"
#include "common/check.h"
#include "engine/quant/checkpoint_formats.h"
#include "engine/quant/fp8.h"
#include "engine/quant/row_tiles.h"

namespace edge::engine::quant {
namespace {

constexpr int64_t kFp8Block = 128;

void load_row(const SourceMatrix& src, int64_t r, float* out) {
    // memcpy reads: a mapped safetensors tensor may start unaligned.
    const char* base = static_cast<const char*>(src.data);
    if (src.type == SourceMatrix::Type::kF32) {
        std::memcpy(out, base + r * src.cols * 4, static_cast<size_t>(src.cols) * 4);
    } else {
        const char* p = base + r * src.cols * 2;
        for (int64_t c = 0; c < src.cols; ++c) {
            uint16_t b;
            std::memcpy(&b, p + c * 2, 2);
            out[c] = std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
        }
    }
}

std::string tensor_label(std::string_view name) {
    return name.empty() ? std::string("weight") : "tensor '" + std::string(name) + "'";
}

Status check_source(const SourceMatrix& src, std::string_view name) {
    if (src.rows <= 0 || src.cols <= 0 || src.data == nullptr) {
        return invalid_argument_error(tensor_label(name) + ": empty or null matrix (" +
                                      std::to_string(src.rows) + " x " + std::to_string(src.cols) +
                                      ")");
    }
    if (src.rows > (int64_t{1} << 40) / src.cols) {
        return invalid_argument_error(tensor_label(name) + ": matrix too large");
    }
    return ok_status();
}

// Rejects NaN/Inf with the exact element, so a corrupt checkpoint is named, not quantized.
Status check_finite_row(const float* row, int64_t r, int64_t cols, std::string_view name) {
    for (int64_t c = 0; c < cols; ++c) {
        if (!std::isfinite(row[c])) {
            return invalid_argument_error(
                tensor_label(name) + ": non-finite value " + (std::isnan(row[c]) ? "NaN" : "Inf") +
                " at [" + std::to_string(r) + ", " + std::to_string(c) + "]; refusing to quantize");
        }
    }
    return ok_status();
}

}  // namespace

AlignedBytes::AlignedBytes(size_t size, Uninitialized) : size_(size) {
    // aligned_alloc wants a multiple of the alignment.
    const size_t rounded = std::max<size_t>(64, (size + 63) / 64 * 64);
    data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, rounded)));
    EDGE_CHECK(data_ != nullptr, "out of memory for " + std::to_string(size) + " weight bytes");
}

AlignedBytes::AlignedBytes(size_t size, uint8_t fill) : AlignedBytes(size, Uninitialized{}) {
    std::memset(data_.get(), fill, size);
}

QuantizedWeight::QuantizedWeight(WeightFormat format, int64_t rows, int64_t cols,
                                 AlignedBytes data, std::vector<float> scales, WeightLayout layout)
    : data_(std::move(data)), scales_(std::move(scales)) {
    view_ = Weight{format, rows, cols, data_.data(), scales_.empty() ? nullptr : scales_.data(),
                   layout};
}

QuantizedWeight::QuantizedWeight(WeightFormat format, int64_t rows, int64_t cols,
                                 const void* external_data, std::vector<float> scales)
    : scales_(std::move(scales)) {
    view_ = Weight{format, rows, cols, external_data, scales_.empty() ? nullptr : scales_.data()};
}

int64_t QuantizedWeight::size_bytes() const {
    const int64_t rows = view_.layout == WeightLayout::kRowTiles16
                             ? ceil_div(view_.rows, kRowTile) * kRowTile
                             : view_.rows;
    return weight_data_bytes(view_.format, rows, view_.cols) +
           weight_scale_count(view_.format, rows, view_.cols) *
               static_cast<int64_t>(sizeof(float));
}

int64_t int4_group_size(WeightFormat format) {
    switch (format) {
        case WeightFormat::kInt4G32:
            return 32;
        case WeightFormat::kInt4G128:
            return 128;
        default:
            return 0;
    }
}

int64_t weight_data_bytes(WeightFormat format, int64_t rows, int64_t cols) {
    if (rows < 0 || cols < 0 || (cols > 0 && rows > (int64_t{1} << 46) / cols)) {
        return 0;
    }
    const int64_t n = rows * cols;
    switch (format) {
        case WeightFormat::kF32:
            return n * 4;
        case WeightFormat::kBF16:
        case WeightFormat::kF16:
            return n * 2;
        case WeightFormat::kFP8E4M3Block128:
        case WeightFormat::kInt8Row:
            return n;
        case WeightFormat::kInt4G32:
        case WeightFormat::kInt4G128:
            return cols % int4_group_size(format) == 0 ? n / 2 : 0;
    }
    return 0;
}

int64_t weight_scale_count(WeightFormat format, int64_t rows, int64_t cols) {
    if (rows < 0 || cols < 0) {
        return 0;
    }
    switch (format) {
        case WeightFormat::kFP8E4M3Block128:
            return ceil_div(rows, kFp8Block) * ceil_div(cols, kFp8Block);
        case WeightFormat::kInt8Row:
            return rows;
        case WeightFormat::kInt4G32:
        case WeightFormat::kInt4G128:
            return rows * (cols / int4_group_size(format));
        default:
            return 0;
    }
}

const char* weight_format_name(WeightFormat format) {
    switch (format) {
        case WeightFormat::kF32:
            return "f32";
        case WeightFormat::kBF16:
            return "bf16";
        case WeightFormat::kF16:
            return "f16";
        case WeightFormat::kFP8E4M3Block128:
            return "fp8-block128";
        case WeightFormat::kInt8Row:
            return "int8-row";
        case WeightFormat::kInt4G32:
            return "int4-g32";
        case WeightFormat::kInt4G128:
            return "int4-g128";
    }
    return "unknown";
}

// The scale that maps a block's or group's largest magnitude to the format's largest code. One
// whose scale would be 0 (all zeros, or only subnormals below max_q x 2^-149, where amax / max_q
// underflows) gets 1: its values then round to 0, where a 0 scale made 0 / 0 NaN codes (FP8) or
// a NaN cast to an integer (INT8, INT4). A subnormal scale (amax below max_q x 2^-126) keeps
// few significant bits: rounded down, it left amax / scale whole codes above max_q, which the
// clamp (INT8, INT4) or saturation (FP8) turned into errors of several scales (INT4: amax 10 x
// 2^-149 got scale 2^-149 and was stored as 7 x 2^-149). Such a scale is raised to the next
// representable one, so the error bounds hold; a normal scale never is (amax / scale <= max_q x
// (1 + 2^-23)), so what quantize wrote before stays byte for byte the same.
namespace {

float group_scale(float amax, float max_q) {
    float scale = amax / max_q;
    if (!(scale > 0.0f)) {
        return 1.0f;
    }
    while (amax / scale > max_q * (1.0f + 0x1p-10f)) {
        scale = std::nextafter(scale, INFINITY);
    }
    return scale;
}

// The error for scale number `index` (of `what`, e.g. "row 3") above kMaxScale, the limit the
// loader holds a checkpoint's scales to: the kernels are only exact below it (the AVX2 FP8 kernel
// takes a block's scale times 2^56, inf above it, where the scalar kernel stayed finite).
// quantize() is also the loader's quantize-on-load, which checked no scale, so the limit is
// kept here.
Status scale_error(float scale, WeightFormat format, int64_t index, const std::string& what,
                   std::string_view name) {
    return invalid_argument_error(tensor_label(name) + ": quantized to " +
                                  weight_format_name(format) + ", scale " + std::to_string(index) +
                                  " (" + what + ") would be " + std::to_string(scale) +
                                  " (scales must be in 0..2^64; weights too large)");
}

}  // namespace

Result<QuantizedWeight> quantize_fp8_block(const SourceMatrix& src, std::string_view name) {
    EDGE_RETURN_IF_ERROR(check_source(src, name));
    const int64_t rows = src.rows;
    const int64_t cols = src.cols;
    const int64_t block_cols = ceil_div(cols, kFp8Block);
    std::vector<float> scales(static_cast<size_t>(ceil_div(rows, kFp8Block) * block_cols));
    AlignedBytes data(static_cast<size_t>(rows * cols));
    std::vector<float> panel(static_cast<size_t>(kFp8Block * cols));
    for (int64_t r0 = 0; r0 < rows; r0 += kFp8Block) {
        const int64_t nr = std::min(kFp8Block, rows - r0);
        for (int64_t i = 0; i < nr; ++i) {
            float* row = panel.data() + i * cols;
            load_row(src, r0 + i, row);
            EDGE_RETURN_IF_ERROR(check_finite_row(row, r0 + i, cols, name));
        }
        for (int64_t bc = 0; bc < block_cols; ++bc) {
            const int64_t c0 = bc * kFp8Block;
            const int64_t nc = std::min(kFp8Block, cols - c0);
            float amax = 0.0f;
            for (int64_t i = 0; i < nr; ++i) {
                for (int64_t c = 0; c < nc; ++c) {
                    amax = std::max(amax, std::fabs(panel[i * cols + c0 + c]));
                }
            }
            const float scale = group_scale(amax, kFp8E4M3Max);
            const int64_t index = (r0 / kFp8Block) * block_cols + bc;
            if (!scale_in_range(scale)) {
                return scale_error(
                    scale, WeightFormat::kFP8E4M3Block128, index,
                    "block [" + std::to_string(r0 / kFp8Block) + ", " + std::to_string(bc) + "]",
                    name);
            }
            scales[index] = scale;
            for (int64_t i = 0; i < nr; ++i) {
                for (int64_t c = 0; c < nc; ++c) {
                    data[(r0 + i) * cols + c0 + c] =
                        fp8_e4m3_encode(panel[i * cols + c0 + c] / scale);
                }
            }
        }
    }
    return QuantizedWeight(WeightFormat::kFP8E4M3Block128, rows, cols, std::move(data),
                           std::move(scales));
}

Result<QuantizedWeight> quantize_int8_row(const SourceMatrix& src, std::string_view name) {
    EDGE_RETURN_IF_ERROR(check_source(src, name));
    const int64_t rows = src.rows;
    const int64_t cols = src.cols;
    std::vector<float> scales(static_cast<size_t>(rows));
    AlignedBytes data(static_cast<size_t>(rows * cols));
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
        load_row(src, r, row.data());
        EDGE_RETURN_IF_ERROR(check_finite_row(row.data(), r, cols, name));
        float amax = 0.0f;
        for (float v : row) {
            amax = std::max(amax, std::fabs(v));
        }
        const float scale = group_scale(amax, 127.0f);
        if (!scale_in_range(scale)) {
            return scale_error(scale, WeightFormat::kInt8Row, r, "row " + std::to_string(r), name);
        }
        scales[r] = scale;
        for (int64_t c = 0; c < cols; ++c) {
            const float q = std::clamp(std::nearbyint(row[c] / scale), -127.0f, 127.0f);
            data[r * cols + c] = static_cast<uint8_t>(static_cast<int8_t>(q));
        }
    }
    return QuantizedWeight(WeightFormat::kInt8Row, rows, cols, std::move(data), std::move(scales));
}

Result<QuantizedWeight> quantize_int4_group(const SourceMatrix& src, int64_t group_size,
                                            std::string_view name) {
    EDGE_RETURN_IF_ERROR(check_source(src, name));
    if (group_size != 32 && group_size != 128) {
        return invalid_argument_error(tensor_label(name) + ": int4 group size " +
                                      std::to_string(group_size) + " unsupported (32 or 128)");
    }
    const int64_t rows = src.rows;
    const int64_t cols = src.cols;
    EDGE_RETURN_IF_ERROR(check_quantizable_shape(
        group_size == 32 ? WeightFormat::kInt4G32 : WeightFormat::kInt4G128, cols, name));
    const int64_t groups = cols / group_size;
    const WeightFormat format = group_size == 32 ? WeightFormat::kInt4G32 : WeightFormat::kInt4G128;
    std::vector<float> scales(static_cast<size_t>(rows * groups));
    AlignedBytes data(static_cast<size_t>(rows * cols / 2));
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
        load_row(src, r, row.data());
        EDGE_RETURN_IF_ERROR(check_finite_row(row.data(), r, cols, name));
        uint8_t* out = data.data() + r * cols / 2;
        for (int64_t g = 0; g < groups; ++g) {
            const float* w = row.data() + g * group_size;
            float amax = 0.0f;
            for (int64_t c = 0; c < group_size; ++c) {
                amax = std::max(amax, std::fabs(w[c]));
            }
            const float scale = group_scale(amax, 7.0f);
            if (!scale_in_range(scale)) {
                return scale_error(scale, format, r * groups + g,
                                   "row " + std::to_string(r) + ", group " + std::to_string(g),
                                   name);
            }
            scales[r * groups + g] = scale;
            for (int64_t c = 0; c < group_size; ++c) {
                const int q =
                    static_cast<int>(std::clamp(std::nearbyint(w[c] / scale), -7.0f, 7.0f));
                const int64_t col = g * group_size + c;
                const uint8_t nibble = static_cast<uint8_t>(q + 8);
                if (col % 2 == 0) {
                    out[col / 2] = nibble;
                } else {
                    out[col / 2] |= static_cast<uint8_t>(nibble << 4);
                }
            }
        }
    }
    return QuantizedWeight(format, rows, cols, std::move(data), std::move(scales));
}

Status check_quantizable_shape(WeightFormat format, int64_t cols, std::string_view name) {
    if (format != WeightFormat::kInt4G32 && format != WeightFormat::kInt4G128) {
        return ok_status();
    }
    const int64_t group_size = int4_group_size(format);
    if (cols % group_size != 0) {
        return invalid_argument_error(tensor_label(name) + ": " + std::to_string(cols) +
                                      " input features are not a multiple of the int4 group " +
                                      std::to_string(group_size));
    }
    return ok_status();
}

Result<QuantizedWeight> quantize(const SourceMatrix& src, WeightFormat format,
                                 std::string_view name) {
    switch (format) {
        case WeightFormat::kFP8E4M3Block128:
            return quantize_fp8_block(src, name);
        case WeightFormat::kInt8Row:
            return quantize_int8_row(src, name);
        case WeightFormat::kInt4G32:
            return quantize_int4_group(src, 32, name);
        case WeightFormat::kInt4G128:
            return quantize_int4_group(src, 128, name);
        default:
            return invalid_argument_error(tensor_label(name) + ": " + weight_format_name(format) +
                                          " is not a quantized format");
    }
}

void dequantize_row(const Weight& w, int64_t r, float* out) {
    if (w.layout == WeightLayout::kRowTiles16) {
        // Gather the row back into the row-major layout and decode that one-row matrix (scratch
        // kept per thread: embedding lookups come here once per token).
        thread_local std::vector<uint8_t> bytes;
        thread_local std::vector<float> scales;
        bytes.resize(static_cast<size_t>(weight_data_bytes(w.format, 1, w.cols)));
        scales.resize(static_cast<size_t>(weight_scale_count(w.format, 1, w.cols)));
        untile_row(w, r, bytes.data(), scales.data());
        dequantize_row(Weight{w.format, 1, w.cols, bytes.data(), scales.data()}, 0, out);
        return;
    }
    const int64_t cols = w.cols;
    switch (w.format) {
        case WeightFormat::kFP8E4M3Block128: {
            const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols;
            const float* s = w.scales + (r / kFp8Block) * ceil_div(cols, kFp8Block);
            for (int64_t c = 0; c < cols; ++c) {
                out[c] = fp8_e4m3_decode(q[c]) * s[c / kFp8Block];
            }
            return;
        }
        case WeightFormat::kInt8Row: {
            const int8_t* q = static_cast<const int8_t*>(w.data) + r * cols;
            for (int64_t c = 0; c < cols; ++c) {
                out[c] = static_cast<float>(q[c]) * w.scales[r];
            }
            return;
        }
        case WeightFormat::kInt4G32:
        case WeightFormat::kInt4G128: {
            const int64_t g = int4_group_size(w.format);
            const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols / 2;
            const float* s = w.scales + r * (cols / g);
            for (int64_t c = 0; c < cols; ++c) {
                const int nibble = (c % 2 == 0) ? (q[c / 2] & 0xF) : (q[c / 2] >> 4);
                out[c] = static_cast<float>(nibble - 8) * s[c / g];
            }
            return;
        }
        case WeightFormat::kF32: {
            const float* p = static_cast<const float*>(w.data) + r * cols;
            std::copy(p, p + cols, out);
            return;
        }
        case WeightFormat::kBF16: {
            const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * cols;
            for (int64_t c = 0; c < cols; ++c) {
                out[c] = std::bit_cast<float>(static_cast<uint32_t>(p[c]) << 16);
            }
            return;
        }
        case WeightFormat::kF16:
            EDGE_CHECK(false, "dequantize_row: f16 not supported");
    }
}

bool requantizes(WeightFormat stored, WeightFormat target) {
    return stored == WeightFormat::kFP8E4M3Block128 &&
           (target == WeightFormat::kInt8Row || target == WeightFormat::kInt4G32 ||
            target == WeightFormat::kInt4G128);
}

Result<QuantizedWeight> requantize(const Weight& w, WeightFormat target, std::string_view name) {
    if (!requantizes(w.format, target)) {
        return invalid_argument_error(tensor_label(name) + ": " + weight_format_name(w.format) +
                                      " is not requantized to " + weight_format_name(target));
    }
    std::vector<float> rows(static_cast<size_t>(w.rows * w.cols));
    for (int64_t r = 0; r < w.rows; ++r) {
        dequantize_row(w, r, rows.data() + r * w.cols);
    }
    return quantize(SourceMatrix::f32(rows.data(), w.rows, w.cols), target, name);
}

}  // namespace edge::engine::quant
