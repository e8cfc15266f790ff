#pragma once

// Multi-head Latent Attention (DeepSeek-V3, Kimi K2) on the device: the shapes of one MLA layer
// (MlaDims), the paged latent cache the kernels read and write (MlaLatentLayout, index math shared
// by the kernels and the host, see hd.h), and one layer's attention weights as host views
// (MlaLayerWeights). Kernels: engine/cuda/kernels/mla.h; CPU twins: host/mla_twin.h.
//
// Latent cache layout (f32, one pool for the whole cache):
//   pool = [layer][physical block][token in block][kv_lora_rank latent | qk_rope_head_dim k_pe]
// Per token and layer only the normed latent (after kv_a_layernorm) and the shared rope key (after
// RoPE) are kept, kv_lora_rank + qk_rope_head_dim floats in one contiguous row, so a warp reads a
// cached position as one run. Blocks hold kKvBlockTokens (16) consecutive positions of one
// sequence and are named by the same block tables as the GQA cache (paged_kv_layout.h):
// block_table[seq * max_blocks_per_seq + p / 16] holds position p at row p % 16.
//
// Value types; thread-safe. Plain C++ (no CUDA), so the checks run in the CPU tests.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/cpu/weight.h"
#include "engine/cuda/host/hd.h"
#include "engine/cuda/host/paged_kv_layout.h"

namespace edge::engine {
class Checkpoint;
class WeightLoader;
struct MlaConfig;
struct SigmoidMoeConfig;
}  // namespace edge::engine

namespace edge::engine::cuda {

// Limits of the MLA kernels. The attention runs one block per (row, group of kMlaHeadsPerBlock
// heads), so each cached row is read once per group rather than once per head: the group's
// latent outputs live in registers (kMlaHeadsPerBlock * kMlaMaxLatent / kMlaThreads floats a
// thread), its query rows (latent + rope each) and kMlaTile positions' scores in shared memory.
inline constexpr int32_t kMlaThreads = 128;
inline constexpr int32_t kMlaMaxLatent = 1024;
inline constexpr int32_t kMlaMaxRope = 256;
inline constexpr int32_t kMlaHeadsPerBlock = 8;
inline constexpr int32_t kMlaTile = 32;  // Positions scored per pass (online softmax).

struct MlaDims {
    int32_t hidden = 0;        // Model width (input of q_a_proj / q_proj / kv_a_proj_with_mqa).
    int32_t heads = 0;         // Query heads.
    int32_t q_lora_rank = 0;   // Query LoRA width; 0: q_proj straight from the hidden state.
    int32_t kv_lora_rank = 0;  // Latent width (cached per token).
    int32_t nope = 0;          // qk_nope_head_dim: per-head q/k dims without RoPE.
    int32_t rope = 0;          // qk_rope_head_dim: per-head q dims with RoPE; the shared k_pe.
    int32_t v_head_dim = 0;    // Per-head value dims (output of the expansion).
    // Of q_a_layernorm and kv_a_layernorm: kMlaSubNormEps (deepseek_v3_config.h), as the CPU
    // model and Hugging Face use, not config.rms_norm_eps.
    float eps = 1e-6f;
    float softmax_scale = 0;   // (nope + rope)^-0.5, times YaRN's mscale^2 (MlaConfig).
    float rope_mscale = 1.0f;  // YaRN's factor on cos and sin (1 without rope_scaling).
    bool interleave = true;    // RoPE pairs (2i, 2i + 1); false: rotate-half within rope dims.

