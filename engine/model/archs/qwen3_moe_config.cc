#include "engine/model/archs/qwen3_moe.h"
#include "engine/model/model_config.h"

namespace edge::engine {

Result<Qwen3MoeConfig> Qwen3MoeConfig::from_json(const ConfigJson& j) {
    constexpr int64_t kBig = int64_t{1} << 24;
    Qwen3MoeConfig c;
    EDGE_ASSIGN_OR_RETURN(c.hidden_size, get_int_in(j, "hidden_size", 1, kBig));
    EDGE_ASSIGN_OR_RETURN(c.num_hidden_layers, get_int_in(j, "num_hidden_layers", 1, 4096));
    EDGE_ASSIGN_OR_RETURN(c.num_attention_heads, get_int_in(j, "num_attention_heads", 1, 4096));
    EDGE_ASSIGN_OR_RETURN(c.num_key_value_heads,
                          get_int_in(j, "num_key_value_heads", 1, c.num_attention_heads));
    if (c.num_attention_heads % c.num_key_value_heads != 0) {
        return invalid_argument_error(j.path() + ": field 'num_key_value_heads' (" +
                                      std::to_string(c.num_key_value_heads) +
                                      ") does not divide num_attention_heads (" +
                                      std::to_string(c.num_attention_heads) + ")");
    }
    if (j.is_null("head_dim")) {
        c.head_dim = c.hidden_size / c.num_attention_heads;
    } else {
        EDGE_ASSIGN_OR_RETURN(c.head_dim, get_int_in(j, "head_dim", 2, 1 << 16));
    }
    if (c.head_dim % 2 != 0 || c.head_dim < 2) {
        return invalid_argument_error(j.path() + ": field 'head_dim' must be even, is " +
                                      std::to_string(c.head_dim));
    }
    EDGE_ASSIGN_OR_RETURN(c.vocab_size, get_int_in(j, "vocab_size", 1, int64_t{1} << 30));
    EDGE_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          get_int_in(j, "max_position_embeddings", 1, int64_t{1} << 30));
    EDGE_ASSIGN_OR_RETURN(c.num_experts, get_int_in(j, "num_experts", 0, 1 << 16));
    EDGE_ASSIGN_OR_RETURN(c.intermediate_size, get_int_in(j, "intermediate_size", 1, kBig));
    if (c.num_experts > 0) {
        EDGE_ASSIGN_OR_RETURN(c.num_experts_per_tok,
                              get_int_in(j, "num_experts_per_tok", 1, c.num_experts));
        EDGE_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                              get_int_in(j, "moe_intermediate_size", 1, kBig));
    }
    if (j.is_null("decoder_sparse_step")) {
        c.decoder_sparse_step = 1;
    } else {
        EDGE_ASSIGN_OR_RETURN(c.decoder_sparse_step, get_int_in(j, "decoder_sparse_step", 1, 4096));
    }
    EDGE_ASSIGN_OR_RETURN(c.mlp_only_layers, j.get_int_list("mlp_only_layers"));
    EDGE_ASSIGN_OR_RETURN(c.rope_theta, j.get_double("rope_theta", 10000.0));
    EDGE_ASSIGN_OR_RETURN(c.rms_norm_eps, j.get_double("rms_norm_eps", 1e-6));
    if (!(c.rope_theta > 1.0)) {
        return invalid_argument_error(j.path() + ": field 'rope_theta' is " +
                                      std::to_string(c.rope_theta) + ", expected more than 1");
    }
    if (!(c.rms_norm_eps > 0.0 && c.rms_norm_eps < 1.0)) {
        return invalid_argument_error(j.path() + ": field 'rms_norm_eps' is " +
                                      std::to_string(c.rms_norm_eps) + ", expected in (0, 1)");
    }
    EDGE_ASSIGN_OR_RETURN(c.norm_topk_prob, j.get_bool("norm_topk_prob", false));
    EDGE_ASSIGN_OR_RETURN(c.tie_word_embeddings, j.get_bool("tie_word_embeddings", false));
    EDGE_ASSIGN_OR_RETURN(c.attention_bias, j.get_bool("attention_bias", false));
    EDGE_ASSIGN_OR_RETURN(bool sliding, j.get_bool("use_sliding_window", false));
    if (sliding) {
        return unimplemented_error(j.path() + ": field 'use_sliding_window' true is not supported");
    }
    // YaRN (Qwen's long-context recipe) over the whole head; other scalings are refused.
    EDGE_ASSIGN_OR_RETURN(c.rope, RotaryConfig::from_json(j, c.rope_theta, c.head_dim,
                                                          c.max_position_embeddings,
                                                          kQwen3MoeArchitecture));
    EDGE_RETURN_IF_ERROR(require_string_if_set(j, "hidden_act", "silu"));
    EDGE_ASSIGN_OR_RETURN(c.eos_token_ids, get_token_ids(j, "eos_token_id", c.vocab_size));
    if (!j.is_null("bos_token_id")) {  // Absent or null: no BOS.
        EDGE_ASSIGN_OR_RETURN(c.bos_token_id, get_int_in(j, "bos_token_id", 0, c.vocab_size - 1));
    }
    return c;
}

bool Qwen3MoeConfig::is_moe_layer(int64_t layer) const {
    for (int64_t l : mlp_only_layers) {
        if (l == layer) {
            return false;
        }
    }
    return num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
}

}  // namespace edge::engine
