#pragma once

// Float tensors read element by element from a checkpoint's stored bytes (BF16, F16 or F32):
// norms, biases and embedding rows, which the architectures use as they are stored. Pure
// functions; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/cpu/weight.h"
#include "engine/model/safetensors.h"

namespace edge::engine {

// The in-memory format of a float dtype (F32 for anything but BF16 and F16).
WeightFormat float_format_of(DType d);
// Element i of stored data in format f (BF16, F16, else F32), as f32.
float stored_element(const void* data, WeightFormat f, int64_t i);
// Tensor `name`, which must be a BF16/F16/F32 vector of n values, converted to f32.
Result<std::vector<float>> read_float_vector(const Checkpoint& ckpt, const std::string& name,
                                             int64_t n);

}  // namespace edge::engine
