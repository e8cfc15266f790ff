#pragma once

// The CUDA kernels of a forward, as validated host entries (internal to engine/cuda and the GPU
// tests; includes CUDA headers). Each entry checks its sizes (launch_plan.h), launches on
// `stream` without synchronizing, and returns the launch's Status; every pointer is device memory
// unless said otherwise. Activations are f32; weights are read in their stored format. Each
// entry has a CPU twin with the same contract in host/cpu_twins.h.
//
// Threading: entries are thread-safe; ordering is the stream's.

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "engine/cpu/weight.h"
#include "engine/cuda/host/paged_kv_layout.h"
#include "engine/cuda/host/router_rule.h"

namespace edge::engine::cuda::kernels {

// out[i] = row ids[i] of `table` (device view; any format dequant_row reads) as f32.
Status embedding(const Weight& table, const int32_t* ids, int64_t n, float* out,
                 cudaStream_t stream);

// RMSNorm of rows x cols (sum of squares in double, as the CPU). `out` may equal `x`.
Status rms_norm(const float* x, const float* weight, int64_t rows, int64_t cols, float eps,
                float* out, cudaStream_t stream);

// RoPE in place on x = [tokens][heads][head_dim]; see twin::rope. inv_freq: rot_dim / 2 doubles.
Status rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
            int64_t rot_dim, const double* inv_freq, bool neox, float mscale,
            cudaStream_t stream);

// Stores k/v = [tokens][kv_heads][head_dim] in the paged pool (layout in paged_kv_layout.h).
Status paged_kv_write(const PagedKvLayout& layout, int32_t layer, const float* k, const float* v,
                      const int32_t* seq_of_token, const int32_t* pos_of_token, int64_t tokens,
                      const int32_t* block_table, int32_t max_blocks_per_seq, float* pool,
                      cudaStream_t stream);

// Causal GQA attention over the paged cache for prefill and decode alike: token t sees positions
// [0, pos_of_token[t]] of its sequence. q and out are [tokens][q_heads][head_dim].
Status paged_attention(const PagedKvLayout& layout, int32_t layer, const float* q, int64_t tokens,
                       int32_t q_heads, const int32_t* seq_of_token, const int32_t* pos_of_token,
                       const int32_t* block_table, int32_t max_blocks_per_seq, const float* pool,
                       float scale, float* out, cudaStream_t stream);

// Routing (router_rule.h's rule, a warp per token, its scratch in shared memory).
Status route(const float* logits, const float* bias, const RouterParams& p, int64_t tokens,
             int32_t* idx, float* w, cudaStream_t stream);

// Stable grouping of assignments by expert (twin::permute). offsets: E + 1; row_of: tokens * K;
// permuted: tokens * K rows of H.
Status permute(const int32_t* idx, int64_t tokens, int32_t K, int32_t E, const float* x,
               int64_t H, int32_t* offsets, int32_t* row_of, float* permuted,
               cudaStream_t stream);

// out[t] (+)= sum_j w[t, j] * y[row_of[t, j]].
Status unpermute(const float* y, const int32_t* row_of, const float* w, int64_t tokens, int32_t K,
                 int64_t H, bool accumulate, float* out, cudaStream_t stream);

// `groups` weights of one format and shape (one per expert): data[g] and scales[g] are device
// arrays of device pointers (scales may be null for float formats).
struct GroupedWeights {
    WeightFormat format = WeightFormat::kBF16;
    int64_t rows = 0;                     // Outputs per weight.
    int64_t cols = 0;                     // Inputs per weight.
    int64_t groups = 0;                   // Weights.
    const void* const* data = nullptr;    // Device array of `groups` device pointers.
    const float* const* scales = nullptr; // Device array of `groups` pointers, or null.
};

// y[t] = W_g x[t] (rows outputs, stride rows) for t in [offsets[g], offsets[g + 1]) of each group;
// offsets (groups + 1 ints) live on the device, so the launch can be captured in a graph before
// the routing is known. x_rows, when given, is offsets[groups] (the routed experts' B * K): with
// fewer rows than groups each row gets its own blocks (plan_grouped_matmul). Fused dequantization
// for every format in cuda_matmul_supports().
Status grouped_matmul(const GroupedWeights& w, const int32_t* offsets, const float* x, float* y,
                      cudaStream_t stream, int64_t x_rows = 0);

// out[i] = silu(gate[i]) * up[i].
Status silu_mul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);

// out[i] += add[i] (residual connections).
Status add_inplace(float* out, const float* add, int64_t n, cudaStream_t stream);

// x[r * cols + c] += bias[c] for rows x cols (projection biases).
Status add_bias_rows(float* x, const float* bias, int64_t rows, int64_t cols,
                     cudaStream_t stream);

// out[i] = x row idx[i] (cols floats) for i < n: the rows whose logits a serving step computes.
// Every idx[i] must be a row of x (the caller checks them: check_staging).
Status gather_rows(const float* x, const int32_t* idx, int64_t n, int64_t cols, float* out,
                   cudaStream_t stream);

// out[r] = argmax of logits row r (n values), ties to the lower index.
Status argmax(const float* logits, int64_t rows, int64_t n, int32_t* out, cudaStream_t stream);

// Per row r: twin::sample_top_p(logits row, n, temperature[r], top_p[r], u[r]).
Status sample_top_p(const float* logits, int64_t rows, int64_t n, const float* temperature,
                    const float* top_p, const float* u, int32_t* out, cudaStream_t stream);

}  // namespace edge::engine::cuda::kernels
