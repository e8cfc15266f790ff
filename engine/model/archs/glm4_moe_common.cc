#include "engine/model/archs/glm4_moe_common.h"

#include <algorithm>
#include <cmath>

#include "common/log.h"
#include "engine/cpu/convert.h"
#include "engine/cpu/ops.h"
#include "engine/model/model_config.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine {
namespace {

const std::vector<DType> kFloatTypes = {DType::kBF16, DType::kF16, DType::kF32};

}  // namespace

Result<SigmoidMoeConfig> SigmoidMoeConfig::from_json(const ConfigJson& j) {
    constexpr int64_t kBig = int64_t{1} << 24;
    SigmoidMoeConfig c;
    EDGE_ASSIGN_OR_RETURN(c.hidden_size, get_int_in(j, "hidden_size", 1, kBig));
    EDGE_ASSIGN_OR_RETURN(c.num_hidden_layers, get_int_in(j, "num_hidden_layers", 1, 4096));
    EDGE_ASSIGN_OR_RETURN(c.num_attention_heads, get_int_in(j, "num_attention_heads", 1, 4096));
    EDGE_ASSIGN_OR_RETURN(c.vocab_size, get_int_in(j, "vocab_size", 1, int64_t{1} << 30));
    EDGE_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          get_int_in(j, "max_position_embeddings", 1, int64_t{1} << 30));
    EDGE_ASSIGN_OR_RETURN(c.intermediate_size, get_int_in(j, "intermediate_size", 1, kBig));
    EDGE_ASSIGN_OR_RETURN(c.n_routed_experts, get_int_in(j, "n_routed_experts", 0, 1 << 16));
    if (c.n_routed_experts > 0) {
        EDGE_ASSIGN_OR_RETURN(c.num_experts_per_tok,
                              get_int_in(j, "num_experts_per_tok", 1, c.n_routed_experts));
        EDGE_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                              get_int_in(j, "moe_intermediate_size", 1, kBig));
        if (!j.is_null("n_shared_experts")) {
            EDGE_ASSIGN_OR_RETURN(c.n_shared_experts, get_int_in(j, "n_shared_experts", 0, 64));
        }
        if (!j.is_null("n_group")) {
            EDGE_ASSIGN_OR_RETURN(c.n_group, get_int_in(j, "n_group", 1, c.n_routed_experts));
        }
        if (c.n_routed_experts % c.n_group != 0) {
            return invalid_argument_error(j.path() + ": field 'n_group' (" +
                                          std::to_string(c.n_group) +
                                          ") does not divide n_routed_experts");
        }
        if (!j.is_null("topk_group")) {
            EDGE_ASSIGN_OR_RETURN(c.topk_group, get_int_in(j, "topk_group", 1, c.n_group));
        }
        if (c.topk_group * (c.n_routed_experts / c.n_group) < c.num_experts_per_tok) {
            return invalid_argument_error(j.path() + ": fields 'topk_group' and 'n_group' keep " +
                                          "fewer experts than num_experts_per_tok");
        }
    }
    if (!j.is_null("first_k_dense_replace")) {
        EDGE_ASSIGN_OR_RETURN(c.first_k_dense_replace,
                              get_int_in(j, "first_k_dense_replace", 0, c.num_hidden_layers));
    }
    if (!j.is_null("num_nextn_predict_layers")) {
        EDGE_ASSIGN_OR_RETURN(c.num_nextn_predict_layers,
                              get_int_in(j, "num_nextn_predict_layers", 0, 64));
    }
    EDGE_ASSIGN_OR_RETURN(c.routed_scaling_factor, j.get_double("routed_scaling_factor", 1.0));
    EDGE_ASSIGN_OR_RETURN(c.rope_theta, j.get_double("rope_theta", 10000.0));
    EDGE_ASSIGN_OR_RETURN(c.rms_norm_eps, j.get_double("rms_norm_eps", 1e-6));
    if (!(c.rope_theta > 1.0) || !(c.rms_norm_eps > 0.0 && c.rms_norm_eps < 1.0) ||
        !(c.routed_scaling_factor > 0.0 && c.routed_scaling_factor < 1e6)) {
        return invalid_argument_error(j.path() + ": field 'rope_theta', 'rms_norm_eps' or " +
                                      "'routed_scaling_factor' is out of range");
    }
    EDGE_ASSIGN_OR_RETURN(c.norm_topk_prob, j.get_bool("norm_topk_prob", true));
    EDGE_ASSIGN_OR_RETURN(c.tie_word_embeddings, j.get_bool("tie_word_embeddings", false));
    if (!j.is_null("hidden_act")) {
        EDGE_ASSIGN_OR_RETURN(std::string act, j.get_string("hidden_act"));
        if (act != "silu") {
            return unimplemented_error(j.path() + ": field 'hidden_act' '" + act +
                                       "' is not supported (only silu)");
        }
    }
    if (!j.is_null("scoring_func")) {
        EDGE_ASSIGN_OR_RETURN(std::string f, j.get_string("scoring_func"));
        if (f != "sigmoid") {
            return unimplemented_error(j.path() + ": field 'scoring_func' '" + f +
                                       "' is not supported (only sigmoid)");
        }
    }
    EDGE_ASSIGN_OR_RETURN(c.eos_token_ids, j.get_int_list("eos_token_id"));
    EDGE_ASSIGN_OR_RETURN(c.bos_token_id, j.get_int("bos_token_id", -1));
    for (int64_t id : c.eos_token_ids) {
        if (id < 0 || id >= c.vocab_size) {
            return invalid_argument_error(j.path() + ": field 'eos_token_id' " +
                                          std::to_string(id) + " is outside the vocabulary");
        }
    }
    return c;
}