    // Per-head query width (nope + rope), as q_b_proj / q_proj output it.
    EDGE_HD int64_t qk() const { return static_cast<int64_t>(nope) + rope; }
    // Floats of one cached position: latent + rope (also the absorbed query width per head).
    EDGE_HD int64_t row() const { return static_cast<int64_t>(kv_lora_rank) + rope; }
    // Rows of kv_b_proj that belong to one head: nope (k part) then v_head_dim (v part).
    EDGE_HD int64_t kv_b_rows_per_head() const { return static_cast<int64_t>(nope) + v_head_dim; }
};

// The dims of a DeepseekV3ForCausalLM config as the CPU model reads them (deepseek_v3_config.h),
// so both sides use one softmax scale, mscale and rotation.
MlaDims mla_dims(const SigmoidMoeConfig& common, const MlaConfig& mla);

// kInvalidArgument (naming the field) for dims the MLA kernels cannot run: any size <= 0 (but
// q_lora_rank, which may be 0), an odd rope, kv_lora_rank > kMlaMaxLatent, rope > kMlaMaxRope,
// or a non-positive softmax_scale.
Status check_mla_dims(const MlaDims& d);

struct MlaLatentLayout {
    int32_t layers = 0;      // Decoder layers.
    int32_t latent = 0;      // kv_lora_rank.
    int32_t rope = 0;        // qk_rope_head_dim.
    int32_t num_blocks = 0;  // Physical blocks in the pool (each kKvBlockTokens positions).

    EDGE_HD int64_t row_floats() const { return static_cast<int64_t>(latent) + rope; }
    // Floats of one physical block of one layer.
    EDGE_HD int64_t block_floats() const { return row_floats() * kKvBlockTokens; }
    // Floats of one layer's pool.
    EDGE_HD int64_t layer_floats() const { return block_floats() * num_blocks; }
    // Floats of the whole pool.
    EDGE_HD int64_t pool_floats() const { return layer_floats() * layers; }
    // Offset of the row of (layer, physical block, row in block) in the pool.
    EDGE_HD int64_t row_offset(int32_t layer, int32_t block, int32_t row) const {
        return static_cast<int64_t>(layer) * layer_floats() +
               static_cast<int64_t>(block) * block_floats() +
               static_cast<int64_t>(row) * row_floats();
    }
    // Offset of position `pos` of the sequence whose table row is `table`, in `layer`.
    EDGE_HD int64_t position_offset(int32_t layer, const int32_t* table, int32_t pos) const {
        return row_offset(layer, table[pos / kKvBlockTokens], pos % kKvBlockTokens);
    }
};

// The latent layout for `dims` with `layers` layers and `num_blocks` blocks.
MlaLatentLayout mla_latent_layout(const MlaDims& dims, int32_t layers, int32_t num_blocks);

// kInvalidArgument unless the layout is non-empty, `layer` is one of its layers, its widths match
// `dims`, and its pool size fits in int64 floats.
Status check_mla_layout(const MlaLatentLayout& layout, int32_t layer, const MlaDims& dims);

// check_block_table (paged_kv_layout.h) for the latent pool: every block the sequences of
// `lengths` use is a block of the pool; errors name the sequence and entry.
Status check_mla_block_table(const MlaLatentLayout& layout, std::span<const int32_t> table,
                             int32_t max_blocks_per_seq, std::span<const int32_t> lengths);

// One MLA layer's weights as host views (stored or quantized-on-load format; norms as f32).
struct MlaLayerWeights {
    Weight q_a;                    // q_a_proj [q_lora_rank, hidden]; empty when q_lora_rank 0.
    std::vector<float> q_a_norm;   // q_a_layernorm [q_lora_rank]; empty when q_lora_rank 0.
    Weight q;                      // q_b_proj [heads * qk, q_lora_rank], or q_proj [.., hidden].
    Weight kv_a;                   // kv_a_proj_with_mqa [latent + rope, hidden].
    std::vector<float> kv_a_norm;  // kv_a_layernorm [latent].
    Weight kv_b;                   // kv_b_proj [heads * (nope + v), latent], float (F32 if
                                   // stored quantized: WeightLoader::float_matrix).
    Weight o;                      // o_proj [hidden, heads * v] (applied by the caller).
};

// Reads the attention weights of one layer, `prefix` being e.g. "model.layers.3.self_attn.";
// shapes are checked against `dims`. Errors name the checkpoint and the tensor.
Result<MlaLayerWeights> read_mla_layer(const Checkpoint& checkpoint, WeightLoader& loader,
                                       const std::string& prefix, const MlaDims& dims);

// Scratch floats mla_attention_layer (device and twin) uses for `rows` rows: the query LoRA,
// the query, the kv_a output, the absorbed queries and the latent outputs.
int64_t mla_scratch_floats(const MlaDims& d, int64_t rows);

}  // namespace edge::engine::cuda
