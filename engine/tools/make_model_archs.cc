#include "engine/tools/make_model_archs.h"

namespace edge::engine::make_model {
namespace {

namespace json = boost::json;

// Bench sizes share the Qwen3 bench's shape (hidden 1024, 12 layers, 64 experts top-8, expert
// width 512: about 2.5 GB of BF16) so the three architectures decode comparable weight bytes; the
// tiny ones mirror the micro fixtures (tests/fixtures/micro-*).
const ArchPreset kPresets[] = {
    // name, arch, H, L, E, K, I_moe, I, heads, kv, hd, V, pos, tie, dense, shared, groups,
    // topk_group, partial_rotary, q_lora, kv_lora, nope, rope, v.
    // Qwen3 tiny: layer 0 dense and tied embeddings so tests reach those paths too.
    {"tiny", Arch::kQwen3Moe,
     128,    2,
     8,      2,
     64,     256,
     4,      2,
     32,     512,
     2048,   true,
     1,      0,
     0,      0,
     0,      0,
     0,      0,
     0,      0},
    {"bench", Arch::kQwen3Moe, 1024, 12, 64, 8, 512, 2816, 16, 4, 64, 32000,
     4096,    false,           0,    0,  0,  0, 0,   0,    0,  0, 0,  0},
    {"tiny", Arch::kGlm4Moe, 128, 3, 8, 2, 64,  256, 4, 2, 32, 512,
     2048,   false,          1,   1, 2, 1, 0.5, 0,   0, 0, 0,  0},
    {"bench", Arch::kGlm4Moe, 1024, 12, 64, 8, 512, 2816, 16, 4, 64, 32000,
     4096,    false,          1,    1,  1,  1, 0.5, 0,    0,  0, 0,  0},
    {"tiny", Arch::kDeepseekV3,
     128,    3,
     8,      2,
     64,     256,
     4,      4,
     0,      512,
     2048,   false,
     1,      1,
     2,      1,
     0,      64,
     32,     32,
     16,     32},
    {"bench", Arch::kDeepseekV3,
     1024,    12,
     64,      8,
     512,     2816,
     16,      16,
     0,       32000,
     4096,    false,
     1,       1,
     8,       4,
     0,       384,
     128,     64,
     32,      64},
};

json::array eos(const ArchPreset& p) { return {p.vocab - 3, p.vocab - 1}; }

json::object qwen3_config(const ArchPreset& p) {
    json::array mlp_only;
    for (int64_t l = 0; l < p.dense_layers; ++l) {
        mlp_only.push_back(l);
    }
    return {{"architectures", {"Qwen3MoeForCausalLM"}},
            {"model_type", "qwen3_moe"},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"bos_token_id", p.vocab - 3},
            {"eos_token_id", eos(p)},
            {"decoder_sparse_step", 1},
            {"head_dim", p.head_dim},
            {"hidden_act", "silu"},
            {"hidden_size", p.hidden},
            {"initializer_range", 0.02},
            {"intermediate_size", p.inter},
            {"max_position_embeddings", p.max_positions},
            {"max_window_layers", p.layers},
            {"mlp_only_layers", mlp_only},
            {"moe_intermediate_size", p.moe_inter},
            {"norm_topk_prob", true},
            {"num_attention_heads", p.heads},
            {"num_experts", p.experts},
            {"num_experts_per_tok", p.top_k},
            {"num_hidden_layers", p.layers},
            {"num_key_value_heads", p.kv_heads},
            {"output_router_logits", false},
            {"rms_norm_eps", 1e-6},
            {"rope_scaling", nullptr},
            {"rope_theta", 1000000.0},
            {"router_aux_loss_coef", 0.001},
            {"sliding_window", nullptr},
            {"tie_word_embeddings", p.tie_embeddings},
            {"torch_dtype", "bfloat16"},
            {"use_cache", true},
            {"use_sliding_window", false},
            {"vocab_size", p.vocab}};
}

json::object glm4_config(const ArchPreset& p) {
    return {{"architectures", {"Glm4MoeForCausalLM"}},
            {"model_type", "glm4_moe"},
            {"attention_bias", true},
            {"attention_dropout", 0.0},
            {"bos_token_id", p.vocab - 3},
            {"eos_token_id", eos(p)},
            {"first_k_dense_replace", p.dense_layers},
            {"head_dim", p.head_dim},
            {"hidden_act", "silu"},
            {"hidden_size", p.hidden},
            {"initializer_range", 0.02},
            {"intermediate_size", p.inter},
            {"max_position_embeddings", p.max_positions},
            {"moe_intermediate_size", p.moe_inter},
            {"n_group", p.n_group},
            {"n_routed_experts", p.experts},
            {"n_shared_experts", p.shared_experts},
            {"norm_topk_prob", true},
            {"num_attention_heads", p.heads},
            {"num_experts_per_tok", p.top_k},
            {"num_hidden_layers", p.layers},
            {"num_key_value_heads", p.kv_heads},
            {"num_nextn_predict_layers", 0},
            {"partial_rotary_factor", p.partial_rotary},
            {"rms_norm_eps", 1e-5},
            {"rope_scaling", nullptr},
            {"rope_theta", 1000000.0},
            {"routed_scaling_factor", 2.5},
            {"tie_word_embeddings", p.tie_embeddings},
            {"topk_group", p.topk_group},
            {"torch_dtype", "bfloat16"},
            {"use_cache", true},
            {"use_qk_norm", true},
            {"vocab_size", p.vocab}};
}

json::object deepseek_config(const ArchPreset& p) {
    return {{"architectures", {"DeepseekV3ForCausalLM"}},
            {"model_type", "deepseek_v3"},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"bos_token_id", p.vocab - 3},
            {"eos_token_id", eos(p)},
            {"first_k_dense_replace", p.dense_layers},
            {"hidden_act", "silu"},
            {"hidden_size", p.hidden},
            {"initializer_range", 0.02},
            {"intermediate_size", p.inter},
            {"kv_lora_rank", p.kv_lora_rank},
            {"max_position_embeddings", p.max_positions},
            {"moe_intermediate_size", p.moe_inter},
            {"moe_layer_freq", 1},
            {"n_group", p.n_group},
            {"n_routed_experts", p.experts},
            {"n_shared_experts", p.shared_experts},
            {"norm_topk_prob", true},
            {"num_attention_heads", p.heads},
            {"num_experts_per_tok", p.top_k},
            {"num_hidden_layers", p.layers},
            {"num_key_value_heads", p.kv_heads},
            {"num_nextn_predict_layers", 0},
            {"q_lora_rank", p.q_lora_rank},
            {"qk_nope_head_dim", p.qk_nope_head_dim},
            {"qk_rope_head_dim", p.qk_rope_head_dim},
            {"rms_norm_eps", 1e-6},
            {"rope_interleave", true},
            {"rope_scaling", nullptr},
            {"rope_theta", 50000.0},
            {"routed_scaling_factor", 2.5},
            {"scoring_func", "sigmoid"},
            {"tie_word_embeddings", p.tie_embeddings},
            {"topk_group", p.topk_group},
            {"topk_method", "noaux_tc"},
            {"torch_dtype", "bfloat16"},
            {"use_cache", true},
            {"v_head_dim", p.v_head_dim},
            {"vocab_size", p.vocab}};
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
