#include "engine/model/model_config.h"

#include <openssl/evp.h>

#include <boost/json.hpp>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>

#include "common/file.h"
#include "common/hex.h"
#include "common/json_text.h"
#include "engine/model/safetensors.h"
#include "engine/quant/policy.h"

namespace edge::engine {

namespace json = boost::json;

Result<ConfigJson> ConfigJson::read(const std::string& dir) {
    std::string path = dir + "/config.json";
    EDGE_ASSIGN_OR_RETURN(std::string text, read_small_file(path));
    return parse(text, path);
}

namespace {

// Equal values; numbers by value (1e6 and 1000000.0 are the same theta).
bool same_value(const json::value& a, const json::value& b) {
    return a.is_number() && b.is_number() ? a.to_number<double>() == b.to_number<double>() : a == b;
}

// transformers v5 saves a model's RoPE settings in one `rope_parameters` object (rope_theta,
// partial_rotary_factor, rope_type and the scaling fields) where v4 had top-level `rope_theta`,
// `partial_rotary_factor` and `rope_scaling`. The architectures read the v4 names, so the nested
// values are lifted to them here: without this a v5 config loaded with the default theta and no
// scaling, in silence. A value given in both places must be the same.
Status lift_rope_parameters(json::object& root, const std::string& path) {
    const json::value* nested = root.if_contains("rope_parameters");
    if (nested == nullptr || nested->is_null()) {
        return ok_status();
    }
    if (!nested->is_object()) {
        return invalid_argument_error(path + ": field 'rope_parameters' is not an object");
    }
    // `key` of rope_parameters against the same setting given as `field` elsewhere.
    auto clash = [&](std::string_view key, const json::value& value, const std::string& field,
                     const json::value& other) {
        return invalid_argument_error(path + ": field 'rope_parameters." + std::string(key) +
                                      "' (" + json::serialize(value) + ") disagrees with field '" +
                                      field + "' (" + json::serialize(other) + ")");
    };
    const json::object params = nested->get_object();  // A copy: root changes below.
    auto agree = [&](std::string_view key, const json::value& inner) -> Status {
        const json::value* top = root.if_contains(key);
        if (top == nullptr || top->is_null()) {
            root[key] = inner;
            return ok_status();
        }
        return same_value(*top, inner) ? ok_status() : clash(key, inner, std::string(key), *top);
    };
    json::object scaling;
    std::string type = "default";
    for (const auto& [key, value] : params) {
        if (key == "rope_theta" || key == "partial_rotary_factor") {
            EDGE_RETURN_IF_ERROR(agree(key, value));
            continue;
        }
        if ((key == "rope_type" || key == "type") && value.is_string()) {
            type = std::string(value.get_string());
        }
        scaling[key] = value;
    }
    const json::value* top = root.if_contains("rope_scaling");
    if (top == nullptr || top->is_null()) {
        // Only the theta (and the type "default"): plain RoPE, nothing to scale.
        const bool plain =
            type == "default" &&
            (scaling.empty() ||
             (scaling.size() == 1 && (scaling.contains("rope_type") || scaling.contains("type"))));
        if (!plain) {
            root["rope_scaling"] = std::move(scaling);
        }
        return ok_status();
    }
    if (!top->is_object()) {
        return invalid_argument_error(path + ": field 'rope_scaling' is not an object");
    }
    // Both given: one scaling, described in two places, so the keys only in rope_parameters are
    // added to rope_scaling (dropping DeepSeek's mscale_all_dim moved the micro fixture's bf16
    // perplexity from 3737.68 to 3647.85). `type` (v4) and `rope_type` (v5) name the same
    // setting and are compared as one key.
    json::object& merged = root["rope_scaling"].as_object();
    auto type_of = [](const json::object& o) -> std::pair<std::string, const json::value*> {
        for (const char* key : {"rope_type", "type"}) {
            if (const json::value* v = o.if_contains(key); v != nullptr && !v->is_null()) {
                return {key, v};
            }
        }
        return {"", nullptr};
    };
    const auto [inner_type_key, inner_type] = type_of(scaling);
    const auto [top_type_key, top_type] = type_of(merged);
    if (inner_type != nullptr && top_type != nullptr && !same_value(*inner_type, *top_type)) {
        return clash(inner_type_key, *inner_type, "rope_scaling." + top_type_key, *top_type);
    }
    const bool top_has_type = top_type != nullptr;  // The pointer dies with the inserts below.
    for (const auto& [key, value] : scaling) {
        if (key == "rope_type" || key == "type") {
            // The architectures read either spelling; add the type only where none was given.
            if (!top_has_type) {
                merged[key] = value;
            }
            continue;
        }
        const json::value* v = merged.if_contains(key);
        if (v == nullptr || v->is_null()) {
            merged[key] = value;
        } else if (!same_value(*v, value)) {
            return clash(key, value, "rope_scaling." + std::string(key), *v);
        }
    }
    return ok_status();
}

// `rope_scaling: {"rope_type": "default"}` (or "type"), which transformers writes for plain
// RoPE, says there is no scaling: it becomes null, as the architectures read an absent one.
// Anything more in it is left for them to read or refuse.
void drop_default_rope_scaling(json::object& root) {
    json::value* rs = root.if_contains("rope_scaling");
    if (rs == nullptr || !rs->is_object() || rs->get_object().empty()) {
        return;
    }
    for (const auto& [key, value] : rs->get_object()) {
        if ((key != "rope_type" && key != "type") || !value.is_string() ||
            value.get_string() != "default") {
            return;
        }
    }
    *rs = nullptr;
}

}  // namespace

Result<ConfigJson> ConfigJson::parse(std::string_view text, std::string path) {
    ConfigJson c;
    EDGE_ASSIGN_OR_RETURN(c.root_, parse_json_object(text, path));
    EDGE_RETURN_IF_ERROR(lift_rope_parameters(c.root_, path));
    drop_default_rope_scaling(c.root_);
    c.path_ = std::move(path);
    c.text_ = std::string(text);
    const json::value* archs = c.root_.if_contains("architectures");
    if (archs != nullptr && archs->is_array() && !archs->get_array().empty() &&
        archs->get_array()[0].is_string()) {
        c.architecture_ = std::string(archs->get_array()[0].get_string());
    } else if (const json::value* mt = c.root_.if_contains("model_type");
               mt != nullptr && mt->is_string()) {
        // No `architectures`: the class Hugging Face pairs with a known model_type.
        const std::string_view type = mt->get_string();
        c.architecture_ = type == "qwen3_moe"                          ? "Qwen3MoeForCausalLM"
                          : type == "glm4_moe"                         ? "Glm4MoeForCausalLM"
                          : type == "deepseek_v3" || type == "kimi_k2" ? "DeepseekV3ForCausalLM"
                                                                       : std::string(type);
    } else {
        return c.field_error("architectures", "is missing (and there is no model_type)");
    }
    return c;
}

Status ConfigJson::field_error(std::string_view key, std::string_view what) const {
    return invalid_argument_error(path_ + ": field '" + std::string(key) + "' " +
                                  std::string(what));
}

bool ConfigJson::has(std::string_view key) const { return root_.if_contains(key) != nullptr; }

bool ConfigJson::is_null(std::string_view key) const {
    const json::value* v = root_.if_contains(key);
    return v == nullptr || v->is_null();
}

Result<int64_t> ConfigJson::get_int(std::string_view key) const {
    const json::value* v = root_.if_contains(key);
    if (v == nullptr) {
        return field_error(key, "is missing");
    }
    if (v->is_int64()) {
        return v->get_int64();
    }
    if (v->is_uint64() && v->get_uint64() <= static_cast<uint64_t>(INT64_MAX)) {
        return static_cast<int64_t>(v->get_uint64());
    }
    if (v->is_double() && std::floor(v->get_double()) == v->get_double() &&
        std::fabs(v->get_double()) < 9e15) {
        return static_cast<int64_t>(v->get_double());
    }
    return field_error(key, "is not an integer");
}

Result<int64_t> ConfigJson::get_int(std::string_view key, int64_t fallback) const {
    if (is_null(key)) {
        return fallback;
    }
    return get_int(key);
}

Result<double> ConfigJson::get_double(std::string_view key) const {
    const json::value* v = root_.if_contains(key);
    if (v == nullptr) {
        return field_error(key, "is missing");
    }
    if (v->is_double()) {
        // 1e999 parses as infinity: no range check below would see it.
        if (!std::isfinite(v->get_double())) {
            return field_error(key, "is not a finite number");
        }
        return v->get_double();
    }
    if (v->is_int64()) {
        return static_cast<double>(v->get_int64());
    }
    if (v->is_uint64()) {
        return static_cast<double>(v->get_uint64());
    }
    return field_error(key, "is not a number");
}

Result<double> ConfigJson::get_double(std::string_view key, double fallback) const {
    if (is_null(key)) {
        return fallback;
    }
    return get_double(key);
}

Result<bool> ConfigJson::get_bool(std::string_view key, bool fallback) const {
    const json::value* v = root_.if_contains(key);
    if (v == nullptr || v->is_null()) {
        return fallback;
    }
    if (!v->is_bool()) {
        return field_error(key, "is not a boolean");
    }
    return v->get_bool();
}

Result<std::string> ConfigJson::get_string(std::string_view key) const {
    const json::value* v = root_.if_contains(key);
    if (v == nullptr) {
        return field_error(key, "is missing");
    }
    if (!v->is_string()) {
        return field_error(key, "is not a string");
    }
    return std::string(v->get_string());
}

Result<std::vector<int64_t>> ConfigJson::get_int_list(std::string_view key) const {
    const json::value* v = root_.if_contains(key);
    std::vector<int64_t> out;
    if (v == nullptr || v->is_null()) {
        return out;
    }
    if (v->is_array()) {
        for (const json::value& e : v->get_array()) {
            if (e.is_int64()) {
                out.push_back(e.get_int64());
            } else if (e.is_uint64() && e.get_uint64() <= static_cast<uint64_t>(INT64_MAX)) {
                out.push_back(static_cast<int64_t>(e.get_uint64()));
            } else {
                return field_error(key, "has an element that is not an integer");
            }
        }
        return out;
    }
    EDGE_ASSIGN_OR_RETURN(int64_t one, get_int(key));
    out.push_back(one);
    return out;
}

Result<int64_t> get_int_in(const ConfigJson& config, std::string_view key, int64_t lo,
                           int64_t hi) {
    EDGE_ASSIGN_OR_RETURN(int64_t v, config.get_int(key));
    if (v < lo || v > hi) {
        return invalid_argument_error(config.path() + ": field '" + std::string(key) + "' is " +
                                      std::to_string(v) + ", expected " + std::to_string(lo) +
                                      ".." + std::to_string(hi));
    }
    return v;
}

Status check_max_context(const ConfigJson& config, int64_t served, int64_t max_context) {
    if (max_context <= served) {
        return ok_status();
    }
    const Result<int64_t> stated = config.get_int("max_position_embeddings");
    const std::string what =
        stated.ok() && *stated < served
            ? std::to_string(served) + " positions (max_position_embeddings " +
                  std::to_string(*stated) +
                  " stretched by rope_scaling: original_max_position_embeddings x factor)"
            : "max_position_embeddings " + std::to_string(served);
    return invalid_argument_error("max_context " + std::to_string(max_context) +
                                  " is larger than the model's " + what + " (" + config.path() +
                                  ")");
}

Status require_string_if_set(const ConfigJson& config, std::string_view key,
                             std::string_view only) {
    if (config.is_null(key)) {
        return ok_status();
    }
    EDGE_ASSIGN_OR_RETURN(std::string v, config.get_string(key));
    if (v != only) {
        return unimplemented_error(config.path() + ": field '" + std::string(key) + "' '" + v +
                                   "' is not supported (only " + std::string(only) + ")");
    }
    return ok_status();
}

Result<std::vector<int64_t>> get_token_ids(const ConfigJson& config, std::string_view key,
                                           int64_t vocab_size) {
    EDGE_ASSIGN_OR_RETURN(std::vector<int64_t> ids, config.get_int_list(key));
    for (int64_t id : ids) {
        if (id < 0 || id >= vocab_size) {
            return invalid_argument_error(config.path() + ": field '" + std::string(key) + "' " +
                                          std::to_string(id) + " is outside the vocabulary");
        }
    }
    return ids;
}

std::string version_digest(const ConfigJson& config, const Checkpoint& checkpoint,
                           const quant::QuantPolicy& policy) {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
    auto feed = [&](std::string_view s) {
        // Length-prefixed so that field boundaries cannot shift between inputs.
        uint64_t n = s.size();
        EVP_DigestUpdate(ctx, &n, sizeof(n));
        EVP_DigestUpdate(ctx, s.data(), s.size());
    };
    feed(config.text());
    for (const std::string& name : checkpoint.names()) {
        const TensorInfo* t = checkpoint.info(name);
        feed(name);
        feed(dtype_name(t->dtype));
        feed(shape_string(t->shape));
    }
    // And the weights' content, sampled: two checkpoints of one shape (another seed, a
    // fine-tune) must not share a version.
    checkpoint.content_sample(64, feed);
    // The tokenizer and chat template change what a request becomes: part of the version too.
    const std::filesystem::path dir = std::filesystem::path(config.path()).parent_path();
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                             "chat_template.jinja", "tiktoken.model"}) {
        // Absent, or unreadable (the loaders name that): not part of the version.
        if (Result<std::string> text = read_small_file((dir / name).string()); text.ok()) {
            feed(name);
            feed(*text);
        }
    }
    // Quantize-on-load serves other weights than the files hold: the same checkpoint plain and
    // with `experts-int4` answer differently, and a pin or a rollout must tell the pools apart.
    // Only when it quantizes something, so that no policy keeps the versions already pinned.
    if (policy.quantizes_anything()) {
        feed("quantization");
        feed(policy.to_string());
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx, md, &len);
    EVP_MD_CTX_free(ctx);
    return to_hex(std::span<const unsigned char>(md, len));
}

}  // namespace edge::engine
