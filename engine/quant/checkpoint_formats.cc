#include "engine/quant/checkpoint_formats.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "common/arith.h"
#include "engine/quant/fp8.h"

namespace edge::engine::quant {
namespace {

static_assert(std::endian::native == std::endian::little,
              "checkpoint tensors are little-endian and viewed in place");

constexpr int64_t kMaxDim = int64_t{1} << 32;

std::string shape_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        s += (i ? ", " : "") + std::to_string(shape[i]);
    }
    return s + "]";
}

std::string label(const TensorRef& t) { return "tensor '" + std::string(t.name) + "'"; }

int64_t dtype_size(TensorDType dtype) {
    switch (dtype) {
        case TensorDType::kF32:
        case TensorDType::kI32:
            return 4;
        case TensorDType::kF16:
        case TensorDType::kBF16:
            return 2;
        case TensorDType::kF8E4M3:
        case TensorDType::kI8:
        case TensorDType::kU8:
            return 1;
        case TensorDType::kI64:
            return 8;
    }
    return 1;
}

// Checks dtype, rank-2 shape equal to `expected` and that size_bytes covers it exactly.
Status check_tensor(const TensorRef& t, TensorDType dtype, const std::vector<int64_t>& expected,
                    std::string_view role) {
    if (t.dtype != dtype) {
        return invalid_argument_error(label(t) + " (" + std::string(role) + "): dtype " +
                                      tensor_dtype_name(t.dtype) + ", expected " +
                                      tensor_dtype_name(dtype));
    }
    if (t.shape != expected) {
        return invalid_argument_error(label(t) + " (" + std::string(role) + "): shape " +
                                      shape_string(t.shape) + ", expected " +
                                      shape_string(expected));
    }
    int64_t n = dtype_size(dtype);
    for (int64_t d : expected) {
        if (d < 0 || d > kMaxDim || (d > 0 && n > (int64_t{1} << 48) / d)) {
            return invalid_argument_error(label(t) + ": shape " + shape_string(t.shape) +
                                          " is too large");
        }
        n *= d;
    }
    if (t.data == nullptr || t.size_bytes != n) {
        return data_loss_error(label(t) + " (" + std::string(role) +
                               "): " + std::to_string(t.size_bytes) + " bytes, shape " +
                               shape_string(t.shape) + " needs " + std::to_string(n));
    }
    return ok_status();
}

float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const int exponent = (h >> 10) & 0x1F;
    const uint32_t mantissa = h & 0x3FF;
    float magnitude;
    if (exponent == 0) {
        magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    } else if (exponent == 31) {
        magnitude = mantissa ? NAN : INFINITY;
    } else {
        magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 1024.0f, exponent - 15);
    }
    return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
}

}  // namespace

const char* tensor_dtype_name(TensorDType dtype) {
    switch (dtype) {
        case TensorDType::kF32:
            return "F32";
        case TensorDType::kF16:
            return "F16";
        case TensorDType::kBF16:
            return "BF16";
        case TensorDType::kF8E4M3:
            return "F8_E4M3";
        case TensorDType::kI8:
            return "I8";
        case TensorDType::kU8:
            return "U8";
        case TensorDType::kI32:
            return "I32";
        case TensorDType::kI64:
            return "I64";
    }
    return "?";
}

