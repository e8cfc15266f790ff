#pragma once

// Internal to make-model (engine/tools/make_model.h): the size presets of each architecture it
// writes (Qwen3-MoE, GLM-4.5 MoE, DeepSeek-V3 / Kimi K2), their config.json and the list of
// tensors with their shapes and initialisation, in the names the real checkpoints use.
//
// Threading: pure functions over constant tables.

#include <boost/json.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace edge::engine::make_model {

enum class Arch { kQwen3Moe, kGlm4Moe, kDeepseekV3 };

// One size of one architecture. Fields an architecture does not use are 0.
struct ArchPreset {
    const char* name = nullptr;  // "tiny" or "bench".
    Arch arch = Arch::kQwen3Moe;
    int64_t hidden = 0;           // hidden_size.
    int64_t layers = 0;           // num_hidden_layers.
    int64_t experts = 0;          // Routed experts per MoE layer.
    int64_t top_k = 0;            // Experts per token.
    int64_t moe_inter = 0;        // Intermediate size of one expert.
    int64_t inter = 0;            // Intermediate size of a dense MLP layer.
    int64_t heads = 0;            // Attention heads.
    int64_t kv_heads = 0;         // Key/value heads (GQA; MLA: = heads).
    int64_t head_dim = 0;         // GQA head size.
    int64_t vocab = 0;            // vocab_size (the last three ids are the special tokens).
    int64_t max_positions = 0;    // max_position_embeddings.
    bool tie_embeddings = false;  // lm_head shares the embedding matrix.
    int64_t dense_layers = 0;     // Leading dense layers (Qwen3: mlp_only_layers = [0, n)).
    int64_t shared_experts = 0;   // n_shared_experts (GLM, DeepSeek).
    int64_t n_group = 0;          // Expert groups for group-limited routing.
    int64_t topk_group = 0;       // Groups a token may use.
    double partial_rotary = 0;    // GLM: fraction of head_dim that is rotated.
    int64_t q_lora_rank = 0;      // MLA ranks and head parts (DeepSeek-V3).
    int64_t kv_lora_rank = 0;
    int64_t qk_nope_head_dim = 0;
    int64_t qk_rope_head_dim = 0;
    int64_t v_head_dim = 0;
};

// "qwen3_moe", "glm4_moe", "deepseek_v3".
const char* arch_name(Arch arch);
bool arch_from_name(const std::string& name, Arch* arch);

// The preset `name` of `arch`; nullptr when there is none.
const ArchPreset* find_preset(Arch arch, const std::string& name);
std::vector<std::string> preset_names();

// config.json of the preset.
boost::json::object config_json(const ArchPreset& p);

// How a tensor's random values are drawn (see make_model.cc).
enum class Init { kLinear, kWide, kEmbedding, kNorm, kBias };

// Calls `add(name, shape, init)` for every tensor of the preset, in file order.
using AddTensor = std::function<void(std::string, std::vector<int64_t>, Init)>;
void for_each_tensor(const ArchPreset& p, const AddTensor& add);

}  // namespace edge::engine::make_model
