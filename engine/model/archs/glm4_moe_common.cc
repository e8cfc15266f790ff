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

Result<SigmoidMoeConfig> SigmoidMoeConfig::from_json(const ConfigJson& j,
                                                     const SigmoidMoeDefaults& d) {
    constexpr int64_t kBig = int64_t{1} << 24;
    SigmoidMoeConfig c;
    c.n_shared_experts = d.n_shared_experts;
    c.n_group = d.n_group;
    c.topk_group = d.topk_group;
    c.first_k_dense_replace = d.first_k_dense_replace;
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
        } else if (c.topk_group > c.n_group) {
            // The architecture's default (4 for DeepSeek-V3) against a config's own n_group:
            // routing would skip the group limit, not what the reference computes.
            return invalid_argument_error(j.path() +
                                          ": field 'topk_group' is missing and its default (" +
                                          std::to_string(c.topk_group) + ") exceeds n_group (" +
                                          std::to_string(c.n_group) + "); set topk_group");
        }
        if (c.topk_group * (c.n_routed_experts / c.n_group) < c.num_experts_per_tok) {
            return invalid_argument_error(j.path() + ": fields 'topk_group' and 'n_group' keep " +
                                          "fewer experts than num_experts_per_tok");
        }
    }
    if (!j.is_null("first_k_dense_replace")) {
        EDGE_ASSIGN_OR_RETURN(c.first_k_dense_replace,
                              get_int_in(j, "first_k_dense_replace", 0, kBig));
    }
    // More dense layers than layers (given, or the architecture's default against a small
    // config): transformers makes every layer dense, and so does this.
    c.first_k_dense_replace = std::min(c.first_k_dense_replace, c.num_hidden_layers);
    if (!j.is_null("num_nextn_predict_layers")) {
        EDGE_ASSIGN_OR_RETURN(c.num_nextn_predict_layers,
                              get_int_in(j, "num_nextn_predict_layers", 0, 64));
    }
    EDGE_ASSIGN_OR_RETURN(c.routed_scaling_factor,
                          j.get_double("routed_scaling_factor", d.routed_scaling_factor));
    EDGE_ASSIGN_OR_RETURN(c.rope_theta, j.get_double("rope_theta", 10000.0));
    EDGE_ASSIGN_OR_RETURN(c.rms_norm_eps, j.get_double("rms_norm_eps", d.rms_norm_eps));
    if (!(c.rope_theta > 1.0) || !(c.rms_norm_eps > 0.0 && c.rms_norm_eps < 1.0) ||
        !(c.routed_scaling_factor > 0.0 && c.routed_scaling_factor < 1e6)) {
        return invalid_argument_error(j.path() + ": field 'rope_theta', 'rms_norm_eps' or " +
                                      "'routed_scaling_factor' is out of range");
    }
    EDGE_ASSIGN_OR_RETURN(c.norm_topk_prob, j.get_bool("norm_topk_prob", true));
    EDGE_ASSIGN_OR_RETURN(c.tie_word_embeddings, j.get_bool("tie_word_embeddings", false));
    EDGE_RETURN_IF_ERROR(require_string_if_set(j, "hidden_act", "silu"));
    EDGE_RETURN_IF_ERROR(require_string_if_set(j, "scoring_func", "sigmoid"));
    // The router computes DeepSeek-V3's noaux_tc (correction bias, groups scored by their two
    // best experts); "greedy" and "group_limited_greedy" (DeepSeek-V2) pick other experts.
    EDGE_RETURN_IF_ERROR(require_string_if_set(j, "topk_method", "noaux_tc"));
    // DeepSeek's remote code makes a layer MoE only when layer % moe_layer_freq == 0 (past
    // first_k_dense_replace); transformers' own class ignores the field. Only 1 means the same
    // layers to both, and is what every released checkpoint sets.
    if (!j.is_null("moe_layer_freq")) {
        EDGE_ASSIGN_OR_RETURN(const int64_t freq, j.get_int("moe_layer_freq"));
        if (freq != 1) {
            return unimplemented_error(j.path() + ": field 'moe_layer_freq' " +
                                       std::to_string(freq) + " is not supported (only 1: " +
                                       "every layer from first_k_dense_replace on is MoE)");
        }
    }
    EDGE_ASSIGN_OR_RETURN(c.eos_token_ids, get_token_ids(j, "eos_token_id", c.vocab_size));
    if (!j.is_null("bos_token_id")) {  // Absent or null: no BOS.
        EDGE_ASSIGN_OR_RETURN(c.bos_token_id, get_int_in(j, "bos_token_id", 0, c.vocab_size - 1));
    }
    return c;
}

