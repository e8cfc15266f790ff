// Embedding, RMSNorm, RoPE, SwiGLU, residual adds and bias adds.

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kernels/dequant.cuh"
#include "engine/cuda/kernels/device_util.cuh"
#include "engine/cuda/kernels/kernels.h"

namespace edge::engine::cuda::kernels {
namespace {

template <WeightFormat F>
__global__ void embedding_kernel(const void* data, const float* scales, int64_t cols,
                                 const int32_t* ids, float* out) {
    const int64_t t = blockIdx.x;
    const int64_t r = ids[t];
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        out[t * cols + c] = load1<F>(data, scales, r, c, cols);
    }
}

__global__ void rms_norm_kernel(const float* x, const float* weight, int64_t cols, float eps,
                                float* out) {
    __shared__ double shared[32];
    const float* row = x + blockIdx.x * cols;
    double ss = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        ss += static_cast<double>(row[c]) * row[c];
    }
    ss = block_sum(ss, shared);
    const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(cols) + eps));
    float* o = out + blockIdx.x * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        o[c] = row[c] * inv * weight[c];
    }
}

__global__ void rope_kernel(float* x, const int32_t* positions, int64_t heads, int64_t head_dim,
                            int64_t rot_dim, const double* inv_freq, bool neox, float mscale) {
    const int64_t t = blockIdx.x;
    const int64_t half = rot_dim / 2;
    const double pos = positions[t];
    for (int64_t k = threadIdx.x; k < heads * half; k += blockDim.x) {
        const int64_t h = k / half;
        const int64_t i = k % half;
        const double a = pos * inv_freq[i];
        const float cs = static_cast<float>(cos(a)) * mscale;
        const float sn = static_cast<float>(sin(a)) * mscale;
        float* head = x + (t * heads + h) * head_dim;
        const int64_t i0 = neox ? i : 2 * i;
        const int64_t i1 = neox ? i + half : 2 * i + 1;
        const float u = head[i0];
        const float v = head[i1];
        head[i0] = u * cs - v * sn;
        head[i1] = v * cs + u * sn;
    }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
    for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void add_kernel(float* out, const float* add, int64_t n) {
    for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        out[i] += add[i];
    }
}

__global__ void gather_rows_kernel(const float* x, const int32_t* idx, int64_t cols, float* out) {
    const float* row = x + static_cast<int64_t>(idx[blockIdx.x]) * cols;
    float* o = out + static_cast<int64_t>(blockIdx.x) * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        o[c] = row[c];
    }
}

__global__ void add_bias_kernel(float* x, const float* bias, int64_t n, int64_t cols) {
    for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        x[i] += bias[i % cols];
    }
}

}  // namespace

Status embedding(const Weight& table, const int32_t* ids, int64_t n, float* out,
                 cudaStream_t stream) {
    if (n <= 0) {
        return ok_status();
    }
    const LaunchShape s = plan_rows(n, table.cols);
    const bool known = dispatch_format(table.format, [&](auto tag) {
        embedding_kernel<decltype(tag)::kFormat><<<grid_of(s), s.block, 0, stream>>>(
            table.data, table.scales, table.cols, ids, out);
    });
    if (!known) {
        return invalid_argument_error("cuda embedding: unknown weight format");
    }
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("embedding");
    return ok_status();
}

Status rms_norm(const float* x, const float* weight, int64_t rows, int64_t cols, float eps,
                float* out, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) {
        return rows == 0 ? ok_status() : invalid_argument_error("cuda rms_norm: cols <= 0");
    }
    const LaunchShape s = plan_rows(rows, cols);
    rms_norm_kernel<<<grid_of(s), s.block, 0, stream>>>(x, weight, cols, eps, out);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("rms_norm");
    return ok_status();
}

Status rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
            int64_t rot_dim, const double* inv_freq, bool neox, float mscale,
            cudaStream_t stream) {
    if (rot_dim <= 0 || rot_dim % 2 != 0 || rot_dim > head_dim) {
        return invalid_argument_error("cuda rope: rot_dim " + std::to_string(rot_dim) +
                                      " must be even and within head_dim " +
                                      std::to_string(head_dim));
    }
    if (tokens <= 0) {
        return ok_status();
    }
    const LaunchShape s = plan_rows(tokens, heads * rot_dim / 2);
    rope_kernel<<<grid_of(s), s.block, 0, stream>>>(x, positions, heads, head_dim, rot_dim,
                                                    inv_freq, neox, mscale);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("rope");
    return ok_status();
}

Status silu_mul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
    if (n <= 0) {
        return ok_status();
    }
    const LaunchShape s = plan_elementwise(n);
    silu_mul_kernel<<<grid_of(s), s.block, 0, stream>>>(gate, up, n, out);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("silu_mul");
    return ok_status();
}

Status add_inplace(float* out, const float* add, int64_t n, cudaStream_t stream) {
    if (n <= 0) {
        return ok_status();
    }
    const LaunchShape s = plan_elementwise(n);
    add_kernel<<<grid_of(s), s.block, 0, stream>>>(out, add, n);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("add");
    return ok_status();
}

Status gather_rows(const float* x, const int32_t* idx, int64_t n, int64_t cols, float* out,
                   cudaStream_t stream) {
    if (n < 0 || cols <= 0) {
        return invalid_argument_error("cuda gather_rows: " + std::to_string(n) + " x " +
                                      std::to_string(cols));
    }
    if (n == 0) {
        return ok_status();
    }
    const LaunchShape s = plan_rows(n, cols);
    gather_rows_kernel<<<grid_of(s), s.block, 0, stream>>>(x, idx, cols, out);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("gather_rows");
    return ok_status();
}

Status add_bias_rows(float* x, const float* bias, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
    if (rows < 0 || cols <= 0) {
        return invalid_argument_error("cuda add_bias_rows: " + std::to_string(rows) + " x " +
                                      std::to_string(cols));
    }
    if (rows == 0) {
        return ok_status();
    }
    const LaunchShape s = plan_elementwise(rows * cols);
    add_bias_kernel<<<grid_of(s), s.block, 0, stream>>>(x, bias, rows * cols, cols);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("add_bias_rows");
    return ok_status();
}

}  // namespace edge::engine::cuda::kernels
