// Multi-head Latent Attention: latent cache writes, query absorption through kv_b_proj's k part,
// causal attention over the paged latent cache, expansion through kv_b_proj's v part, and the
// launch sequence of a whole layer. Contracts in mla.h; CPU twins in host/mla_twin.h.

#include <cfloat>
#include <string>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kernels/dequant.cuh"
#include "engine/cuda/kernels/device_util.cuh"
#include "engine/cuda/kernels/mla.h"

namespace edge::engine::cuda::kernels {
namespace {

constexpr int kWarps = kMlaThreads / 32;
constexpr int kLatentPerThread = kMlaMaxLatent / kMlaThreads;

// One block per row: RMSNorm of the latent (sum of squares in double, as the CPU), then the row
// [normed latent, k_pe] into the pool.
__global__ void __launch_bounds__(kMlaThreads)
    latent_write_kernel(MlaLatentLayout layout, int32_t layer, float eps, const float* kv,
                        const float* norm, const int32_t* seq_of_token, const int32_t* pos_of_token,
                        const int32_t* block_table, int32_t max_blocks, float* pool) {
    __shared__ double shared[32];
    const int64_t t = blockIdx.x;
    const int64_t c = layout.latent;
    const int64_t width = layout.row_floats();
    const float* src = kv + t * width;
    const int32_t* table = block_table + static_cast<int64_t>(seq_of_token[t]) * max_blocks;
    float* dst = pool + layout.position_offset(layer, table, pos_of_token[t]);
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        ss += static_cast<double>(src[j]) * src[j];
    }
    ss = block_sum(ss, shared);
    const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(c) + eps));
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
        dst[j] = j < c ? src[j] * inv * norm[j] : src[j];
    }
}

// One block per (row, head): q_full[j] = sum_i q_nope[i] * kv_b[h * (nope + v) + i][j] (a thread
// per latent column, reading kv_b rows coalesced), then q_pe copied behind the latent part.
template <WeightFormat F>
__global__ void __launch_bounds__(kMlaThreads)
    absorb_kernel(const void* kv_b, const float* kv_b_scales, MlaDims d, const float* q,
                  float* q_full) {
    extern __shared__ float qn[];
    const int64_t t = blockIdx.x;
    const int64_t h = blockIdx.y;
    const int64_t c = d.kv_lora_rank;
    const float* qh = q + (t * d.heads + h) * d.qk();
    float* qf = q_full + (t * d.heads + h) * d.row();
    for (int i = threadIdx.x; i < d.nope; i += blockDim.x) {
        qn[i] = qh[i];
    }
    __syncthreads();
    const int64_t r0 = h * d.kv_b_rows_per_head();
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < d.nope; ++i) {
            acc += qn[i] * load1<F>(kv_b, kv_b_scales, r0 + i, j, c);
        }
        qf[j] = acc;
    }
    for (int i = threadIdx.x; i < d.rope; i += blockDim.x) {
        qf[c + i] = qh[d.nope + i];
    }
}

// One block per (row, head): scores of kMlaTile positions at a time (a warp per position, lanes
// over the row), then an online-softmax update of the latent output (a thread per latent
// column, kLatentPerThread columns in registers).
__global__ void __launch_bounds__(kMlaThreads)
    attention_kernel(MlaLatentLayout layout, int32_t layer, int32_t heads, float scale,
                     const float* q_full, const int32_t* seq_of_token, const int32_t* pos_of_token,
                     const int32_t* block_table, int32_t max_blocks, const float* pool,
                     float* o_lat) {
    extern __shared__ float smem[];
    float* scores = smem;
    float* qs = smem + kMlaTile;
    const int64_t t = blockIdx.x;
    const int64_t h = blockIdx.y;
    const int32_t c = layout.latent;
    const int32_t width = static_cast<int32_t>(layout.row_floats());
    const int32_t n_ctx = pos_of_token[t] + 1;
    const int32_t* table = block_table + static_cast<int64_t>(seq_of_token[t]) * max_blocks;
    const float* qh = q_full + (t * heads + h) * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        qs[j] = qh[j];
    }
    __syncthreads();
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    float m = -FLT_MAX;
    float l = 0.0f;
    float acc[kLatentPerThread];
