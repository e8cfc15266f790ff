#pragma once

// Qwen3MoeForCausalLM: embeddings; per layer RMSNorm, GQA attention with per-head q/k RMSNorm
// before NeoX RoPE (YaRN-scaled when rope_scaling asks for it), RMSNorm, then a sparse MoE block
// (softmax router, top-k with ties to the lower expert index, optional renormalisation, SwiGLU
// experts) or a dense SwiGLU MLP (decoder_sparse_step / mlp_only_layers); final RMSNorm and
// lm_head (or tied embeddings). Weights stay in the mapped checkpoint; the routed experts run
// in the shared, sharded MoeBlock (engine/model/moe_block.h).
//
// Threading: as CausalLM (one driving thread; forward() uses the backend's threads).

#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/model/archs/rotary_config.h"
#include "engine/model/causal_lm.h"
#include "engine/model/loader.h"

namespace edge::engine {

class ConfigJson;

inline constexpr const char* kQwen3MoeArchitecture = "Qwen3MoeForCausalLM";

// The config.json fields this architecture reads.
struct Qwen3MoeConfig {
    int64_t hidden_size = 0;
    int64_t num_hidden_layers = 0;
    int64_t num_attention_heads = 0;
    int64_t num_key_value_heads = 0;
    int64_t head_dim = 0;               // Defaults to hidden_size / num_attention_heads.
    int64_t vocab_size = 0;
    int64_t max_position_embeddings = 0;
    int64_t num_experts = 0;
    int64_t num_experts_per_tok = 0;
    int64_t moe_intermediate_size = 0;
    int64_t intermediate_size = 0;      // Width of the dense MLP layers.
    int64_t decoder_sparse_step = 1;
    std::vector<int64_t> mlp_only_layers;
    double rope_theta = 10000.0;
    RotaryConfig rope;                  // Frequencies over head_dim, YaRN from rope_scaling.
    double rms_norm_eps = 1e-6;
    bool norm_topk_prob = false;
    bool tie_word_embeddings = false;
    bool attention_bias = false;
    std::vector<int64_t> eos_token_ids;
    int64_t bos_token_id = -1;

    // Reads and range-checks the fields; errors name config.json and the field.
    static Result<Qwen3MoeConfig> from_json(const ConfigJson& config);
    // Whether layer `layer` has the sparse MoE block (else the dense MLP).
    bool is_moe_layer(int64_t layer) const;
};

Result<std::unique_ptr<CausalLM>> load_qwen3_moe(const std::string& dir, const ConfigJson& config,
                                                 const LoadOptions& options);
// What load_qwen3_moe checks before it reads a weight: the config's fields. On success,
// `max_positions` (when given) is set to the positions the model serves, as the load serves
// them (with YaRN, the stretched length).
Status check_qwen3_moe_config(const ConfigJson& config, int64_t* max_positions = nullptr);

}  // namespace edge::engine
