// Expert routing, permute/unpermute of tokens to experts, and the grouped expert matmul with
// fused dequantization.

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kernels/dequant.cuh"
#include "engine/cuda/kernels/device_util.cuh"
#include "engine/cuda/kernels/kernels.h"

namespace edge::engine::cuda::kernels {
namespace {

// The K best of `choice` into idx, best first, by a warp: lane l owns experts l + 32 k (bit k of
// its `taken`), each pick the warp's maximum with ties to the lower index. Without NaN scores
// this is router_pick's choice: its scan keeps the first of the highest, -inf included only when
// nothing else is left.
__device__ void warp_pick_top_k(const float* choice, int32_t E, int32_t K, int32_t* idx) {
    const int lane = threadIdx.x % 32;
    uint32_t taken = 0;
    for (int32_t j = 0; j < K; ++j) {
        float v = 0.0f;
        int i = -1;
        for (int32_t k = 0, e = lane; e < E; ++k, e += 32) {
            if (((taken >> k) & 1u) == 0) {
                better(v, i, choice[e], e);
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
        }
        if (i % 32 == lane) {
            taken |= 1u << (i / 32);
        }
        if (lane == 0) {
            idx[j] = i;
        }
    }
}

// A warp per token (router_rule.h's rule, spread over the lanes): scores and picks by lane,
// the sums in the rule's own order by lane 0, scratch in shared memory. A token with a
// non-finite logit or bias runs route_token itself on lane 0 (NaN ordering is the scan's).
__global__ void route_kernel(const float* logits, const float* bias, RouterParams p, int64_t tokens,
                             int32_t* idx, float* w) {
    extern __shared__ float scratch[];
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
    if (t >= tokens) {
        return;  // The whole warp.
    }
    const int32_t E = p.experts;
    const float* lg = logits + t * E;
    int32_t* ti = idx + t * p.top_k;
    float* tw = w + t * p.top_k;
    float* s = scratch + warp * router_scratch_floats(p);
    float* choice = s + E;
    float* group_score = s + 2 * E;
    bool odd = false;
    for (int32_t e = lane; e < E; e += 32) {
        odd = odd || !isfinite(lg[e]) || (bias != nullptr && !isfinite(bias[e]));
    }
    if (__any_sync(0xffffffffu, odd)) {
        if (lane == 0) {
            route_token(lg, bias, p, ti, tw, s);
        }
        return;
    }
    if (p.scoring == RouterScoring::kSoftmax) {
        float mx = -FLT_MAX;
        for (int32_t e = lane; e < E; e += 32) {
            mx = fmaxf(mx, lg[e]);
        }
        for (int o = 16; o > 0; o >>= 1) {
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        }
        for (int32_t e = lane; e < E; e += 32) {
            s[e] = expf(lg[e] - mx);
        }
        __syncwarp();
        float inv = lane == 0 ? router_softmax_inverse(s, E) : 0.0f;
        inv = __shfl_sync(0xffffffffu, inv, 0);
        for (int32_t e = lane; e < E; e += 32) {
            s[e] *= inv;
            choice[e] = s[e];
        }
    } else {
        for (int32_t e = lane; e < E; e += 32) {
            s[e] = 1.0f / (1.0f + expf(-lg[e]));
            choice[e] = s[e] + (bias != nullptr ? bias[e] : 0.0f);
        }
        const int32_t groups = p.n_group > 0 ? p.n_group : 1;
        if (groups > 1 && p.topk_group < groups) {
            const int32_t per = E / groups;
            __syncwarp();
            for (int32_t g = lane; g < groups; g += 32) {
                group_score[g] = router_group_score(choice, g, per);
            }
            __syncwarp();
            if (lane == 0) {
                router_keep_groups(group_score, groups, p.topk_group);
            }
            __syncwarp();
            for (int32_t e = lane; e < E; e += 32) {
                const float gs = group_score[e / per];
                if (gs == gs) {  // Not kept.
                    choice[e] = -INFINITY;
                }
            }
        }
    }
    __syncwarp();
    warp_pick_top_k(choice, E, p.top_k, ti);
    if (lane == 0) {
        router_weights(s, ti, p, tw);
    }
}

// One block; thread e counts expert e's assignments, thread 0 scans, then thread e hands out its
// rows in (token, choice) order: the stable order of the CPU MoE block.
__global__ void permute_plan_kernel(const int32_t* idx, int64_t assignments, int32_t E,
                                    int32_t* offsets, int32_t* row_of) {
    extern __shared__ int32_t counts[];
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t c = 0;
        for (int64_t a = 0; a < assignments; ++a) {
            c += idx[a] == e ? 1 : 0;
        }
        counts[e] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t sum = 0;
        for (int32_t e = 0; e < E; ++e) {
            offsets[e] = sum;
            const int32_t c = counts[e];
            counts[e] = sum;
            sum += c;
        }
        offsets[E] = sum;
    }
    __syncthreads();
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t row = counts[e];
        for (int64_t a = 0; a < assignments; ++a) {
            if (idx[a] == e) {
                row_of[a] = row++;
            }
        }
    }
}

__global__ void gather_kernel(const float* x, const int32_t* row_of, int32_t K, int64_t H,
                              float* permuted) {
    const int64_t a = blockIdx.x;
    const float* src = x + (a / K) * H;
    float* dst = permuted + static_cast<int64_t>(row_of[a]) * H;
    for (int64_t d = threadIdx.x; d < H; d += blockDim.x) {
        dst[d] = src[d];
    }
}

__global__ void unpermute_kernel(const float* y, const int32_t* row_of, const float* w, int32_t K,
                                 int64_t H, bool accumulate, float* out) {
    const int64_t t = blockIdx.x;
    for (int64_t d = threadIdx.x; d < H; d += blockDim.x) {
        float acc = accumulate ? out[t * H + d] : 0.0f;
        for (int32_t j = 0; j < K; ++j) {
            acc += w[t * K + j] * y[static_cast<int64_t>(row_of[t * K + j]) * H + d];
        }
        out[t * H + d] = acc;
    }
}

// A warp per output row r of group blockIdx.y: for each tile of kMatmulTokenTile of the group's
// tokens, read the stored row once, dequantize in registers and accumulate every token's dot.
// (Staging x in shared memory per block was tried: on an H200 it saved a little at one token
// and cost 15-20% at 64, where the shared reads and FMAs bound the loop, not x's traffic.)
// by_row: blockIdx.y is a row of x, done alone in the group that holds it (the last whose
// offset is at most that row: empty groups share their offset with the next).
template <WeightFormat F, bool kVec>
__global__ void __launch_bounds__(kMatmulWarps * 32)
    grouped_matmul_kernel(GroupedWeights w, const int32_t* offsets, bool by_row, const float* x,
                          float* y) {
    const int lane = threadIdx.x % 32;
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kMatmulWarps + threadIdx.x / 32;
    if (r >= w.rows) {
        return;
    }
    int32_t g = blockIdx.y;
    int32_t t0 = 0;
    int32_t t1 = 0;
    if (by_row) {
        const int32_t row = blockIdx.y;
        int32_t lo = 0;
        int32_t hi = static_cast<int32_t>(w.groups);  // offsets[lo] <= row < offsets[hi].
        while (hi - lo > 1) {
            const int32_t mid = (lo + hi) / 2;
            if (offsets[mid] <= row) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        g = lo;
        t0 = row;
        t1 = row + 1;
    } else {
        t0 = offsets[g];
        t1 = offsets[g + 1];
    }
    const void* data = w.data[g];
    const float* scales = w.scales != nullptr ? w.scales[g] : nullptr;
    const int64_t cols = w.cols;
    for (int32_t tb = t0; tb < t1; tb += kMatmulTokenTile) {
        const int nt = min(kMatmulTokenTile, t1 - tb);
        float acc[kMatmulTokenTile];
#pragma unroll
        for (int t = 0; t < kMatmulTokenTile; ++t) {
            acc[t] = 0.0f;
        }
        if constexpr (kVec) {
            // Unrolled so a lane's loads of the row are in flight together.
#pragma unroll 4
            for (int64_t c = lane * 8; c < cols; c += 256) {
                float wv[8];
                load8<F>(data, scales, r, c, cols, wv);
#pragma unroll
                for (int t = 0; t < kMatmulTokenTile; ++t) {
                    if (t < nt) {
                        const float4* xp =
                            reinterpret_cast<const float4*>(x + (tb + t) * cols + c);
                        const float4 a = xp[0];
                        const float4 b = xp[1];
                        acc[t] += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w +
                                  wv[4] * b.x + wv[5] * b.y + wv[6] * b.z + wv[7] * b.w;
                    }
                }
            }
        } else {
            for (int64_t c = lane; c < cols; c += 32) {
                const float wv = load1<F>(data, scales, r, c, cols);
#pragma unroll
                for (int t = 0; t < kMatmulTokenTile; ++t) {
                    if (t < nt) {
                        acc[t] += wv * x[(tb + t) * cols + c];
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < kMatmulTokenTile; ++t) {
            const float s = warp_sum(acc[t]);
            if (lane == 0 && t < nt) {
                y[static_cast<int64_t>(tb + t) * w.rows + r] = s;
            }
        }
    }
}

}  // namespace

Status route(const float* logits, const float* bias, const RouterParams& p, int64_t tokens,
             int32_t* idx, float* w, cudaStream_t stream) {
    if (p.experts <= 0 || p.experts > kMaxRouterExperts || p.top_k <= 0 || p.top_k > p.experts ||
        (p.scoring == RouterScoring::kSigmoid && p.n_group > 1 && p.experts % p.n_group != 0)) {
        return invalid_argument_error("cuda route: " + std::to_string(p.top_k) + " of " +
                                      std::to_string(p.experts) + " experts in " +
                                      std::to_string(p.n_group) + " groups is not supported");
    }
    if (tokens <= 0) {
        return ok_status();
    }
    // A warp per token, as many a block (up to 8) as 48 KiB of scratch holds (E <=
    // kMaxRouterExperts: at least 4).
    const int64_t floats = router_scratch_floats(p);
    const int warps = static_cast<int>(std::clamp<int64_t>(12 * 1024 / floats, 1, 8));
    const int threads = warps * 32;
    const int64_t blocks = (tokens + warps - 1) / warps;
    const size_t shared = static_cast<size_t>(warps * floats) * sizeof(float);
    route_kernel<<<static_cast<unsigned>(blocks), threads, shared, stream>>>(logits, bias, p,
                                                                             tokens, idx, w);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("route");
    return ok_status();
}

Status permute(const int32_t* idx, int64_t tokens, int32_t K, int32_t E, const float* x,
               int64_t H, int32_t* offsets, int32_t* row_of, float* permuted,
               cudaStream_t stream) {
    if (E <= 0 || E > kMaxRouterExperts || K <= 0) {
        return invalid_argument_error("cuda permute: " + std::to_string(E) + " experts, top-" +
                                      std::to_string(K));
    }
    const int threads = static_cast<int>(plan_rows(1, E, 1024).block);
    permute_plan_kernel<<<1, threads, E * sizeof(int32_t), stream>>>(idx, tokens * K, E, offsets,
                                                                    row_of);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("permute plan");
    if (tokens > 0) {
        const LaunchShape s = plan_rows(tokens * K, H);
        gather_kernel<<<grid_of(s), s.block, 0, stream>>>(x, row_of, K, H, permuted);
        EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("permute gather");
    }
    return ok_status();
}

Status unpermute(const float* y, const int32_t* row_of, const float* w, int64_t tokens, int32_t K,
                 int64_t H, bool accumulate, float* out, cudaStream_t stream) {
    if (tokens <= 0) {
        return ok_status();
    }
    const LaunchShape s = plan_rows(tokens, H);
    unpermute_kernel<<<grid_of(s), s.block, 0, stream>>>(y, row_of, w, K, H, accumulate, out);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("unpermute");
    return ok_status();
}

Status grouped_matmul(const GroupedWeights& w, const int32_t* offsets, const float* x, float* y,
                      cudaStream_t stream, int64_t x_rows) {
    EDGE_ASSIGN_OR_RETURN(MatmulPlan plan,
                          plan_grouped_matmul(w.format, w.rows, w.cols, w.groups, x_rows));
    const dim3 grid = grid_of(plan.shape);
    dispatch_format(w.format, [&](auto tag) {
        constexpr WeightFormat F = decltype(tag)::kFormat;
        if (plan.vectorized) {
            grouped_matmul_kernel<F, true>
                <<<grid, plan.shape.block, 0, stream>>>(w, offsets, plan.by_row, x, y);
        } else {
            grouped_matmul_kernel<F, false>
                <<<grid, plan.shape.block, 0, stream>>>(w, offsets, plan.by_row, x, y);
        }
    });
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("grouped_matmul");
    return ok_status();
}

}  // namespace edge::engine::cuda::kernels
