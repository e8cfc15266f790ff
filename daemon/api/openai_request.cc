#include "daemon/api/openai_request.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <unordered_set>

#include <boost/json.hpp>

#include "common/json_text.h"
#include "engine/sampling/json_schema.h"
#include "engine/sampling/sampler.h"

namespace edge::daemon::api {
namespace {

namespace json = boost::json;

// Bounds that keep a hostile request cheap before it reaches the engine.
constexpr size_t kMaxMessages = 4096;
constexpr size_t kMaxStops = 4;
constexpr size_t kMaxPromptTokens = 1 << 20;
constexpr int64_t kMaxTokensLimit = 1 << 20;
constexpr size_t kMaxTools = 128;
constexpr size_t kMaxToolCalls = 128;  // Per assistant message of the history.
constexpr size_t kMaxToolNameLength = 64;

// Fails with the first error found; fields are checked in a fixed order.
class Validator {
public:
    std::optional<ApiError> error;

    bool fail(std::string message, std::string param) {
        if (!error) {
            error = invalid_request(std::move(message), std::move(param));
        }
        return false;
    }

    std::optional<double> number(const json::value& v, const std::string& name, double min,
                                 double max) {
        double d = 0;
        if (v.is_double()) {
            d = v.get_double();
        } else if (v.is_int64()) {
            d = static_cast<double>(v.get_int64());
        } else if (v.is_uint64()) {
            d = static_cast<double>(v.get_uint64());
        } else {
            fail("'" + name + "' must be a number", name);
            return std::nullopt;
        }
        if (!std::isfinite(d) || d < min || d > max) {
            fail("'" + name + "' must be between " + trim(min) + " and " + trim(max), name);
            return std::nullopt;
        }
        return d;
    }

    std::optional<int64_t> integer(const json::value& v, const std::string& name, int64_t min,
                                   int64_t max) {
        int64_t i = 0;
        if (v.is_int64()) {
            i = v.get_int64();
        } else if (v.is_uint64()) {
            if (v.get_uint64() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                fail("'" + name + "' is outside the 64-bit integer range", name);
                return std::nullopt;
            }
            i = static_cast<int64_t>(v.get_uint64());
        } else if (v.is_double() && std::trunc(v.get_double()) == v.get_double()) {
            // 1e16, or a whole number beyond 64 bits (parsed as a double). -2^63 converts
            // exactly; 2^63 would not.
            constexpr double kTwo63 = 9223372036854775808.0;
            const double d = v.get_double();
            if (!(d >= -kTwo63 && d < kTwo63)) {
                fail("'" + name + "' is outside the 64-bit integer range", name);
                return std::nullopt;
            }
            i = static_cast<int64_t>(d);
        } else {
            fail("'" + name + "' must be an integer", name);
            return std::nullopt;
        }
        if (i < min || i > max) {
            fail("'" + name + "' must be between " + std::to_string(min) + " and " +
                     std::to_string(max),
                 name);
            return std::nullopt;
        }
        return i;
    }

    std::optional<bool> boolean(const json::value& v, const std::string& name) {
        if (!v.is_bool()) {
            fail("'" + name + "' must be a boolean", name);
            return std::nullopt;
        }
        return v.get_bool();
    }

