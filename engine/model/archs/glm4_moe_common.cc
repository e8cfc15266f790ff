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

WeightFormat format_of(DType d) {
    switch (d) {
        case DType::kBF16:
            return WeightFormat::kBF16;
        case DType::kF16:
            return WeightFormat::kF16;
        default:
            return WeightFormat::kF32;
    }
}

const std::vector<DType> kFloatTypes = {DType::kBF16, DType::kF16, DType::kF32};

}  // namespace

float stored_element(const void* data, WeightFormat f, int64_t i) {
    switch (f) {
        case WeightFormat::kBF16:
            return cpu::bf16_to_f32(cpu::load_u16(data, i));
        case WeightFormat::kF16:
            return cpu::f16_to_f32(cpu::load_u16(data, i));
        default:
            return cpu::load_f32(data, i);
    }
}

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
      backend_(std::move(backend)),
      placement_(ExpertPlacement::single_rank(static_cast<int32_t>(c_.num_hidden_layers),
                                              static_cast<int32_t>(c_.n_routed_experts))) {}

void SigmoidMoeModel::truncate_slot(int32_t slot, int32_t length) {
    if (kv_->in_use(slot) && length >= 0 && length < kv_->length(slot)) {
        kv_->set_length(slot, length);
    }
}

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
    w.format = format_of(t.dtype());
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
    EDGE_ASSIGN_OR_RETURN(TensorView t, ckpt_->tensor(name, kFloatTypes, {n}));
    std::vector<float> out(n);
    for (int64_t i = 0; i < n; ++i) {
        out[i] = stored_element(t.data, format_of(t.dtype()), i);
    }
    return out;
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
    EDGE_ASSIGN_OR_RETURN(embed_, weight("model.embed_tokens.weight", c_.vocab_size, H));
    if (c_.tie_word_embeddings && !ckpt_->has("lm_head.weight")) {
        lm_head_ = embed_;
    } else {
        EDGE_ASSIGN_OR_RETURN(lm_head_, weight("lm_head.weight", c_.vocab_size, H));
    }
    EDGE_ASSIGN_OR_RETURN(final_norm_, vector("model.norm.weight", H));
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
        EDGE_ASSIGN_OR_RETURN(F.router, weight(p + "mlp.gate.weight", E, H));
        if (ckpt_->has(p + "mlp.gate.e_score_correction_bias")) {
            EDGE_ASSIGN_OR_RETURN(F.correction_bias,
                                  vector(p + "mlp.gate.e_score_correction_bias", E));
        }
        F.experts.resize(E);
        for (int64_t e = 0; e < E; ++e) {
            if (placement_.is_local(static_cast<int32_t>(l), static_cast<int32_t>(e))) {
                EDGE_ASSIGN_OR_RETURN(
                    F.experts[e],
                    swiglu(p + "mlp.experts." + std::to_string(e) + ".", c_.moe_intermediate_size));
            }
        }
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
    if (options.max_slots < 1) {
        return invalid_argument_error("load options: max_slots must be at least 1");
    }
    KvCacheShape shape;
    shape.layers = static_cast<int32_t>(c_.num_hidden_layers);
    shape.kv_heads = kv_heads;
    shape.head_dim = head_dim;
    shape.slots = options.max_slots;
    shape.max_context = static_cast<int32_t>(max_context);
    shape.max_tokens = options.kv_cache_bytes > 0 ? options.kv_cache_bytes / kv_bytes_per_token
                                                  : int64_t{options.max_slots} * max_context;
    if (shape.max_tokens < 1) {
        return invalid_argument_error(
            "load options: kv_cache_bytes " + std::to_string(options.kv_cache_bytes) +
            " holds no token (one takes " + std::to_string(kv_bytes_per_token) + " bytes)");
    }
    EDGE_ASSIGN_OR_RETURN(kv_, KvCache::create(shape));
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

Status SigmoidMoeModel::validate(std::span<const SequenceChunk> batch, int64_t* total) const {
    int64_t new_tokens = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
        const SequenceChunk& ch = batch[i];
        const std::string where =
            "forward: chunk " + std::to_string(i) + " (slot " + std::to_string(ch.slot) + ")";
        if (!kv_->in_use(ch.slot)) {
            return invalid_argument_error(where + ": slot is not acquired");
        }
        for (size_t j = 0; j < i; ++j) {
            if (batch[j].slot == ch.slot) {
                return invalid_argument_error(where + ": slot appears twice in one batch");
            }
        }
        if (ch.start_pos != kv_->length(ch.slot)) {
            return invalid_argument_error(where + ": start_pos " + std::to_string(ch.start_pos) +
                                          " is not the slot's length " +
                                          std::to_string(kv_->length(ch.slot)));
        }
        if (ch.tokens.empty()) {
            return invalid_argument_error(where + ": no tokens");
        }
        if (static_cast<int64_t>(ch.start_pos) + static_cast<int64_t>(ch.tokens.size()) >
            spec_.max_context) {
            return invalid_argument_error(where + ": the chunk goes beyond the context of " +
                                          std::to_string(spec_.max_context) + " tokens");
        }
        for (TokenId t : ch.tokens) {
            if (t < 0 || t >= spec_.vocab_size) {
                return invalid_argument_error(where + ": token id " + std::to_string(t) +
                                              " is outside the vocabulary of " +
                                              std::to_string(spec_.vocab_size));
            }
        }
        new_tokens += static_cast<int64_t>(ch.tokens.size());
    }
    if (kv_->used_tokens() + new_tokens > kv_->shape().max_tokens) {
        return resource_exhausted_error("forward: the KV cache holds " +
                                        std::to_string(kv_->shape().max_tokens) + " tokens; " +
                                        std::to_string(kv_->used_tokens()) + " are in use and " +
                                        std::to_string(new_tokens) + " more were asked for");
    }
    *total = new_tokens;
    return ok_status();
}

