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

// Rows a block of the absorb and expand kernels takes: kv_b_proj is read once per tile of rows.
constexpr int kRowTile = 8;

// One block per (tile of kRowTile rows, head): q_full[t][j] = sum_i q_nope[t][i] *
// kv_b[h * (nope + v) + i][j] (a thread per latent column, reading kv_b rows coalesced, once for
// the tile), then q_pe copied behind the latent part.
template <WeightFormat F>
__global__ void __launch_bounds__(kMlaThreads)
    absorb_kernel(const void* kv_b, const float* kv_b_scales, MlaDims d, const float* q,
                  int64_t rows, float* q_full) {
    extern __shared__ float qn[];  // [kRowTile][nope]
    const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kRowTile;
    const int here = static_cast<int>(min(static_cast<int64_t>(kRowTile), rows - t0));
    const int64_t h = blockIdx.y;
    const int64_t c = d.kv_lora_rank;
    const int nope = d.nope;
    for (int k = threadIdx.x; k < kRowTile * nope; k += blockDim.x) {
        const int r = k / nope;
        qn[k] = r < here ? q[((t0 + r) * d.heads + h) * d.qk() + k % nope] : 0.0f;
    }
    __syncthreads();
    const int64_t r0 = h * d.kv_b_rows_per_head();
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        float acc[kRowTile];
#pragma unroll
        for (int r = 0; r < kRowTile; ++r) {
            acc[r] = 0.0f;
        }
        for (int i = 0; i < nope; ++i) {
            const float w = load1<F>(kv_b, kv_b_scales, r0 + i, j, c);
#pragma unroll
            for (int r = 0; r < kRowTile; ++r) {
                acc[r] += qn[r * nope + i] * w;
            }
        }
        for (int r = 0; r < here; ++r) {
            q_full[((t0 + r) * d.heads + h) * d.row() + j] = acc[r];
        }
    }
    for (int k = threadIdx.x; k < here * d.rope; k += blockDim.x) {
        const int64_t t = t0 + k / d.rope;
        q_full[(t * d.heads + h) * d.row() + c + k % d.rope] =
            q[(t * d.heads + h) * d.qk() + nope + k % d.rope];
    }
}

// One block per (row, group of kG heads): scores of kMlaTile positions at a time for the whole
// group (a warp per position, lanes over the row, each cached value read once for all kG
// queries), then an online-softmax update of the group's latent outputs (a thread per latent
// column, kLatentPerThread columns of each head in registers). Heads past `heads` in the last
// group have zero queries and are not written.
constexpr int kG = kMlaHeadsPerBlock;

