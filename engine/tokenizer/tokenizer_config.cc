#include "engine/tokenizer/tokenizer_config.h"

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/file.h"
#include "common/json_text.h"

namespace edge::engine::tokenizer {

namespace json = boost::json;

namespace {

// A token field is a string, null, or an object with "content" (the AddedToken form).
Result<std::string> token_text(const json::object& o, const char* field) {
    const json::value* v = o.if_contains(field);
    if (v == nullptr || v->is_null()) {
        return std::string();
    }
    if (v->is_string()) {
        return std::string(v->get_string());
    }
    if (const json::object* t = v->if_object()) {
        const json::value* content = t->if_contains("content");
        if (content != nullptr && content->is_string()) {
            return std::string(content->get_string());
        }
    }
    return invalid_argument_error(std::string("tokenizer_config.json: ") + field +
                                  ": expected a string, null or {\"content\": ...}");
}

Result<TokenId> token_id_value(const json::value& v, const std::string& where) {
    if (!v.is_int64() || v.get_int64() < 0 || v.get_int64() >= (1LL << 31)) {
        return invalid_argument_error("generation_config.json: " + where +
                                      ": expected a non-negative integer");
    }
    return static_cast<TokenId>(v.get_int64());
}

Status parse_tokenizer_part(std::string_view text, TokenizerConfig* out) {
    EDGE_ASSIGN_OR_RETURN(json::object o, parse_json_object(text, "tokenizer_config.json"));
    EDGE_ASSIGN_OR_RETURN(out->bos_token, token_text(o, "bos_token"));
    EDGE_ASSIGN_OR_RETURN(out->eos_token, token_text(o, "eos_token"));
    if (const json::value* add = o.if_contains("add_bos_token"); add && !add->is_null()) {
        if (!add->is_bool()) {
            return invalid_argument_error("tokenizer_config.json: add_bos_token: not a boolean");
        }
        out->add_bos_token = add->get_bool();
    }
    const json::value* tmpl = o.if_contains("chat_template");
    if (tmpl == nullptr || tmpl->is_null()) {
        return ok_status();
    }
    if (tmpl->is_string()) {
        out->chat_template = std::string(tmpl->get_string());
        return ok_status();
    }
    // The list form: [{"name": "default", "template": ...}, ...]; take "default" or the first.
    if (const json::array* list = tmpl->if_array()) {
        for (const json::value& entry : *list) {
            const json::object* e = entry.if_object();
            const json::value* name = e ? e->if_contains("name") : nullptr;
            const json::value* body = e ? e->if_contains("template") : nullptr;
            if (body == nullptr || !body->is_string()) {
                return invalid_argument_error(
                    "tokenizer_config.json: chat_template: list entry without a template");
            }
            if (out->chat_template.empty() ||
                (name != nullptr && name->is_string() && name->get_string() == "default")) {
                out->chat_template = std::string(body->get_string());
            }
        }
        return ok_status();
    }
    return invalid_argument_error("tokenizer_config.json: chat_template: not a string or list");
}

// A number of generation_config.json within [lo, hi] (lo excluded when `open_lo`), or nullopt
// when the field is absent or null.
Result<std::optional<double>> sampling_number(const json::object& o, const char* field, double lo,
                                              double hi, bool open_lo) {
    const json::value* v = o.if_contains(field);
    if (v == nullptr || v->is_null()) {
        return std::optional<double>();
    }
    if (!v->is_number()) {
        return invalid_argument_error(std::string("generation_config.json: ") + field +
                                      ": expected a number");
    }
    const double x = v->to_number<double>();
    if (!(open_lo ? x > lo : x >= lo) || !(x <= hi)) {
        char range[96];
        std::snprintf(range, sizeof(range), "%s%g, %g]", open_lo ? "(" : "[", lo, hi);
        char value[32];
        std::snprintf(value, sizeof(value), "%g", x);
        return invalid_argument_error(std::string("generation_config.json: ") + field + ": " +
                                      value + " is outside " + range);
    }
    return std::optional<double>(x);
}

Status parse_sampling_defaults(const json::object& o, SamplingDefaults* out) {
    // The ranges the API accepts from a client.
    EDGE_ASSIGN_OR_RETURN(auto temperature, sampling_number(o, "temperature", 0, 2, false));
    EDGE_ASSIGN_OR_RETURN(auto top_p, sampling_number(o, "top_p", 0, 1, true));
    // HF's top_k 0 (and vLLM's -1) mean off, as 0 does here.
    EDGE_ASSIGN_OR_RETURN(auto top_k, sampling_number(o, "top_k", -1, 1 << 20, false));
    if (top_k && *top_k != std::floor(*top_k)) {
        return invalid_argument_error("generation_config.json: top_k: expected an integer");
    }
    if (temperature) {
        out->temperature = static_cast<float>(*temperature);
    }
    if (top_p) {
        out->top_p = std::max(static_cast<float>(*top_p), std::numeric_limits<float>::min());
    }
    if (top_k) {
        out->top_k = static_cast<int32_t>(std::max(*top_k, 0.0));
    }
    return ok_status();
}

Status parse_generation_part(std::string_view text, TokenizerConfig* out) {
    EDGE_ASSIGN_OR_RETURN(json::object o, parse_json_object(text, "generation_config.json"));
    EDGE_RETURN_IF_ERROR(parse_sampling_defaults(o, &out->sampling));
    if (const json::value* bos = o.if_contains("bos_token_id"); bos && !bos->is_null()) {
        EDGE_ASSIGN_OR_RETURN(out->generation_bos_id, token_id_value(*bos, "bos_token_id"));
    }
    const json::value* eos = o.if_contains("eos_token_id");
    if (eos == nullptr || eos->is_null()) {
        return ok_status();
    }
    if (const json::array* list = eos->if_array()) {
        for (size_t i = 0; i < list->size(); ++i) {
            EDGE_ASSIGN_OR_RETURN(
                TokenId id, token_id_value((*list)[i], "eos_token_id[" + std::to_string(i) + "]"));
            out->generation_eos_ids.push_back(id);
        }
        return ok_status();
    }
    EDGE_ASSIGN_OR_RETURN(TokenId id, token_id_value(*eos, "eos_token_id"));
    out->generation_eos_ids.push_back(id);
    return ok_status();
}

Result<std::string> read_optional(const std::filesystem::path& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
        return std::string();
    }
    return read_small_file(path.string());
}

}  // namespace