SigmoidMoeModel::SigmoidMoeModel(SigmoidMoeConfig config, std::unique_ptr<Checkpoint> ckpt,
                                 std::unique_ptr<Backend> backend)
    : c_(std::move(config)),
      ckpt_(std::move(ckpt)),
      backend_(std::move(backend)) {}

Result<Weight> SigmoidMoeModel::weight(const std::string& name, int64_t rows, int64_t cols) {
    // The embedding table and MLA's kv_b_proj are read element by element (stored_element), so
    // they stay float; every other matrix goes through the WeightLoader (quantized checkpoints,
    // quantization policy on load), as in Qwen3-MoE.
    const bool float_only =
        name == "model.embed_tokens.weight" || name.ends_with("kv_b_proj.weight");
    if (!float_only && weights_ != nullptr) {
        EDGE_ASSIGN_OR_RETURN(Weight w, weights_->matrix(name, rows, cols));
        if (!backend_->supports(Op::kMatmul, w.format)) {
            return unimplemented_error(ckpt_->description() + ": tensor '" + name +
                                       "': backend " + std::string(backend_->name()) +
                                       " has no matmul for format " +
                                       std::string(quant::weight_format_name(w.format)));
        }
        return w;
    }
    EDGE_ASSIGN_OR_RETURN(TensorView t, ckpt_->tensor(name, kFloatTypes, {rows, cols}));
    Weight w;
    w.format = float_format_of(t.dtype());
    w.rows = rows;
    w.cols = cols;
    w.data = t.data;
    if (!backend_->supports(Op::kMatmul, w.format)) {
        return unimplemented_error(*t.file + ": tensor '" + name + "': backend " +
                                   std::string(backend_->name()) + " has no matmul for dtype " +
                                   std::string(dtype_name(t.dtype())));
    }
    return w;
}

Result<std::vector<float>> SigmoidMoeModel::vector(const std::string& name, int64_t n) {
    return read_float_vector(*ckpt_, name, n);
}

Result<SwiGlu> SigmoidMoeModel::swiglu(const std::string& prefix, int64_t inter) {
    SwiGlu m;
    EDGE_ASSIGN_OR_RETURN(m.gate, weight(prefix + "gate_proj.weight", inter, c_.hidden_size));
    EDGE_ASSIGN_OR_RETURN(m.up, weight(prefix + "up_proj.weight", inter, c_.hidden_size));
    EDGE_ASSIGN_OR_RETURN(m.down, weight(prefix + "down_proj.weight", c_.hidden_size, inter));
    return m;
}

