#pragma once

// The non-matmul kernels of a transformer forward in f32: RMSNorm, rotary embeddings, softmax,
// SiLU-gated product and causal GQA attention over a KV cache. RMSNorm, RoPE, softmax and the
// SiLU product run AVX-512 versions where cpuid reports AVX-512 (chosen once, at first use) and
// the scalar references of ops_kernels.h elsewhere; the matmuls (engine/cpu/matmul.h) are where
// the time goes.
// Pure functions over caller-owned buffers; thread-safe on disjoint outputs.

#include <cstdint>

namespace edge::engine::cpu {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i], i < n. `out` may equal `x`.
void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out);

// Rotary embedding tables for one position: cos/sin of pos * inv_freq[i], i < rot_dim / 2.
// inv_freq[i] = theta^(-2i / rot_dim).
void rope_angles(int64_t pos, const double* inv_freq, int64_t half, float* cos_out,
                 float* sin_out);

// NeoX "rotate-half" RoPE on one head of `head_dim` values: the first `rot_dim` values are rotated
// pairing dim i with i + rot_dim/2 (partial rotary leaves the rest as they are).
void rope_neox(float* head, int64_t rot_dim, const float* cos, const float* sin);

// Interleaved (GPT-J) RoPE: pairs (2i, 2i+1). For architectures that use it.
void rope_interleaved(float* head, int64_t rot_dim, const float* cos, const float* sin);

// In-place softmax over n values.
void softmax(float* x, int64_t n);

// out[i] = e^(x[i] - shift), i < n (exactly 0 where x[i] is -inf), and their sum. `out` may equal
// `x`. With `shift` the largest x[i], no term overflows (the sampler's and log-softmax's pass).
double exp_sum(const float* x, int64_t n, float shift, float* out);

// out[i] = silu(gate[i]) * up[i].
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// Causal attention of `n_q` query heads sharing one KV head: q is [n_q][head_dim], keys and values
// are [n_ctx][head_dim] (row stride `kv_stride` floats), and the output is [n_q][head_dim]. Every
// query sees all n_ctx positions (the caller passes n_ctx = its position + 1). `scores` is scratch
// of n_q * n_ctx floats.
void attention_gqa(const float* q, int64_t n_q, int64_t head_dim, const float* keys,
                   const float* values, int64_t kv_stride, int64_t n_ctx, float scale,
                   float* scores, float* out);

}  // namespace edge::engine::cpu
