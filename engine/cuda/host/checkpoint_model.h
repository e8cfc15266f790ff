#pragma once

// CheckpointModel is a checkpoint read for the device decoder (engine/cuda/device_decoder.h):
// config.json checked against what the whole-step device path runs, then every tensor of a
// decode step as a host view (norms and biases converted to f32, matrices in their stored or
// quantized-on-load format through WeightLoader). Plain C++ (no CUDA), so the checks run in the
// CPU tests; the decoder uploads the views to the device once.
//
// Architectures:
//  - Qwen3MoeForCausalLM: every layer sparse (decoder_sparse_step 1, no mlp_only_layers), no
//    attention bias, per-head q/k RMSNorm, full NeoX RoPE (YaRN rope_scaling as the CPU model
//    reads it), softmax top-k routing.
//  - Glm4MoeForCausalLM (GLM-4.5): the first `first_k_dense_replace` layers a dense SwiGLU MLP,
//    the others routed experts (sigmoid grouped top-k with e_score_correction_bias, n_group,
//    topk_group, norm_topk_prob, routed_scaling_factor) plus `n_shared_experts` shared experts
//    as one dense SwiGLU added unscaled; q/k/v bias (attention_bias), optional q/k RMSNorm
//    (use_qk_norm), NeoX RoPE on the first head_dim * partial_rotary_factor dims (YaRN as
//    for Qwen3).
//  - DeepseekV3ForCausalLM (DeepSeek-V3, Kimi K2): GLM-4.5's feed-forward and routing with
//    Multi-head Latent Attention (AttentionKind::kMla, host/mla_layout.h): the query LoRA (or
//    q_proj), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj and o_proj of each layer; YaRN
//    rope_scaling as the CPU model reads it (deepseek_v3_config.h).
// Qwen3 and GLM: GQA attention (AttentionKind::kGqa), head_dim a multiple of 32 and at most
// 256. All: every routed expert of the model in one format. Anything else is
// kUnimplemented naming config.json and the field, so the caller can fall back to the engine's
// own forward; a missing or misshapen tensor is the checkpoint's error naming the file and
// tensor.
//
// Threading: built by one thread; afterwards immutable. Lifetime: the views point into the
// mapped checkpoint and the loader's quantized copies, both owned here.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/cpu/weight.h"
#include "engine/cuda/host/mla_layout.h"
#include "engine/cuda/host/router_rule.h"

namespace edge::engine {
class Checkpoint;
class WeightLoader;
}  // namespace edge::engine

namespace edge::engine::cuda {

// How a layer's attention runs on the device. Every layer of a model has the same kind.
enum class AttentionKind : int32_t {
    kGqa = 0,  // q/k/v projections (optional bias, optional per-head q/k norm), RoPE, paged GQA.
    kMla = 1,  // Multi-head Latent Attention over the paged latent cache (host/mla_layout.h).
};

// A dense SwiGLU MLP: down(silu(gate x) * up x). Empty (null data) when the layer has none.
struct CheckpointMlp {
    Weight gate, up, down;
    bool present() const { return gate.data != nullptr; }
};

struct CheckpointLayer {
    std::vector<float> input_norm;       // hidden
    std::vector<float> post_norm;        // hidden
    // kGqa attention.
    std::vector<float> q_norm;           // head_dim; empty without per-head q/k norm.
    std::vector<float> k_norm;           // head_dim; empty without per-head q/k norm.
    std::vector<float> q_bias;           // heads * head_dim; empty without attention bias.
    std::vector<float> k_bias;           // kv_heads * head_dim; empty without attention bias.
    std::vector<float> v_bias;           // kv_heads * head_dim; empty without attention bias.
    Weight q, k, v, o;                   // Attention projections.
    // kMla attention (its o_proj is mla.o).
    MlaLayerWeights mla;
    // Feed-forward: a dense MLP (moe false) or routed experts plus optional shared experts.
    bool moe = true;
    CheckpointMlp dense;                 // moe false: intermediate dense_inter.
    Weight router;                       // experts x hidden (mlp.gate), moe layers.
    std::vector<float> router_bias;      // experts (e_score_correction_bias); empty: none.
    std::vector<Weight> gate, up, down;  // One per routed expert, moe layers.
    CheckpointMlp shared;                // Shared experts (intermediate shared_inter) or empty.
};

struct CheckpointModel {
    std::string architecture;  // The CPU model's name (config.json architectures[0]).
    AttentionKind attention = AttentionKind::kGqa;
    int32_t hidden = 0;
    int32_t layers = 0;
    int32_t experts = 0;
    int32_t top_k = 0;
    int32_t moe_inter = 0;     // Width of one routed expert.
    int32_t dense_inter = 0;   // Width of the dense MLP layers; 0 when every layer is MoE.
    int32_t shared_inter = 0;  // Width of the shared experts' SwiGLU; 0 without shared experts.
    int32_t heads = 0;
    int32_t kv_heads = 0;
    int32_t head_dim = 0;
    int32_t rot_dim = 0;       // Leading values of each head RoPE rotates (NeoX), even.
    int32_t vocab = 0;
    int32_t max_position = 0;  // max_position_embeddings.
    float rms_eps = 1e-6f;
    bool norm_topk_prob = false;
    RouterParams router;       // The routing rule (scoring, groups, scaling), as the CPU model's.
    std::vector<int64_t> eos_token_ids;  // config.json eos_token_id (checked in the vocabulary).
    int64_t bos_token_id = -1;           // config.json bos_token_id, -1 when absent.
    WeightFormat expert_format = WeightFormat::kBF16;  // Of every routed expert matrix.
    std::vector<double> inv_freq;  // rot_dim / 2 RoPE frequencies, as the CPU model computes.
    double rope_mscale = 1.0;      // kGqa: factor on cos and sin (YaRN's; kMla: mla's).
    // kMla: the attention's shapes and scales (rot_dim is mla.rope, inv_freq YaRN-scaled); the
    // host cache is sized with kv_heads 1 and head_dim (kv_lora_rank + rope) / 2, which gives the
    // latent rows' bytes (the CPU model's choice), and the device pool is MlaLatentLayout.
    MlaDims mla;
    Weight embed;
    Weight lm_head;  // The embedding table when tied.
    std::vector<float> final_norm;
    std::vector<CheckpointLayer> layer;

    std::shared_ptr<Checkpoint> checkpoint;  // Owns the mapping the views point into.
    std::shared_ptr<WeightLoader> loader;    // Owns quantized-on-load copies.
};

// Reads `dir` with the quantize-on-load `policy` ("none", "experts-int4", "routed_experts=fp8",
// ...; engine/quant/policy.h). Errors name the file and the field or tensor.
Result<CheckpointModel> read_checkpoint_model(const std::string& dir, const std::string& policy);

}  // namespace edge::engine::cuda
