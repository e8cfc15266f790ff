#include "engine/quant/fp8.h"

#include <array>
#include <bit>
#include <cmath>
#include <limits>

namespace edge::engine::quant {
namespace {

float decode_uncached(uint8_t bits) {
    const bool negative = (bits & 0x80) != 0;
    const int exponent = (bits >> 3) & 0xF;
    const int mantissa = bits & 0x7;
    float magnitude;
    if ((bits & 0x7F) == 0x7F) {
        magnitude = std::numeric_limits<float>::quiet_NaN();
    } else if (exponent == 0) {
        magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // 2^(1-7) * m/8.
    } else {
        magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
    }
    return negative ? -magnitude : magnitude;
}

std::array<float, 256> build_table() {
    std::array<float, 256> table{};
    for (int i = 0; i < 256; ++i) {
        table[i] = decode_uncached(static_cast<uint8_t>(i));
    }
    return table;
}

const std::array<float, 256>& table() {
    static const std::array<float, 256> t = build_table();
    return t;
}

}  // namespace

uint8_t fp8_e4m3_encode(float v) {
    const uint32_t bits = std::bit_cast<uint32_t>(v);
    const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
    const float a = std::fabs(v);
    if (std::isnan(v)) {
        return sign | kFp8E4M3NanBits;
    }
    if (a >= kFp8E4M3Max) {
        return sign | kFp8E4M3MaxBits;
    }
    if (a < 0.015625f) {  // Below the smallest normal 2^-6: a multiple of 2^-9.
        // a * 512 is exact (a power-of-two scaling of a value far above f32's subnormal range or
        // itself subnormal, where the product stays exact), so this is the exact quotient.
        const float q = a * 512.0f;
        uint32_t whole = static_cast<uint32_t>(q);
        const float frac = q - static_cast<float>(whole);
        if (frac > 0.5f || (frac == 0.5f && (whole & 1) != 0)) {
            ++whole;
        }
        // whole == 8 is code 0x08, the smallest normal: the encodings are contiguous.
        return sign | static_cast<uint8_t>(whole);
    }
    const uint32_t abits = bits & 0x7FFFFFFF;
    int exponent = static_cast<int>(abits >> 23) - 127;  // In [-6, 8].
    const uint32_t mantissa = abits & 0x7FFFFF;
    uint32_t keep = mantissa >> 20;
    const uint32_t rest = mantissa & 0xFFFFF;
    constexpr uint32_t kHalf = 0x80000;
    if (rest > kHalf || (rest == kHalf && (keep & 1) != 0)) {
        ++keep;
    }
    if (keep == 8) {
        keep = 0;
        ++exponent;
    }
    const uint32_t code = (static_cast<uint32_t>(exponent + 7) << 3) | keep;
    if (code > kFp8E4M3MaxBits) {  // Rounded up past 448 (from just below 464).
        return sign | kFp8E4M3MaxBits;
    }
    return sign | static_cast<uint8_t>(code);
}

float fp8_e4m3_decode(uint8_t bits) { return table()[bits]; }

const float* fp8_e4m3_table() { return table().data(); }

}  // namespace edge::engine::quant