__global__ void __launch_bounds__(kMlaThreads)
    attention_kernel(MlaLatentLayout layout, int32_t layer, int32_t heads, float scale,
                     const float* q_full, const int32_t* seq_of_token, const int32_t* pos_of_token,
                     const int32_t* block_table, int32_t max_blocks, const float* pool,
                     float* o_lat) {
    extern __shared__ float smem[];
    const int32_t c = layout.latent;
    const int32_t width = static_cast<int32_t>(layout.row_floats());
    float* qs = smem;                     // [kG][width]
    float* scores = qs + kG * width;      // [kG][kMlaTile]
    float* m_s = scores + kG * kMlaTile;  // [kG] running max
    float* corr_s = m_s + kG;             // [kG] rescale of this tile
    float* l_s = corr_s + kG;             // [kG] running sum
    const int64_t t = blockIdx.x;
    const int32_t h0 = blockIdx.y * kG;
    const int32_t group = min(kG, heads - h0);
    const int32_t n_ctx = pos_of_token[t] + 1;
    const int32_t* table = block_table + static_cast<int64_t>(seq_of_token[t]) * max_blocks;
    const float* qh = q_full + (t * heads + h0) * width;
    for (int i = threadIdx.x; i < kG * width; i += blockDim.x) {
        qs[i] = i / width < group ? qh[i] : 0.0f;
    }
    if (threadIdx.x < kG) {
        m_s[threadIdx.x] = -FLT_MAX;
        l_s[threadIdx.x] = 0.0f;
    }
    __syncthreads();
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    float acc[kG][kLatentPerThread];
#pragma unroll
    for (int g = 0; g < kG; ++g) {
#pragma unroll
        for (int k = 0; k < kLatentPerThread; ++k) {
            acc[g][k] = 0.0f;
        }
    }
    for (int32_t p0 = 0; p0 < n_ctx; p0 += kMlaTile) {
        const int live = min(kMlaTile, n_ctx - p0);
        for (int pi = warp; pi < kMlaTile; pi += kWarps) {
            const int32_t p = p0 + pi;
            float dot[kG];
#pragma unroll
            for (int g = 0; g < kG; ++g) {
                dot[g] = 0.0f;
            }
            if (p < n_ctx) {
                const float* row = pool + layout.position_offset(layer, table, p);
                for (int j = lane; j < width; j += 32) {
                    const float v = row[j];
#pragma unroll
                    for (int g = 0; g < kG; ++g) {
                        dot[g] += qs[g * width + j] * v;
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < kG; ++g) {
                dot[g] = warp_sum(dot[g]);
            }
            if (lane == 0) {
#pragma unroll
                for (int g = 0; g < kG; ++g) {
                    scores[g * kMlaTile + pi] = p < n_ctx ? dot[g] * scale : -FLT_MAX;
                }
            }
        }
        __syncthreads();
        if (threadIdx.x < kG) {
            const int g = threadIdx.x;
            float tile_max = -FLT_MAX;
            for (int i = 0; i < live; ++i) {
                tile_max = fmaxf(tile_max, scores[g * kMlaTile + i]);
            }
            const float m_new = fmaxf(m_s[g], tile_max);
            corr_s[g] = expf(m_s[g] - m_new);
            m_s[g] = m_new;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < kG * kMlaTile; i += blockDim.x) {
            const int g = i / kMlaTile;
            scores[i] = i % kMlaTile < live ? expf(scores[i] - m_s[g]) : 0.0f;
        }
        __syncthreads();
        if (threadIdx.x < kG) {
            const int g = threadIdx.x;
            float sum = 0.0f;
            for (int i = 0; i < live; ++i) {
                sum += scores[g * kMlaTile + i];
            }
            l_s[g] = l_s[g] * corr_s[g] + sum;
        }
#pragma unroll
        for (int g = 0; g < kG; ++g) {
            const float corr = corr_s[g];
#pragma unroll
            for (int k = 0; k < kLatentPerThread; ++k) {
                acc[g][k] *= corr;
            }
        }
        for (int i = 0; i < live; ++i) {
            const float* row = pool + layout.position_offset(layer, table, p0 + i);
#pragma unroll
            for (int k = 0; k < kLatentPerThread; ++k) {
                const int j = threadIdx.x + k * kMlaThreads;
                if (j < c) {
                    const float v = row[j];
#pragma unroll
                    for (int g = 0; g < kG; ++g) {
                        acc[g][k] += scores[g * kMlaTile + i] * v;
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
        if (g < group) {
            float* o = o_lat + (t * heads + h0 + g) * c;
            const float l = l_s[g];
#pragma unroll
            for (int k = 0; k < kLatentPerThread; ++k) {
                const int j = threadIdx.x + k * kMlaThreads;
                if (j < c) {
                    o[j] = acc[g][k] / l;
                }
            }
        }
    }
}

// One block per (tile of kRowTile rows, head): out[t][e] = kv_b[h * (nope + v) + nope + e] .
// o_lat[t] (a warp per output, lanes over the latent, each kv_b row read once for the tile).
template <WeightFormat F>
__global__ void __launch_bounds__(kMlaThreads)
    expand_kernel(const void* kv_b, const float* kv_b_scales, MlaDims d, const float* o_lat,
                  int64_t rows, float* out) {
    extern __shared__ float ol[];  // [kRowTile][latent]
    const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kRowTile;
    const int here = static_cast<int>(min(static_cast<int64_t>(kRowTile), rows - t0));
    const int64_t h = blockIdx.y;
    const int c = d.kv_lora_rank;
    for (int k = threadIdx.x; k < kRowTile * c; k += blockDim.x) {
        const int r = k / c;
        ol[k] = r < here ? o_lat[((t0 + r) * d.heads + h) * c + k % c] : 0.0f;
    }
    __syncthreads();
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int64_t r0 = h * d.kv_b_rows_per_head() + d.nope;
    for (int e = warp; e < d.v_head_dim; e += kWarps) {
        float acc[kRowTile];
#pragma unroll
        for (int r = 0; r < kRowTile; ++r) {
            acc[r] = 0.0f;
        }
        for (int j = lane; j < c; j += 32) {
            const float w = load1<F>(kv_b, kv_b_scales, r0 + e, j, c);
#pragma unroll
            for (int r = 0; r < kRowTile; ++r) {
                acc[r] += ol[r * c + j] * w;
            }
        }
#pragma unroll
        for (int r = 0; r < kRowTile; ++r) {
            acc[r] = warp_sum(acc[r]);
        }
        if (lane == 0) {
            for (int r = 0; r < here; ++r) {
                out[((t0 + r) * d.heads + h) * d.v_head_dim + e] = acc[r];
            }
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

// (tiles of kRowTile rows) x heads.
dim3 row_tile_grid(int64_t rows, const MlaDims& d) {
    return dim3(static_cast<unsigned>((rows + kRowTile - 1) / kRowTile),
                static_cast<unsigned>(d.heads), 1);
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
    const size_t shared = static_cast<size_t>(kRowTile) * d.nope * sizeof(float);
    if (shared > 48 * 1024) {
        return invalid_argument_error("cuda mla_absorb: qk_nope_head_dim " +
                                      std::to_string(d.nope) + " exceeds shared memory");
    }
    dispatch_format(kv_b.format, [&](auto tag) {
        absorb_kernel<decltype(tag)::kFormat>
            <<<row_tile_grid(rows, d), kMlaThreads, shared, stream>>>(kv_b.data, kv_b.scales, d, q,
                                                                      rows, q_full);
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
    const size_t shared = static_cast<size_t>(kG * (d.row() + kMlaTile) + 3 * kG) * sizeof(float);
    if (shared > 48 * 1024) {
        return invalid_argument_error("cuda mla_attention: rows of " + std::to_string(d.row()) +
                                      " floats exceed shared memory for " + std::to_string(kG) +
                                      " heads a block");
    }
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((d.heads + kG - 1) / kG), 1);
    attention_kernel<<<grid, kMlaThreads, shared, stream>>>(
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
    const size_t shared = static_cast<size_t>(kRowTile) * d.kv_lora_rank * sizeof(float);
    dispatch_format(kv_b.format, [&](auto tag) {
        expand_kernel<decltype(tag)::kFormat>
            <<<row_tile_grid(rows, d), kMlaThreads, shared, stream>>>(kv_b.data, kv_b.scales, d,
                                                                      o_lat, rows, out);
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
