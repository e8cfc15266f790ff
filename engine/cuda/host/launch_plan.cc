#include "engine/cuda/host/launch_plan.h"

#include <algorithm>
#include <string>

#include "common/arith.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine::cuda {
namespace {

constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxGridY = 65535;

}  // namespace

bool cuda_matmul_supports(WeightFormat format) {
    switch (format) {
        case WeightFormat::kF32:
        case WeightFormat::kBF16:
        case WeightFormat::kF16:
        case WeightFormat::kFP8E4M3Block128:
        case WeightFormat::kInt8Row:
        case WeightFormat::kInt4G32:
        case WeightFormat::kInt4G128:
            return true;
    }
    return false;
}

Result<MatmulPlan> plan_grouped_matmul(WeightFormat format, int64_t rows, int64_t cols,
                                       int64_t groups, int64_t x_rows) {
    const std::string what = std::string("cuda matmul (") + quant::weight_format_name(format) +
                             ", " + std::to_string(rows) + " x " + std::to_string(cols) + ", " +
                             std::to_string(groups) + " groups)";
    if (!cuda_matmul_supports(format)) {
        return invalid_argument_error(what + ": format not supported");
    }
    if (rows <= 0 || cols <= 0 || groups <= 0 || x_rows < 0) {
        return invalid_argument_error(what + ": empty shape");
    }
    const int64_t g = quant::int4_group_size(format);
    if (g > 0 && cols % g != 0) {
        return invalid_argument_error(what + ": cols is not a multiple of the int4 group " +
                                      std::to_string(g));
    }
    if (ceil_div(rows, kMatmulWarps) > kMaxGridX || groups > kMaxGridY) {
        return invalid_argument_error(what + ": beyond the launch grid limits");
    }
    MatmulPlan plan;
    plan.shape.grid_x = ceil_div(rows, kMatmulWarps);
    plan.by_row = x_rows > 0 && x_rows < groups;
    plan.shape.grid_y = plan.by_row ? x_rows : groups;
    plan.shape.block = kMatmulWarps * 32;
    plan.vectorized = cols % 8 == 0;
    return plan;
}

Result<LaunchShape> plan_attention(int64_t tokens, int64_t q_heads, int64_t kv_heads,
                                   int64_t head_dim) {
    const std::string what = "cuda attention (" + std::to_string(tokens) + " tokens, " +
                             std::to_string(q_heads) + "/" + std::to_string(kv_heads) +
                             " heads, head_dim " + std::to_string(head_dim) + ")";
    if (tokens <= 0 || q_heads <= 0 || kv_heads <= 0 || q_heads % kv_heads != 0) {
        return invalid_argument_error(what + ": query heads must be a positive multiple of the "
                                             "KV heads");
    }
    if (head_dim <= 0 || head_dim % 32 != 0 || head_dim > kMaxAttentionHeadDim) {
        return invalid_argument_error(what + ": head_dim must be a multiple of 32 up to " +
                                      std::to_string(kMaxAttentionHeadDim));
    }
    if (tokens > kMaxGridX || q_heads > kMaxGridY) {
        return invalid_argument_error(what + ": beyond the launch grid limits");
    }
    LaunchShape s;
    s.grid_x = tokens;
    s.grid_y = q_heads;
    s.block = kAttentionThreads;
    s.shared_bytes = static_cast<int32_t>(attention_shared_floats(head_dim) * sizeof(float));
    return s;
}

LaunchShape plan_rows(int64_t rows, int64_t cols, int32_t max_threads) {
    LaunchShape s;
    s.grid_x = std::max<int64_t>(rows, 1);
    const int64_t want = ceil_div(std::max<int64_t>(cols, 1), 32) * 32;
    s.block = static_cast<int32_t>(std::clamp<int64_t>(want, 32, std::max(32, max_threads)));
    return s;
}

LaunchShape plan_elementwise(int64_t n, int64_t max_blocks) {
    LaunchShape s;
    s.block = 256;
    s.grid_x = std::clamp<int64_t>(ceil_div(std::max<int64_t>(n, 1), 256), 1, max_blocks);
    return s;
}

}  // namespace edge::engine::cuda
