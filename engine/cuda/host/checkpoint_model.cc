#include "engine/cuda/host/checkpoint_model.h"

#include <cmath>

#include "engine/model/archs/qwen3_moe.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/stored_tensor.h"
#include "engine/model/weight_loader.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine::cuda {
namespace {

Status unsupported(const ConfigJson& json, const std::string& field, const std::string& why) {
    return unimplemented_error(json.path() + ": " + field + ": " + why +
                               " (the device decoder runs all-MoE Qwen3 checkpoints only)");
}

}  // namespace

Result<CheckpointModel> read_checkpoint_model(const std::string& dir, const std::string& policy) {
    EDGE_ASSIGN_OR_RETURN(ConfigJson json, ConfigJson::read(dir));
    if (json.architecture() != kQwen3MoeArchitecture && json.architecture() != "qwen3_moe") {
        return unsupported(json, "architectures",
                           "'" + json.architecture() + "' is not " + kQwen3MoeArchitecture);
    }
    EDGE_ASSIGN_OR_RETURN(Qwen3MoeConfig c, Qwen3MoeConfig::from_json(json));
    if (c.num_experts <= 0) {
        return unsupported(json, "num_experts", "no routed experts");
    }
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        if (!c.is_moe_layer(l)) {
            return unsupported(json, "decoder_sparse_step / mlp_only_layers",
                               "layer " + std::to_string(l) + " is a dense MLP");
        }
    }
    if (c.attention_bias) {
        return unsupported(json, "attention_bias", "attention biases");
    }
    if (!json.is_null("rope_scaling")) {
        return unsupported(json, "rope_scaling", "scaled RoPE");
    }
    if (c.head_dim % 32 != 0 || c.head_dim > 256) {
        return unsupported(json, "head_dim",
                           std::to_string(c.head_dim) + " is not a multiple of 32 up to 256");
    }
    if (c.num_attention_heads % c.num_key_value_heads != 0) {
        return unsupported(json, "num_key_value_heads", "does not divide num_attention_heads");
    }

    CheckpointModel m;
    m.hidden = static_cast<int32_t>(c.hidden_size);
    m.layers = static_cast<int32_t>(c.num_hidden_layers);
    m.experts = static_cast<int32_t>(c.num_experts);
    m.top_k = static_cast<int32_t>(c.num_experts_per_tok);
    m.moe_inter = static_cast<int32_t>(c.moe_intermediate_size);
    m.heads = static_cast<int32_t>(c.num_attention_heads);
    m.kv_heads = static_cast<int32_t>(c.num_key_value_heads);
    m.head_dim = static_cast<int32_t>(c.head_dim);
    m.vocab = static_cast<int32_t>(c.vocab_size);
    m.max_position = static_cast<int32_t>(c.max_position_embeddings);
    m.rms_eps = static_cast<float>(c.rms_norm_eps);
    m.norm_topk_prob = c.norm_topk_prob;
    // The CPU model's formula (qwen3_moe.cc), so both sides rotate by the same angles.
    for (int64_t i = 0; i < c.head_dim / 2; ++i) {
        m.inv_freq.push_back(std::pow(
            c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim)));
    }

    EDGE_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::open_dir(dir));
    m.checkpoint = std::move(ckpt);
    EDGE_ASSIGN_OR_RETURN(std::unique_ptr<WeightLoader> loader,
                          WeightLoader::create(*m.checkpoint, json, policy));
    m.loader = std::move(loader);
    const Checkpoint& ck = *m.checkpoint;
    WeightLoader& wl = *m.loader;
    const int64_t H = c.hidden_size, hd = c.head_dim;
    const int64_t qd = c.num_attention_heads * hd, kvd = c.num_key_value_heads * hd;
    EDGE_ASSIGN_OR_RETURN(m.embed, wl.matrix("model.embed_tokens.weight", c.vocab_size, H));
    if (c.tie_word_embeddings && !ck.has("lm_head.weight")) {
        m.lm_head = m.embed;
    } else {
        EDGE_ASSIGN_OR_RETURN(m.lm_head, wl.matrix("lm_head.weight", c.vocab_size, H));
    }
    EDGE_ASSIGN_OR_RETURN(m.final_norm, read_float_vector(ck, "model.norm.weight", H));
    bool expert_format_known = false;
    m.layer.resize(static_cast<size_t>(c.num_hidden_layers));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        CheckpointLayer& L = m.layer[static_cast<size_t>(l)];
        const std::string p = "model.layers." + std::to_string(l) + ".";
        EDGE_ASSIGN_OR_RETURN(L.input_norm, read_float_vector(ck, p + "input_layernorm.weight", H));
        EDGE_ASSIGN_OR_RETURN(L.post_norm,
                              read_float_vector(ck, p + "post_attention_layernorm.weight", H));
        EDGE_ASSIGN_OR_RETURN(L.q_norm, read_float_vector(ck, p + "self_attn.q_norm.weight", hd));
        EDGE_ASSIGN_OR_RETURN(L.k_norm, read_float_vector(ck, p + "self_attn.k_norm.weight", hd));
        EDGE_ASSIGN_OR_RETURN(L.q, wl.matrix(p + "self_attn.q_proj.weight", qd, H));
        EDGE_ASSIGN_OR_RETURN(L.k, wl.matrix(p + "self_attn.k_proj.weight", kvd, H));
        EDGE_ASSIGN_OR_RETURN(L.v, wl.matrix(p + "self_attn.v_proj.weight", kvd, H));
        EDGE_ASSIGN_OR_RETURN(L.o, wl.matrix(p + "self_attn.o_proj.weight", H, qd));
        EDGE_ASSIGN_OR_RETURN(L.router, wl.matrix(p + "mlp.gate.weight", c.num_experts, H));
        for (int64_t e = 0; e < c.num_experts; ++e) {
            const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
            EDGE_ASSIGN_OR_RETURN(Weight g,
                                  wl.matrix(ep + "gate_proj.weight", c.moe_intermediate_size, H));
            EDGE_ASSIGN_OR_RETURN(Weight u,
                                  wl.matrix(ep + "up_proj.weight", c.moe_intermediate_size, H));
            EDGE_ASSIGN_OR_RETURN(Weight d,
                                  wl.matrix(ep + "down_proj.weight", H, c.moe_intermediate_size));
            for (const Weight* w : {&g, &u, &d}) {
                if (!expert_format_known) {
                    m.expert_format = w->format;
                    expert_format_known = true;
                } else if (w->format != m.expert_format) {
                    return unimplemented_error(ck.description() + ": " + ep + ": expert format " +
                                               quant::weight_format_name(w->format) +
                                               " differs from the first "
                                               "expert's " +
                                               quant::weight_format_name(m.expert_format) +
                                               " (the device decoder needs one expert format)");
                }
            }
            L.gate.push_back(g);
            L.up.push_back(u);
            L.down.push_back(d);
        }
    }
    return m;
}

}  // namespace edge::engine::cuda
