#include "daemon/api/request_tools.h"

#include <algorithm>
#include <cctype>
#include <unordered_set>

#include "common/json_text.h"

namespace edge::daemon::api {

namespace json = boost::json;

namespace {

// Bounds that keep a hostile request cheap before it reaches the engine.
constexpr size_t kMaxTools = 128;
constexpr size_t kMaxToolCalls = 128;  // Per assistant message of the history.
constexpr size_t kMaxToolNameLength = 64;

// OpenAI's rule for function names: 1..64 of a-z, A-Z, 0-9, '_' and '-'. It also keeps names
// safe inside every family's call markers.
bool valid_tool_name(std::string_view name) {
    if (name.empty() || name.size() > kMaxToolNameLength) {
        return false;
    }
    for (char c : name) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '_' || c == '-';
        if (!ok) {
            return false;
        }
    }
    return true;
}

// `"type": "function"` of a tool or tool call object.
bool function_type(Validator& v, const json::object& o, const std::string& where) {
    const json::string* type = required_string(v, o, where, "type");
    if (type == nullptr) {
        return false;
    }
    if (*type != "function") {
        return v.fail("'" + where + ".type' must be \"function\"", where + ".type");
    }
    return true;
}

}  // namespace

// An assistant message's `tool_calls` (the calls it made earlier in the conversation).
bool parse_history_tool_calls(Validator& v, const json::value& value, const std::string& where,
                              std::vector<engine::ChatToolCall>& out) {
    if (value.is_null()) {
        return true;
    }
    if (!value.is_array()) {
        return v.fail("'" + where + "' must be an array", where);
    }
    const json::array& calls = value.get_array();
    if (calls.size() > kMaxToolCalls) {
        return v.fail("'" + where + "' has more than " + std::to_string(kMaxToolCalls) + " entries",
                      where);
    }
    for (size_t i = 0; i < calls.size(); ++i) {
        const std::string name = where + "[" + std::to_string(i) + "]";
        if (!calls[i].is_object()) {
            return v.fail("'" + name + "' must be an object", name);
        }
        const json::object& c = calls[i].get_object();
        if (!only_keys(v, c, name, {"id", "type", "function"}) || !function_type(v, c, name)) {
            return false;
        }
        engine::ChatToolCall call;
        const json::string* id = required_string(v, c, name, "id");
        if (id == nullptr) {
            return false;
        }
        call.id = std::string(*id);
        const json::value* fn = c.if_contains("function");
        if (fn == nullptr || !fn->is_object()) {
            return v.fail("'" + name + ".function' must be an object", name + ".function");
        }
        const std::string fname = name + ".function";
        if (!only_keys(v, fn->get_object(), fname, {"name", "arguments"})) {
            return false;
        }
        const json::string* fn_name = required_string(v, fn->get_object(), fname, "name");
        const json::string* args =
            fn_name ? required_string(v, fn->get_object(), fname, "arguments") : nullptr;
        if (args == nullptr) {
            return false;
        }
        call.name = std::string(*fn_name);
        call.arguments = std::string(*args);
        out.push_back(std::move(call));
    }
    return true;
}

// `tools`: function tools, each with a valid, unique name and an object of parameters.
bool parse_tools(Validator& v, const json::value& value, std::vector<engine::ToolSpec>& out) {
    if (value.is_null()) {
        return true;
    }
    if (!value.is_array()) {
        return v.fail("'tools' must be an array", "tools");
    }
    const json::array& tools = value.get_array();
    if (tools.size() > kMaxTools) {
        return v.fail("'tools' has more than " + std::to_string(kMaxTools) + " entries", "tools");
    }
    for (size_t i = 0; i < tools.size(); ++i) {
        const std::string where = "tools[" + std::to_string(i) + "]";
        if (!tools[i].is_object()) {
            return v.fail("'" + where + "' must be an object", where);
        }
        const json::object& t = tools[i].get_object();
        // The type first: another type's own key ("custom") would read as unrecognized.
        if (!function_type(v, t, where) || !only_keys(v, t, where, {"type", "function"})) {
            return false;
        }
        const json::value* fn = t.if_contains("function");
        const std::string fwhere = where + ".function";
        if (fn == nullptr || !fn->is_object()) {
            return v.fail("'" + fwhere + "' must be an object", fwhere);
        }
        const json::object& f = fn->get_object();
        if (!only_keys(v, f, fwhere, {"name", "description", "parameters", "strict"})) {
            return false;
        }
        engine::ToolSpec spec;
        const json::string* name = required_string(v, f, fwhere, "name");
        if (name == nullptr) {
            return false;
        }
        if (!valid_tool_name(std::string_view(name->data(), name->size()))) {
            return v.fail(
                "'" + fwhere + ".name' must be 1 to 64 letters, digits, underscores or dashes",
                fwhere + ".name");
        }
        spec.name = std::string(*name);
        for (const engine::ToolSpec& earlier : out) {
            if (earlier.name == spec.name) {
                return v.fail("tool '" + spec.name + "' is defined twice", fwhere + ".name");
            }
        }
        if (const json::value* d = f.if_contains("description"); d && !d->is_null()) {
            const json::string* desc = v.string(*d, fwhere + ".description");
            if (desc == nullptr) {
                return false;
            }
            spec.description = std::string(*desc);
        }
        spec.parameters_json = "{}";
        const json::value* params = f.if_contains("parameters");
        if (params != nullptr && !params->is_null()) {
            if (!params->is_object()) {
                return v.fail("'" + fwhere + ".parameters' must be a JSON Schema object",
                              fwhere + ".parameters");
            }
            spec.parameters_json = json_text(*params);
        }
        if (const json::value* strict = f.if_contains("strict"); strict && !strict->is_null()) {
            if (!v.boolean(*strict, fwhere + ".strict")) {
                return false;
            }
            if (strict->get_bool()) {
                // A strict tool's arguments follow its parameters when a call is forced to it
                // (tool_choice naming it), so they must be a schema the engine can hold a reply
                // to; none: no arguments, `{}`.
                static const json::value kNoParameters = {{"type", "object"},
                                                          {"properties", json::object()},
                                                          {"additionalProperties", false}};
                auto compiled = engine::sampling::JsonSchema::compile(
                    params != nullptr && !params->is_null() ? *params : kNoParameters);
                if (!compiled.ok()) {
                    return v.fail("'" + fwhere +
                                      ".parameters' of a strict tool cannot be "
                                      "followed: " +
                                      compiled.status().message(),
                                  fwhere + ".parameters");
                }
                spec.strict_schema = std::move(compiled).value();
            }
        }
        out.push_back(std::move(spec));
    }
    return true;
}

