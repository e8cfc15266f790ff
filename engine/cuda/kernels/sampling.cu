// Greedy (argmax) and temperature + top-p sampling, one block per row.

#include <cfloat>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kernels/device_util.cuh"
#include "engine/cuda/kernels/kernels.h"

namespace edge::engine::cuda::kernels {
namespace {

constexpr int kSampleThreads = 256;
// Greedy decoding's argmax runs once a step over the whole vocabulary: a full block, so each
// thread's chain of loads is short (one row of 32000 took 53 us at 256 threads on an H200).
constexpr int kArgmaxThreads = 1024;

// Block-wide argmax, ties to the lower index; every thread gets the index.
__device__ int block_argmax(const float* row, int64_t n) {
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    float v = -FLT_MAX;
    int i = -1;
#pragma unroll 4
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
        better(v, i, row[c], static_cast<int>(c));
    }
    for (int o = 16; o > 0; o >>= 1) {
        better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
    }
    __syncthreads();
    if (threadIdx.x % 32 == 0) {
        best_v[threadIdx.x / 32] = v;
        best_i[threadIdx.x / 32] = i;
    }
    __syncthreads();
    v = -FLT_MAX;
    i = -1;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
        better(v, i, best_v[w], best_i[w]);
    }
    return i < 0 ? 0 : i;
}

__global__ void argmax_kernel(const float* logits, int64_t n, int32_t* out) {
    const int best = block_argmax(logits + blockIdx.x * n, n);
    if (threadIdx.x == 0) {
        out[blockIdx.x] = best;
    }
}

__device__ __forceinline__ float scaled_exp(float l, float mx, float temperature) {
    return expf((l - mx) / temperature);
}

// twin::sample_top_p: the nucleus threshold by bisection on the bits of non-negative floats
// (mass(e >= x) only falls as x grows, and e <= 1), then a chunked walk in index order.
__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const float* logits, int64_t n, const float* temperature, const float* top_p,
                  const float* u, int32_t* out) {
    __shared__ double shared[32];
    __shared__ double chunk_mass[kSampleThreads];
    const float* row = logits + blockIdx.x * n;
    const int best = block_argmax(row, n);
    const float temp = temperature[blockIdx.x];
    if (!(temp > 0.0f)) {
        if (threadIdx.x == 0) {
            out[blockIdx.x] = best;
        }
        return;
    }
    const float mx = row[best];
    auto mass_at_least = [&](float threshold) {
        double m = 0.0;
        for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
            const float e = scaled_exp(row[c], mx, temp);
            m += e >= threshold ? e : 0.0f;
        }
        return block_sum(m, shared);
    };
    const double target = static_cast<double>(top_p[blockIdx.x]) * mass_at_least(0.0f);
    uint32_t lo = 0;
    uint32_t hi = 0x3F800000u;  // 1.0f, the largest e.
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        if (mass_at_least(__uint_as_float(mid)) >= target) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    const float threshold = __uint_as_float(lo);
    const int64_t chunk = (n + blockDim.x - 1) / blockDim.x;
    const int64_t c0 = threadIdx.x * chunk;
    const int64_t c1 = min(n, c0 + chunk);
    double mine = 0.0;
    for (int64_t c = c0; c < c1; ++c) {
        const float e = scaled_exp(row[c], mx, temp);
        mine += e >= threshold ? e : 0.0f;
    }
    chunk_mass[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        double mass = 0.0;
        for (int i = 0; i < static_cast<int>(blockDim.x); ++i) {
            mass += chunk_mass[i];
        }
        const double goal = static_cast<double>(u[blockIdx.x]) * mass;
        double walk = 0.0;
        int32_t last = best;
        int32_t pick = -1;
        for (int i = 0; i < static_cast<int>(blockDim.x) && pick < 0; ++i) {
            if (walk + chunk_mass[i] <= goal) {
                walk += chunk_mass[i];
                continue;
            }
            for (int64_t c = i * chunk; c < min(n, (i + 1) * chunk); ++c) {
                const float e = scaled_exp(row[c], mx, temp);
                if (e >= threshold) {
                    walk += e;
                    last = static_cast<int32_t>(c);
                    if (walk > goal) {
                        pick = last;
                        break;
                    }
                }
            }
        }
        out[blockIdx.x] = pick >= 0 ? pick : last;
    }
}

}  // namespace

Status argmax(const float* logits, int64_t rows, int64_t n, int32_t* out, cudaStream_t stream) {
    if (rows <= 0) {
        return ok_status();
    }
    if (n <= 0 || n > (int64_t{1} << 31) - 1) {
        return invalid_argument_error("cuda argmax: row length " + std::to_string(n));
    }
    argmax_kernel<<<static_cast<unsigned>(rows), kArgmaxThreads, 0, stream>>>(logits, n, out);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("argmax");
    return ok_status();
}

Status sample_top_p(const float* logits, int64_t rows, int64_t n, const float* temperature,
                    const float* top_p, const float* u, int32_t* out, cudaStream_t stream) {
    if (rows <= 0) {
        return ok_status();
    }
    if (n <= 0 || n > (int64_t{1} << 31) - 1) {
        return invalid_argument_error("cuda sample: row length " + std::to_string(n));
    }
    sample_kernel<<<static_cast<unsigned>(rows), kSampleThreads, 0, stream>>>(
        logits, n, temperature, top_p, u, out);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("sample_top_p");
    return ok_status();
}

}  // namespace edge::engine::cuda::kernels
