#include "engine/model/archs/qwen3_moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/backend.h"
#include "engine/cpu/convert.h"
#include "engine/cpu/ops.h"
#include "engine/model/paged_attention.h"
#include "engine/model/paged_causal_lm.h"
#include "engine/model/stored_tensor.h"
#include "engine/model/model_config.h"
#include "engine/model/moe_block.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_loader.h"

namespace edge::engine {
namespace {

using Mlp = SwiGlu;

struct Layer {
    std::vector<float> input_norm;
    std::vector<float> post_norm;
    std::vector<float> q_norm;
    std::vector<float> k_norm;
    Weight q, k, v, o;
    std::vector<float> q_bias, k_bias, v_bias, o_bias;  // Empty without attention_bias.
    bool moe = false;  // Routed experts live in the shared MoeBlock (moe_block.h).
    Mlp dense;
};


class Qwen3Moe final : public PagedCausalLM {
public:
    Qwen3Moe(Qwen3MoeConfig config, std::unique_ptr<Checkpoint> ckpt,
             std::unique_ptr<Backend> backend)
        : c_(std::move(config)), ckpt_(std::move(ckpt)), backend_(std::move(backend)) {}

    Status load(const std::string& dir, const ConfigJson& json, const LoadOptions& options);

    const ModelSpec& spec() const override { return spec_; }
    Status forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) override;
    std::optional<shard::ShardStats> shard_stats() const override {
        if (!moe_) {
            return std::nullopt;
        }
        return moe_->stats();
    }

  protected:
    Backend* host_backend() override { return backend_.get(); }

  private:
    Result<Weight> weight(const std::string& name, int64_t rows, int64_t cols);
    Result<std::vector<float>> vector(const std::string& name, int64_t n);
    Result<Mlp> mlp(const std::string& prefix, int64_t inter);
    void attention_block(const Layer& layer, int32_t li, int64_t n);
    Status moe_block(const Layer& layer, int32_t li, int64_t n);

    Qwen3MoeConfig c_;
    std::unique_ptr<Checkpoint> ckpt_;
    std::unique_ptr<WeightLoader> weights_;  // Owns weights quantized on load; after ckpt_.
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<MoeBlock> moe_;  // Routed experts of every MoE layer, sharded over ranks.
    ModelSpec spec_;
    Weight embed_;
    Weight lm_head_;
    std::vector<float> final_norm_;
    std::vector<Layer> layers_;

