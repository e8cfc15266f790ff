#include "engine/cuda/host/mla_layout.h"

#include <limits>

#include "engine/model/archs/deepseek_v3_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/stored_tensor.h"
#include "engine/model/weight_loader.h"

namespace edge::engine::cuda {

MlaDims mla_dims(const SigmoidMoeConfig& c, const MlaConfig& m) {
    MlaDims d;
    d.hidden = static_cast<int32_t>(c.hidden_size);
    d.heads = static_cast<int32_t>(c.num_attention_heads);
    d.q_lora_rank = static_cast<int32_t>(m.q_lora_rank);
    d.kv_lora_rank = static_cast<int32_t>(m.kv_lora_rank);
    d.nope = static_cast<int32_t>(m.qk_nope_head_dim);
    d.rope = static_cast<int32_t>(m.qk_rope_head_dim);
    d.v_head_dim = static_cast<int32_t>(m.v_head_dim);
    d.eps = kMlaSubNormEps;  // Not c.rms_norm_eps: see kMlaSubNormEps.
    d.softmax_scale = static_cast<float>(m.softmax_scale);
    d.rope_mscale = static_cast<float>(m.rope_mscale);
    d.interleave = m.rope_interleave;
    return d;
}

Status check_mla_dims(const MlaDims& d) {
    auto bad = [](const char* field, int64_t v, const std::string& why) {
        return invalid_argument_error("mla: " + std::string(field) + " " + std::to_string(v) + " " +
                                      why);
    };
    if (d.hidden <= 0) {
        return bad("hidden", d.hidden, "must be positive");
    }
    if (d.heads <= 0) {
        return bad("heads", d.heads, "must be positive");
    }
    if (d.q_lora_rank < 0) {
        return bad("q_lora_rank", d.q_lora_rank, "must not be negative");
    }
    if (d.kv_lora_rank <= 0 || d.kv_lora_rank > kMlaMaxLatent) {
        return bad("kv_lora_rank", d.kv_lora_rank,
                   "must be in [1, " + std::to_string(kMlaMaxLatent) + "]");
    }
    if (d.nope <= 0) {
        return bad("qk_nope_head_dim", d.nope, "must be positive");
    }
    if (d.rope <= 0 || d.rope % 2 != 0 || d.rope > kMlaMaxRope) {
        return bad("qk_rope_head_dim", d.rope,
                   "must be even and in [2, " + std::to_string(kMlaMaxRope) + "]");
    }
    if (d.v_head_dim <= 0) {
        return bad("v_head_dim", d.v_head_dim, "must be positive");
    }
    if (!(d.softmax_scale > 0.0f) || !(d.rope_mscale > 0.0f) || !(d.eps > 0.0f)) {
        return invalid_argument_error("mla: softmax_scale, rope_mscale and eps must be positive");
    }
    return ok_status();
}

MlaLatentLayout mla_latent_layout(const MlaDims& dims, int32_t layers, int32_t num_blocks) {
    return MlaLatentLayout{layers, dims.kv_lora_rank, dims.rope, num_blocks};
}

Status check_mla_layout(const MlaLatentLayout& layout, int32_t layer, const MlaDims& dims) {
    if (layout.layers <= 0 || layout.num_blocks <= 0 || layer < 0 || layer >= layout.layers) {
        return invalid_argument_error("mla cache: layer " + std::to_string(layer) +
                                      " outside a layout of " + std::to_string(layout.layers) +
                                      " layers and " + std::to_string(layout.num_blocks) +
                                      " blocks");
    }
    if (layout.latent != dims.kv_lora_rank || layout.rope != dims.rope) {
        return invalid_argument_error("mla cache: rows of " + std::to_string(layout.latent) +
                                      " + " + std::to_string(layout.rope) +
                                      " floats, but the layer has kv_lora_rank " +
                                      std::to_string(dims.kv_lora_rank) + " and qk_rope_head_dim " +
                                      std::to_string(dims.rope));
    }
    const int64_t max = std::numeric_limits<int64_t>::max();
    if (layout.block_floats() > max / layout.num_blocks / layout.layers) {
        return invalid_argument_error("mla cache: pool size overflows");
    }
    return ok_status();
}

Status check_mla_block_table(const MlaLatentLayout& layout, std::span<const int32_t> table,
                             int32_t max_blocks_per_seq, std::span<const int32_t> lengths) {
    PagedKvLayout blocks;
    blocks.layers = layout.layers;
    blocks.kv_heads = 1;
    blocks.head_dim = static_cast<int32_t>(layout.row_floats());
    blocks.num_blocks = layout.num_blocks;
    return check_block_table(blocks, table, max_blocks_per_seq, lengths);
}

Result<MlaLayerWeights> read_mla_layer(const Checkpoint& ck, WeightLoader& wl, const std::string& p,
                                       const MlaDims& d) {
    MlaLayerWeights w;
    const int64_t q_rows = static_cast<int64_t>(d.heads) * d.qk();
    if (d.q_lora_rank > 0) {
        EDGE_ASSIGN_OR_RETURN(w.q_a, wl.matrix(p + "q_a_proj.weight", d.q_lora_rank, d.hidden));
        EDGE_ASSIGN_OR_RETURN(w.q_a_norm,
                              read_float_vector(ck, p + "q_a_layernorm.weight", d.q_lora_rank));
        EDGE_ASSIGN_OR_RETURN(w.q, wl.matrix(p + "q_b_proj.weight", q_rows, d.q_lora_rank));
    } else {
        EDGE_ASSIGN_OR_RETURN(w.q, wl.matrix(p + "q_proj.weight", q_rows, d.hidden));
    }
    EDGE_ASSIGN_OR_RETURN(w.kv_a, wl.matrix(p + "kv_a_proj_with_mqa.weight", d.row(), d.hidden));
    EDGE_ASSIGN_OR_RETURN(w.kv_a_norm,
                          read_float_vector(ck, p + "kv_a_layernorm.weight", d.kv_lora_rank));
    // kv_b_proj always in float (F32 when stored quantized, as in the FP8 releases of
    // DeepSeek-V3 and Kimi K2): the values the CPU model reads (SigmoidMoeModel::weight), and no
    // quantize-on-load policy reaches it, so the absorb / expand kernels never see a format the
    // CPU model does not use.
    const int64_t kv_b_rows = static_cast<int64_t>(d.heads) * d.kv_b_rows_per_head();
    EDGE_ASSIGN_OR_RETURN(w.kv_b, wl.float_matrix(p + "kv_b_proj.weight", kv_b_rows,
                                                  d.kv_lora_rank));
    EDGE_ASSIGN_OR_RETURN(w.o, wl.matrix(p + "o_proj.weight", d.hidden,
                                         static_cast<int64_t>(d.heads) * d.v_head_dim));
    return w;
}

int64_t mla_scratch_floats(const MlaDims& d, int64_t rows) {
    const int64_t per_row = d.q_lora_rank + d.heads * d.qk() + d.row() + d.heads * d.row() +
                            static_cast<int64_t>(d.heads) * d.kv_lora_rank;
    return per_row * rows;
}

}  // namespace edge::engine::cuda
