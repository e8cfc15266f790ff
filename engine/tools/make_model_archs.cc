#include "engine/tools/make_model_archs.h"

namespace edge::engine::make_model {
namespace {

namespace json = boost::json;

// Bench sizes share the Qwen3 bench's shape (hidden 1024, 12 layers, 64 experts top-8, expert
// width 512: about 2.5 GB of BF16) so the three architectures decode comparable weight bytes; the
// tiny ones mirror the micro fixtures (tests/fixtures/micro-*).
// Fields left out of an initializer keep ArchPreset's defaults (0, false).
const ArchPreset kPresets[] = {
    // Qwen3 tiny: layer 0 dense and tied embeddings so tests reach those paths too.
    {.name = "tiny",
     .arch = Arch::kQwen3Moe,
     .hidden = 128,
     .layers = 2,
     .experts = 8,
     .top_k = 2,
     .moe_inter = 64,
     .inter = 256,
     .heads = 4,
     .kv_heads = 2,
     .head_dim = 32,
     .vocab = 512,
     .max_positions = 2048,
     .tie_embeddings = true,
     .dense_layers = 1},
    {.name = "bench",
     .arch = Arch::kQwen3Moe,
     .hidden = 1024,
     .layers = 12,
     .experts = 64,
     .top_k = 8,
     .moe_inter = 512,
     .inter = 2816,
     .heads = 16,
     .kv_heads = 4,
     .head_dim = 64,
     .vocab = 32000,
     .max_positions = 4096},
    {.name = "tiny",
     .arch = Arch::kGlm4Moe,
     .hidden = 128,
     .layers = 3,
     .experts = 8,
     .top_k = 2,
     .moe_inter = 64,
     .inter = 256,
     .heads = 4,
     .kv_heads = 2,
     .head_dim = 32,
     .vocab = 512,
     .max_positions = 2048,
     .dense_layers = 1,
     .shared_experts = 1,
     .n_group = 2,
     .topk_group = 1,
     .partial_rotary = 0.5},
    {.name = "bench",
     .arch = Arch::kGlm4Moe,
     .hidden = 1024,
     .layers = 12,
     .experts = 64,
     .top_k = 8,
     .moe_inter = 512,
     .inter = 2816,
     .heads = 16,
     .kv_heads = 4,
     .head_dim = 64,
     .vocab = 32000,
     .max_positions = 4096,
     .dense_layers = 1,
     .shared_experts = 1,
     .n_group = 1,
     .topk_group = 1,
     .partial_rotary = 0.5},
    {.name = "tiny",
     .arch = Arch::kDeepseekV3,
     .hidden = 128,
     .layers = 3,
     .experts = 8,
     .top_k = 2,
     .moe_inter = 64,
     .inter = 256,
     .heads = 4,
     .kv_heads = 4,
     .vocab = 512,
     .max_positions = 2048,
     .dense_layers = 1,
     .shared_experts = 1,
     .n_group = 2,
     .topk_group = 1,
     .q_lora_rank = 64,
     .kv_lora_rank = 32,
     .qk_nope_head_dim = 32,
     .qk_rope_head_dim = 16,
     .v_head_dim = 32},
    {.name = "bench",
     .arch = Arch::kDeepseekV3,
     .hidden = 1024,
     .layers = 12,
     .experts = 64,
     .top_k = 8,
     .moe_inter = 512,
     .inter = 2816,
     .heads = 16,
     .kv_heads = 16,
     .vocab = 32000,
     .max_positions = 4096,
     .dense_layers = 1,
     .shared_experts = 1,
     .n_group = 8,
     .topk_group = 4,
     .q_lora_rank = 384,
     .kv_lora_rank = 128,
     .qk_nope_head_dim = 64,
     .qk_rope_head_dim = 32,
     .v_head_dim = 64},
};

// The keys every architecture's config.json has, with the values all presets share.
json::object common_config(const ArchPreset& p, const char* architecture, const char* model_type) {
    return {{"architectures", {architecture}},
            {"model_type", model_type},
            {"attention_dropout", 0.0},
            {"bos_token_id", p.vocab - 3},
            {"eos_token_id", {p.vocab - 3, p.vocab - 1}},
            {"hidden_act", "silu"},
            {"hidden_size", p.hidden},
            {"initializer_range", 0.02},
            {"intermediate_size", p.inter},
            {"max_position_embeddings", p.max_positions},
            {"moe_intermediate_size", p.moe_inter},
            {"norm_topk_prob", true},
            {"num_attention_heads", p.heads},
            {"num_experts_per_tok", p.top_k},
            {"num_hidden_layers", p.layers},
            {"num_key_value_heads", p.kv_heads},
            {"rms_norm_eps", 1e-6},
            {"rope_scaling", nullptr},
            {"rope_theta", 1000000.0},
            {"tie_word_embeddings", p.tie_embeddings},
            {"torch_dtype", "bfloat16"},
            {"use_cache", true},
            {"vocab_size", p.vocab}};
}

// Adds `keys` to `config`, replacing values already there.
json::object with(json::object config, const json::object& keys) {
    for (const auto& kv : keys) {
        config[kv.key()] = kv.value();
    }
    return config;
}

json::object qwen3_config(const ArchPreset& p) {
    json::array mlp_only;
    for (int64_t l = 0; l < p.dense_layers; ++l) {
        mlp_only.push_back(l);
    }
    return with(common_config(p, "Qwen3MoeForCausalLM", "qwen3_moe"),
                json::object{{"attention_bias", false},
                             {"decoder_sparse_step", 1},
                             {"head_dim", p.head_dim},
                             {"max_window_layers", p.layers},
                             {"mlp_only_layers", mlp_only},
                             {"num_experts", p.experts},
                             {"output_router_logits", false},
                             {"router_aux_loss_coef", 0.001},
                             {"sliding_window", nullptr},
                             {"use_sliding_window", false}});
}

// Keys GLM-4.5 and DeepSeek-V3 share (dense leading layers, shared and grouped experts).
json::object grouped_moe_config(const ArchPreset& p, const char* architecture,
                                const char* model_type) {
    return with(common_config(p, architecture, model_type),
                json::object{{"first_k_dense_replace", p.dense_layers},
                             {"n_group", p.n_group},
                             {"n_routed_experts", p.experts},
                             {"n_shared_experts", p.shared_experts},
                             {"num_nextn_predict_layers", 0},
                             {"routed_scaling_factor", 2.5},
                             {"topk_group", p.topk_group}});
}

json::object glm4_config(const ArchPreset& p) {
    return with(grouped_moe_config(p, "Glm4MoeForCausalLM", "glm4_moe"),
                json::object{{"attention_bias", true},
                             {"head_dim", p.head_dim},
                             {"partial_rotary_factor", p.partial_rotary},
                             {"rms_norm_eps", 1e-5},
                             {"use_qk_norm", true}});
}

json::object deepseek_config(const ArchPreset& p) {
    return with(grouped_moe_config(p, "DeepseekV3ForCausalLM", "deepseek_v3"),
                json::object{{"attention_bias", false},
                             {"kv_lora_rank", p.kv_lora_rank},
                             {"moe_layer_freq", 1},
                             {"q_lora_rank", p.q_lora_rank},
                             {"qk_nope_head_dim", p.qk_nope_head_dim},
                             {"qk_rope_head_dim", p.qk_rope_head_dim},
                             {"rope_interleave", true},
                             {"rope_theta", 50000.0},
                             {"scoring_func", "sigmoid"},
                             {"topk_method", "noaux_tc"},
                             {"v_head_dim", p.v_head_dim}});
}

void add_mlp(const std::string& pre, int64_t hidden, int64_t inter, const AddTensor& add) {
    add(pre + "gate_proj.weight", {inter, hidden}, Init::kLinear);
    add(pre + "up_proj.weight", {inter, hidden}, Init::kLinear);
    add(pre + "down_proj.weight", {hidden, inter}, Init::kLinear);
}

void add_attention(const ArchPreset& p, const std::string& pre, const AddTensor& add) {
    const int64_t H = p.hidden;
    if (p.arch == Arch::kDeepseekV3) {
        const int64_t qk = p.qk_nope_head_dim + p.qk_rope_head_dim;
        add(pre + "q_a_proj.weight", {p.q_lora_rank, H}, Init::kLinear);
        add(pre + "q_a_layernorm.weight", {p.q_lora_rank}, Init::kNorm);
        add(pre + "q_b_proj.weight", {p.heads * qk, p.q_lora_rank}, Init::kLinear);
        add(pre + "kv_a_proj_with_mqa.weight", {p.kv_lora_rank + p.qk_rope_head_dim, H},
            Init::kLinear);
        add(pre + "kv_a_layernorm.weight", {p.kv_lora_rank}, Init::kNorm);
        add(pre + "kv_b_proj.weight",
            {p.heads * (p.qk_nope_head_dim + p.v_head_dim), p.kv_lora_rank}, Init::kLinear);
        add(pre + "o_proj.weight", {H, p.heads * p.v_head_dim}, Init::kLinear);
        return;
    }
    const int64_t q = p.heads * p.head_dim, kv = p.kv_heads * p.head_dim;
    add(pre + "q_proj.weight", {q, H}, Init::kLinear);
    add(pre + "k_proj.weight", {kv, H}, Init::kLinear);
    add(pre + "v_proj.weight", {kv, H}, Init::kLinear);
    add(pre + "o_proj.weight", {H, q}, Init::kLinear);
    add(pre + "q_norm.weight", {p.head_dim}, Init::kNorm);
    add(pre + "k_norm.weight", {p.head_dim}, Init::kNorm);
    if (p.arch == Arch::kGlm4Moe) {
        add(pre + "q_proj.bias", {q}, Init::kBias);
        add(pre + "k_proj.bias", {kv}, Init::kBias);
        add(pre + "v_proj.bias", {kv}, Init::kBias);
    }
}

}  // namespace

const char* arch_name(Arch arch) {
    switch (arch) {
        case Arch::kGlm4Moe:
            return "glm4_moe";
        case Arch::kDeepseekV3:
            return "deepseek_v3";
        case Arch::kQwen3Moe:
            break;
    }
    return "qwen3_moe";
}

bool arch_from_name(const std::string& name, Arch* arch) {
    for (Arch a : {Arch::kQwen3Moe, Arch::kGlm4Moe, Arch::kDeepseekV3}) {
        if (name == arch_name(a)) {
            *arch = a;
            return true;
        }
    }
    return false;
}

const ArchPreset* find_preset(Arch arch, const std::string& name) {
    for (const ArchPreset& p : kPresets) {
        if (p.arch == arch && name == p.name) {
            return &p;
        }
    }
    return nullptr;
}

std::vector<std::string> preset_names() { return {"tiny", "bench"}; }

json::object config_json(const ArchPreset& p) {
    switch (p.arch) {
        case Arch::kGlm4Moe:
            return glm4_config(p);
        case Arch::kDeepseekV3:
            return deepseek_config(p);
        case Arch::kQwen3Moe:
            break;
    }
    return qwen3_config(p);
}

void for_each_tensor(const ArchPreset& p, const AddTensor& add) {
    const int64_t H = p.hidden;
    add("model.embed_tokens.weight", {p.vocab, H}, Init::kEmbedding);
    for (int64_t l = 0; l < p.layers; ++l) {
        const std::string pre = "model.layers." + std::to_string(l) + ".";
        add(pre + "input_layernorm.weight", {H}, Init::kNorm);
        add(pre + "post_attention_layernorm.weight", {H}, Init::kNorm);
        add_attention(p, pre + "self_attn.", add);
        if (l < p.dense_layers) {
            add_mlp(pre + "mlp.", H, p.inter, add);
            continue;
        }
        add(pre + "mlp.gate.weight", {p.experts, H}, Init::kWide);
        if (p.arch != Arch::kQwen3Moe) {
            add(pre + "mlp.gate.e_score_correction_bias", {p.experts}, Init::kBias);
        }
        for (int64_t e = 0; e < p.experts; ++e) {
            add_mlp(pre + "mlp.experts." + std::to_string(e) + ".", H, p.moe_inter, add);
        }
        if (p.shared_experts > 0) {
            add_mlp(pre + "mlp.shared_experts.", H, p.moe_inter * p.shared_experts, add);
        }
    }
    add("model.norm.weight", {H}, Init::kNorm);
    if (!p.tie_embeddings) {
        add("lm_head.weight", {p.vocab, H}, Init::kWide);
    }
}

}  // namespace edge::engine::make_model
