#include "engine/cuda/host/checkpoint_model.h"

#include "engine/model/archs/deepseek_v3.h"
#include "engine/model/archs/deepseek_v3_config.h"
#include "engine/model/archs/glm4_moe.h"
#include "engine/model/archs/glm4_moe_common.h"
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
                               " (the device decoder runs Qwen3-MoE, GLM-4.5 and DeepSeek-V3 "
                               "checkpoints; "
                               "engine/cuda/host/checkpoint_model.h lists what)");
}

// What config.json says about the tensors to read, beyond the shape in CheckpointModel.
struct TensorPlan {
    bool attention_bias = false;  // q/k/v_proj.bias.
    bool qk_norm = false;         // self_attn.q_norm / k_norm.
    bool tie_word_embeddings = false;
    bool float_embed = false;  // The embedding table read as stored (never quantized).
    std::vector<bool> moe_layer;  // Per layer: routed experts (else a dense MLP).
};

// The checks every architecture's attention and experts share on the device.
Status check_device_limits(const ConfigJson& json, const CheckpointModel& m) {
    if (m.experts <= 0) {
        return unsupported(json, "num_experts / n_routed_experts", "no routed experts");
    }
    if (m.experts > kMaxRouterExperts) {
        return unsupported(json, "num_experts / n_routed_experts",
                           std::to_string(m.experts) +
                               " routed experts (the device router "
                               "takes at most " +
                               std::to_string(kMaxRouterExperts) + ")");
    }
    if (m.attention == AttentionKind::kMla) {
        const Status s = check_mla_dims(m.mla);
        return s.ok() ? s : unsupported(json, "MLA dims", s.message());
    }
    if (m.head_dim % 32 != 0 || m.head_dim > 256) {
        return unsupported(json, "head_dim",
                           std::to_string(m.head_dim) + " is not a multiple of 32 up to 256");
    }
    if (m.kv_heads <= 0 || m.heads % m.kv_heads != 0) {
        return unsupported(json, "num_key_value_heads", "does not divide num_attention_heads");
    }
    // rope_scaling: the architecture's config has refused what it does not compute, and
    // CheckpointModel carries the frequencies and cos/sin factor of what it does (YaRN).
    return ok_status();
}

Status plan_qwen3(const ConfigJson& json, CheckpointModel* m, TensorPlan* plan) {
    EDGE_ASSIGN_OR_RETURN(Qwen3MoeConfig c, Qwen3MoeConfig::from_json(json));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        if (!c.is_moe_layer(l)) {
            return unsupported(json, "decoder_sparse_step / mlp_only_layers",
                               "layer " + std::to_string(l) + " is a dense MLP in a Qwen3-MoE");
        }
    }
    if (c.attention_bias) {
        return unsupported(json, "attention_bias", "attention biases in a Qwen3-MoE");
    }
    m->architecture = kQwen3MoeArchitecture;
    m->hidden = static_cast<int32_t>(c.hidden_size);
    m->layers = static_cast<int32_t>(c.num_hidden_layers);
    m->experts = static_cast<int32_t>(c.num_experts);
    m->top_k = static_cast<int32_t>(c.num_experts_per_tok);
    m->moe_inter = static_cast<int32_t>(c.moe_intermediate_size);
    m->heads = static_cast<int32_t>(c.num_attention_heads);
    m->kv_heads = static_cast<int32_t>(c.num_key_value_heads);
    m->head_dim = static_cast<int32_t>(c.head_dim);
    m->rot_dim = m->head_dim;
    m->vocab = static_cast<int32_t>(c.vocab_size);
    m->max_position = static_cast<int32_t>(c.rope.max_positions);
    m->rms_eps = static_cast<float>(c.rms_norm_eps);
    m->norm_topk_prob = c.norm_topk_prob;
    m->router.scoring = RouterScoring::kSoftmax;
    m->eos_token_ids = c.eos_token_ids;
    m->bos_token_id = c.bos_token_id;
    plan->qk_norm = true;
    plan->tie_word_embeddings = c.tie_word_embeddings;
    m->inv_freq = c.rope.inv_freq;
    m->rope_mscale = c.rope.mscale;
    plan->moe_layer.assign(static_cast<size_t>(c.num_hidden_layers), true);
    return ok_status();
}