    const json::string* string(const json::value& v, const std::string& name) {
        if (!v.is_string()) {
            fail("'" + name + "' must be a string", name);
            return nullptr;
        }
        return &v.get_string();
    }

private:
    static std::string trim(double d) {
        std::string s = std::to_string(d);
        while (s.size() > 1 && s.back() == '0') {
            s.pop_back();
        }
        if (!s.empty() && s.back() == '.') {
            s.pop_back();
        }
        return s;
    }
};

bool parse_content(Validator& v, const json::value& content, const std::string& name,
                   std::string& out) {
    if (content.is_string()) {
        out = content.get_string();
        return true;
    }
    if (!content.is_array()) {
        return v.fail("'" + name + "' must be a string or an array of content parts", name);
    }
    const json::array& parts = content.get_array();
    for (size_t i = 0; i < parts.size(); ++i) {
        std::string part_name = name + "[" + std::to_string(i) + "]";
        if (!parts[i].is_object()) {
            return v.fail("'" + part_name + "' must be an object", part_name);
        }
        const json::object& part = parts[i].get_object();
        const json::value* type = part.if_contains("type");
        if (type == nullptr) {
            return v.fail("'" + part_name + ".type' is required", part_name + ".type");
        }
        const json::string* t = v.string(*type, part_name + ".type");
        if (t == nullptr) {
            return false;
        }
        if (*t != "text") {
            return v.fail("content part type '" + std::string(*t) + "' is not supported",
                          part_name + ".type");
        }
        for (const auto& kv : part) {
            if (kv.key() != "type" && kv.key() != "text") {
                std::string p = part_name + "." + std::string(kv.key());
                return v.fail("unrecognized field '" + p + "'", p);
            }
        }
        const json::value* text = part.if_contains("text");
        if (text == nullptr) {
            return v.fail("'" + part_name + ".text' is required", part_name + ".text");
        }
        const json::string* s = v.string(*text, part_name + ".text");
        if (s == nullptr) {
            return false;
        }
        // Text parts are separate paragraphs of one message, as vLLM joins them.
        if (i > 0) {
            out += '\n';
        }
        out.append(s->data(), s->size());
    }
    return true;
}

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

// Only `allowed` keys in `o`, else a failure naming `where.key`.
bool only_keys(Validator& v, const json::object& o, const std::string& where,
               std::initializer_list<std::string_view> allowed) {
    for (const auto& kv : o) {
        const std::string_view key(kv.key().data(), kv.key().size());
        if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
            std::string field = where + "." + std::string(kv.key());
            return v.fail("unrecognized field '" + field + "'", field);
        }
    }
    return true;
}

// A required string member `key` of `o` (at `where`).
const json::string* required_string(Validator& v, const json::object& o, const std::string& where,
                                    std::string_view key) {
    const std::string field = where + "." + std::string(key);
    const json::value* value = o.if_contains(key);
    if (value == nullptr) {
        v.fail("'" + field + "' is required", field);
        return nullptr;
    }
    return v.string(*value, field);
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
        return v.fail("'" + where + "' has more than " + std::to_string(kMaxToolCalls) +
                          " entries",
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
            return v.fail("'" + fwhere +
                              ".name' must be 1 to 64 letters, digits, underscores or dashes",
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
bool parse_tool_choice(Validator& v, const json::value& value, ParsedRequest& out,
                       bool& given) {
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
            return v.fail("'tool_choice' must be \"none\", \"auto\", \"required\" or a "
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
    const json::string* name =
        required_string(v, fn->get_object(), "tool_choice.function", "name");
    if (name == nullptr) {
        return false;
    }
    out.tool_choice = ToolChoice::kFunction;
    out.tool_choice_function = std::string(*name);
    return true;
}

bool parse_messages(Validator& v, const json::value& value,
                    std::vector<engine::ChatMessage>& out) {
    if (!value.is_array()) {
        return v.fail("'messages' must be an array", "messages");
    }
    const json::array& messages = value.get_array();
    if (messages.empty()) {
        return v.fail("'messages' must contain at least one message", "messages");
    }
    if (messages.size() > kMaxMessages) {
        return v.fail("'messages' has more than " + std::to_string(kMaxMessages) + " entries",
                      "messages");
    }
    for (size_t i = 0; i < messages.size(); ++i) {
        std::string name = "messages[" + std::to_string(i) + "]";
        if (!messages[i].is_object()) {
            return v.fail("'" + name + "' must be an object", name);
        }
        const json::object& m = messages[i].get_object();
        engine::ChatMessage msg;
        const json::value* role = m.if_contains("role");
        if (role == nullptr) {
            return v.fail("'" + name + ".role' is required", name + ".role");
        }
        const json::string* r = v.string(*role, name + ".role");
        if (r == nullptr) {
            return false;
        }
        if (*r == "developer") {
            msg.role = "system";
        } else if (*r == "system" || *r == "user" || *r == "assistant" || *r == "tool") {
            msg.role = std::string(*r);
        } else {
            return v.fail("'" + std::string(*r) +
                              "' is not a valid role (system, developer, user, assistant, tool)",
                          name + ".role");
        }
        for (const auto& kv : m) {
            std::string key(kv.key());
            std::string field = name + "." + key;
            if (key == "role") {
                continue;
            }
            if (key == "content") {
                if (kv.value().is_null() && msg.role == "assistant") {
                    continue;
                }
                if (!parse_content(v, kv.value(), field, msg.content)) {
                    return false;
                }
            } else if (key == "name") {
                if (!kv.value().is_null()) {
                    const json::string* s = v.string(kv.value(), field);
                    if (s == nullptr) {
                        return false;
                    }
                    msg.name = std::string(*s);
                }
            } else if (key == "tool_call_id") {
                if (!kv.value().is_null()) {
                    const json::string* id = v.string(kv.value(), field);
                    if (id == nullptr) {
                        return false;
                    }
                    msg.tool_call_id = std::string(*id);
                }
            } else if (key == "reasoning_content" && msg.role == "assistant") {
                // A reasoning model's earlier thinking, sent back apart from its answer.
                if (!kv.value().is_null()) {
                    const json::string* r = v.string(kv.value(), field);
                    if (r == nullptr) {
                        return false;
                    }
                    msg.reasoning_content = std::string(*r);
                }
            } else if (key == "refusal") {
                if (!kv.value().is_null() && v.string(kv.value(), field) == nullptr) {
                    return false;
                }
            } else if (key == "tool_calls" && msg.role == "assistant") {
                if (!parse_history_tool_calls(v, kv.value(), field, msg.tool_calls)) {
                    return false;
                }
            } else if (key == "tool_calls" || key == "function_call" || key == "audio") {
                if (!kv.value().is_null() &&
                    !(kv.value().is_array() && kv.value().get_array().empty())) {
                    return v.fail("'" + field + "' is not supported", field);
                }
            } else {
                return v.fail("unrecognized field '" + field + "'", field);
            }
        }
        if (!m.if_contains("content") && msg.role != "assistant") {
            return v.fail("'" + name + ".content' is required", name + ".content");
        }
        // A tool result answers one call; without the id the template cannot pair them.
        if (msg.role == "tool" && msg.tool_call_id.empty()) {
            return v.fail("'" + name + ".tool_call_id' is required for a tool message",
                          name + ".tool_call_id");
        }
        out.push_back(std::move(msg));
    }
    return true;
}

// One prompt given as token ids (`name`: the field, for errors).
bool parse_token_ids(Validator& v, const json::array& list, const std::string& name,
                     std::vector<engine::TokenId>& ids) {
    if (list.empty()) {
        return v.fail("'" + name + "' is an empty list of token ids", name);
    }
    if (list.size() > kMaxPromptTokens) {
        return v.fail("'" + name + "' has too many tokens", name);
    }
    ids.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
        std::optional<int64_t> id = v.integer(list[i], name + "[" + std::to_string(i) + "]", 0,
                                              std::numeric_limits<engine::TokenId>::max());
        if (!id) {
            return false;
        }
        ids.push_back(static_cast<engine::TokenId>(*id));
    }
    return true;
}

// A string, token ids, or a list of prompts (OpenAI's batch: strings, or arrays of token ids,
// not both): the first goes to generate.prompt, the others to more_prompts.
bool parse_prompt(Validator& v, const json::value& value, ParsedRequest& out) {
    engine::GenerateRequest& req = out.generate;
    if (value.is_string()) {
        req.prompt = std::string(value.get_string());
        return true;
    }
    if (!value.is_array() || value.get_array().empty()) {
        return v.fail(
            "'prompt' must be a string, an array of token ids, or an array of prompts (strings, "
            "or arrays of token ids)",
            "prompt");
    }
    const json::array& a = value.get_array();
    if (!a[0].is_string() && !a[0].is_array()) {
        std::vector<engine::TokenId> ids;
        if (!parse_token_ids(v, a, "prompt", ids)) {
            return false;
        }
        req.prompt = std::move(ids);
        return true;
    }
    if (a.size() > static_cast<size_t>(kMaxBatchChoices)) {
        return v.fail("'prompt' holds more than " + std::to_string(kMaxBatchChoices) + " prompts",
                      "prompt");
    }
    // The kind of prompt[0] is the kind of every element (as vLLM's parser takes them).
    const bool text = a[0].is_string();
    out.more_prompts.clear();
    for (size_t i = 0; i < a.size(); ++i) {
        const std::string name = "prompt[" + std::to_string(i) + "]";
        decltype(engine::GenerateRequest::prompt) prompt;
        if (text != a[i].is_string() || (!text && !a[i].is_array())) {
            return v.fail("'" + name + "' must be " +
                              (text ? "a string" : "an array of token ids") +
                              ", as 'prompt[0]' is: a list of prompts holds strings or arrays "
                              "of token ids, not both",
                          name);
        }
        if (text) {
            prompt = std::string(a[i].get_string());
        } else {
            std::vector<engine::TokenId> ids;
            if (!parse_token_ids(v, a[i].get_array(), name, ids)) {
                return false;
            }
            prompt = std::move(ids);
        }
        if (i == 0) {
            req.prompt = std::move(prompt);
        } else {
            out.more_prompts.push_back(std::move(prompt));
        }
    }
    return true;
}

bool parse_stop(Validator& v, const json::value& value, std::vector<std::string>& out) {
    if (value.is_null()) {
        return true;
    }
    // One string, or each of the array's, named as the client wrote it.
    auto take = [&](const json::string& s, const std::string& name) {
        if (s.empty()) {
            return v.fail("'" + name + "' must not be empty", name);
        }
        if (s.size() > engine::sampling::kMaxStopBytes) {
            return v.fail("'" + name + "' is longer than " +
                              std::to_string(engine::sampling::kMaxStopBytes) + " bytes",
                          name);
        }
        out.push_back(std::string(s));
        return true;
    };
    if (value.is_string()) {
        return take(value.get_string(), "stop");
    }
    if (!value.is_array() || value.get_array().size() > kMaxStops) {
        return v.fail("'stop' must be a string or an array of at most 4 strings", "stop");
    }
    const json::array& a = value.get_array();
    for (size_t i = 0; i < a.size(); ++i) {
        const std::string name = "stop[" + std::to_string(i) + "]";
        const json::string* s = v.string(a[i], name);
        if (s == nullptr || !take(*s, name)) {
            return false;
        }
    }
    return true;
}

// OpenAI's logit_bias: {"<token id>": bias in [-100, 100], ...}; null or {} is none.
bool parse_logit_bias(Validator& v, const json::value& value,
                      std::vector<std::pair<engine::TokenId, float>>& out) {
    if (value.is_null()) {
        return true;
    }
    if (!value.is_object()) {
        return v.fail("'logit_bias' must be an object mapping token ids to biases", "logit_bias");
    }
    if (value.get_object().size() > engine::sampling::kMaxLogitBias) {
        return v.fail("'logit_bias' may hold at most 1024 tokens", "logit_bias");
    }
    std::unordered_set<int64_t> ids;
    for (const auto& kv : value.get_object()) {
        const std::string_view key = kv.key();
        int64_t id = -1;
        const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
        if (ec != std::errc() || end != key.data() + key.size() || id < 0 ||
            id > std::numeric_limits<engine::TokenId>::max()) {
            // At most 64 bytes of it, cut on a character boundary (the error is JSON: UTF-8).
            size_t cut = std::min<size_t>(key.size(), 64);
            while (cut > 0 && cut < key.size() &&
                   (static_cast<unsigned char>(key[cut]) & 0xC0) == 0x80) {
                --cut;
            }
            return v.fail(
                "'logit_bias' key '" + std::string(key.substr(0, cut)) + "' is not a token id",
                "logit_bias");
        }
        const std::string name = "logit_bias." + std::string(key);
        std::optional<double> bias = v.number(kv.value(), name, -100, 100);
        if (!bias) {
            return false;
        }
        if (!ids.insert(id).second) {
            // "7" and "07" are two keys to JSON, one token to the sampler, which would add
            // both biases (past +-100).
            return v.fail("'logit_bias' names token " + std::to_string(id) + " twice", name);
        }
        out.emplace_back(static_cast<engine::TokenId>(id), static_cast<float>(*bias));
    }
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

// Fields that clients commonly send with their default (unused) value; anything else is refused.
// `chat`: the completions-only ones (echo, suffix, best_of) are unknown there, as in OpenAI's API.
// `json_schema`: set by response_format (parse_response_format).
bool parse_unsupported(Validator& v, const std::string& key, const json::value& value, bool chat,
                       std::shared_ptr<const engine::sampling::JsonSchema>* json_schema) {
    auto refuse = [&] { return v.fail("'" + key + "' is not supported", key); };
    if (chat && (key == "echo" || key == "suffix" || key == "best_of")) {
        return v.fail("unrecognized request argument '" + key + "' (a /v1/completions field)",
                      key);
    }
    if (key == "best_of") {
        // Server-side best-of (generate several, return the likeliest) is not made: only 1.
        std::optional<int64_t> n =
            value.is_null() ? 1 : v.integer(value, key, INT64_MIN, INT64_MAX);
        return n && (*n == 1 || v.fail("'best_of' must be 1 (use 'n' for several choices)", key));
    }
    if (key == "metadata") {
        if (value.is_null()) {
            return true;
        }
        if (!value.is_object()) {
            return v.fail("'" + key + "' must be an object", key);
        }
        return true;
    }
    if (key == "functions") {
        if (value.is_null()) {
            return true;
        }
        if (!value.is_array()) {
            return v.fail("'" + key + "' must be an array", key);
        }
        return value.get_array().empty() || refuse();
    }
    if (key == "function_call") {
        return value.is_null() || (value.is_string() && value.get_string() == "none") ||
               (value.is_string() && value.get_string() == "auto") || refuse();
    }
    if (key == "response_format") {
        return parse_response_format(v, value, json_schema);
    }
    if (key == "parallel_tool_calls" || key == "store") {
        return value.is_null() || v.boolean(value, key).has_value();
    }
    if (key == "user" || key == "service_tier" || key == "reasoning_effort") {
        return value.is_null() || v.string(value, key) != nullptr;
    }
    if (key == "prompt_cache_key" || key == "safety_identifier") {
        // A caching hint (this server's prefix cache needs none) and the successor of `user`.
        return value.is_null() || v.string(value, key) != nullptr;
    }
    if (chat && key == "modalities") {
        // ["text"] is the default and all this server makes.
        const json::array* a = value.if_array();
        return value.is_null() ||
               (a != nullptr && a->size() == 1 && (*a)[0].is_string() &&
                (*a)[0].get_string() == "text") ||
               refuse();
    }
    if (key == "suffix" || key == "modalities" || key == "prediction" || key == "audio") {
        return value.is_null() || refuse();
    }
    return v.fail("unrecognized request argument '" + key + "'", key);
}

// The value of the four hex digits at s[i], or -1.
int hex4(std::string_view s, size_t i) {
    if (i + 4 > s.size()) {
        return -1;
    }
    int v = 0;
    const auto [end, err] = std::from_chars(s.data() + i, s.data() + i + 4, v, 16);
    return err == std::errc() && end == s.data() + i + 4 ? v : -1;
}

// The body with every \uD800..\uDFFF escape that is not half of a pair written as \uFFFD,
// or nullopt when it has none. JSON's grammar allows such escapes and Python's
// parser (so OpenAI's and vLLM's servers) reads them; Boost.JSON refuses them, so the body is
// read again with the replacement character, as a decoder does with a broken sequence.
std::optional<std::string> replace_lone_surrogates(std::string_view body) {
    std::string out;
    bool in_string = false;
    bool changed = false;
    size_t copied = 0;
    for (size_t i = 0; i < body.size(); ++i) {
        if (body[i] == '"') {
            in_string = !in_string;
        } else if (in_string && body[i] == '\\' && i + 1 < body.size()) {
            if (body[i + 1] != 'u') {
                ++i;  // A one-character escape (\" and \\ included).
                continue;
            }
            const int unit = hex4(body, i + 2);
            if (unit >= 0xD800 && unit <= 0xDBFF && i + 8 <= body.size() && body[i + 6] == '\\' &&
                body[i + 7] == 'u') {
                const int low = hex4(body, i + 8);
                if (low >= 0xDC00 && low <= 0xDFFF) {
                    i += 11;  // A pair: both escapes stay.
                    continue;
                }
            }
            if (unit >= 0xD800 && unit <= 0xDFFF) {
                out.append(body.substr(copied, i - copied));
                out.append("\\uFFFD");
                copied = i + 6;
                changed = true;
            }
            i += 5;
        }
    }
    if (!changed) {
        return std::nullopt;
    }
    out.append(body.substr(copied));
    return out;
}

}  // namespace

std::variant<ParsedRequest, ApiError> parse_openai_request(Endpoint endpoint,
                                                           std::string_view body) {
    std::error_code ec;
    std::string why;
    json::value root = parse_json(body, ec, &why);
    if (ec) {
        // The replacement keeps every byte's place, so the fixed body's error is where the
        // body's own is (not at a lone surrogate the parser would have stopped at first).
        if (const std::optional<std::string> fixed = replace_lone_surrogates(body)) {
            root = parse_json(*fixed, ec, &why);
        }
    }
    if (ec) {
        return invalid_request("the request body is not valid JSON at " + why, std::nullopt);
    }
    if (!root.is_object()) {
        return invalid_request("the request body must be a JSON object", std::nullopt);
    }
    const json::object& obj = root.get_object();
    const bool chat = endpoint == Endpoint::kChatCompletions;
    ParsedRequest out;
    out.endpoint = endpoint;
    engine::GenerateRequest& req = out.generate;
    engine::SamplingParams& s = req.sampling;
    // Unset, a chat reply may run to the end of the context, a completion to OpenAI's 16 tokens;
    // the engine lowers either to what the context leaves after the prompt.
    s.max_tokens = chat ? static_cast<int32_t>(kMaxTokensLimit) : 16;
    req.max_tokens_is_default = true;
    Validator v;
    bool have_prompt = false;
    bool want_logprobs = false;
    std::optional<int64_t> top_logprobs;
    bool tool_choice_given = false;
    bool stream_options_given = false;  // Not null: null is absent, as for every field.
    for (const auto& kv : obj) {
        std::string key(kv.key());
        const json::value& value = kv.value();
        bool ok = true;
        if (key == "model") {
            const json::string* m = v.string(value, key);
            ok = m != nullptr;
            if (ok) {
                req.model = std::string(*m);
            }
        } else if (chat && key == "messages") {
            std::vector<engine::ChatMessage> messages;
            ok = parse_messages(v, value, messages);
            req.prompt = std::move(messages);
            have_prompt = true;
        } else if (!chat && key == "prompt") {
            ok = parse_prompt(v, value, out);
            have_prompt = true;
        } else if (key == "max_tokens" || key == "max_completion_tokens") {
            // max_completion_tokens, OpenAI's newer name, wins over max_tokens in either order.
            if (!value.is_null()) {
                auto n = v.integer(value, key, 1, kMaxTokensLimit);
                ok = n.has_value();
                if (ok && (key == "max_completion_tokens" || out.max_tokens_param.empty())) {
                    s.max_tokens = static_cast<int32_t>(*n);
                    req.max_tokens_is_default = false;
                    req.max_tokens_field = key;
                    out.max_tokens_param = key;
                }
            }
        } else if (key == "temperature") {
            if (!value.is_null()) {
                auto t = v.number(value, key, 0, 2);
                ok = t.has_value();
                s.temperature = static_cast<float>(t.value_or(1));
                out.temperature_set = true;
            }
        } else if (key == "top_p") {
            if (!value.is_null()) {
                auto p = v.number(value, key, 0, 1);
                ok = p.has_value() && (*p > 0 || v.fail("'top_p' must be greater than 0", key));
                // A positive value below float's range keeps only the most likely token.
                s.top_p = std::max(static_cast<float>(p.value_or(1)),
                                   std::numeric_limits<float>::min());
                out.top_p_set = true;
            }
        } else if (key == "top_k") {
            if (!value.is_null()) {
                // -1 is vLLM's "off", as 0 is here.
                auto k = v.integer(value, key, -1, 1 << 20);
                ok = k.has_value();
                s.top_k = static_cast<int32_t>(std::max<int64_t>(k.value_or(0), 0));
                out.top_k_set = true;
            }
        } else if (key == "seed") {
            if (!value.is_null()) {
                auto seed = v.integer(value, key, std::numeric_limits<int64_t>::min(),
                                      std::numeric_limits<int64_t>::max());
                ok = seed.has_value();
                if (ok) {
                    s.seed = static_cast<uint64_t>(*seed);
                }
            }
        } else if (key == "presence_penalty" || key == "frequency_penalty") {
            if (!value.is_null()) {
                auto p = v.number(value, key, -2, 2);
                ok = p.has_value();
                (key == "presence_penalty" ? s.presence_penalty : s.frequency_penalty) =
                    static_cast<float>(p.value_or(0));
            }
        } else if (!chat && key == "echo") {
            // The prompt comes back before the completion, with its logprobs when asked for.
            if (!value.is_null()) {
                auto b = v.boolean(value, key);
                ok = b.has_value();
                req.echo_prompt = b.value_or(false);
            }
        } else if (key == "repetition_penalty") {
            // vLLM's extensions (repetition_penalty, min_p, min_tokens): see SamplingParams.
            if (!value.is_null()) {
                auto r = v.number(value, key, 0, 2);
                ok = r.has_value() &&
                     (*r > 0 || v.fail("'repetition_penalty' must be greater than 0", key));
                s.repetition_penalty = static_cast<float>(r.value_or(1));
            }
        } else if (key == "min_p") {
            if (!value.is_null()) {
                auto p = v.number(value, key, 0, 1);
                ok = p.has_value();
                s.min_p = static_cast<float>(p.value_or(0));
            }
        } else if (key == "stop_token_ids") {
            if (!value.is_null()) {
                const json::array* ids = value.if_array();
                if (ids == nullptr) {
                    ok = v.fail("'stop_token_ids' must be an array of token ids", key);
                } else if (ids->size() > engine::sampling::kMaxStopTokenIds) {
                    ok = v.fail("'stop_token_ids' may hold at most " +
                                    std::to_string(engine::sampling::kMaxStopTokenIds) + " ids",
                                key);
                }
                for (size_t i = 0; ok && ids != nullptr && i < ids->size(); ++i) {
                    auto id = v.integer((*ids)[i], key + "[" + std::to_string(i) + "]", 0,
                                        std::numeric_limits<int32_t>::max());
                    ok = id.has_value();
                    s.stop_token_ids.push_back(static_cast<engine::TokenId>(id.value_or(0)));
                }
            }
        } else if (key == "min_tokens") {
            if (!value.is_null()) {
                auto n = v.integer(value, key, 0, 1 << 30);
                ok = n.has_value();
                s.min_tokens = static_cast<int32_t>(n.value_or(0));
            }
        } else if (chat && key == "tools") {
            ok = parse_tools(v, value, req.tools);
        } else if (chat && key == "tool_choice") {
            ok = parse_tool_choice(v, value, out, tool_choice_given);
        } else if (chat && key == "parallel_tool_calls") {
            if (!value.is_null()) {
                auto b = v.boolean(value, key);
                ok = b.has_value();
                out.parallel_tool_calls = b.value_or(true);
            }
        } else if (key == "stop") {
            ok = parse_stop(v, value, s.stop);
        } else if (key == "logprobs") {
            if (value.is_null()) {
                continue;
            }
            if (chat) {
                auto b = v.boolean(value, key);
                ok = b.has_value();
                want_logprobs = b.value_or(false);
            } else {
                // Completions: an integer count of alternatives (0..5).
                auto n = v.integer(value, key, 0, 5);
                ok = n.has_value();
                want_logprobs = ok;
                top_logprobs = n;
            }
        } else if (chat && key == "top_logprobs") {
            if (!value.is_null()) {
                top_logprobs = v.integer(value, key, 0, 20);
                ok = top_logprobs.has_value();
            }
        } else if (key == "stream") {
            if (!value.is_null()) {
                auto b = v.boolean(value, key);
                ok = b.has_value();
                out.stream = b.value_or(false);
            }
        } else if (key == "stream_options") {
            stream_options_given = !value.is_null();
            if (value.is_null()) {
                // Unset.
            } else if (!value.is_object()) {
                ok = v.fail("'stream_options' must be an object", key);
            } else {
                for (const auto& opt : value.get_object()) {
                    std::string name = "stream_options." + std::string(opt.key());
                    const bool known = opt.key() == "include_usage" ||
                                       opt.key() == "include_obfuscation" ||
                                       opt.key() == "continuous_usage_stats";
                    if (known && opt.value().is_null()) {
                        // Unset, as at the top level (clients that always send every key).
                    } else if (opt.key() == "include_usage") {
                        auto b = v.boolean(opt.value(), name);
                        ok = ok && b.has_value();
                        out.include_usage = b.value_or(false);
                    } else if (opt.key() == "include_obfuscation") {
                        ok = ok && v.boolean(opt.value(), name).has_value();
                    } else if (opt.key() == "continuous_usage_stats") {
                        // vLLM's usage in every chunk is not made; its default, false, changes
                        // nothing.
                        std::optional<bool> b = v.boolean(opt.value(), name);
                        ok = ok && b.has_value() &&
                             (!*b || v.fail("'" + name +
                                                "' is not supported (the usage comes in the "
                                                "final chunk, with include_usage)",
                                            name));
                    } else {
                        ok = v.fail("unrecognized field '" + name + "'", name);
                    }
                }
            }
        } else if (key == "n") {
            if (!value.is_null()) {
                std::optional<int64_t> n = v.integer(value, key, 1, kMaxChoices);
                ok = n.has_value();
                out.n = static_cast<int32_t>(n.value_or(1));
            }
        } else if (key == "ignore_eos") {
            auto b = value.is_null() ? false : v.boolean(value, key);
            ok = b.has_value();
            s.ignore_eos = b.value_or(false);
        } else if (key == "return_token_ids") {
            auto b = value.is_null() ? false : v.boolean(value, key);
            ok = b.has_value();
            out.return_token_ids = b.value_or(false);
        } else if (key == "logit_bias") {
            ok = parse_logit_bias(v, value, s.logit_bias);
        } else if (key == "chat_template_kwargs" && chat) {
            // vLLM's and SGLang's switches of the chat template; we render each family in
            // code, so only the thinking switch (Qwen3's and GLM-4.5's enable_thinking,
            // DeepSeek-V3.1's thinking) is known. Null is unset, as for every other field.
            if (value.is_null()) {
                // Unset.
            } else if (!value.is_object()) {
                ok = v.fail("'chat_template_kwargs' must be an object", key);
            } else {
                for (const auto& kw : value.get_object()) {
                    const std::string name = "chat_template_kwargs." + std::string(kw.key());
                    const bool known = kw.key() == "enable_thinking" || kw.key() == "thinking";
                    if (known && kw.value().is_null()) {
                        // Unset, as at the top level.
                    } else if (known) {
                        std::optional<bool> b = v.boolean(kw.value(), name);
                        ok = ok && b.has_value();
                        if (ok && req.thinking && *req.thinking != *b) {
                            // The two names of one switch, set both ways: which was meant?
                            ok = v.fail("'chat_template_kwargs.enable_thinking' and "
                                        "'chat_template_kwargs.thinking' disagree",
                                        name);
                        }
                        req.thinking = b;
                    } else {
                        ok = v.fail("'" + name +
                                        "' is not supported (supported: enable_thinking, "
                                        "thinking)",
                                    name);
                    }
                }
            }
        } else {
            ok = parse_unsupported(v, key, value, chat, &s.json.schema);
        }
        if (!ok) {
            return *v.error;
        }
    }
    if (req.model.empty()) {
        return invalid_request("'model' is required", std::string("model"));
    }
    if (!have_prompt) {
        std::string field = chat ? "messages" : "prompt";
        return invalid_request("'" + field + "' is required", field);
    }
    if (out.choices() > kMaxBatchChoices) {
        return invalid_request("'prompt' holds " + std::to_string(out.prompts()) +
                                   " prompts and 'n' is " + std::to_string(out.n) +
                                   ": at most " + std::to_string(kMaxBatchChoices) +
                                   " choices per request (n for each prompt)",
                               std::string("prompt"));
    }
    if (top_logprobs && chat && !want_logprobs && *top_logprobs > 0) {
        return invalid_request("'top_logprobs' requires 'logprobs' to be true",
                               std::string("top_logprobs"));
    }
    // Unset on a completion, max_tokens is OpenAI's 16, not the context's room (which the
    // engine checks min_tokens against, and whose error would then name the room as 16 tokens).
    if (s.min_tokens > s.max_tokens && (!out.max_tokens_param.empty() || !chat)) {
        const bool unset = out.max_tokens_param.empty();
        return invalid_request("'min_tokens' (" + std::to_string(s.min_tokens) +
                                   ") must not exceed '" +
                                   (unset ? std::string("max_tokens") : out.max_tokens_param) +
                                   "' (" + std::to_string(s.max_tokens) +
                                   (unset ? ", its default for /v1/completions" : "") + ")",
                               std::string("min_tokens"));
    }
    // Any stream_options, {} and include_usage false too: OpenAI refuses them all without a
    // stream, and so does the message below.
    if (stream_options_given && !out.stream) {
        return invalid_request("'stream_options' is only allowed when 'stream' is true",
                               std::string("stream_options"));
    }
    if (!tool_choice_given && !req.tools.empty()) {
        out.tool_choice = ToolChoice::kAuto;  // OpenAI's default when tools are present.
    }
    if (req.tools.empty() && out.tool_choice == ToolChoice::kAuto) {
        out.tool_choice = ToolChoice::kNone;  // Nothing to choose from; as OpenAI, not an error.
    }
    if (out.tool_choice != ToolChoice::kNone && req.tools.empty()) {
        return invalid_request("'tool_choice' requires 'tools'", std::string("tool_choice"));
    }
    if (out.tool_choice == ToolChoice::kFunction) {
        const bool declared = std::any_of(req.tools.begin(), req.tools.end(), [&](const auto& t) {
            return t.name == out.tool_choice_function;
        });
        if (!declared) {
            return invalid_request("'tool_choice' names function '" + out.tool_choice_function +
                                       "', which is not in 'tools'",
                                   std::string("tool_choice.function.name"));
        }
    }
    if (out.tool_choice == ToolChoice::kNone) {
        req.tools.clear();  // Not offered: the prompt carries no tools and nothing is parsed.
    }
    s.logprobs = want_logprobs;
    s.top_logprobs = static_cast<int32_t>(top_logprobs.value_or(0));
    return out;
}

}  // namespace edge::daemon::api
