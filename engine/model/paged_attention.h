#pragma once

// Attention reads through a KvCache's block tables: the paged counterpart of
// cpu::attention_gqa (the same arithmetic; bit-identical to the contiguous cache except where a
// SIMD form runs: head dims that are multiples of 16 on AVX-512 and of 8 on AVX2
// (paged_attention_simd.h), whose sums are ordered differently and agree to f32 rounding), plus a
// gather of cached rows for attention that needs them contiguous (MLA).
//
// Threading: pure functions over memory the caller owns; distinct outputs may be computed from
// different threads at once.

#include <cstdint>

#include "engine/model/kv_cache.h"

namespace edge::engine {

// Causal attention of `n_q` query heads sharing KV head `kv_head` of `layer`, over positions
// [0, n_ctx) of `slot`: q is [n_q][head_dim] (head_dim = the cache's), out is [n_q][head_dim],
// `scores` is scratch of n_q * n_ctx floats.
void paged_attention_gqa(const KvCache& kv, int32_t slot, int32_t layer, int32_t kv_head,
                         const float* q, int64_t n_q, int64_t n_ctx, float scale, float* scores,
                         float* out);

// Copies positions [0, count) of one head's keys (values) into out, [count][head_dim].
void gather_keys(const KvCache& kv, int32_t slot, int32_t layer, int32_t kv_head, int32_t count,
                 float* out);
void gather_values(const KvCache& kv, int32_t slot, int32_t layer, int32_t kv_head, int32_t count,
                   float* out);

}  // namespace edge::engine