Result<std::vector<float>> read_float_scales(const TensorRef& t,
                                             const std::vector<int64_t>& expected,
                                             std::string_view role) {
    if (t.dtype != TensorDType::kBF16 && t.dtype != TensorDType::kF16 &&
        t.dtype != TensorDType::kF32) {
        return invalid_argument_error(label(t) + " (" + std::string(role) + "): dtype " +
                                      tensor_dtype_name(t.dtype) + ", expected BF16, F16 or F32");
    }
    EDGE_RETURN_IF_ERROR(check_tensor(t, t.dtype, expected, role));
    int64_t count = 1;
    for (int64_t d : expected) {
        count *= d;  // Bounded: check_tensor matched the bytes to it.
    }
    std::vector<float> out(static_cast<size_t>(count));
    const auto* bytes = static_cast<const uint8_t*>(t.data);
    for (int64_t i = 0; i < count; ++i) {
        float v;
        if (t.dtype == TensorDType::kF32) {
            std::memcpy(&v, bytes + 4 * i, 4);
        } else {
            uint16_t h;
            std::memcpy(&h, bytes + 2 * i, 2);
            v = t.dtype == TensorDType::kBF16 ? std::bit_cast<float>(static_cast<uint32_t>(h) << 16)
                                              : half_to_float(h);
        }
        if (!scale_in_range(v)) {  // NaN compares false; Inf is above kMaxScale.
            return invalid_argument_error(label(t) + ": scale " + std::to_string(i) + " is " +
                                          std::to_string(v) + " (must be in 0..2^64)");
        }
        out[static_cast<size_t>(i)] = v;
    }
    return out;
}

Result<std::vector<float>> read_fp8_block_scales(const TensorRef& weight,
                                                 const TensorRef& scale_inv, bool scan_for_nan) {
    if (weight.shape.size() != 2 || weight.shape[0] <= 0 || weight.shape[1] <= 0) {
        return invalid_argument_error(label(weight) + ": FP8 weight must be 2-D and non-empty, " +
                                      "got shape " + shape_string(weight.shape));
    }
    const int64_t rows = weight.shape[0];
    const int64_t cols = weight.shape[1];
    EDGE_RETURN_IF_ERROR(check_tensor(weight, TensorDType::kF8E4M3, {rows, cols}, "weight"));
    // Named as stored: the fp8 method's weight_scale_inv, or compressed-tensors' weight_scale.
    const std::string role = std::string(scale_inv.name.ends_with("_inv") ? "weight_scale_inv"
                                                                           : "weight_scale") +
                             ", 128x128 blocks";
    EDGE_ASSIGN_OR_RETURN(
        auto scales,
        read_float_scales(scale_inv, {ceil_div(rows, 128), ceil_div(cols, 128)}, role));
    if (scan_for_nan) {
        const auto* bytes = static_cast<const uint8_t*>(weight.data);
        for (int64_t i = 0; i < rows * cols; ++i) {
            if (fp8_e4m3_is_nan(bytes[i])) {
                return invalid_argument_error(
                    label(weight) + ": NaN (byte 0x" + (bytes[i] == 0xFF ? "FF" : "7F") + ") at [" +
                    std::to_string(i / cols) + ", " + std::to_string(i % cols) + "]");
            }
        }
    }
    return scales;
}

Result<QuantizedWeight> from_fp8_block(const TensorRef& weight, const TensorRef& scale_inv,
                                       bool scan_for_nan) {
    EDGE_ASSIGN_OR_RETURN(auto scales, read_fp8_block_scales(weight, scale_inv, scan_for_nan));
    return QuantizedWeight(WeightFormat::kFP8E4M3Block128, weight.shape[0], weight.shape[1],
                           weight.data, std::move(scales));
}