// The feed-forward, routing and vocabulary fields GLM-4.5 and DeepSeek-V3 share
// (glm4_moe_common.h), as their CPU models read them.
void plan_sigmoid_moe(const SigmoidMoeConfig& c, CheckpointModel* m, TensorPlan* plan) {
    m->hidden = static_cast<int32_t>(c.hidden_size);
    m->layers = static_cast<int32_t>(c.num_hidden_layers);
    m->experts = static_cast<int32_t>(c.n_routed_experts);
    m->top_k = static_cast<int32_t>(c.num_experts_per_tok);
    m->moe_inter = static_cast<int32_t>(c.moe_intermediate_size);
    m->shared_inter = static_cast<int32_t>(c.moe_intermediate_size * c.n_shared_experts);
    m->dense_inter = c.first_k_dense_replace > 0 ? static_cast<int32_t>(c.intermediate_size) : 0;
    m->heads = static_cast<int32_t>(c.num_attention_heads);
    m->vocab = static_cast<int32_t>(c.vocab_size);
    m->max_position = static_cast<int32_t>(c.max_position_embeddings);
    m->rms_eps = static_cast<float>(c.rms_norm_eps);
    m->norm_topk_prob = c.norm_topk_prob;
    m->router.scoring = RouterScoring::kSigmoid;
    m->router.n_group = static_cast<int32_t>(c.n_group);
    m->router.topk_group = static_cast<int32_t>(c.topk_group);
    m->router.scaling_factor = static_cast<float>(c.routed_scaling_factor);
    m->eos_token_ids = c.eos_token_ids;
    m->bos_token_id = c.bos_token_id;
    plan->tie_word_embeddings = c.tie_word_embeddings;
    plan->float_embed = true;  // As the CPU model (glm4_moe_common.cc) reads it.
    plan->moe_layer.resize(static_cast<size_t>(c.num_hidden_layers));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        plan->moe_layer[static_cast<size_t>(l)] = c.is_moe_layer(l);
    }
}

// GLM-4.5's attention fields, read by the CPU model's own Glm4AttentionConfig (its rotary
// frequencies included, so both sides rotate by the same angles).
Status plan_glm4(const ConfigJson& json, CheckpointModel* m, TensorPlan* plan) {
    EDGE_ASSIGN_OR_RETURN(SigmoidMoeConfig c,
                          SigmoidMoeConfig::from_json(json, kGlm4MoeDefaults));
    if (c.n_routed_experts <= 0) {
        return unsupported(json, "n_routed_experts", "no routed experts");
    }
    EDGE_ASSIGN_OR_RETURN(Glm4AttentionConfig a, Glm4AttentionConfig::from_json(json, c));
    plan->attention_bias = a.attention_bias;
    plan->qk_norm = a.use_qk_norm;
    m->architecture = kGlm4MoeArchitecture;
    plan_sigmoid_moe(c, m, plan);
    m->kv_heads = static_cast<int32_t>(a.num_key_value_heads);
    m->head_dim = static_cast<int32_t>(a.head_dim);
    m->rot_dim = static_cast<int32_t>(a.rotary_dim);
    m->inv_freq = a.rope.inv_freq;
    m->rope_mscale = a.rope.mscale;
    m->max_position = static_cast<int32_t>(a.rope.max_positions);
    return ok_status();
}

