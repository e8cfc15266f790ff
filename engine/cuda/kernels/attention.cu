// Paged KV-cache writes and causal GQA attention over the paged cache (prefill and decode).

#include <cfloat>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kernels/device_util.cuh"
#include "engine/cuda/kernels/kernels.h"

namespace edge::engine::cuda::kernels {
namespace {

constexpr int kDimsPerThread = kMaxAttentionHeadDim / kAttentionThreads;
constexpr int kWarps = kAttentionThreads / 32;

__global__ void kv_write_kernel(PagedKvLayout layout, int32_t layer, const float* k,
                                const float* v, const int32_t* seq_of_token,
                                const int32_t* pos_of_token, const int32_t* block_table,
                                int32_t max_blocks, float* pool) {
    const int64_t t = blockIdx.x;
    const int32_t* table = block_table + static_cast<int64_t>(seq_of_token[t]) * max_blocks;
    const int64_t hd = layout.head_dim;
    float* kp = pool + layout.plane_offset(layer, 0);
    float* vp = pool + layout.plane_offset(layer, 1);
    for (int64_t i = threadIdx.x; i < layout.kv_heads * hd; i += blockDim.x) {
        const int32_t h = static_cast<int32_t>(i / hd);
        const int64_t at = layout.position_offset(table, h, pos_of_token[t]) + i % hd;
        kp[at] = k[t * layout.kv_heads * hd + i];
        vp[at] = v[t * layout.kv_heads * hd + i];
    }
}

// One block per (token, query head). Scores of kAttentionTile positions at a time (a warp per
// position, lanes over head_dim), then an online-softmax update of the output (a thread per
// output dim), so shared memory stays fixed for any context length.
__global__ void __launch_bounds__(kAttentionThreads)
    attention_kernel(PagedKvLayout layout, int32_t layer, const float* q, int32_t q_heads,
                     const int32_t* seq_of_token, const int32_t* pos_of_token,
                     const int32_t* block_table, int32_t max_blocks, const float* pool,
                     float scale, float* out) {
    extern __shared__ float smem[];
    float* scores = smem;
    float* qs = smem + kAttentionTile;
    const int64_t t = blockIdx.x;
    const int32_t h = blockIdx.y;
    const int32_t hd = layout.head_dim;
    const int32_t kvh = h / (q_heads / layout.kv_heads);
    const int32_t n_ctx = pos_of_token[t] + 1;
    const int32_t* table = block_table + static_cast<int64_t>(seq_of_token[t]) * max_blocks;
    const float* kp = pool + layout.plane_offset(layer, 0);
    const float* vp = pool + layout.plane_offset(layer, 1);
    const float* qh = q + (t * q_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        qs[d] = qh[d];
    }
    __syncthreads();
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    float m = -FLT_MAX;
    float l = 0.0f;
    float acc[kDimsPerThread];
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j) {
        acc[j] = 0.0f;
    }
    for (int32_t p0 = 0; p0 < n_ctx; p0 += kAttentionTile) {
        for (int pi = warp; pi < kAttentionTile; pi += kWarps) {
            const int32_t p = p0 + pi;
            float dot = 0.0f;
            if (p < n_ctx) {
                const float* k = kp + layout.position_offset(table, kvh, p);
                for (int d = lane; d < hd; d += 32) {
                    dot += qs[d] * k[d];
                }
            }
            dot = warp_sum(dot);
            if (lane == 0) {
                scores[pi] = p < n_ctx ? dot * scale : -FLT_MAX;
            }
        }
        __syncthreads();
        float tile_max = -FLT_MAX;
        const int live = min(kAttentionTile, n_ctx - p0);
        for (int i = 0; i < live; ++i) {
            tile_max = fmaxf(tile_max, scores[i]);
        }
        const float m_new = fmaxf(m, tile_max);
        const float corr = expf(m - m_new);
        l *= corr;
#pragma unroll
        for (int j = 0; j < kDimsPerThread; ++j) {
            acc[j] *= corr;
        }
        for (int i = 0; i < live; ++i) {
            const float e = expf(scores[i] - m_new);
            l += e;
            const float* v = vp + layout.position_offset(table, kvh, p0 + i);
#pragma unroll
            for (int j = 0; j < kDimsPerThread; ++j) {
                const int d = threadIdx.x + j * kAttentionThreads;
                if (d < hd) {
                    acc[j] += e * v[d];
                }
            }
        }
        m = m_new;
        __syncthreads();
    }
    float* o = out + (t * q_heads + h) * hd;
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j) {
        const int d = threadIdx.x + j * kAttentionThreads;
        if (d < hd) {
            o[d] = acc[j] / l;
        }
    }
}

Status check_layout(const PagedKvLayout& layout, int32_t layer) {
    if (layer < 0 || layer >= layout.layers || layout.kv_heads <= 0 || layout.head_dim <= 0 ||
        layout.num_blocks <= 0) {
        return invalid_argument_error("cuda paged KV: layer " + std::to_string(layer) +
                                      " outside a layout of " + std::to_string(layout.layers) +
                                      " layers, or an empty layout");
    }
    return ok_status();
}

}  // namespace

Status paged_kv_write(const PagedKvLayout& layout, int32_t layer, const float* k, const float* v,
                      const int32_t* seq_of_token, const int32_t* pos_of_token, int64_t tokens,
                      const int32_t* block_table, int32_t max_blocks_per_seq, float* pool,
                      cudaStream_t stream) {
    EDGE_RETURN_IF_ERROR(check_layout(layout, layer));
    if (tokens <= 0) {
        return ok_status();
    }
    const LaunchShape s = plan_rows(tokens, static_cast<int64_t>(layout.kv_heads) * layout.head_dim);
    kv_write_kernel<<<grid_of(s), s.block, 0, stream>>>(layout, layer, k, v, seq_of_token,
                                                        pos_of_token, block_table,
                                                        max_blocks_per_seq, pool);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("paged_kv_write");
    return ok_status();
}

Status paged_attention(const PagedKvLayout& layout, int32_t layer, const float* q, int64_t tokens,
                       int32_t q_heads, const int32_t* seq_of_token, const int32_t* pos_of_token,
                       const int32_t* block_table, int32_t max_blocks_per_seq, const float* pool,
                       float scale, float* out, cudaStream_t stream) {
    EDGE_RETURN_IF_ERROR(check_layout(layout, layer));
    if (tokens <= 0) {
        return ok_status();
    }
    EDGE_ASSIGN_OR_RETURN(LaunchShape s,
                          plan_attention(tokens, q_heads, layout.kv_heads, layout.head_dim));
    attention_kernel<<<grid_of(s), s.block, s.shared_bytes, stream>>>(
        layout, layer, q, q_heads, seq_of_token, pos_of_token, block_table, max_blocks_per_seq,
        pool, scale, out);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("paged_attention");
    return ok_status();
}

}  // namespace edge::engine::cuda::kernels