// `tool_choice`: "none", "auto", "required" or {"type": "function", "function": {"name": N}}.
bool parse_tool_choice(Validator& v, const json::value& value, ParsedRequest& out, bool& given) {
    if (value.is_null()) {
        return true;
    }
    given = true;
    if (value.is_string()) {
        const json::string& s = value.get_string();
        if (s == "none") {
            out.tool_choice = ToolChoice::kNone;
        } else if (s == "auto") {
            out.tool_choice = ToolChoice::kAuto;
        } else if (s == "required") {
            out.tool_choice = ToolChoice::kRequired;
        } else {
            return v.fail(
                "'tool_choice' must be \"none\", \"auto\", \"required\" or a "
                "function choice object",
                "tool_choice");
        }
        return true;
    }
    if (!value.is_object()) {
        return v.fail("'tool_choice' must be a string or an object", "tool_choice");
    }
    const json::object& o = value.get_object();
    if (!only_keys(v, o, "tool_choice", {"type", "function"}) ||
        !function_type(v, o, "tool_choice")) {
        return false;
    }
    const json::value* fn = o.if_contains("function");
    if (fn == nullptr || !fn->is_object()) {
        return v.fail("'tool_choice.function' must be an object", "tool_choice.function");
    }
    if (!only_keys(v, fn->get_object(), "tool_choice.function", {"name"})) {
        return false;
    }
    const json::string* name = required_string(v, fn->get_object(), "tool_choice.function", "name");
    if (name == nullptr) {
        return false;
    }
    out.tool_choice = ToolChoice::kFunction;
    out.tool_choice_function = std::string(*name);
    return true;
}

// response_format: {"type": "text"}, {"type": "json_object"} (any object), or
// {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}, whose
// schema is compiled here (engine/sampling/json_schema.h says which keywords it holds a reply to;
// it always does, `strict` or not). `schema` is left null for text.
bool parse_response_format(Validator& v, const json::value& value,
                           std::shared_ptr<const engine::sampling::JsonSchema>* schema) {
    const std::string key = "response_format";
    if (value.is_null()) {
        return true;
    }
    const json::object* o = value.if_object();
    const json::value* t = o ? o->if_contains("type") : nullptr;
    const json::string* type = t ? t->if_string() : nullptr;
    if (type == nullptr || (*type != "text" && *type != "json_object" && *type != "json_schema")) {
        return v.fail(
            "'response_format' must be {\"type\": \"text\"}, {\"type\": "
            "\"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": "
            "{\"name\": ..., \"schema\": {...}}}",
            key);
    }
    for (const auto& [k, unused] : *o) {
        if (k != "type" && !(k == "json_schema" && *type == "json_schema")) {
            return v.fail("unrecognized field 'response_format." + std::string(k) + "'", key);
        }
    }
    if (*type == "text") {
        return true;
    }
    if (*type == "json_object") {
        *schema = engine::sampling::JsonSchema::any_object();
        return true;
    }
    const json::value* spec_value = o->if_contains("json_schema");
    const json::object* spec = spec_value ? spec_value->if_object() : nullptr;
    if (spec == nullptr) {
        return v.fail("'response_format.json_schema' must be an object with 'name' and 'schema'",
                      key);
    }
    for (const auto& [k, field] : *spec) {
        const std::string name = "response_format.json_schema." + std::string(k);
        if (k == "strict") {
            if (!field.is_null() && !v.boolean(field, name)) {
                return false;
            }
        } else if (k == "description") {
            if (!field.is_null() && v.string(field, name) == nullptr) {
                return false;
            }
        } else if (k != "name" && k != "schema") {
            return v.fail("unrecognized field '" + name + "'", key);
        }
    }
    const json::value* name = spec->if_contains("name");
    const json::string* name_text = name ? name->if_string() : nullptr;
    const bool name_ok =
        name_text != nullptr && !name_text->empty() && name_text->size() <= 64 &&
        std::all_of(name_text->begin(), name_text->end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
        });
    if (!name_ok) {
        return v.fail(
            "'response_format.json_schema.name' must be 1 to 64 letters, digits, '_' "
            "or '-'",
            key);
    }
    const json::value* body = spec->if_contains("schema");
    if (body == nullptr || !body->is_object()) {
        return v.fail("'response_format.json_schema.schema' must be a JSON Schema object", key);
    }
    auto compiled = engine::sampling::JsonSchema::compile(*body);
    if (!compiled.ok()) {
        return v.fail("'response_format.json_schema.schema' cannot be followed: " +
                          compiled.status().message(),
                      key);
    }
    *schema = std::move(compiled).value();
    return true;
}

}  // namespace edge::daemon::api