// DeepSeek-V3's MLA fields, read by the CPU model's own MlaConfig (YaRN included).
Status plan_deepseek_v3(const ConfigJson& json, CheckpointModel* m, TensorPlan* plan) {
    EDGE_ASSIGN_OR_RETURN(SigmoidMoeConfig c,
                          SigmoidMoeConfig::from_json(json, kDeepseekV3Defaults));
    if (c.n_routed_experts <= 0) {
        return unsupported(json, "n_routed_experts", "no routed experts");
    }
    EDGE_ASSIGN_OR_RETURN(MlaConfig mla, MlaConfig::from_json(json, c));
    m->architecture = kDeepseekV3Architecture;
    m->attention = AttentionKind::kMla;
    plan_sigmoid_moe(c, m, plan);
    m->max_position = static_cast<int32_t>(mla.rope_max_positions);  // YaRN's, as the CPU model.
    m->mla = mla_dims(c, mla);
    m->kv_heads = 1;
    m->head_dim = static_cast<int32_t>(m->mla.row() / 2);
    m->rot_dim = m->mla.rope;
    m->inv_freq = mla.inv_freq;
    return ok_status();
}

Result<CheckpointMlp> read_mlp(WeightLoader& wl, const std::string& prefix, int64_t inter,
                               int64_t hidden) {
    CheckpointMlp mlp;
    EDGE_ASSIGN_OR_RETURN(mlp.gate, wl.matrix(prefix + "gate_proj.weight", inter, hidden));
    EDGE_ASSIGN_OR_RETURN(mlp.up, wl.matrix(prefix + "up_proj.weight", inter, hidden));
    EDGE_ASSIGN_OR_RETURN(mlp.down, wl.matrix(prefix + "down_proj.weight", hidden, inter));
    return mlp;
}

// kGqa attention of layer `p` ("model.layers.N.").
Status read_gqa(const Checkpoint& ck, WeightLoader& wl, const CheckpointModel& m,
                const TensorPlan& plan, const std::string& p, CheckpointLayer* L) {
    const int64_t H = m.hidden, hd = m.head_dim;
    const int64_t qd = int64_t{m.heads} * hd, kvd = int64_t{m.kv_heads} * hd;
    const std::string a = p + "self_attn.";
    if (plan.qk_norm) {
        EDGE_ASSIGN_OR_RETURN(L->q_norm, read_float_vector(ck, a + "q_norm.weight", hd));
        EDGE_ASSIGN_OR_RETURN(L->k_norm, read_float_vector(ck, a + "k_norm.weight", hd));
    }
    EDGE_ASSIGN_OR_RETURN(L->q, wl.matrix(a + "q_proj.weight", qd, H));
    EDGE_ASSIGN_OR_RETURN(L->k, wl.matrix(a + "k_proj.weight", kvd, H));
    EDGE_ASSIGN_OR_RETURN(L->v, wl.matrix(a + "v_proj.weight", kvd, H));
    EDGE_ASSIGN_OR_RETURN(L->o, wl.matrix(a + "o_proj.weight", H, qd));
    if (plan.attention_bias) {
        EDGE_ASSIGN_OR_RETURN(L->q_bias, read_float_vector(ck, a + "q_proj.bias", qd));
        EDGE_ASSIGN_OR_RETURN(L->k_bias, read_float_vector(ck, a + "k_proj.bias", kvd));
        EDGE_ASSIGN_OR_RETURN(L->v_bias, read_float_vector(ck, a + "v_proj.bias", kvd));
    }
    return ok_status();
}

}  // namespace