SigmoidMoeModel::SigmoidMoeModel(SigmoidMoeConfig config, std::unique_ptr<Checkpoint> ckpt,
                                 std::unique_ptr<Backend> backend)
    : c_(std::move(config)),
      ckpt_(std::move(ckpt)),
      backend_(std::move(backend)) {}

Result<Weight> SigmoidMoeModel::weight(const std::string& name, int64_t rows, int64_t cols) {
    // MLA's kv_b_proj is read element by element (stored_element, widened to f32 for the
    // absorbed path), so it stays float (dequantized on load when the checkpoint stores it in
    // FP8, as DeepSeek-V3's does); every other matrix goes through the WeightLoader (quantized
    // checkpoints, quantization policy on load), as in Qwen3-MoE.
    const bool float_only = name.ends_with("kv_b_proj.weight");
    if (weights_ != nullptr) {
        return float_only ? weights_->float_matrix(name, rows, cols)
                          : weights_->matrix_for(*backend_, name, rows, cols);
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
    return load_swiglu(*weights_, *backend_, prefix, c_.hidden_size, inter);
}

Status SigmoidMoeModel::load_common(const std::string& dir, const ConfigJson& json,
                                    const LoadOptions& options, const std::string& architecture,
                                    int32_t kv_heads, int32_t head_dim,
                                    int64_t kv_bytes_per_token) {
    const int64_t H = c_.hidden_size;
    EDGE_ASSIGN_OR_RETURN(weights_, WeightLoader::create(*ckpt_, json, options.quantization));
    weights_->use_row_tiles(options.row_tiles && backend_->supports_row_tiles());
    EDGE_ASSIGN_OR_RETURN(embed_, weight("model.embed_tokens.weight", c_.vocab_size, H));
    // Tied as Hugging Face ties them: the embeddings, even when the checkpoint also holds an
    // lm_head.weight (then logged as unread).
    if (c_.tie_word_embeddings) {
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
        EDGE_ASSIGN_OR_RETURN(
            std::vector<SwiGlu> experts,
            load_experts(*weights_, *backend_, p + "mlp.experts.", E, c_.hidden_size,
                         c_.moe_intermediate_size, load_threads(options)));
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
    PagedModelShape shape;
    shape.architecture = architecture;
    shape.layers = c_.num_hidden_layers;
    shape.kv_heads = kv_heads;
    shape.head_dim = head_dim;
    shape.max_position_embeddings = c_.max_position_embeddings;
    shape.vocab_size = c_.vocab_size;
    shape.eos_token_ids = c_.eos_token_ids;
    shape.bos_token_id = c_.bos_token_id;
    shape.kv_bytes_per_token = kv_bytes_per_token;
    shape.version = version_digest(json, *ckpt_, weights_->policy());
    shape.weight_bytes = weights_->resident_bytes();
    // Every rank runs in this process and every expert is read (load_experts), sharded or not:
    // what is left unread is unused.
    shape.weight_bytes -= release_unread_tensors(*ckpt_);
    return finish_load(dir, options, shape, &spec_);
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
    // An error a step that failed for another reason left in the backend is not this step's.
    (void)backend_->take_error();
    const int64_t out_rows = embed_batch(batch, embed_, grow(x_, n * c_.hidden_size));
    if (moe_) {
        moe_->begin_step();
    }
    for (int32_t l = 0; l < static_cast<int32_t>(ffn_.size()); ++l) {
        attention(l, n);
        EDGE_RETURN_IF_ERROR(ffn(ffn_[l], l, n));
        layer_done();
    }
    batch_logits(batch, x_.data(), final_norm_, static_cast<float>(c_.rms_norm_eps), lm_head_,
                 out_rows, *backend_, h_, logits);
    // A backend call that failed without losing the device (a full arena) wrote NaN: the batch
    // fails rather than sampling from it.
    EDGE_RETURN_IF_ERROR(backend_->take_error());
    commit_batch(batch);
    if (moe_) {
        // The slots' lengths have moved on: the step succeeded, whatever end_step says. A load
        // refresh it could not make (logged there) only skips a rebalance; failing the step
        // here would have the scheduler replan positions the cache already holds.
        (void)moe_->end_step();
    }
    return ok_status();
}

}  // namespace edge::engine
