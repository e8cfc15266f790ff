#pragma once

// Scalar conversions of stored 16-bit floats to f32. `static inline` on purpose: the per-ISA kernel
// files include this too, and internal linkage keeps an AVX-512 copy from being merged into code
// that runs on a plain x86-64. Pure functions; thread-safe.

#include <cstdint>
#include <cstring>

namespace edge::engine::cpu {

// Element i of a stored array whose start may be unaligned (a safetensors data section starts
// wherever the header ends).
static inline uint16_t load_u16(const void* base, int64_t i) {
    uint16_t v;
    std::memcpy(&v, static_cast<const char*>(base) + i * 2, sizeof(v));
    return v;
}

static inline float load_f32(const void* base, int64_t i) {
    float v;
    std::memcpy(&v, static_cast<const char*>(base) + i * 4, sizeof(v));
    return v;
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
}

// Round to nearest even; NaN stays NaN.
static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return static_cast<uint16_t>((bits >> 16) | 0x40);
    }
    uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>((bits + rounding) >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {
            // Subnormal: normalise.
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400u) == 0);
            mant &= 0x3ffu;
            bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | mant << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | mant << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
}

}  // namespace edge::engine::cpu
