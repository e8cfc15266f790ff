#include "engine/model/archs/deepseek_v3_config.h"

#include <cmath>
#include <limits>
#include <utility>

#include "engine/model/archs/rotary_config.h"
#include "engine/model/model_config.h"

namespace edge::engine {

Result<MlaConfig> MlaConfig::from_json(const ConfigJson& j, const SigmoidMoeConfig& c) {
    MlaConfig m;
    // Absent is not null here: DeepseekV3Config defaults q_lora_rank to 1536 (DeepSeek-V3's),
    // while an explicit null (DeepSeek-V2-Lite) means q_proj without a query LoRA.
    if (!j.has("q_lora_rank")) {
        m.q_lora_rank = kDeepseekV3QLoraRank;
    } else if (!j.is_null("q_lora_rank")) {
        EDGE_ASSIGN_OR_RETURN(m.q_lora_rank, get_int_in(j, "q_lora_rank", 1, 1 << 16));
    }
    EDGE_ASSIGN_OR_RETURN(m.kv_lora_rank, get_int_in(j, "kv_lora_rank", 1, 1 << 16));
    EDGE_ASSIGN_OR_RETURN(m.qk_nope_head_dim, get_int_in(j, "qk_nope_head_dim", 1, 1 << 12));
    EDGE_ASSIGN_OR_RETURN(m.qk_rope_head_dim, get_int_in(j, "qk_rope_head_dim", 2, 1 << 12));
    EDGE_ASSIGN_OR_RETURN(m.v_head_dim, get_int_in(j, "v_head_dim", 1, 1 << 12));
    if (m.qk_rope_head_dim % 2 != 0) {
        return invalid_argument_error(j.path() + ": field 'qk_rope_head_dim' must be even");
    }
    if ((m.kv_lora_rank + m.qk_rope_head_dim) % 2 != 0) {
        return unimplemented_error(j.path() + ": kv_lora_rank + qk_rope_head_dim must be even");
    }
    if (!j.is_null("attention_bias")) {
        EDGE_ASSIGN_OR_RETURN(bool bias, j.get_bool("attention_bias", false));
        if (bias) {
            return unimplemented_error(j.path() + ": field 'attention_bias' true is not " +
                                       "supported for " + kDeepseekV3Architecture);
        }
    }
    EDGE_ASSIGN_OR_RETURN(m.rope_interleave, j.get_bool("rope_interleave", true));
    m.softmax_scale = 1.0 / std::sqrt(static_cast<double>(m.qk_nope_head_dim + m.qk_rope_head_dim));
    EDGE_ASSIGN_OR_RETURN(RotaryConfig rope,
                          RotaryConfig::from_json(j, c.rope_theta, m.qk_rope_head_dim,
                                                  c.max_position_embeddings,
                                                  kDeepseekV3Architecture));
    m.inv_freq = std::move(rope.inv_freq);
    m.rope_mscale = rope.mscale;
    m.rope_max_positions = rope.max_positions;
    if (rope.yarn && rope.yarn->mscale_all_dim != 0.0) {
        // DeepSeek's attention also scales the softmax by get_mscale(factor, mscale_all_dim)^2.
        const double ms = cpu::yarn_get_mscale(rope.yarn->factor, rope.yarn->mscale_all_dim);
        m.softmax_scale *= ms * ms;
        if (!(m.softmax_scale <= std::numeric_limits<float>::max())) {
            // A backstop to read_yarn's bounds: attention takes the scale as a float, and an
            // infinite one makes every logit NaN rather than an error.
            return invalid_argument_error(j.path() + ": field 'rope_scaling.mscale_all_dim' " +
                                          "gives a softmax scale beyond a float");
        }
    }
    return m;
}

}  // namespace edge::engine