#pragma unroll
    for (int k = 0; k < kLatentPerThread; ++k) {
        acc[k] = 0.0f;
    }
    for (int32_t p0 = 0; p0 < n_ctx; p0 += kMlaTile) {
        for (int pi = warp; pi < kMlaTile; pi += kWarps) {
            const int32_t p = p0 + pi;
            float dot = 0.0f;
            if (p < n_ctx) {
                const float* row = pool + layout.position_offset(layer, table, p);
                for (int j = lane; j < width; j += 32) {
                    dot += qs[j] * row[j];
                }
            }
            dot = warp_sum(dot);
            if (lane == 0) {
                scores[pi] = p < n_ctx ? dot * scale : -FLT_MAX;
            }
        }
        __syncthreads();
        const int live = min(kMlaTile, n_ctx - p0);
        float tile_max = -FLT_MAX;
        for (int i = 0; i < live; ++i) {
            tile_max = fmaxf(tile_max, scores[i]);
        }
        const float m_new = fmaxf(m, tile_max);
        const float corr = expf(m - m_new);
        l *= corr;
#pragma unroll
        for (int k = 0; k < kLatentPerThread; ++k) {
            acc[k] *= corr;
        }
        for (int i = 0; i < live; ++i) {
            const float e = expf(scores[i] - m_new);
            l += e;
            const float* row = pool + layout.position_offset(layer, table, p0 + i);
#pragma unroll
            for (int k = 0; k < kLatentPerThread; ++k) {
                const int j = threadIdx.x + k * kMlaThreads;
                if (j < c) {
                    acc[k] += e * row[j];
                }
            }
        }
        m = m_new;
        __syncthreads();
    }
    float* o = o_lat + (t * heads + h) * c;
#pragma unroll
    for (int k = 0; k < kLatentPerThread; ++k) {
        const int j = threadIdx.x + k * kMlaThreads;
        if (j < c) {
            o[j] = acc[k] / l;
        }
    }
}

// One block per (row, head): out[e] = kv_b[h * (nope + v) + nope + e] . o_lat (a warp per output,
// lanes over the latent).
template <WeightFormat F>
__global__ void __launch_bounds__(kMlaThreads)
    expand_kernel(const void* kv_b, const float* kv_b_scales, MlaDims d, const float* o_lat,
                  float* out) {
    extern __shared__ float ol[];
    const int64_t t = blockIdx.x;
    const int64_t h = blockIdx.y;
    const int64_t c = d.kv_lora_rank;
    const float* src = o_lat + (t * d.heads + h) * c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        ol[j] = src[j];
    }
    __syncthreads();
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int64_t r0 = h * d.kv_b_rows_per_head() + d.nope;
    for (int e = warp; e < d.v_head_dim; e += kWarps) {
        float acc = 0.0f;
        for (int64_t j = lane; j < c; j += 32) {
            acc += ol[j] * load1<F>(kv_b, kv_b_scales, r0 + e, j, c);
        }
        acc = warp_sum(acc);
        if (lane == 0) {
            out[(t * d.heads + h) * d.v_head_dim + e] = acc;
        }
    }
}

Status check_rows(int64_t rows, const MlaDims& d, const char* what) {
    if (rows > 0x7fffffffLL) {
        return invalid_argument_error(std::string("cuda ") + what + ": " + std::to_string(rows) +
                                      " rows exceed the grid");
    }
    if (d.heads > 65535) {
        return invalid_argument_error(std::string("cuda ") + what + ": " + std::to_string(d.heads) +
                                      " heads exceed the grid");
    }
    return check_mla_dims(d);
}