Result<TokenizerConfig> parse_tokenizer_config(std::string_view tokenizer_config_json,
                                               std::string_view generation_config_json) {
    TokenizerConfig config;
    try {
        if (!tokenizer_config_json.empty()) {
            EDGE_RETURN_IF_ERROR(parse_tokenizer_part(tokenizer_config_json, &config));
        }
        if (!generation_config_json.empty()) {
            EDGE_RETURN_IF_ERROR(parse_generation_part(generation_config_json, &config));
        }
    } catch (const std::exception& e) {
        return invalid_argument_error(std::string("tokenizer configuration: ") + e.what());
    }
    if (!config.chat_template.empty()) {
        config.chat_template_file = "tokenizer_config.json";
    }
    return config;
}

Result<TokenizerConfig> load_tokenizer_config(const std::string& dir) {
    const std::filesystem::path base(dir);
    EDGE_ASSIGN_OR_RETURN(std::string tok, read_optional(base / "tokenizer_config.json"));
    EDGE_ASSIGN_OR_RETURN(std::string gen, read_optional(base / "generation_config.json"));
    auto config = parse_tokenizer_config(tok, gen);
    if (!config.ok()) {
        return config.status().with_context(dir);
    }
    // Newer checkpoints ship the template as a file of its own, which takes precedence over
    // tokenizer_config.json's (as in transformers).
    EDGE_ASSIGN_OR_RETURN(std::string jinja, read_optional(base / "chat_template.jinja"));
    if (!jinja.empty()) {
        config->chat_template = std::move(jinja);
        config->chat_template_file = "chat_template.jinja";
    }
    return config;
}

}  // namespace edge::engine::tokenizer
