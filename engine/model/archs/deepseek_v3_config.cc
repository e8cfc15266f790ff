#include "engine/model/archs/deepseek_v3_config.h"

#include <boost/json.hpp>
#include <cmath>

#include "engine/model/model_config.h"

namespace edge::engine {

namespace json = boost::json;

namespace {

Result<double> number_field(const json::object& o, const std::string& where, const char* key,
                            double fallback) {
    const json::value* v = o.if_contains(key);
    if (v == nullptr || v->is_null()) {
        return fallback;
    }
    if (!v->is_number() || !std::isfinite(v->to_number<double>())) {
        return invalid_argument_error(where + "." + key + " is not a finite number");
    }
    return v->to_number<double>();
}

}  // namespace

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
    m.inv_freq = cpu::rope_inv_freq(c.rope_theta, m.qk_rope_head_dim);
    if (j.is_null("rope_scaling")) {
        return m;
    }
    const json::value& rs = j.root().at("rope_scaling");
    const std::string where = j.path() + ": field 'rope_scaling'";
    if (!rs.is_object()) {
        return invalid_argument_error(where + " is not an object");
    }
    const json::object& o = rs.get_object();
    std::string type;
    for (const char* key : {"type", "rope_type"}) {
        if (const json::value* t = o.if_contains(key); t != nullptr && t->is_string()) {
            type = std::string(t->get_string());
        }
    }
    if (type != "yarn") {
        return unimplemented_error(where + ": type '" + type + "' is not supported (only yarn)");
    }
    cpu::YarnConfig y;
    EDGE_ASSIGN_OR_RETURN(y.factor, number_field(o, where, "factor", 1.0));
    // Without original_max_position_embeddings transformers' YaRN takes the model's own
    // max_position_embeddings as the pretrained length.
    EDGE_ASSIGN_OR_RETURN(double orig,
                          number_field(o, where, "original_max_position_embeddings",
                                       static_cast<double>(c.max_position_embeddings)));
    EDGE_ASSIGN_OR_RETURN(y.beta_fast, number_field(o, where, "beta_fast", 32.0));
    EDGE_ASSIGN_OR_RETURN(y.beta_slow, number_field(o, where, "beta_slow", 1.0));
    // 0 stands for absent: transformers scales cos/sin by get_mscale(factor, mscale) /
    // get_mscale(factor, mscale_all_dim) only when both are set and nonzero, else by
    // get_mscale(factor) (m = 1); a default of 1 for mscale would take the ratio when only
    // mscale_all_dim is set.
    EDGE_ASSIGN_OR_RETURN(y.mscale, number_field(o, where, "mscale", 0.0));
    EDGE_ASSIGN_OR_RETURN(y.mscale_all_dim, number_field(o, where, "mscale_all_dim", 0.0));
    // attention_factor, when set, is the cos/sin scale itself (transformers' YaRN takes it
    // instead of the mscale ratio); 0 stands for absent.
    EDGE_ASSIGN_OR_RETURN(const double attention_factor,
                          number_field(o, where, "attention_factor", 0.0));
    if (const json::value* t = o.if_contains("truncate"); t != nullptr && !t->is_null()) {
        if (!t->is_bool()) {
            return invalid_argument_error(where + ".truncate is not true or false");
        }
        y.truncate = t->get_bool();
    }
    if (!(y.factor >= 1.0 && y.factor < 1e6) || !(orig >= 1.0 && orig < 1e9) ||
        !(y.beta_fast > 0.0) || !(y.beta_slow > 0.0) || !(attention_factor >= 0.0)) {
        return invalid_argument_error(where + ": factor, original_max_position_embeddings, " +
                                      "beta or attention_factor values out of range");
    }
    if (y.mscale < 0.0 || y.mscale_all_dim < 0.0) {
        // get_mscale(factor, m) = 0.1 m ln(factor) + 1 is then below 1, zero or negative: a
        // rope scale of infinity, or cos/sin and the softmax scale turned over, not an error.
        return invalid_argument_error(where + ": mscale and mscale_all_dim must not be negative");
    }
    y.original_max_position = static_cast<int64_t>(orig);
    m.inv_freq = cpu::yarn_inv_freq(c.rope_theta, m.qk_rope_head_dim, y);
    if (attention_factor != 0.0) {
        m.rope_mscale = attention_factor;
    } else if (y.mscale != 0.0 && y.mscale_all_dim != 0.0) {
        m.rope_mscale = cpu::yarn_get_mscale(y.factor, y.mscale) /
                        cpu::yarn_get_mscale(y.factor, y.mscale_all_dim);
    } else {
        m.rope_mscale = cpu::yarn_get_mscale(y.factor, 1.0);
    }
    if (y.mscale_all_dim != 0.0) {
        const double ms = cpu::yarn_get_mscale(y.factor, y.mscale_all_dim);
        m.softmax_scale *= ms * ms;
    }
    return m;
}

}  // namespace edge::engine