    // Per-forward scratch, grown on demand and kept between calls.
    std::vector<float> x_, h_, q_, k_, v_, attn_, tmp_, scores_, rope_;
    SwiGluScratch mlp_scratch_;
};

Result<Weight> Qwen3Moe::weight(const std::string& name, int64_t rows, int64_t cols) {
    return weights_->matrix_for(*backend_, name, rows, cols);
}

Result<std::vector<float>> Qwen3Moe::vector(const std::string& name, int64_t n) {
    return read_float_vector(*ckpt_, name, n);
}

Result<Mlp> Qwen3Moe::mlp(const std::string& prefix, int64_t inter) {
    return load_swiglu(*weights_, *backend_, prefix, c_.hidden_size, inter);
}

Status Qwen3Moe::load(const std::string& dir, const ConfigJson& json, const LoadOptions& options) {
    const int64_t hd = c_.head_dim;
    const int64_t qdim = c_.num_attention_heads * hd;
    const int64_t kvdim = c_.num_key_value_heads * hd;
    EDGE_ASSIGN_OR_RETURN(weights_, WeightLoader::create(*ckpt_, json, options.quantization));
    weights_->use_row_tiles(options.row_tiles && backend_->supports_row_tiles());
    EDGE_ASSIGN_OR_RETURN(embed_, weight("model.embed_tokens.weight", c_.vocab_size,
                                         c_.hidden_size));
    // Tied as Hugging Face ties them: the embeddings, even when the checkpoint also holds an
    // lm_head.weight (then logged as unread).
    if (c_.tie_word_embeddings) {
        lm_head_ = embed_;
    } else {
        EDGE_ASSIGN_OR_RETURN(lm_head_, weight("lm_head.weight", c_.vocab_size, c_.hidden_size));
    }
    EDGE_ASSIGN_OR_RETURN(final_norm_, vector("model.norm.weight", c_.hidden_size));
    MoeShape moe_shape;
    moe_shape.hidden = c_.hidden_size;
    moe_shape.inter = c_.moe_intermediate_size;
    moe_shape.experts = static_cast<int32_t>(c_.num_experts);
    moe_shape.top_k = static_cast<int32_t>(c_.num_experts_per_tok);
    moe_shape.layers = static_cast<int32_t>(c_.num_hidden_layers);
    if (c_.num_experts > 0) {
        EDGE_ASSIGN_OR_RETURN(moe_,
                              MoeBlock::create(moe_shape, options.sharding, backend_.get()));
    }
    layers_.resize(c_.num_hidden_layers);
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
        Layer& L = layers_[l];
        const std::string p = "model.layers." + std::to_string(l) + ".";
        EDGE_ASSIGN_OR_RETURN(L.input_norm, vector(p + "input_layernorm.weight", c_.hidden_size));
        EDGE_ASSIGN_OR_RETURN(L.post_norm,
                              vector(p + "post_attention_layernorm.weight", c_.hidden_size));
        EDGE_ASSIGN_OR_RETURN(L.q_norm, vector(p + "self_attn.q_norm.weight", hd));
        EDGE_ASSIGN_OR_RETURN(L.k_norm, vector(p + "self_attn.k_norm.weight", hd));
        EDGE_ASSIGN_OR_RETURN(L.q, weight(p + "self_attn.q_proj.weight", qdim, c_.hidden_size));
        EDGE_ASSIGN_OR_RETURN(L.k, weight(p + "self_attn.k_proj.weight", kvdim, c_.hidden_size));
        EDGE_ASSIGN_OR_RETURN(L.v, weight(p + "self_attn.v_proj.weight", kvdim, c_.hidden_size));
        EDGE_ASSIGN_OR_RETURN(L.o, weight(p + "self_attn.o_proj.weight", c_.hidden_size, qdim));
        if (c_.attention_bias) {
            EDGE_ASSIGN_OR_RETURN(L.q_bias, vector(p + "self_attn.q_proj.bias", qdim));
            EDGE_ASSIGN_OR_RETURN(L.k_bias, vector(p + "self_attn.k_proj.bias", kvdim));
            EDGE_ASSIGN_OR_RETURN(L.v_bias, vector(p + "self_attn.v_proj.bias", kvdim));
            if (ckpt_->has(p + "self_attn.o_proj.bias")) {
                EDGE_ASSIGN_OR_RETURN(L.o_bias, vector(p + "self_attn.o_proj.bias",
                                                       c_.hidden_size));
            }
        }
        L.moe = c_.is_moe_layer(l);
        if (L.moe) {
            // In-process ranks share memory: every expert is loaded once and the placement only
            // decides which rank computes it.
            EDGE_ASSIGN_OR_RETURN(Weight router,
                                  weight(p + "mlp.gate.weight", c_.num_experts, c_.hidden_size));
            EDGE_ASSIGN_OR_RETURN(
                std::vector<SwiGlu> experts,
                load_experts(*weights_, *backend_, p + "mlp.experts.", c_.num_experts,
                             c_.hidden_size, c_.moe_intermediate_size, load_threads(options)));
            moe_->set_layer(static_cast<int32_t>(l), router,
                            make_softmax_router(moe_shape.experts, moe_shape.top_k,
                                                c_.norm_topk_prob),
                            std::move(experts));
        } else {
            EDGE_ASSIGN_OR_RETURN(L.dense, mlp(p + "mlp.", c_.intermediate_size));
        }
    }