Status SigmoidMoeModel::load_common(const std::string& dir, const ConfigJson& json,
                                    const LoadOptions& options, const std::string& architecture,
                                    int32_t kv_heads, int32_t head_dim,
                                    int64_t kv_bytes_per_token) {
    const int64_t H = c_.hidden_size;
    EDGE_ASSIGN_OR_RETURN(weights_, WeightLoader::create(*ckpt_, json, options.quantization));
    weights_->use_row_tiles(options.row_tiles && backend_->supports_row_tiles());
    EDGE_ASSIGN_OR_RETURN(embed_, weight("model.embed_tokens.weight", c_.vocab_size, H));
    if (c_.tie_word_embeddings && !ckpt_->has("lm_head.weight")) {
        lm_head_ = embed_;
    } else {
        EDGE_ASSIGN_OR_RETURN(lm_head_, weight("lm_head.weight", c_.vocab_size, H));
    }
    EDGE_ASSIGN_OR_RETURN(final_norm_, vector("model.norm.weight", H));
    MoeShape moe_shape;
    moe_shape.hidden = H;
    moe_shape.inter = c_.moe_intermediate_size;
    moe_shape.experts = static_cast<int32_t>(c_.n_routed_experts);
    moe_shape.top_k = static_cast<int32_t>(c_.num_experts_per_tok);
    moe_shape.layers = static_cast<int32_t>(c_.num_hidden_layers);
    if (c_.n_routed_experts > 0) {
        EDGE_ASSIGN_OR_RETURN(moe_,
                              MoeBlock::create(moe_shape, options.sharding, backend_.get()));
    }
    cpu::GroupRouterConfig rc;
    rc.experts = c_.n_routed_experts;
    rc.top_k = c_.num_experts_per_tok;
    rc.n_group = c_.n_group;
    rc.topk_group = c_.topk_group;
    rc.norm_topk_prob = c_.norm_topk_prob;
    rc.scaling_factor = static_cast<float>(c_.routed_scaling_factor);
    input_norm_.resize(c_.num_hidden_layers);
    ffn_.resize(c_.num_hidden_layers);
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
        FfnLayer& F = ffn_[l];
        const std::string p = "model.layers." + std::to_string(l) + ".";
        EDGE_ASSIGN_OR_RETURN(input_norm_[l], vector(p + "input_layernorm.weight", H));
        EDGE_ASSIGN_OR_RETURN(F.post_norm, vector(p + "post_attention_layernorm.weight", H));
        EDGE_RETURN_IF_ERROR(load_attention(l, p + "self_attn."));
        F.moe = c_.is_moe_layer(l);
        if (!F.moe) {
            EDGE_ASSIGN_OR_RETURN(F.dense, swiglu(p + "mlp.", c_.intermediate_size));
            continue;
        }
        const int64_t E = c_.n_routed_experts;
        EDGE_ASSIGN_OR_RETURN(Weight router, weight(p + "mlp.gate.weight", E, H));
        std::vector<float> correction_bias;  // Empty when the checkpoint has none.
        if (ckpt_->has(p + "mlp.gate.e_score_correction_bias")) {
            EDGE_ASSIGN_OR_RETURN(correction_bias,
                                  vector(p + "mlp.gate.e_score_correction_bias", E));
        }
        // In-process ranks share memory: every expert is mapped once and the placement only
        // decides which rank computes it.
        std::vector<SwiGlu> experts(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) {
            EDGE_ASSIGN_OR_RETURN(
                experts[e],
                swiglu(p + "mlp.experts." + std::to_string(e) + ".", c_.moe_intermediate_size));
        }
        moe_->set_layer(static_cast<int32_t>(l), router,
                        make_sigmoid_group_router(rc, std::move(correction_bias)),
                        std::move(experts));
        if (c_.n_shared_experts > 0) {
            EDGE_ASSIGN_OR_RETURN(F.shared, swiglu(p + "mlp.shared_experts.",
                                                   c_.moe_intermediate_size * c_.n_shared_experts));
        }
    }
    if (c_.num_nextn_predict_layers > 0) {
        log::info("model_mtp_layers_skipped", {{"dir", dir},
                                               {"layers", c_.num_nextn_predict_layers},
                                               {"first", c_.num_hidden_layers}});
    }
    int64_t max_context = c_.max_position_embeddings;
    if (options.max_context > 0) {
        if (options.max_context > max_context) {
            return invalid_argument_error(dir + ": max_context " +
                                          std::to_string(options.max_context) +
                                          " is larger than the model's max_position_embeddings " +
                                          std::to_string(max_context));
        }
        max_context = options.max_context;
    }
    EDGE_RETURN_IF_ERROR(create_kv_cache(static_cast<int32_t>(c_.num_hidden_layers), kv_heads,
                                         head_dim, options.max_slots,
                                         static_cast<int32_t>(max_context), options.kv_block_tokens,
                                         options.kv_cache_bytes));
    spec_.architecture = architecture;
    spec_.vocab_size = static_cast<int32_t>(c_.vocab_size);
    spec_.max_context = static_cast<int32_t>(max_context);
    for (int64_t id : c_.eos_token_ids) {
        spec_.eos_token_ids.push_back(static_cast<TokenId>(id));
    }
    spec_.bos_token_id = static_cast<TokenId>(
        c_.bos_token_id >= 0 && c_.bos_token_id < c_.vocab_size ? c_.bos_token_id : -1);
    spec_.version = version_digest(json, *ckpt_);
    spec_.weight_bytes = weights_->resident_bytes();
    spec_.kv_bytes_per_token = kv_bytes_per_token;
    return ok_status();
}