void SigmoidMoeModel::mlp_rows(const SwiGlu& m, const float* in, int64_t rows, float* out) {
    const int64_t inter = m.gate.rows;
    float* gate = grow(gate_, rows * inter);
    float* up = grow(up_, rows * inter);
    float* act = grow(act_, rows * inter);
    const MatmulJob gate_up[] = {{&m.gate, in, rows, gate, inter}, {&m.up, in, rows, up, inter}};
    backend_->matmul_batch(gate_up);
    cpu::silu_mul(gate, up, rows * inter, act);
    backend_->matmul(m.down, act, rows, out, c_.hidden_size);
}

void SigmoidMoeModel::ffn(const FfnLayer& F, int32_t li, int64_t n) {
    const int64_t H = c_.hidden_size;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    float* x = x_.data();
    float* h = grow(h_, n * H);
    for (int64_t i = 0; i < n; ++i) {
        cpu::rms_norm(x + i * H, F.post_norm.data(), H, eps, h + i * H);
    }
    float* out = grow(tmp_, n * H);
    if (!F.moe) {
        mlp_rows(F.dense, h, n, out);
        for (int64_t i = 0; i < n * H; ++i) {
            x[i] += out[i];
        }
        return;
    }
    if (c_.n_shared_experts > 0) {
        mlp_rows(F.shared, h, n, out);
        for (int64_t i = 0; i < n * H; ++i) {
            x[i] += out[i];
        }
    }
    const int64_t E = c_.n_routed_experts;
    const int64_t K = c_.num_experts_per_tok;
    float* router = grow(router_, n * E);
    backend_->matmul(F.router, h, n, router, E);
    cpu::GroupRouterConfig rc;
    rc.experts = E;
    rc.top_k = K;
    rc.n_group = c_.n_group;
    rc.topk_group = c_.topk_group;
    rc.norm_topk_prob = c_.norm_topk_prob;
    rc.scaling_factor = static_cast<float>(c_.routed_scaling_factor);
    float* scratch = grow(route_scratch_, 2 * E + c_.n_group);
    topk_idx_.resize(n * K);
    topk_w_.resize(n * K);
    row_of_.resize(n * K);
    expert_count_.assign(E, 0);
    expert_begin_.resize(E + 1);
    const float* bias = F.correction_bias.empty() ? nullptr : F.correction_bias.data();
    for (int64_t i = 0; i < n; ++i) {
        cpu::route_sigmoid_grouped(router + i * E, bias, rc, topk_idx_.data() + i * K,
                                   topk_w_.data() + i * K, scratch);
        for (int64_t j = 0; j < K; ++j) {
            ++expert_count_[topk_idx_[i * K + j]];
        }
    }
    // Group assignments by expert so each expert's weights are read once for all its tokens.
    expert_begin_[0] = 0;
    for (int64_t e = 0; e < E; ++e) {
        expert_begin_[e + 1] = expert_begin_[e] + expert_count_[e];
    }
    std::fill(expert_count_.begin(), expert_count_.end(), 0);
    float* in = grow(moe_in_, n * K * H);
    float* res = grow(moe_out_, n * K * H);
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < K; ++j) {
            const int32_t e = topk_idx_[i * K + j];
            const int32_t row = expert_begin_[e] + expert_count_[e]++;
            row_of_[i * K + j] = row;
            std::copy(h + i * H, h + (i + 1) * H, in + static_cast<int64_t>(row) * H);
        }
    }
    const int64_t I = c_.moe_intermediate_size;
    float* gate = grow(gate_, n * K * I);
    float* up = grow(up_, n * K * I);
    float* act = grow(act_, n * K * I);
    for (int pass = 0; pass < 2; ++pass) {
        jobs_.clear();
        for (int32_t e = 0; e < E; ++e) {
            const int64_t rows = expert_begin_[e + 1] - expert_begin_[e];
            if (rows == 0 || !placement_.is_local(li, e)) {
                continue;
            }
            const int64_t r0 = expert_begin_[e];
            const SwiGlu& m = F.experts[e];
            if (pass == 0) {
                jobs_.push_back({&m.gate, in + r0 * H, rows, gate + r0 * I, I});
                jobs_.push_back({&m.up, in + r0 * H, rows, up + r0 * I, I});
            } else {
                jobs_.push_back({&m.down, act + r0 * I, rows, res + r0 * H, H});
            }
        }
        backend_->matmul_batch(jobs_);
        if (pass == 0) {
            cpu::silu_mul(gate, up, n * K * I, act);
        }
    }
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < K; ++j) {
            if (!placement_.is_local(li, topk_idx_[i * K + j])) {
                continue;  // Another rank's result; the sharding step adds it.
            }
            const float w = topk_w_[i * K + j];
            const float* r = res + static_cast<int64_t>(row_of_[i * K + j]) * H;
            float* xi = x + i * H;
            for (int64_t d = 0; d < H; ++d) {
                xi[d] += w * r[d];
            }
        }
    }
}

Status SigmoidMoeModel::forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) {
    int64_t n = 0;
    EDGE_RETURN_IF_ERROR(validate(batch, &n));
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
    for (int32_t l = 0; l < static_cast<int32_t>(ffn_.size()); ++l) {
        attention(l, n);
        ffn(ffn_[l], l, n);
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
    for (const SequenceChunk& ch : batch) {
        kv_->set_length(ch.slot, ch.start_pos + static_cast<int32_t>(ch.tokens.size()));
    }
    return ok_status();
}

}  // namespace edge::engine