    PagedModelShape shape;
    shape.architecture = kQwen3MoeArchitecture;
    shape.layers = c_.num_hidden_layers;
    shape.kv_heads = c_.num_key_value_heads;
    shape.head_dim = hd;
    shape.max_position_embeddings = c_.rope.max_positions;
    shape.vocab_size = c_.vocab_size;
    shape.eos_token_ids = c_.eos_token_ids;
    shape.bos_token_id = c_.bos_token_id;
    shape.kv_bytes_per_token = c_.num_hidden_layers * 2 * c_.num_key_value_heads * hd * 4;
    shape.version = version_digest(json, *ckpt_, weights_->policy());
    shape.weight_bytes = weights_->resident_bytes();
    // Every rank runs in this process and every expert is read (load_experts), sharded or not:
    // what is left unread is unused.
    shape.weight_bytes -= release_unread_tensors(*ckpt_);
    return finish_load(dir, options, shape, &spec_);
}

void Qwen3Moe::attention_block(const Layer& L, int32_t li, int64_t n) {
    const int64_t H = c_.hidden_size;
    const int64_t hd = c_.head_dim;
    const int64_t nh = c_.num_attention_heads;
    const int64_t nkv = c_.num_key_value_heads;
    const int64_t group = nh / nkv;
    const int64_t qdim = nh * hd;
    const int64_t kvdim = nkv * hd;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    const int threads = backend_->threads();
    float* x = x_.data();
    float* h = grow(h_, n * H);
    float* q = grow(q_, n * qdim);
    float* k = grow(k_, n * kvdim);
    float* v = grow(v_, n * kvdim);
    float* attn = grow(attn_, n * qdim);
    float* rope = grow(rope_, threads * hd);
    const auto score_rows = static_cast<size_t>(group * longest_context());  // Per worker.
    float* scores = grow(scores_, static_cast<size_t>(threads) * score_rows);

    for (int64_t i = 0; i < n; ++i) {
        cpu::rms_norm(x + i * H, L.input_norm.data(), H, eps, h + i * H);
    }
    const MatmulJob qkv[] = {{&L.q, h, n, q, qdim}, {&L.k, h, n, k, kvdim}, {&L.v, h, n, v, kvdim}};
    backend_->matmul_batch(qkv);
    if (!L.q_bias.empty()) {
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t d = 0; d < qdim; ++d) {
                q[i * qdim + d] += L.q_bias[d];
            }
            for (int64_t d = 0; d < kvdim; ++d) {
                k[i * kvdim + d] += L.k_bias[d];
                v[i * kvdim + d] += L.v_bias[d];
            }
        }
    }
    // Per-head norms, RoPE at each token's position, and the new keys/values into the cache.
    backend_->for_each_task(n, [&](int64_t i, int worker) {
        float* cs = rope + worker * hd;
        float* sn = cs + hd / 2;
        const int32_t pos = tok_pos_[i];
        c_.rope.angles(pos, cs, sn);
        for (int64_t head = 0; head < nh; ++head) {
            float* qh = q + i * qdim + head * hd;
            cpu::rms_norm(qh, L.q_norm.data(), hd, eps, qh);
            cpu::rope_neox(qh, hd, cs, sn);
        }
        for (int64_t head = 0; head < nkv; ++head) {
            float* kh = k + i * kvdim + head * hd;
            cpu::rms_norm(kh, L.k_norm.data(), hd, eps, kh);
            cpu::rope_neox(kh, hd, cs, sn);
            const int32_t slot = tok_slot_[i];
            std::copy(kh, kh + hd, kv_->key(slot, li, static_cast<int32_t>(head), pos));
            const float* vh = v + i * kvdim + head * hd;
            std::copy(vh, vh + hd, kv_->value(slot, li, static_cast<int32_t>(head), pos));
        }
    });
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    auto attend = [&](int64_t task, int worker) {
        const int64_t i = task / nkv;
        const int32_t g = static_cast<int32_t>(task % nkv);
        const int32_t slot = tok_slot_[i];
        paged_attention_gqa(
            *kv_, slot, li, g, q + i * qdim + g * group * hd, group, tok_pos_[i] + 1, scale,
            scores + static_cast<size_t>(worker) * score_rows, attn + i * qdim + g * group * hd);
    };
    // Short decode steps are cheaper on this thread than a dispatch.
    int64_t ctx_work = 0;
    for (int64_t i = 0; i < n; ++i) {
        ctx_work += (tok_pos_[i] + 1) * qdim;
    }
    if (ctx_work < (1 << 16)) {
        for (int64_t task = 0; task < n * nkv; ++task) {
            attend(task, 0);
        }
    } else {
        backend_->for_each_task(n * nkv, attend);
    }
    float* o = grow(tmp_, n * H);
    backend_->matmul(L.o, attn, n, o, H);
    for (int64_t i = 0; i < n * H; ++i) {
        x[i] += o[i];
    }
    if (!L.o_bias.empty()) {
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t d = 0; d < H; ++d) {
                x[i * H + d] += L.o_bias[d];
            }
        }
    }
}