Status SigmoidMoeModel::ffn(const FfnLayer& F, int32_t li, int64_t n) {
    const int64_t H = c_.hidden_size;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    float* x = x_.data();
    float* h = grow(h_, n * H);
    for (int64_t i = 0; i < n; ++i) {
        cpu::rms_norm(x + i * H, F.post_norm.data(), H, eps, h + i * H);
    }
    float* out = grow(tmp_, n * H);
    if (!F.moe) {
        swiglu_rows(*backend_, F.dense, h, n, out, &mlp_scratch_);
        for (int64_t i = 0; i < n * H; ++i) {
            x[i] += out[i];
        }
        return ok_status();
    }
    if (c_.n_shared_experts > 0) {
        swiglu_rows(*backend_, F.shared, h, n, out, &mlp_scratch_);
        for (int64_t i = 0; i < n * H; ++i) {
            x[i] += out[i];
        }
    }
    return moe_->forward(li, h, n, x);
}

Status SigmoidMoeModel::forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) {
    int64_t n = 0;
    EDGE_RETURN_IF_ERROR(prepare_batch(batch, &n));
    const int64_t H = c_.hidden_size;
    const int64_t V = c_.vocab_size;
    tok_slot_.resize(n);
    tok_pos_.resize(n);
    float* x = grow(x_, n * H);
    int64_t i = 0;
    int64_t out_rows = 0;
    for (const SequenceChunk& ch : batch) {
        for (size_t j = 0; j < ch.tokens.size(); ++j, ++i) {
            tok_slot_[i] = ch.slot;
            tok_pos_[i] = ch.start_pos + static_cast<int32_t>(j);
            const int64_t base = static_cast<int64_t>(ch.tokens[j]) * H;
            for (int64_t d = 0; d < H; ++d) {
                x[i * H + d] = stored_element(embed_.data, embed_.format, base + d);
            }
        }
        out_rows += ch.all_logits ? static_cast<int64_t>(ch.tokens.size()) : 1;
    }
    if (moe_) {
        moe_->begin_step();
    }
    for (int32_t l = 0; l < static_cast<int32_t>(ffn_.size()); ++l) {
        attention(l, n);
        EDGE_RETURN_IF_ERROR(ffn(ffn_[l], l, n));
    }
    float* h = grow(h_, out_rows * H);
    const float eps = static_cast<float>(c_.rms_norm_eps);
    int64_t row = 0;
    i = 0;
    for (const SequenceChunk& ch : batch) {
        const int64_t len = static_cast<int64_t>(ch.tokens.size());
        for (int64_t j = ch.all_logits ? 0 : len - 1; j < len; ++j, ++row) {
            cpu::rms_norm(x_.data() + (i + j) * H, final_norm_.data(), H, eps, h + row * H);
        }
        i += len;
    }
    logits->resize(static_cast<size_t>(out_rows * V));
    backend_->matmul(lm_head_, h, out_rows, logits->data(), V);
    commit_batch(batch);
    return moe_ ? moe_->end_step() : ok_status();
}

}  // namespace edge::engine
