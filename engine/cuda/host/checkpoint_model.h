#pragma once

// CheckpointModel is a Qwen3-MoE checkpoint read for the device decoder
// (engine/cuda/device_decoder.h): config.json checked against what the whole-step device path
// runs, then every tensor of a decode step as a host view (norms converted to f32, matrices in
// their stored or quantized-on-load format through WeightLoader). Plain C++ (no CUDA), so the
// checks run in the CPU tests; the decoder uploads the views to the device once.
//
// Supported: every layer sparse (decoder_sparse_step 1, no mlp_only_layers), no attention bias,
// no rope_scaling, head_dim a multiple of 32 and at most 256, every routed expert of the model in
// one format. Anything else is kUnimplemented naming config.json and the field, so the caller
// can fall back to the engine's own forward.
//
// Threading: built by one thread; afterwards immutable. Lifetime: the views point into the
// mapped checkpoint and the loader's quantized copies, both owned here.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/cpu/weight.h"

namespace edge::engine {
class Checkpoint;
class WeightLoader;
}  // namespace edge::engine

namespace edge::engine::cuda {

struct CheckpointLayer {
    std::vector<float> input_norm;       // hidden
    std::vector<float> post_norm;        // hidden
    std::vector<float> q_norm;           // head_dim
    std::vector<float> k_norm;           // head_dim
    Weight q, k, v, o;                   // Attention projections.
    Weight router;                       // experts x hidden (mlp.gate).
    std::vector<Weight> gate, up, down;  // One per routed expert.
};

struct CheckpointModel {
    int32_t hidden = 0;
    int32_t layers = 0;
    int32_t experts = 0;
    int32_t top_k = 0;
    int32_t moe_inter = 0;
    int32_t heads = 0;
    int32_t kv_heads = 0;
    int32_t head_dim = 0;
    int32_t vocab = 0;
    int32_t max_position = 0;  // max_position_embeddings.
    float rms_eps = 1e-6f;
    bool norm_topk_prob = false;
    WeightFormat expert_format = WeightFormat::kBF16;  // Of every routed expert matrix.
    std::vector<double> inv_freq;  // head_dim / 2 RoPE frequencies, as the CPU model computes.
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
