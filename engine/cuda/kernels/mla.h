#pragma once

// The CUDA kernels of Multi-head Latent Attention (DeepSeek-V3, Kimi K2) over the paged latent
// cache (host/mla_layout.h), as validated host entries like kernels.h: each checks its sizes,
// launches on `stream` without synchronizing and returns the launch's Status; pointers are device
// memory. Shapes and math are those of the CPU twins in host/mla_twin.h (same names, same
// contracts), which the GPU tests compare them with. kv_b_proj is read in its stored format
// (every format dequant.cuh's load1 reads: f32, bf16, f16, FP8 block-128, int8, int4).
//
// The absorb and expand kernels run one block of kMlaThreads per (tile of 8 rows, head), reading
// kv_b_proj once per tile; the attention one per (row, group of kMlaHeadsPerBlock heads), reading
// each cached row once for the group, and scores kMlaTile cached positions at a time with an
// online softmax, so any context length runs in fixed shared memory.
//
// Threading: entries are thread-safe; ordering is the stream's.

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "engine/cpu/weight.h"
#include "engine/cuda/host/mla_layout.h"
#include "engine/cuda/kernels/kernels.h"

namespace edge::engine::cuda::kernels {

// twin::mla_latent_write: RMSNorm of each kv row's latent with `norm`, the row [latent, k_pe]
// stored at the row's (sequence, position) of `layer`.
Status mla_latent_write(const MlaLatentLayout& layout, int32_t layer, const MlaDims& d,
                        const float* kv, const float* norm, const int32_t* seq_of_token,
                        const int32_t* pos_of_token, int64_t rows, const int32_t* block_table,
                        int32_t max_blocks_per_seq, float* pool, cudaStream_t stream);

// twin::mla_absorb: q [rows][heads][nope + rope] -> q_full [rows][heads][latent + rope]; kv_b is
// a device view of kv_b_proj [heads * (nope + v), latent].
Status mla_absorb(const Weight& kv_b, const MlaDims& d, const float* q, int64_t rows, float* q_full,
                  cudaStream_t stream);

// twin::mla_attention: causal latent attention, o_lat [rows][heads][latent].
Status mla_attention(const MlaLatentLayout& layout, int32_t layer, const MlaDims& d,
                     const float* q_full, int64_t rows, const int32_t* seq_of_token,
                     const int32_t* pos_of_token, const int32_t* block_table,
                     int32_t max_blocks_per_seq, const float* pool, float* o_lat,
                     cudaStream_t stream);

// twin::mla_expand: o_lat -> out [rows][heads][v_head_dim].
Status mla_expand(const Weight& kv_b, const MlaDims& d, const float* o_lat, int64_t rows,
                  float* out, cudaStream_t stream);

// One MLA layer's weights on the device. The projections are single-group GroupedWeights (the
// dense matmul of kernels.h: device arrays holding the data pointer and the scales pointer);
// kv_b is a plain device view, as the absorb and expand kernels read it directly.
struct MlaDeviceWeights {
    GroupedWeights q_a;                // q_a_proj (unused when q_lora_rank is 0).
    const float* q_a_norm = nullptr;   // q_a_layernorm [q_lora_rank].
    GroupedWeights q;                  // q_b_proj, or q_proj when q_lora_rank is 0.
    GroupedWeights kv_a;               // kv_a_proj_with_mqa.
    const float* kv_a_norm = nullptr;  // kv_a_layernorm [latent].
    Weight kv_b;                       // kv_b_proj, device view.
};

// The whole MLA attention of one layer for `rows` rows up to o_proj, the launch sequence of
// twin::mla_attention_layer (same math, same order):
//   x         [rows][hidden] after the input RMSNorm;   out [rows][heads * v_head_dim]
//   offsets   {0, rows} on the device (the dense matmuls' single group; graph-capturable)
//   inv_freq  rope / 2 doubles on the device (YaRN applied), scaled by d.rope_mscale
//   scratch   mla_scratch_floats(d, rows) floats on the device
// The block table must already hold every row's position (checked on the host by the caller with
// check_mla_block_table: the device cannot check it without a sync).
Status mla_attention_layer(const MlaDeviceWeights& w, const MlaDims& d,
                           const MlaLatentLayout& layout, int32_t layer, const float* x,
                           int64_t rows, const int32_t* offsets, const int32_t* seq_of_token,
                           const int32_t* pos_of_token, const int32_t* block_table,
                           int32_t max_blocks_per_seq, const double* inv_freq, float* pool,
                           float* scratch, float* out, cudaStream_t stream);

}  // namespace edge::engine::cuda::kernels
