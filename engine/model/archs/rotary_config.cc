#include "engine/model/archs/rotary_config.h"

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "engine/cpu/ops.h"
#include "engine/model/model_config.h"

namespace edge::engine {
namespace {

namespace json = boost::json;

// "dir/config.json: field 'rope_scaling.KEY'".
std::string field_name(const ConfigJson& j, std::string_view key) {
    return j.path() + ": field 'rope_scaling." + std::string(key) + "'";
}

// The number at `key`, `fallback` when it is absent or null.
Result<double> number_field(const ConfigJson& j, const json::object& o, const char* key,
                            double fallback) {
    const json::value* v = o.if_contains(key);
    if (v == nullptr || v->is_null()) {
        return fallback;
    }
    if (!v->is_number() || !std::isfinite(v->to_number<double>())) {
        return invalid_argument_error(field_name(j, key) + " is not a finite number");
    }
    return v->to_number<double>();
}

// `key`'s value as written, and what it should have been.
Status out_of_range(const ConfigJson& j, const json::object& o, const char* key,
                    const std::string& expected) {
    return invalid_argument_error(field_name(j, key) + " is " + json::serialize(o.at(key)) +
                                  ", expected " + expected);
}

// The scaling's type and the key that gave it: rope_type, else its older spelling type (as
// transformers reads them).
Result<std::pair<const char*, std::string>> scaling_type(const ConfigJson& j,
                                                         const json::object& o) {
    for (const char* key : {"rope_type", "type"}) {
        const json::value* t = o.if_contains(key);
        if (t == nullptr || t->is_null()) {
            continue;
        }
        if (!t->is_string()) {
            return invalid_argument_error(field_name(j, key) + " is not a string");
        }
        return std::pair<const char*, std::string>(key, std::string(t->get_string()));
    }
    return invalid_argument_error(j.path() + ": field 'rope_scaling' has no 'rope_type' (or " +
                                  "'type')");
}

// A number from 0 to `most` (none: no bound), 0 when absent or null.
Result<double> nonnegative_field(const ConfigJson& j, const json::object& o, const char* key,
                                 std::optional<int> most = std::nullopt) {
    EDGE_ASSIGN_OR_RETURN(const double v, number_field(j, o, key, 0.0));
    if (v < 0.0 || (most && v > *most)) {
        return out_of_range(j, o, key,
                            most ? "0 or more and at most " + std::to_string(*most) : "0 or more");
    }
    return v;
}

// The most mscale, mscale_all_dim and attention_factor may be. Checkpoints hold about 0.7 to 1;
// far above, cos/sin or the softmax scale overflows a float (mscale_all_dim 1e21 squares into a
// softmax scale of 1e40, attention_factor 1e20 into q.k of 1e40) and every logit is NaN. Up to
// it, with factor below 1e6, get_mscale stays below 1400 and its square below 2e6.
constexpr int kMaxYarnScale = 1000;

Result<cpu::YarnConfig> read_yarn(const ConfigJson& j, const json::object& o,
                                  int64_t max_position_embeddings) {
    cpu::YarnConfig y;
    if (const json::value* f = o.if_contains("factor"); f == nullptr || f->is_null()) {
        return invalid_argument_error(field_name(j, "factor") +
                                      " is missing (YaRN's context extension factor)");
    }
    EDGE_ASSIGN_OR_RETURN(y.factor, number_field(j, o, "factor", 0.0));
    if (!(y.factor >= 1.0 && y.factor < 1e6)) {
        // Below 1 would shrink the context the model was trained on. 1 is taken, as
        // transformers takes it: the plain table (interpolating by 1 is extrapolating), cos/sin
        // scaled by attention_factor when given (get_mscale(1) is 1).
        return out_of_range(j, o, "factor", "a number of 1 or more (and below 1e6)");
    }
    // transformers takes `get(key) or max_position_embeddings`; an explicit 0 or less is a
    // mistake rather than a request for the fallback.
    const auto max_pos = static_cast<double>(max_position_embeddings);
    EDGE_ASSIGN_OR_RETURN(const double orig,
                          number_field(j, o, "original_max_position_embeddings", max_pos));
    if (!(orig >= 1.0) || orig != std::floor(orig)) {
        return out_of_range(j, o, "original_max_position_embeddings",
                            "a whole number of positions, 1 or more");
    }
    if (orig > max_pos) {
        // YaRN stretches the pretrained length to a longer one; an "original" length above the
        // config's own is the two fields swapped, or a typo.
        return out_of_range(
            j, o, "original_max_position_embeddings",
            "at most max_position_embeddings (" + std::to_string(max_position_embeddings) + ")");
    }
    y.original_max_position = static_cast<int64_t>(orig);
    // transformers takes `get(key) or default`: absent, null and 0 all mean the default.
    EDGE_ASSIGN_OR_RETURN(y.beta_fast, nonnegative_field(j, o, "beta_fast"));
    EDGE_ASSIGN_OR_RETURN(y.beta_slow, nonnegative_field(j, o, "beta_slow"));
    y.beta_fast = y.beta_fast == 0.0 ? 32.0 : y.beta_fast;
    y.beta_slow = y.beta_slow == 0.0 ? 1.0 : y.beta_slow;
    // beta_fast below beta_slow runs the ramp backwards (the high frequencies interpolated, the
    // low ones kept), likely a mistake; transformers only warns and computes that table, which
    // stays finite (ends that meet are moved apart by 0.001): so does this.

    // 0 stands for absent (transformers takes the mscale ratio only when both are set and
    // nonzero). A negative one makes get_mscale(factor, m) = 0.1 m ln(factor) + 1 below 1, zero
    // or negative: cos/sin and the softmax scale turned over or divided by zero.
    EDGE_ASSIGN_OR_RETURN(y.mscale, nonnegative_field(j, o, "mscale", kMaxYarnScale));
    EDGE_ASSIGN_OR_RETURN(y.mscale_all_dim,
                          nonnegative_field(j, o, "mscale_all_dim", kMaxYarnScale));
    EDGE_ASSIGN_OR_RETURN(y.attention_factor, number_field(j, o, "attention_factor", 0.0));
    if (const json::value* a = o.if_contains("attention_factor");
        a != nullptr && !a->is_null() &&
        !(y.attention_factor > 0.0 && y.attention_factor <= kMaxYarnScale)) {
        return out_of_range(j, o, "attention_factor",
                            "a number above 0 and at most " + std::to_string(kMaxYarnScale));
    }
    if (const json::value* t = o.if_contains("truncate"); t != nullptr && !t->is_null()) {
        if (!t->is_bool()) {
            return invalid_argument_error(field_name(j, "truncate") + " is not true or false");
        }
        y.truncate = t->get_bool();
    }
    return y;
}

}  // namespace

Result<RotaryConfig> RotaryConfig::from_json(const ConfigJson& j, double theta, int64_t rot_dim,
                                             int64_t max_position_embeddings,
                                             std::string_view architecture) {
    RotaryConfig r;
    r.max_positions = max_position_embeddings;
    if (j.is_null("rope_scaling")) {
        r.inv_freq = cpu::rope_inv_freq(theta, rot_dim);
        return r;
    }
    const json::value& rs = j.root().at("rope_scaling");
    if (!rs.is_object()) {
        return invalid_argument_error(j.path() + ": field 'rope_scaling' is not an object");
    }
    const json::object& o = rs.get_object();
    EDGE_ASSIGN_OR_RETURN(const auto type, scaling_type(j, o));
    if (type.second != "yarn") {
        return unimplemented_error(field_name(j, type.first) + " '" + type.second +
                                   "' is not supported for " + std::string(architecture) +
                                   " (only yarn)");
    }
    EDGE_ASSIGN_OR_RETURN(cpu::YarnConfig y, read_yarn(j, o, max_position_embeddings));
    r.inv_freq = cpu::yarn_inv_freq(theta, rot_dim, y);
    r.mscale = cpu::yarn_attention_factor(y);
    if (!(std::abs(r.mscale) <= std::numeric_limits<float>::max())) {
        // A backstop to read_yarn's bounds: angles() scales the float cos/sin by it, and an
        // infinite factor makes every logit NaN rather than an error.
        return invalid_argument_error(j.path() + ": field 'rope_scaling' gives a cos/sin factor " +
                                      "(attention_factor, or from mscale / mscale_all_dim) of " +
                                      std::to_string(r.mscale) + ", beyond a float");
    }
    r.yarn = y;
    // Bounded as max_position_embeddings is read (factor < 1e6, original <= max positions).
    const double stretched = std::floor(static_cast<double>(y.original_max_position) * y.factor);
    r.max_positions =
        std::max(max_position_embeddings, static_cast<int64_t>(std::min(stretched, 0x1p30)));
    return r;
}

void RotaryConfig::angles(int64_t pos, float* cos_out, float* sin_out) const {
    const auto half = static_cast<int64_t>(inv_freq.size());
    cpu::rope_angles(pos, inv_freq.data(), half, cos_out, sin_out);
    if (mscale != 1.0) {
        const auto m = static_cast<float>(mscale);
        for (int64_t i = 0; i < half; ++i) {
            cos_out[i] *= m;
            sin_out[i] *= m;
        }
    }
}

}  // namespace edge::engine
