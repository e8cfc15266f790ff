#pragma once

// CPU twins of the MLA kernels (engine/cuda/kernels/mla.h): for each kernel entry a host function
// with the same contract over host buffers. They are a deliberately separate, simple
// implementation (plain loops, double accumulation, every kv_b_proj row read through
// quant::dequantize_row), checked against the CPU model (engine/model/archs/deepseek_v3.cc) in
// tests/gpu/host/mla_twin_test.cc; the GPU tests check each kernel against its twin.
//
// Shapes (all f32, row-major; "rows" are the tokens of a step, prefill and decode alike, each
// with its sequence seq_of_token[t] and position pos_of_token[t]):
//   kv      [rows][latent + rope]        kv_a_proj_with_mqa output, k_pe already rotated
//   q       [rows][heads][nope + rope]   q_b_proj / q_proj output, q_pe already rotated
//   q_full  [rows][heads][latent + rope] absorbed queries: q_nope through kv_b's k part, then q_pe
//   o_lat   [rows][heads][latent]        attention output in the latent space
//   out     [rows][heads][v_head_dim]    o_lat through kv_b's v part (the input of o_proj)
//
// Pure functions over caller-owned buffers; thread-safe on disjoint outputs.

#include <cstdint>

#include "common/status.h"
#include "engine/cpu/weight.h"
#include "engine/cuda/host/mla_layout.h"

namespace edge::engine::cuda::twin {

// Per row t: RMSNorm of the latent part of kv[t] with `norm` (kv_a_layernorm) and d.eps, then the
// row [normed latent, k_pe] stored at (seq_of_token[t], pos_of_token[t]) of `layer`'s pool.
void mla_latent_write(const MlaLatentLayout& layout, int32_t layer, const MlaDims& d,
                      const float* kv, const float* norm, const int32_t* seq_of_token,
                      const int32_t* pos_of_token, int64_t rows, const int32_t* block_table,
                      int32_t max_blocks_per_seq, float* pool);

// q_full[t][h] = [q_nope[t][h] * W_k(h), q_pe[t][h]], W_k(h) = kv_b rows [h * (nope + v),
// h * (nope + v) + nope) as a nope x latent matrix.
void mla_absorb(const Weight& kv_b, const MlaDims& d, const float* q, int64_t rows, float* q_full);

// Causal attention in the latent space: row t, head h sees positions [0, pos_of_token[t]] of its
// sequence; score(p) = q_full[t][h] . cache_row(p) * d.softmax_scale (latent and rope parts in
// one dot), softmax over p, o_lat[t][h] = sum_p w(p) * latent(p).
void mla_attention(const MlaLatentLayout& layout, int32_t layer, const MlaDims& d,
                   const float* q_full, int64_t rows, const int32_t* seq_of_token,
                   const int32_t* pos_of_token, const int32_t* block_table,
                   int32_t max_blocks_per_seq, const float* pool, float* o_lat);

// out[t][h] = W_v(h) o_lat[t][h], W_v(h) = kv_b rows [h * (nope + v) + nope, (h + 1) * (nope + v))
// as a v x latent matrix.
void mla_expand(const Weight& kv_b, const MlaDims& d, const float* o_lat, int64_t rows, float* out);

// The whole MLA attention of one layer for `rows` rows, up to (not including) o_proj:
//   x    [rows][hidden]   hidden states after the layer's input RMSNorm
//   out  [rows][heads * v_head_dim]
// q path (q_a_proj, q_a_layernorm, q_b_proj; or q_proj), kv_a_proj_with_mqa, RoPE of q_pe and
// k_pe at each row's position with inv_freq (rope / 2 values, YaRN applied) and dims.rope_mscale,
// the cache write, absorb, attention with dims.softmax_scale, expand. Every row's position must
// already have its block in the table (rows of one sequence in position order, as a step has).
// kInvalidArgument for bad dims, layout or block table (nothing is written then).
Status mla_attention_layer(const MlaLayerWeights& w, const MlaDims& d,
                           const MlaLatentLayout& layout, int32_t layer, const float* x,
                           int64_t rows, const int32_t* seq_of_token, const int32_t* pos_of_token,
                           int32_t sequences, const int32_t* block_table,
                           int32_t max_blocks_per_seq, const double* inv_freq, float* pool,
                           float* out);

}  // namespace edge::engine::cuda::twin
