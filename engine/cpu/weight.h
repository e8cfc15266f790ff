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

struct Weight {
    WeightFormat format = WeightFormat::kF32;
    int64_t rows = 0;
    int64_t cols = 0;
    const void* data = nullptr;    // Stored elements.
    const float* scales = nullptr; // Format-specific scales; nullptr for float formats.
};

}  // namespace edge::engine
