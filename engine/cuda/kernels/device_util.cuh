#pragma once

// Device-only helpers shared by the kernel files: warp and block reductions, launch conversion.

#include <cuda_runtime.h>

#include "engine/cuda/host/launch_plan.h"

namespace edge::engine::cuda::kernels {

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `shared` holds 32 doubles; contains a __syncthreads, so all threads must call it.
__device__ __forceinline__ double block_sum(double v, double* shared) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) {
        shared[warp] = v;
    }
    __syncthreads();
    double total = 0.0;
    const int warps = blockDim.x / 32;
    for (int i = 0; i < warps; ++i) {
        total += shared[i];
    }
    return total;
}

// (value, index) maximum with ties to the lower index; NaN never wins.
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
    if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) {
        v = ov;
        i = oi;
    }
}

inline dim3 grid_of(const LaunchShape& s) {
    return dim3(static_cast<unsigned>(s.grid_x), static_cast<unsigned>(s.grid_y), 1);
}

}  // namespace edge::engine::cuda::kernels
