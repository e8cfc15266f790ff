#include "engine/tools/make_model_archs.h"

#include <string_view>

namespace edge::engine::make_model {
namespace {

namespace json = boost::json;

// Bench sizes share the Qwen3 bench's shape (hidden 1024, 12 layers, 64 experts top-8, expert
// width 512: about 2.5 GB of BF16) so the three architectures decode comparable weight bytes; the
// tiny ones mirror the micro fixtures (tests/fixtures/micro-*). sized() is the shape a size shares
// across architectures (GQA: kv_heads and head_dim; MLA overrides them).
ArchPreset sized(const char* name, Arch arch) {
    const bool bench = std::string_view(name) == "bench";
    ArchPreset p;
    p.name = name;
    p.arch = arch;
    p.hidden = bench ? 1024 : 128;
    p.layers = bench ? 12 : 3;
    p.experts = bench ? 64 : 8;
    p.top_k = bench ? 8 : 2;
    p.moe_inter = bench ? 512 : 64;
    p.inter = bench ? 2816 : 256;
    p.heads = bench ? 16 : 4;
    p.kv_heads = bench ? 4 : 2;
    p.head_dim = bench ? 64 : 32;
    p.vocab = bench ? 32000 : 512;
    p.max_positions = bench ? 4096 : 2048;
    return p;
}

std::vector<ArchPreset> make_presets() {
    std::vector<ArchPreset> out;
    for (const char* size : {"tiny", "bench"}) {
        const bool bench = std::string_view(size) == "bench";
        // Qwen3 tiny: 2 layers, layer 0 dense and tied embeddings so tests reach those paths.
        ArchPreset qwen = sized(size, Arch::kQwen3Moe);
        qwen.layers = bench ? 12 : 2;
        qwen.tie_embeddings = !bench;
        qwen.dense_layers = bench ? 0 : 1;
        out.push_back(qwen);

        ArchPreset glm = sized(size, Arch::kGlm4Moe);
        glm.dense_layers = 1;
        glm.shared_experts = 1;
        glm.n_group = bench ? 1 : 2;
        glm.topk_group = 1;
        glm.partial_rotary = 0.5;
        out.push_back(glm);

        ArchPreset ds = sized(size, Arch::kDeepseekV3);
        ds.kv_heads = ds.heads;
        ds.head_dim = 0;
        ds.dense_layers = 1;
        ds.shared_experts = 1;
        ds.n_group = bench ? 8 : 2;
        ds.topk_group = bench ? 4 : 1;
        ds.q_lora_rank = bench ? 384 : 64;
        ds.kv_lora_rank = bench ? 128 : 32;
        ds.qk_nope_head_dim = bench ? 64 : 32;
        ds.qk_rope_head_dim = bench ? 32 : 16;
        ds.v_head_dim = bench ? 64 : 32;
        out.push_back(ds);
    }
    return out;
}

const std::vector<ArchPreset>& presets() {
    static const std::vector<ArchPreset> all = make_presets();
    return all;
}

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
    for (const ArchPreset& p : presets()) {
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