Status check_kv_b(const Weight& kv_b, const MlaDims& d, const char* what) {
    if (kv_b.data == nullptr || kv_b.rows != d.heads * d.kv_b_rows_per_head() ||
        kv_b.cols != d.kv_lora_rank) {
        return invalid_argument_error(
            std::string("cuda ") + what + ": kv_b_proj of " + std::to_string(kv_b.rows) + " x " +
            std::to_string(kv_b.cols) + " (or no data) for " + std::to_string(d.heads) +
            " heads of " + std::to_string(d.kv_b_rows_per_head()) + " rows x " +
            std::to_string(d.kv_lora_rank));
    }
    if (!cuda_matmul_supports(kv_b.format)) {
        return invalid_argument_error(std::string("cuda ") + what +
                                      ": kv_b_proj's format is not read by the kernels");
    }
    return ok_status();
}

dim3 row_head_grid(int64_t rows, const MlaDims& d) {
    return dim3(static_cast<unsigned>(rows), static_cast<unsigned>(d.heads), 1);
}

}  // namespace

Status mla_latent_write(const MlaLatentLayout& layout, int32_t layer, const MlaDims& d,
                        const float* kv, const float* norm, const int32_t* seq_of_token,
                        const int32_t* pos_of_token, int64_t rows, const int32_t* block_table,
                        int32_t max_blocks_per_seq, float* pool, cudaStream_t stream) {
    EDGE_RETURN_IF_ERROR(check_rows(rows, d, "mla_latent_write"));
    EDGE_RETURN_IF_ERROR(check_mla_layout(layout, layer, d));
    if (rows <= 0) {
        return ok_status();
    }
    latent_write_kernel<<<static_cast<unsigned>(rows), kMlaThreads, 0, stream>>>(
        layout, layer, d.eps, kv, norm, seq_of_token, pos_of_token, block_table, max_blocks_per_seq,
        pool);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("mla_latent_write");
    return ok_status();
}

Status mla_absorb(const Weight& kv_b, const MlaDims& d, const float* q, int64_t rows, float* q_full,
                  cudaStream_t stream) {
    EDGE_RETURN_IF_ERROR(check_rows(rows, d, "mla_absorb"));
    EDGE_RETURN_IF_ERROR(check_kv_b(kv_b, d, "mla_absorb"));
    if (rows <= 0) {
        return ok_status();
    }
    const size_t shared = static_cast<size_t>(d.nope) * sizeof(float);
    if (shared > 48 * 1024) {
        return invalid_argument_error("cuda mla_absorb: qk_nope_head_dim " +
                                      std::to_string(d.nope) + " exceeds shared memory");
    }
    dispatch_format(kv_b.format, [&](auto tag) {
        absorb_kernel<decltype(tag)::kFormat>
            <<<row_head_grid(rows, d), kMlaThreads, shared, stream>>>(kv_b.data, kv_b.scales, d, q,
                                                                      q_full);
    });
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("mla_absorb");
    return ok_status();
}

Status mla_attention(const MlaLatentLayout& layout, int32_t layer, const MlaDims& d,
                     const float* q_full, int64_t rows, const int32_t* seq_of_token,
                     const int32_t* pos_of_token, const int32_t* block_table,
                     int32_t max_blocks_per_seq, const float* pool, float* o_lat,
                     cudaStream_t stream) {
    EDGE_RETURN_IF_ERROR(check_rows(rows, d, "mla_attention"));
    EDGE_RETURN_IF_ERROR(check_mla_layout(layout, layer, d));
    if (rows <= 0) {
        return ok_status();
    }
    const size_t shared = static_cast<size_t>(kMlaTile + d.row()) * sizeof(float);
    attention_kernel<<<row_head_grid(rows, d), kMlaThreads, shared, stream>>>(
        layout, layer, d.heads, d.softmax_scale, q_full, seq_of_token, pos_of_token, block_table,
        max_blocks_per_seq, pool, o_lat);
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("mla_attention");
    return ok_status();
}

