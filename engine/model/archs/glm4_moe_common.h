#pragma once

// The parts GLM-4.5 (Glm4MoeForCausalLM) and DeepSeek-V3 / Kimi K2 (DeepseekV3ForCausalLM) share,
// as a base class: the common config fields, weight loading helpers, slots and batch validation
// over the KV cache, the forward loop (embedding, per-layer attention then feed-forward, final
// norm, lm_head), and the feed-forward block: a dense SwiGLU MLP on the first
// `first_k_dense_replace` layers, then the MoE block with the sigmoid / correction-bias /
// group-limited router (engine/cpu/router.h) and routed_scaling_factor, whose routed experts run
// in the shared, sharded MoeBlock (engine/model/moe_block.h), and shared experts added unscaled. Architectures supply the attention.
// Multi-token-prediction layers (num_nextn_predict_layers) are not loaded; a log line says so.
//
// Threading: as CausalLM (one driving thread; forward() uses the backend's threads).

#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/backend.h"
#include "engine/cpu/router.h"
#include "engine/model/causal_lm.h"
#include "engine/model/paged_causal_lm.h"
#include "engine/model/stored_tensor.h"
#include "engine/model/loader.h"
#include "engine/model/moe_block.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_loader.h"

namespace edge::engine {

class ConfigJson;

// What a field config.json omits means: the default of the architecture's transformers config
// class, as transformers and vLLM read such a checkpoint. GLM-4.5 and DeepSeek-V3 share the
// reader but not these defaults; fields whose default is the same for both (rope_theta 10000,
// norm_topk_prob true, tie_word_embeddings false) are in SigmoidMoeConfig::from_json.
struct SigmoidMoeDefaults {
    int64_t n_shared_experts = 0;
    int64_t n_group = 1;
    int64_t topk_group = 1;
    int64_t first_k_dense_replace = 0;
    double routed_scaling_factor = 1.0;
    double rms_norm_eps = 1e-6;
};

// transformers' Glm4MoeConfig (models/glm4_moe/configuration_glm4_moe.py).
inline constexpr SigmoidMoeDefaults kGlm4MoeDefaults{.n_shared_experts = 1,
                                                     .n_group = 1,
                                                     .topk_group = 1,
                                                     .first_k_dense_replace = 1,
                                                     .routed_scaling_factor = 1.0,
                                                     .rms_norm_eps = 1e-5};

// transformers' DeepseekV3Config (models/deepseek_v3/configuration_deepseek_v3.py).
inline constexpr SigmoidMoeDefaults kDeepseekV3Defaults{.n_shared_experts = 1,
                                                        .n_group = 8,
                                                        .topk_group = 4,
                                                        .first_k_dense_replace = 3,
                                                        .routed_scaling_factor = 2.5,
                                                        .rms_norm_eps = 1e-6};

// config.json fields common to both architectures.
struct SigmoidMoeConfig {
    int64_t hidden_size = 0;
    int64_t num_hidden_layers = 0;  // Decoder layers (MTP layers not counted).
    int64_t num_attention_heads = 0;
    int64_t vocab_size = 0;
    int64_t max_position_embeddings = 0;
    int64_t intermediate_size = 0;      // Width of the dense MLP layers.
    int64_t moe_intermediate_size = 0;  // Width of one routed (and shared) expert.
    int64_t n_routed_experts = 0;
    int64_t num_experts_per_tok = 0;
    int64_t n_shared_experts = 0;  // Shared expert width = moe_intermediate_size * this.
    int64_t n_group = 1;
    int64_t topk_group = 1;
    int64_t first_k_dense_replace = 0;     // Layers [0, this) are dense.
    int64_t num_nextn_predict_layers = 0;  // MTP layers in the checkpoint (skipped).
    double routed_scaling_factor = 1.0;
    double rope_theta = 10000.0;
    double rms_norm_eps = 1e-6;
    bool norm_topk_prob = true;
    bool tie_word_embeddings = false;
    std::vector<int64_t> eos_token_ids;
    int64_t bos_token_id = -1;

    // Reads and range-checks the common fields, `defaults` standing in for those config.json
    // omits (or sets to null); errors name config.json and the field.
    static Result<SigmoidMoeConfig> from_json(const ConfigJson& config,
                                              const SigmoidMoeDefaults& defaults);
    bool is_moe_layer(int64_t layer) const {
        return n_routed_experts > 0 && layer >= first_k_dense_replace;
    }
};

class SigmoidMoeModel : public PagedCausalLM {
  public:
    SigmoidMoeModel(SigmoidMoeConfig config, std::unique_ptr<Checkpoint> ckpt,
                    std::unique_ptr<Backend> backend);

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

    // Loads embeddings, norms, feed-forward weights of every layer and creates the KV cache with
    // `kv_heads` x `head_dim` keys and values per layer; `kv_bytes_per_token` is what the spec
    // reports. Calls load_attention(layer) for each layer.
    Status load_common(const std::string& dir, const ConfigJson& json, const LoadOptions& options,
                       const std::string& architecture, int32_t kv_heads, int32_t head_dim,
                       int64_t kv_bytes_per_token);
    virtual Status load_attention(int64_t layer, const std::string& prefix) = 0;
    // Adds the attention output of layer `li` to x_ for the n tokens of this forward; tok_slot_
    // and tok_pos_ give each token's slot and position.
    virtual void attention(int32_t li, int64_t n) = 0;

    Result<Weight> weight(const std::string& name, int64_t rows, int64_t cols);
    Result<std::vector<float>> vector(const std::string& name, int64_t n);
    Result<SwiGlu> swiglu(const std::string& prefix, int64_t inter);

    SigmoidMoeConfig c_;
    std::unique_ptr<Checkpoint> ckpt_;
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<WeightLoader> weights_;  // Quantized checkpoints and the policy; after ckpt_.
    std::unique_ptr<MoeBlock> moe_;  // Routed experts of every MoE layer, sharded over ranks.
    ModelSpec spec_;
    std::vector<float> x_;                        // [n][hidden] residual stream.
    std::vector<float> h_;                        // [n][hidden] normed input of a block.
    std::vector<std::vector<float>> input_norm_;  // Per layer, applied before attention.

  private:
    struct FfnLayer {
        std::vector<float> post_norm;
        bool moe = false;  // Routed experts (and router) live in moe_.
        SwiGlu shared;     // Valid when n_shared_experts > 0.
        SwiGlu dense;
    };
    Status ffn(const FfnLayer& layer, int32_t li, int64_t n);

    Weight embed_;
    Weight lm_head_;
    std::vector<float> final_norm_;
    std::vector<FfnLayer> ffn_;
    std::vector<float> tmp_;
    SwiGluScratch mlp_scratch_;
};

}  // namespace edge::engine
