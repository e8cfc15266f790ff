#include "engine/cuda/nccl_reduce.h"

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/host/launch_plan.h"

namespace edge::engine::cuda {
namespace {

template <typename T>
__global__ void sum_in_order_kernel(const T* gathered, int32_t ranks, int64_t n, T* out) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        T acc = gathered[i];
        for (int32_t r = 1; r < ranks; ++r) {
            acc += gathered[r * n + i];
        }
        out[i] = acc;
    }
}

}  // namespace

template <typename T>
Status sum_ranks_in_order(const T* gathered, int32_t ranks, int64_t n, T* out,
                          cudaStream_t stream) {
    if (n <= 0) {
        return ok_status();
    }
    const LaunchShape s = plan_elementwise(n);
    sum_in_order_kernel<T><<<static_cast<unsigned>(s.grid_x), s.block, 0, stream>>>(
        gathered, ranks, n, out);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("sum_ranks_in_order");
    return ok_status();
}

template Status sum_ranks_in_order<float>(const float*, int32_t, int64_t, float*, cudaStream_t);
template Status sum_ranks_in_order<int64_t>(const int64_t*, int32_t, int64_t, int64_t*,
                                            cudaStream_t);

}  // namespace edge::engine::cuda