Status mla_expand(const Weight& kv_b, const MlaDims& d, const float* o_lat, int64_t rows,
                  float* out, cudaStream_t stream) {
    EDGE_RETURN_IF_ERROR(check_rows(rows, d, "mla_expand"));
    EDGE_RETURN_IF_ERROR(check_kv_b(kv_b, d, "mla_expand"));
    if (rows <= 0) {
        return ok_status();
    }
    const size_t shared = static_cast<size_t>(d.kv_lora_rank) * sizeof(float);
    dispatch_format(kv_b.format, [&](auto tag) {
        expand_kernel<decltype(tag)::kFormat>
            <<<row_head_grid(rows, d), kMlaThreads, shared, stream>>>(kv_b.data, kv_b.scales, d,
                                                                      o_lat, out);
    });
    EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("mla_expand");
    return ok_status();
}

Status mla_attention_layer(const MlaDeviceWeights& w, const MlaDims& d,
                           const MlaLatentLayout& layout, int32_t layer, const float* x,
                           int64_t rows, const int32_t* offsets, const int32_t* seq_of_token,
                           const int32_t* pos_of_token, const int32_t* block_table,
                           int32_t max_blocks_per_seq, const double* inv_freq, float* pool,
                           float* scratch, float* out, cudaStream_t stream) {
    EDGE_RETURN_IF_ERROR(check_rows(rows, d, "mla_attention_layer"));
    EDGE_RETURN_IF_ERROR(check_mla_layout(layout, layer, d));
    if (rows <= 0) {
        return ok_status();
    }
    // Scratch in mla_scratch_floats' order: query LoRA, query, kv_a output, absorbed queries,
    // latent outputs.
    float* qa = scratch;
    float* q = qa + rows * d.q_lora_rank;
    float* kv = q + rows * d.heads * d.qk();
    float* q_full = kv + rows * d.row();
    float* o_lat = q_full + rows * d.heads * d.row();
    if (d.q_lora_rank > 0) {
        EDGE_RETURN_IF_ERROR(grouped_matmul(w.q_a, offsets, x, qa, stream));
        EDGE_RETURN_IF_ERROR(rms_norm(qa, w.q_a_norm, rows, d.q_lora_rank, d.eps, qa, stream));
        EDGE_RETURN_IF_ERROR(grouped_matmul(w.q, offsets, qa, q, stream));
    } else {
        EDGE_RETURN_IF_ERROR(grouped_matmul(w.q, offsets, x, q, stream));
    }
    EDGE_RETURN_IF_ERROR(grouped_matmul(w.kv_a, offsets, x, kv, stream));
    // The rope dims are the last `rope` of each q head and of each kv row: rotated in place as
    // heads of width qk (or row) starting nope (or latent) floats in, as the twin does.
    EDGE_RETURN_IF_ERROR(rope(q + d.nope, pos_of_token, rows, d.heads, d.qk(), d.rope, inv_freq,
                              !d.interleave, d.rope_mscale, stream));
    EDGE_RETURN_IF_ERROR(rope(kv + d.kv_lora_rank, pos_of_token, rows, 1, d.row(), d.rope, inv_freq,
                              !d.interleave, d.rope_mscale, stream));
    EDGE_RETURN_IF_ERROR(mla_latent_write(layout, layer, d, kv, w.kv_a_norm, seq_of_token,
                                          pos_of_token, rows, block_table, max_blocks_per_seq, pool,
                                          stream));
    EDGE_RETURN_IF_ERROR(mla_absorb(w.kv_b, d, q, rows, q_full, stream));
    EDGE_RETURN_IF_ERROR(mla_attention(layout, layer, d, q_full, rows, seq_of_token, pos_of_token,
                                       block_table, max_blocks_per_seq, pool, o_lat, stream));
    return mla_expand(w.kv_b, d, o_lat, rows, out, stream);
}

}  // namespace edge::engine::cuda::kernels
