#pragma once

// FP8 E4M3 "fn" encoding (the OCP / NVIDIA variant used by DeepSeek-V3 and Kimi K2 checkpoints):
// 1 sign bit, 4 exponent bits with bias 7, 3 mantissa bits, subnormals, no infinities, the largest
// finite magnitude 448 (0x7E) and NaN encoded as 0x7F / 0xFF. Pure functions; thread-safe.

#include <cstdint>

namespace edge::engine::quant {

inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr uint8_t kFp8E4M3MaxBits = 0x7E;
inline constexpr uint8_t kFp8E4M3NanBits = 0x7F;

// Round-to-nearest-even encoding of `v`. Finite magnitudes above 448 (including ties above it)
// saturate to +-448 rather than become NaN: quantization divides by a block scale chosen so that
// |v| <= 448, and a float rounding step past 448 must not turn a weight into NaN. Infinities also
// saturate; NaN encodes as 0x7F (with the sign). Callers reject NaN/Inf before encoding.
uint8_t fp8_e4m3_encode(float v);

// Exact value of an E4M3 byte (every E4M3 value is exactly representable in f32); NaN for 0x7F
// and 0xFF.
float fp8_e4m3_decode(uint8_t bits);

// The 256-entry decode table behind fp8_e4m3_decode, for kernels.
const float* fp8_e4m3_table();

// Whether `bits` is one of the two NaN encodings.
inline bool fp8_e4m3_is_nan(uint8_t bits) { return (bits & 0x7F) == 0x7F; }

}  // namespace edge::engine::quant
