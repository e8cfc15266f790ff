#include "engine/model/stored_tensor.h"

#include "engine/cpu/convert.h"

namespace edge::engine {

WeightFormat float_format_of(DType d) {
    switch (d) {
        case DType::kBF16:
            return WeightFormat::kBF16;
        case DType::kF16:
            return WeightFormat::kF16;
        default:
            return WeightFormat::kF32;
    }
}

float stored_element(const void* data, WeightFormat f, int64_t i) {
    switch (f) {
        case WeightFormat::kBF16:
            return cpu::bf16_to_f32(cpu::load_u16(data, i));
        case WeightFormat::kF16:
            return cpu::f16_to_f32(cpu::load_u16(data, i));
        default:
            return cpu::load_f32(data, i);
    }
}

Result<std::vector<float>> read_float_vector(const Checkpoint& ckpt, const std::string& name,
                                             int64_t n) {
    static const std::vector<DType> kFloatTypes = {DType::kBF16, DType::kF16, DType::kF32};
    EDGE_ASSIGN_OR_RETURN(TensorView t, ckpt.tensor(name, kFloatTypes, {n}));
    std::vector<float> out(static_cast<size_t>(n));
    const WeightFormat f = float_format_of(t.dtype());
    for (int64_t i = 0; i < n; ++i) {
        out[static_cast<size_t>(i)] = stored_element(t.data, f, i);
    }
    return out;
}

}  // namespace edge::engine