Status Qwen3Moe::moe_block(const Layer& L, int32_t li, int64_t n) {
    const int64_t H = c_.hidden_size;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    float* x = x_.data();
    float* h = grow(h_, n * H);
    for (int64_t i = 0; i < n; ++i) {
        cpu::rms_norm(x + i * H, L.post_norm.data(), H, eps, h + i * H);
    }
    if (!L.moe) {
        float* out = grow(tmp_, n * H);
        swiglu_rows(*backend_, L.dense, h, n, out, &mlp_scratch_);
        for (int64_t i = 0; i < n * H; ++i) {
            x[i] += out[i];
        }
        return ok_status();
    }
    return moe_->forward(li, h, n, x);
}

Status Qwen3Moe::forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) {
    int64_t n = 0;
    EDGE_RETURN_IF_ERROR(prepare_batch(batch, &n));
    // An error a step that failed for another reason left in the backend is not this step's.
    (void)backend_->take_error();
    const int64_t out_rows = embed_batch(batch, embed_, grow(x_, n * c_.hidden_size));
    if (moe_) {
        moe_->begin_step();
    }
    for (int32_t l = 0; l < static_cast<int32_t>(layers_.size()); ++l) {
        attention_block(layers_[l], l, n);
        EDGE_RETURN_IF_ERROR(moe_block(layers_[l], l, n));
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

}  // namespace

Status check_qwen3_moe_config(const ConfigJson& json, int64_t* max_positions) {
    EDGE_ASSIGN_OR_RETURN(Qwen3MoeConfig config, Qwen3MoeConfig::from_json(json));
    if (max_positions != nullptr) {
        *max_positions = config.rope.max_positions;
    }
    return ok_status();
}

Result<std::unique_ptr<CausalLM>> load_qwen3_moe(const std::string& dir, const ConfigJson& json,
                                                 const LoadOptions& options) {
    EDGE_ASSIGN_OR_RETURN(Qwen3MoeConfig config, Qwen3MoeConfig::from_json(json));
    EDGE_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::open_dir(dir));
    BackendOptions bo;
    bo.threads = options.threads;
    bo.activation_precision = options.activation_precision;
    bo.cpu_kernels = options.cpu_kernels;
    EDGE_ASSIGN_OR_RETURN(auto backend, create_backend(options.backend, bo));
    auto model =
        std::make_unique<Qwen3Moe>(std::move(config), std::move(ckpt), std::move(backend));
    EDGE_RETURN_IF_ERROR(model->load(dir, json, options));
    return std::unique_ptr<CausalLM>(std::move(model));
}

}  // namespace edge::engine
