#pragma once

// Element access into the stored weight formats (engine/cpu/weight.h) shared by the CUDA kernels
// and the host (hd.h): where an element's byte and scale are and how a stored value decodes. The
// grouped matmul kernels dequantize with exactly these functions; the CPU tests check them
// against quant::dequantize_row. Pure functions; thread-safe.

#include <cstdint>
#include <cstring>

#include "engine/cuda/host/hd.h"

namespace edge::engine::cuda {

EDGE_HD float float_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

inline constexpr int64_t kFp8BlockSize = 128;

// Index into the scales of a kFP8E4M3Block128 weight for element (r, c).
EDGE_HD int64_t fp8_scale_index(int64_t r, int64_t c, int64_t cols) {
    return (r / kFp8BlockSize) * ((cols + kFp8BlockSize - 1) / kFp8BlockSize) + c / kFp8BlockSize;
}

// Index into the scales of an int4 weight with groups of `group` inputs for element (r, c).
EDGE_HD int64_t int4_scale_index(int64_t r, int64_t c, int64_t cols, int64_t group) {
    return r * (cols / group) + c / group;
}

// Byte offset of element (r, c) of an int4 weight, and its signed value from that byte.
EDGE_HD int64_t int4_byte_index(int64_t r, int64_t c, int64_t cols) { return r * (cols / 2) + c / 2; }
EDGE_HD int32_t int4_value(uint8_t byte, int64_t c) {
    return static_cast<int32_t>((c & 1) != 0 ? (byte >> 4) : (byte & 0x0F)) - 8;
}

// Value of an E4M3 "fn" byte (bias 7, subnormals, 0x7F/0xFF NaN), without tables or intrinsics.
EDGE_HD float fp8_e4m3_value(uint8_t bits) {
    const int32_t exp = (bits >> 3) & 0x0F;
    const int32_t mant = bits & 0x07;
    float mag;
    if (exp == 0x0F && mant == 0x07) {
        mag = float_from_bits(0x7FC00000u);
    } else if (exp == 0) {
        mag = static_cast<float>(mant) * (1.0f / 512.0f);  // mant / 8 * 2^-6.
    } else {
        // (1 + mant / 8) * 2^(exp - 7), built from the exponent bits so it is exact.
        const float scale = exp >= 7 ? static_cast<float>(1 << (exp - 7))
                                     : 1.0f / static_cast<float>(1 << (7 - exp));
        mag = (1.0f + static_cast<float>(mant) * 0.125f) * scale;
    }
    return (bits & 0x80) != 0 ? -mag : mag;
}

// bf16 bits to f32.
EDGE_HD float bf16_value(uint16_t bits) {
    return float_from_bits(static_cast<uint32_t>(bits) << 16);
}

}  // namespace edge::engine::cuda
