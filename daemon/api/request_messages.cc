#include "daemon/api/request_messages.h"

#include <optional>
#include <string>

#include "daemon/api/request_tools.h"

namespace edge::daemon::api {

namespace json = boost::json;

namespace {

// Bounds that keep a hostile request cheap before it reaches the engine.
constexpr size_t kMaxMessages = 4096;

// `assistant`: the content of an assistant message, whose parts may also be refusals
// ({"type": "refusal", "refusal": text}, as OpenAI returns a refused answer and its clients
// send the conversation back); a refusal is what the assistant said, its text as a text part's.
bool parse_content(Validator& v, const json::value& content, const std::string& name,
                   bool assistant, std::string& out) {
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
        if (*t != "text" && !(assistant && *t == "refusal")) {
            return v.fail("content part type '" + std::string(*t) + "' is not supported" +
                              (assistant ? " (text or refusal)" : " (text)"),
                          part_name + ".type");
        }
        const std::string key = *t == "text" ? "text" : "refusal";  // Where its text is.
        for (const auto& kv : part) {
            if (kv.key() != "type" && kv.key() != key) {
                std::string p = part_name + "." + std::string(kv.key());
                return v.fail("unrecognized field '" + p + "'", p);
            }
        }
        const json::value* text = part.if_contains(key);
        if (text == nullptr) {
            return v.fail("'" + part_name + "." + key + "' is required", part_name + "." + key);
        }
        const json::string* s = v.string(*text, part_name + "." + key);
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

}  // namespace

bool parse_messages(Validator& v, const json::value& value, std::vector<engine::ChatMessage>& out) {
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
        std::optional<std::string> refusal;  // The message's `refusal` field.
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
                if (!parse_content(v, kv.value(), field, msg.role == "assistant", msg.content)) {
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
                if (!kv.value().is_null()) {
                    const json::string* text = v.string(kv.value(), field);
                    if (text == nullptr) {
                        return false;
                    }
                    refusal = std::string(*text);
                }
            } else if (key == "tool_calls" && msg.role == "assistant") {
                if (!parse_history_tool_calls(v, kv.value(), field, msg.tool_calls)) {
                    return false;
                }
            } else if (key == "annotations" && msg.role == "assistant") {
                // An earlier answer's citations (url_citation), which openai-python's
                // message.model_dump() sends back, null when there were none: metadata about the
                // content, which the template does not show the model.
                if (!kv.value().is_null() && !kv.value().is_array()) {
                    return v.fail("'" + field + "' must be an array", field);
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
        // OpenAI's refused answer is message.refusal with a null content, and its clients send
        // it back so: that text is what the assistant said. Beside content (its refusal parts
        // hold the same text), the field adds nothing.
        if (refusal && msg.role == "assistant" && msg.content.empty()) {
            msg.content = std::move(*refusal);
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

}  // namespace edge::daemon::api