Result<CheckpointModel> read_checkpoint_model(const std::string& dir, const std::string& policy) {
    EDGE_ASSIGN_OR_RETURN(ConfigJson json, ConfigJson::read(dir));
    CheckpointModel m;
    TensorPlan plan;
    const std::string arch = json.architecture();
    if (arch == kQwen3MoeArchitecture || arch == "qwen3_moe") {
        EDGE_RETURN_IF_ERROR(plan_qwen3(json, &m, &plan));
    } else if (arch == kGlm4MoeArchitecture) {
        EDGE_RETURN_IF_ERROR(plan_glm4(json, &m, &plan));
    } else if (arch == kDeepseekV3Architecture) {
        EDGE_RETURN_IF_ERROR(plan_deepseek_v3(json, &m, &plan));
    } else {
        return unsupported(json, "architectures", "'" + arch + "' is not supported");
    }
    EDGE_RETURN_IF_ERROR(check_device_limits(json, m));
    m.router.experts = m.experts;
    m.router.top_k = m.top_k;
    m.router.norm_topk_prob = m.norm_topk_prob;

    EDGE_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::open_dir(dir));
    m.checkpoint = std::move(ckpt);
    EDGE_ASSIGN_OR_RETURN(std::unique_ptr<WeightLoader> loader,
                          WeightLoader::create(*m.checkpoint, json, policy));
    m.loader = std::move(loader);
    const Checkpoint& ck = *m.checkpoint;
    WeightLoader& wl = *m.loader;
    const int64_t H = m.hidden, E = m.experts;
    if (plan.float_embed) {
        EDGE_ASSIGN_OR_RETURN(TensorView t,
                              ck.tensor("model.embed_tokens.weight",
                                        {DType::kBF16, DType::kF16, DType::kF32}, {m.vocab, H}));
        m.embed = Weight{float_format_of(t.dtype()), m.vocab, H, t.data, nullptr};
    } else {
        EDGE_ASSIGN_OR_RETURN(m.embed, wl.matrix("model.embed_tokens.weight", m.vocab, H));
    }
    // As Hugging Face ties them and the CPU model does (qwen3_moe.cc): the flag alone decides,
    // a stored lm_head.weight beside it is not read.
    if (plan.tie_word_embeddings) {
        m.lm_head = m.embed;
    } else {
        EDGE_ASSIGN_OR_RETURN(m.lm_head, wl.matrix("lm_head.weight", m.vocab, H));
    }
    EDGE_ASSIGN_OR_RETURN(m.final_norm, read_float_vector(ck, "model.norm.weight", H));
    bool expert_format_known = false;
    m.layer.resize(static_cast<size_t>(m.layers));
    for (int64_t l = 0; l < m.layers; ++l) {
        CheckpointLayer& L = m.layer[static_cast<size_t>(l)];
        const std::string p = "model.layers." + std::to_string(l) + ".";
        EDGE_ASSIGN_OR_RETURN(L.input_norm, read_float_vector(ck, p + "input_layernorm.weight", H));
        EDGE_ASSIGN_OR_RETURN(L.post_norm,
                              read_float_vector(ck, p + "post_attention_layernorm.weight", H));
        switch (m.attention) {
            case AttentionKind::kGqa:
                EDGE_RETURN_IF_ERROR(read_gqa(ck, wl, m, plan, p, &L));
                break;
            case AttentionKind::kMla:
                EDGE_ASSIGN_OR_RETURN(L.mla, read_mla_layer(ck, wl, p + "self_attn.", m.mla));
                break;
        }
        L.moe = plan.moe_layer[static_cast<size_t>(l)];
        if (!L.moe) {
            EDGE_ASSIGN_OR_RETURN(L.dense, read_mlp(wl, p + "mlp.", m.dense_inter, H));
            continue;
        }
        EDGE_ASSIGN_OR_RETURN(L.router, wl.matrix(p + "mlp.gate.weight", E, H));
        // Optional, as in the CPU model (which routes without it when absent).
        const std::string bias = p + "mlp.gate.e_score_correction_bias";
        if (m.router.scoring == RouterScoring::kSigmoid && ck.has(bias)) {
            EDGE_ASSIGN_OR_RETURN(L.router_bias, read_float_vector(ck, bias, E));
        }
        if (m.shared_inter > 0) {
            EDGE_ASSIGN_OR_RETURN(L.shared,
                                  read_mlp(wl, p + "mlp.shared_experts.", m.shared_inter, H));
        }
        for (int64_t e = 0; e < E; ++e) {
            const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
            EDGE_ASSIGN_OR_RETURN(CheckpointMlp x, read_mlp(wl, ep, m.moe_inter, H));
            for (const Weight* w : {&x.gate, &x.up, &x.down}) {
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
            L.gate.push_back(x.gate);
            L.up.push_back(x.up);
            L.down.push_back(x.down);
        }
    }
    return m;
}

}  // namespace edge::engine::cuda