Result<QuantizedWeight> from_compressed_tensors(const TensorRef& weight_packed,
                                                const TensorRef& weight_scale,
                                                const TensorRef& weight_shape, int64_t group_size,
                                                int64_t expected_rows, int64_t expected_cols) {
    if (group_size != 32 && group_size != 128) {
        return invalid_argument_error(label(weight_packed) + ": int4 group_size " +
                                      std::to_string(group_size) + " unsupported (32 or 128)");
    }
    // weight_shape: two integers {rows, cols}.
    const TensorDType shape_dtype = weight_shape.dtype;
    if (shape_dtype != TensorDType::kI32 && shape_dtype != TensorDType::kI64) {
        return invalid_argument_error(label(weight_shape) + ": dtype " +
                                      tensor_dtype_name(shape_dtype) + ", expected I32 or I64");
    }
    EDGE_RETURN_IF_ERROR(check_tensor(weight_shape, shape_dtype, {2}, "weight_shape"));
    int64_t dims[2];
    for (int i = 0; i < 2; ++i) {
        if (shape_dtype == TensorDType::kI32) {
            int32_t v;
            std::memcpy(&v, static_cast<const uint8_t*>(weight_shape.data) + 4 * i, 4);
            dims[i] = v;
        } else {
            std::memcpy(&dims[i], static_cast<const uint8_t*>(weight_shape.data) + 8 * i, 8);
        }
    }
    const int64_t rows = dims[0];
    const int64_t cols = dims[1];
    if (rows <= 0 || cols <= 0 || rows > kMaxDim || cols > kMaxDim) {
        return invalid_argument_error(label(weight_shape) + ": bad weight shape [" +
                                      std::to_string(rows) + ", " + std::to_string(cols) + "]");
    }
    if (expected_rows > 0 && expected_cols > 0 && (rows != expected_rows || cols != expected_cols)) {
        return invalid_argument_error(label(weight_shape) + " is [" + std::to_string(rows) + ", " +
                                      std::to_string(cols) + "], but the model's config wants [" +
                                      std::to_string(expected_rows) + ", " +
                                      std::to_string(expected_cols) + "]");
    }
    if (cols % group_size != 0) {
        return invalid_argument_error(label(weight_packed) + ": " + std::to_string(cols) +
                                      " input features are not a multiple of group_size " +
                                      std::to_string(group_size));
    }
    EDGE_RETURN_IF_ERROR(
        check_tensor(weight_packed, TensorDType::kI32, {rows, cols / 8}, "weight_packed"));
    EDGE_ASSIGN_OR_RETURN(auto scales, read_float_scales(weight_scale, {rows, cols / group_size},
                                                         "weight_scale, one per group"));
    const WeightFormat format = group_size == 32 ? WeightFormat::kInt4G32 : WeightFormat::kInt4G128;
    return QuantizedWeight(format, rows, cols, weight_packed.data, std::move(scales));
}

Result<std::vector<int32_t>> pack_int4_to_int32(const int8_t* q, int64_t rows, int64_t cols) {
    if (rows < 0 || cols < 0 || rows > kMaxDim || cols > kMaxDim) {
        return invalid_argument_error("pack_int4_to_int32: bad shape");
    }
    const int64_t words_per_row = ceil_div(cols, 8);
    std::vector<int32_t> out(static_cast<size_t>(rows * words_per_row), 0);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
            const int v = q[r * cols + c];
            if (v < -8 || v > 7) {
                return invalid_argument_error("pack_int4_to_int32: value " + std::to_string(v) +
                                              " at [" + std::to_string(r) + ", " +
                                              std::to_string(c) + "] is outside [-8, 7]");
            }
            uint32_t& word = reinterpret_cast<uint32_t&>(out[r * words_per_row + c / 8]);
            word |= static_cast<uint32_t>(v + 8) << (4 * (c % 8));
        }
    }
    return out;
}

Result<std::vector<int8_t>> unpack_int32_to_int4(const int32_t* words, int64_t word_count,
                                                 int64_t rows, int64_t cols) {
    if (rows < 0 || cols < 0 || rows > kMaxDim || cols > kMaxDim) {
        return invalid_argument_error("unpack_int32_to_int4: bad shape");
    }
    const int64_t words_per_row = ceil_div(cols, 8);
    if (word_count < rows * words_per_row) {
        return invalid_argument_error("unpack_int32_to_int4: " + std::to_string(word_count) +
                                      " words, shape [" + std::to_string(rows) + ", " +
                                      std::to_string(cols) + "] needs " +
                                      std::to_string(rows * words_per_row));
    }
    std::vector<int8_t> out(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
            const auto word = static_cast<uint32_t>(words[r * words_per_row + c / 8]);
            out[r * cols + c] =
                static_cast<int8_t>(static_cast<int>((word >> (4 * (c % 8))) & 0xF) - 8);
        }
    }
    return out;
}

}  // namespace edge::engine::quant
