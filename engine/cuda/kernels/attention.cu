// Paged KV-cache writes and causal GQA attention over the paged cache (prefill and decode).

#include <cfloat>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kernels/device_util.cuh"
#include "engine/cuda/kernels/kernels.h"

namespace edge::engine::cuda::kernels {
namespace {

constexpr int kWarps = kAttentionThreads / 32;
constexpr int kTileBlocks = kAttentionTile / kKvBlockTokens;  // Physical blocks a tile spans.
static_assert(kAttentionTile % kKvBlockTokens == 0);

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

// Max and sum over the block's kAttentionThreads threads, to every thread. `red` holds kWarps
// floats; both contain __syncthreads, so every thread calls them.
__device__ __forceinline__ float attention_block_max(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    if (threadIdx.x % 32 == 0) {
        red[threadIdx.x / 32] = v;
    }
    __syncthreads();
    float r = red[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
        r = fmaxf(r, red[w]);
    }
    __syncthreads();
    return r;
}

__device__ __forceinline__ float attention_block_sum(float v, float* red) {
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) {
        red[threadIdx.x / 32] = v;
    }
    __syncthreads();
    float r = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
        r += red[w];
    }
    __syncthreads();
    return r;
}

// One block per (token, query head), over kAttentionTile (= kAttentionThreads) positions at a
// time with an online softmax, so shared memory stays fixed for any context length. A tile starts
// by reading its kTileBlocks physical block ids into shared memory once; then each thread scores
// one position (its whole key row, four floats a load), and for the output each thread owns four
// dims of one position slot (head_dim 64: 16 threads a row, 8 slots taking every 8th position),
// the slots summed at the end. No load waits on another (the block ids are already there), so a
// tile costs a few memory latencies instead of one per position.
__global__ void __launch_bounds__(kAttentionThreads)
    attention_kernel(PagedKvLayout layout, int32_t layer, const float* q, int32_t q_heads,
                     const int32_t* seq_of_token, const int32_t* pos_of_token,
                     const int32_t* block_table, int32_t max_blocks, const float* pool,
                     float scale, float* out) {
    extern __shared__ float smem[];
    float* weights = smem;                                            // kAttentionTile.
    float* red = weights + kAttentionTile;                            // kWarps.
    int32_t* tile_blocks = reinterpret_cast<int32_t*>(red + kWarps);  // kTileBlocks.
    float* qs = red + kWarps + kTileBlocks;                           // head_dim.
    float* part = qs + layout.head_dim;  // 4 * kAttentionThreads: the slots' sums.
    const int64_t t = blockIdx.x;
    const int32_t h = blockIdx.y;
    const int32_t hd = layout.head_dim;
    const int32_t kvh = h / (q_heads / layout.kv_heads);
    const int32_t n_ctx = pos_of_token[t] + 1;
    const int32_t used_blocks = (n_ctx + kKvBlockTokens - 1) / kKvBlockTokens;
    const int32_t* table = block_table + static_cast<int64_t>(seq_of_token[t]) * max_blocks;
    const float* kp = pool + layout.plane_offset(layer, 0);
    const float* vp = pool + layout.plane_offset(layer, 1);
    const float* qh = q + (t * q_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        qs[d] = qh[d];
    }
    const int quads = hd / 4;
    const int slots = kAttentionThreads / quads;
    const int quad = threadIdx.x % quads;
    const int slot = threadIdx.x / quads;
    const float4* q4 = reinterpret_cast<const float4*>(qs);
    float m = -FLT_MAX;
    float l = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int32_t p0 = 0; p0 < n_ctx; p0 += kAttentionTile) {
        if (threadIdx.x < kTileBlocks) {
            const int32_t b = p0 / kKvBlockTokens + static_cast<int32_t>(threadIdx.x);
            tile_blocks[threadIdx.x] = b < used_blocks ? table[b] : 0;
        }
        __syncthreads();  // tile_blocks (and, the first time, qs).
        const int32_t i = static_cast<int32_t>(threadIdx.x);
        float score = -FLT_MAX;
        if (p0 + i < n_ctx) {
            // Rows are head_dim (a multiple of 32) floats from a cudaMalloc'd pool: 16-byte
            // aligned.
            const float4* k4 = reinterpret_cast<const float4*>(
                kp + layout.row_offset(tile_blocks[i / kKvBlockTokens], kvh, i % kKvBlockTokens));
            float dot = 0.0f;
#pragma unroll 8
            for (int j = 0; j < hd / 4; ++j) {  // hd / 4 is a multiple of 8.
                const float4 a = k4[j];
                const float4 b = q4[j];
                dot += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            }
            score = dot * scale;
        }
        const float m_new = fmaxf(m, attention_block_max(score, red));
        const float corr = expf(m - m_new);
        const float e = p0 + i < n_ctx ? expf(score - m_new) : 0.0f;
        weights[i] = e;
        l = l * corr + attention_block_sum(e, red);  // Its barrier publishes `weights`.
        acc.x *= corr;
        acc.y *= corr;
        acc.z *= corr;
        acc.w *= corr;
        const int live = min(kAttentionTile, n_ctx - p0);
        if (slot < slots) {
#pragma unroll 8
            for (int r = slot; r < live; r += slots) {
                const float wr = weights[r];
                const float4 v = reinterpret_cast<const float4*>(
                    vp + layout.row_offset(tile_blocks[r / kKvBlockTokens], kvh,
                                           r % kKvBlockTokens))[quad];
                acc.x += wr * v.x;
                acc.y += wr * v.y;
                acc.z += wr * v.z;
                acc.w += wr * v.w;
            }
        }
        m = m_new;
        __syncthreads();  // weights and tile_blocks are rewritten by the next tile.
    }
    if (slot < slots) {
        reinterpret_cast<float4*>(part + slot * hd)[quad] = acc;
    }
    __syncthreads();
    float* o = out + (t * q_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float sum = 0.0f;
        for (int k = 0; k < slots; ++k) {
            sum += part[k * hd + d];
        }
        o[d] = sum / l;
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
