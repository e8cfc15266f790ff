#pragma once

// Weight bytes a Qwen3-MoE checkpoint's decode reads (BF16, every layer MoE, as make-model's
// bench preset), from its config.json: what a token reads alone, and what one pass over one
// routed expert reads. The benches turn expert passes per step (ShardStats::expert_passes) into
// bytes per step with these: a batched step reads the non-expert weights once and each expert
// it routes to once. A token's products do not depend on the batch: each token multiplies the
// weights it would read alone. Pure functions.

#include <algorithm>
#include <cstdint>

#include "engine/model/model_config.h"

namespace edge::bench {

// Weight bytes one decode token reads (2 bytes per BF16 weight): attention, router, the top-k
// experts of each MoE layer, lm_head and one embedding row.
inline int64_t decode_bytes_per_token(const edge::engine::ConfigJson& c) {
    auto g = [&](const char* k) { return c.get_int(k).value_or(0); };
    const int64_t H = g("hidden_size"), L = g("num_hidden_layers"), hd = g("head_dim");
    const int64_t q = g("num_attention_heads") * hd, kv = g("num_key_value_heads") * hd;
    const int64_t E = g("num_experts"), K = g("num_experts_per_tok"),
                  I = g("moe_intermediate_size");
    int64_t params = 0;
    for (int64_t l = 0; l < L; ++l) {
        params += H * q * 2 + H * kv * 2;
        params += E * H + K * 3 * I * H;  // Every layer of the bench preset is MoE.
    }
    params += g("vocab_size") * H + H;
    return params * 2;
}

// Products (multiply-adds) of one decode token's matmuls: one per weight it reads except the
// embedding row, which is copied. The attention scores over the context are left out (at the
// benches' contexts of 32-100 tokens, under 1% of the sum). Exact activations (hi and lo) take
// two BF16 products per weight.
inline int64_t decode_products_per_token(const edge::engine::ConfigJson& c) {
    return decode_bytes_per_token(c) / 2 - c.get_int("hidden_size").value_or(0);
}

// Products of one logits row (lm_head), the part of a token's products a prefill token that
// does not end its prompt skips.
inline int64_t lm_head_products(const edge::engine::ConfigJson& c) {
    return c.get_int("vocab_size").value_or(0) * c.get_int("hidden_size").value_or(0);
}

// Weight bytes one pass over one routed expert reads (gate, up and down, BF16).
inline int64_t expert_pass_bytes(const edge::engine::ConfigJson& c) {
    return 3 * c.get_int("moe_intermediate_size").value_or(0) *
           c.get_int("hidden_size").value_or(0) * 2;
}

// The bytes of a step that made `passes` expert passes: the single token's bytes with its top-k
// passes per layer replaced by the step's.
inline double step_bytes(const edge::engine::ConfigJson& c, double passes) {
    const int64_t single_passes = c.get_int("num_experts_per_tok").value_or(0) *
                                  c.get_int("num_hidden_layers").value_or(0);
    return static_cast<double>(decode_bytes_per_token(c)) +
           (passes - static_cast<double>(single_passes)) *
               static_cast<double>(expert_pass_bytes(c));
}

// The shortest time a step can take when it reads each phase's weights during that phase: a
// layer's attention (its projections and router; lm_head at the end) must finish before its
// router picks the experts, and the experts before the next layer's attention, so the step spends
// at least max(bytes / bandwidth, products / peak) on each kind of phase, summed. Tighter than
// the two bounds taken apart when one phase is compute-bound and the other memory-bound (a
// batched step's attention and lm_head multiply many tokens by few bytes; its experts few
// tokens, 4 a pass at 32 tokens top-8 of 64, by most of the bytes). A step computing `tokens`
// tokens, `head_tokens` of them through lm_head, in `passes` expert passes, each weight times a
// token costing `cost` products at `peak`; 0 without a bandwidth or a peak.
inline double phase_bound_seconds(const edge::engine::ConfigJson& c, double tokens,
                                  double head_tokens, double passes, double cost,
                                  double bandwidth, double peak) {
    if (bandwidth <= 0 || peak <= 0) {
        return 0.0;
    }
    const int64_t single_passes = c.get_int("num_experts_per_tok").value_or(0) *
                                  c.get_int("num_hidden_layers").value_or(0);
    const double pass_bytes = static_cast<double>(expert_pass_bytes(c));
    const double head = static_cast<double>(lm_head_products(c));
    const double shared_bytes = static_cast<double>(decode_bytes_per_token(c)) -
                                static_cast<double>(single_passes) * pass_bytes;
    // A token's products are one per weight it reads, the embedding row aside.
    const double shared_products =
        cost * (tokens * (static_cast<double>(decode_products_per_token(c)) -
                          static_cast<double>(single_passes) * pass_bytes / 2 - head) +
                head_tokens * head);
    const double expert_products =
        cost * tokens * static_cast<double>(single_passes) * pass_bytes / 2;
    return std::max(shared_bytes / bandwidth, shared_products / peak) +
           std::max(passes * pass_bytes / bandwidth, expert_products / peak);
}

}  // namespace edge::bench
