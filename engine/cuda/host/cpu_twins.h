#pragma once

// CPU twins of the CUDA kernels: for each kernel entry (engine/cuda/kernels/kernels.h) a host
// function with the same contract over host buffers, built from the CPU backend's own ops
// (engine/cpu/ops.h, router.h, quant::dequantize_row) wherever one exists. The GPU parity tests
// compare every kernel with its twin; the CPU tests check the twins against the CPU backend.
// Pure functions over caller-owned buffers; thread-safe on disjoint outputs.

#include <cstdint>
#include <span>

#include "engine/cpu/weight.h"
#include "engine/cuda/host/paged_kv_layout.h"
#include "engine/cuda/host/router_rule.h"

namespace edge::engine::cuda::twin {

// out[i] = row ids[i] of `table` (a rows x cols weight in any format) as f32.
void embedding(const Weight& table, const int32_t* ids, int64_t n, float* out);

// RMSNorm of `rows` rows of `cols` values (cpu::rms_norm per row).
void rms_norm_rows(const float* x, const float* weight, int64_t rows, int64_t cols, float eps,
                   float* out);

// RoPE in place on x = [tokens][heads][head_dim] at positions[t]: the first rot_dim values of
// each head (partial rotary leaves the rest), NeoX rotate-half or interleaved pairs; inv_freq
// holds rot_dim / 2 values (engine/cpu/rope_scaling.h), cos/sin scaled by `mscale`.
void rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
          int64_t rot_dim, const double* inv_freq, bool neox, float mscale);

// Writes k/v = [tokens][kv_heads][head_dim] into the paged pool plane of `layer` at each token's
// (sequence, position).
void paged_kv_write(const PagedKvLayout& layout, int32_t layer, const float* k, const float* v,
                    const int32_t* seq_of_token, const int32_t* pos_of_token, int64_t tokens,
                    const int32_t* block_table, int32_t max_blocks_per_seq, float* pool);

// Causal GQA attention of q = [tokens][q_heads][head_dim] over the paged cache: token t of
// sequence seq_of_token[t] at position pos_of_token[t] sees positions [0, pos]. Output like q.
// Gathers the sequence's keys and values and runs cpu::attention_gqa.
void paged_attention(const PagedKvLayout& layout, int32_t layer, const float* q, int64_t tokens,
                     int32_t q_heads, const int32_t* seq_of_token, const int32_t* pos_of_token,
                     const int32_t* block_table, int32_t max_blocks_per_seq, const float* pool,
                     float scale, float* out);

// Routing of `tokens` tokens (logits [tokens][E]): softmax via cpu::softmax and the lower-index
// tie rule, sigmoid via cpu::route_sigmoid_grouped. idx/w are [tokens][K].
void route(const float* logits, const float* bias, const RouterParams& p, int64_t tokens,
           int32_t* idx, float* w);

// Groups the tokens' (token, choice) assignments by expert, stably in (token, choice) order:
// offsets (E + 1) are the experts' first rows, row_of[t * K + j] the row of an assignment, and
// permuted[row] = x[t] (H values).
void permute(const int32_t* idx, int64_t tokens, int32_t K, int32_t E, const float* x, int64_t H,
             int32_t* offsets, int32_t* row_of, float* permuted);

// out[t] (+)= sum_j w[t * K + j] * y[row_of[t * K + j]]; `accumulate` adds into out.
void unpermute(const float* y, const int32_t* row_of, const float* w, int64_t tokens, int32_t K,
               int64_t H, bool accumulate, float* out);

// y[row] = W_g x[row] for the rows [offsets[g], offsets[g + 1]) of each group g, W_g =
// weights[g] (all rows x cols, one format), reading each weight through quant::dequantize_row
// (f16 through cpu::f16_to_f32) and accumulating in double. y has stride `rows`.
void grouped_matmul(std::span<const Weight> weights, const int32_t* offsets, const float* x,
                    float* y);

// x[r * cols + c] += bias[c] for rows x cols (a projection's bias broadcast over its rows).
void add_bias_rows(float* x, const float* bias, int64_t rows, int64_t cols);

// out[i] = x row idx[i] (cols floats) for i < n (kernels::gather_rows).
void gather_rows(const float* x, const int32_t* idx, int64_t n, int64_t cols, float* out);

// out[i] = silu(gate[i]) * up[i] (cpu::silu_mul).
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// Index of the largest logit of a row, ties to the lower index.
int32_t argmax(const float* logits, int64_t n);

// Temperature + top-p draw with uniform `u` in [0, 1): e_i = exp((l_i - max) / temperature);
// the nucleus is every token with e_i >= t, t the value at which the descending cumulative mass
// first reaches top_p of the total; the draw walks the nucleus in index order to u times its
// mass. temperature <= 0 is argmax. The device kernel finds t by bisection on the float bits.
int32_t sample_top_p(const float* logits, int64_t n, float temperature, float top_p, float u);

}  // namespace edge::engine::cuda::twin
