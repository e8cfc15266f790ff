#include "engine/tokenizer/chat_template.h"

#include <boost/json.hpp>

#include "common/json_text.h"
#include "engine/tokenizer/chat_render.h"
#include "engine/tokenizer/utf8.h"

namespace edge::engine::tokenizer {

namespace {

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";
constexpr std::string_view kGMask = "[gMASK]";
constexpr std::string_view kGlmAssistant = "<|assistant|>";
constexpr std::string_view kImMiddle = "<|im_middle|>";
using namespace render;

// {"type": "function", "function": {"name", "description", "parameters"}} per tool.
Result<json::array> tools_json(std::span<const ToolSpec> tools) {
    json::array out;
    for (size_t i = 0; i < tools.size(); ++i) {
        const ToolSpec& t = tools[i];
        std::error_code ec;
        json::value params = parse_json(t.parameters_json.empty() ? "{}" : t.parameters_json, ec);
        if (ec || !params.is_object()) {
            return invalid_argument_error("tools[" + std::to_string(i) +
                                          "].function.parameters: not a JSON object");
        }
        json::object fn;
        fn["name"] = t.name;
        if (!t.description.empty()) {
            fn["description"] = t.description;
        }
        fn["parameters"] = std::move(params);
        json::object tool;
        tool["type"] = "function";
        tool["function"] = std::move(fn);
        out.push_back(std::move(tool));
    }
    return out;
}

// Python's str.isspace() for one code point (what Jinja's strip() removes).
bool python_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

// Length of the valid code point at the start of s when it is a space, else 0.
size_t space_at(std::string_view s) {
    const size_t n = utf8_valid_sequence(s);
    return n > 0 && python_space(utf8_decode(s, n)) ? n : 0;
}

// Python's str.strip(): Unicode whitespace off both ends (invalid bytes are kept).
std::string strip(std::string_view s) {
    while (size_t n = space_at(s)) {
        s.remove_prefix(n);
    }
    while (!s.empty()) {
        size_t start = s.size() - 1;  // Back to the lead byte of the last code point.
        while (start > 0 && s.size() - start < 4 &&
               (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
            --start;
        }
        const size_t n = space_at(s.substr(start));
        if (n == 0 || start + n != s.size()) {
            break;
        }
        s.remove_suffix(n);
    }
    return std::string(s);
}

// Python's str.lstrip(chars) / rstrip(chars).
std::string_view lstrip(std::string_view s, std::string_view chars) {
    const size_t b = s.find_first_not_of(chars);
    return b == std::string_view::npos ? std::string_view() : s.substr(b);
}
std::string_view rstrip(std::string_view s, std::string_view chars) {
    const size_t e = s.find_last_not_of(chars);
    return e == std::string_view::npos ? std::string_view() : s.substr(0, e + 1);
}

// An assistant message's reasoning and answer, as the Qwen3 and GLM-4.5 templates split them:
// reasoning_content when the client sent it; else, when content holds "</think>", the text
// before the first one (after the last "<think>" before it) and the text after the last one.
struct Reasoned {
    std::string reasoning;
    std::string content;
};
Reasoned split_reasoning(const ChatMessage& m) {
    if (m.reasoning_content) {
        return {*m.reasoning_content, m.content};
    }
    constexpr std::string_view kOpen = "<think>", kClose = "</think>";
    const std::string_view c = m.content;
    const size_t first = c.find(kClose);
    if (first == std::string_view::npos) {
        return {"", m.content};
    }
    std::string_view reasoning = rstrip(c.substr(0, first), "\n");
    if (const size_t open = reasoning.rfind(kOpen); open != std::string_view::npos) {
        reasoning.remove_prefix(open + kOpen.size());
    }
    reasoning = lstrip(reasoning, "\n");
    return {std::string(reasoning),
            std::string(lstrip(c.substr(c.rfind(kClose) + kClose.size()), "\n"))};
}


// `thinking`: the vocabulary has Qwen3's <think> tokens, and the template's reasoning rules
// apply (Qwen2.5's ChatML has none): an assistant turn before the last user query keeps only its
// answer; one after it (a tool-calling loop) keeps its reasoning in a <think> block, as the last
// message always does. `opens_thought`: the assistant turn opens with <think>\n (a thinking-only
// template), unless thinking is switched off (a forced tool call), which closes it at once.
Status chatml(std::span<const ChatMessage> messages, const json::array& tools, bool thinking,
              bool opens_thought, const ChatOptions& options, Builder* b) {
    // The last user message that is a query (not a tool response a client wrapped itself).
    size_t last_query = messages.size() - 1;
    for (size_t i = messages.size(); i-- > 0;) {
        const std::string& c = messages[i].content;
        const bool wrapped = c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
        if (messages[i].role == "user" && !wrapped) {
            last_query = i;
            break;
        }
    }
    size_t first = 0;
    if (!tools.empty()) {
        b->marker(kImStart);
        b->text("system\n");
        if (messages[0].role == "system") {
            b->text(messages[0].content + "\n\n");
            first = 1;
        }
        b->text(kToolsIntro);
        for (const auto& t : tools) {
            std::string s;
            append_json(t, JsonStyle::kPython, &s);
            b->text("\n" + s);
        }
        b->tagged(
            "\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
            "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
        b->marker(kImEnd);
        b->text("\n");
    }
    for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "tool") {
            if (i == 0 || messages[i - 1].role != "tool") {
                b->marker(kImStart);
                b->text("user");
            }
            b->tagged("\n<tool_response>\n");
            b->text(m.content);
            b->tagged("\n</tool_response>");
            if (i + 1 == messages.size() || messages[i + 1].role != "tool") {
                b->marker(kImEnd);
                b->text("\n");
            }
            continue;
        }
        b->marker(kImStart);
        std::string content = m.content;
        // The template's test before the first call is on the content before its lstrip: a
        // content of "\n" is written as nothing and still gets the call its newline.
        bool has_content = !content.empty();
        if (m.role == "assistant" && thinking) {
            Reasoned r = split_reasoning(m);
            content = std::move(r.content);
            has_content = !content.empty();
            if (i > last_query && (i + 1 == messages.size() || !r.reasoning.empty())) {
                b->text(m.role + "\n");
                b->marker("<think>");
                b->text("\n" + std::string(rstrip(lstrip(r.reasoning, "\n"), "\n")) + "\n");
                b->marker("</think>");
                b->text("\n\n");
                content = std::string(lstrip(content, "\n"));
            } else {
                b->text(m.role + "\n");
            }
        } else {
            b->text(m.role + "\n");
        }
        b->text(content);
        for (size_t j = 0; j < m.tool_calls.size(); ++j) {
            const ChatToolCall& c = m.tool_calls[j];
            b->text((j > 0 || has_content) ? "\n" : "");
            b->tagged("<tool_call>\n");
            b->text("{\"name\": " + json::serialize(json::value(c.name)) +
                    ", \"arguments\": " + (c.arguments.empty() ? "{}" : c.arguments) + "}");
            b->tagged("\n</tool_call>");
        }
        b->marker(kImEnd);
        b->text("\n");
    }
    b->marker(kImStart);
    b->text("assistant\n");
    if (thinking && options.thinking == false) {  // enable_thinking false: an empty thought.
        b->marker("<think>");
        b->text("\n\n");
        b->marker("</think>");
        b->text("\n\n");
    } else if (thinking && opens_thought) {
        b->marker("<think>");
        b->text("\n");
    }
    return ok_status();
}

Status glm45(std::span<const ChatMessage> messages, const json::array& tools,
             const ChatOptions& options, Builder* b) {
    int64_t last_user = -1;  // None: every assistant turn comes after it.
    for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].role == "user") {
            last_user = static_cast<int64_t>(i);
        }
    }
    b->marker(kGMask);
    b->marker("<sop>");
    if (!tools.empty()) {
        b->marker("<|system|>");
        b->text("\n");
        b->text(kToolsIntro);
        b->text("\n");
        for (const auto& t : tools) {
            std::string s;
            append_json(t, JsonStyle::kPython, &s);
            b->text(s + "\n");
        }
        b->text(
            "</tools>\n\nFor each function call, output the function name and arguments within "
            "the following XML format:\n");
        b->marker("<tool_call>");
        b->text("{function-name}\n");
        for (int k = 1; k <= 2; ++k) {
            b->marker("<arg_key>");
            b->text("{arg-key-" + std::to_string(k) + "}");
            b->marker("</arg_key>");
            b->text("\n");
            b->marker("<arg_value>");
            b->text("{arg-value-" + std::to_string(k) + "}");
            b->marker("</arg_value>");
            b->text("\n");
        }
        b->text("...\n");
        b->marker("</tool_call>");
    }
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (m.role == "system" || m.role == "user") {
            b->marker(m.role == "system" ? "<|system|>" : "<|user|>");
            b->text("\n" + m.content);
            // With thinking off, the template also tells every user turn (the model was trained
            // to read it across turns, not only from the empty thought at the end).
            if (m.role == "user" && options.thinking == false && !m.content.ends_with("/nothink")) {
                b->text("/nothink");
            }
        } else if (m.role == "assistant") {
            b->marker(kGlmAssistant);
            b->text("\n");
            // The reasoning stays only after the last user message (a tool-calling loop).
            const Reasoned r = split_reasoning(m);
            b->marker("<think>");
            if (static_cast<int64_t>(i) > last_user && !strip(r.reasoning).empty()) {
                b->text(strip(r.reasoning));
            }
            b->marker("</think>");
            const std::string content = strip(r.content);
            if (!content.empty()) {
                b->text("\n" + content);
            }
            for (size_t j = 0; j < m.tool_calls.size(); ++j) {
                const ChatToolCall& c = m.tool_calls[j];
                std::error_code ec;
                json::value args = parse_json(c.arguments.empty() ? "{}" : c.arguments, ec);
                if (ec || !args.is_object()) {
                    return invalid_argument_error(where + ".tool_calls[" + std::to_string(j) +
                                                  "].function.arguments: not a JSON object");
                }
                b->text("\n");
                b->marker("<tool_call>");
                b->text(c.name + "\n");
                for (const auto& kv : args.get_object()) {
                    b->marker("<arg_key>");
                    b->text(kv.key());
                    b->marker("</arg_key>");
                    b->text("\n");
                    b->marker("<arg_value>");
                    if (kv.value().is_string()) {
                        b->text(kv.value().get_string());
                    } else {
                        std::string s;
                        append_json(kv.value(), JsonStyle::kPython, &s);
                        b->text(s);
                    }
                    b->marker("</arg_value>");
                    b->text("\n");
                }
                b->marker("</tool_call>");
            }
        } else if (m.role == "tool") {
            if (i == 0 || messages[i - 1].role != "tool") {
                b->marker("<|observation|>");
            }
            b->text("\n");
            b->marker("<tool_response>");
            b->text("\n" + m.content + "\n");
            b->marker("</tool_response>");
        } else {
            return invalid_argument_error(where + ".role: \"" + m.role +
                                          "\" is not system, user, assistant or tool");
        }
    }
    b->marker(kGlmAssistant);
    if (options.thinking == false) {  // enable_thinking false: an empty thought.
        b->text("\n");
        b->marker("<think>");
        b->marker("</think>");
    }
    return ok_status();
}

Status kimi_k2(std::span<const ChatMessage> messages, const json::array& tools, Builder* b) {
    if (!tools.empty()) {
        b->marker("<|im_system|>");
        b->text("tool_declare");
        b->marker(kImMiddle);
        std::string s;
        append_json(json::value(tools), JsonStyle::kPython, &s);
        b->text(s);
        b->marker(kImEnd);
    }
    if (messages[0].role != "system") {
        b->marker("<|im_system|>");
        b->text("system");
        b->marker(kImMiddle);
        b->text("You are Kimi, an AI assistant created by Moonshot AI.");
        b->marker(kImEnd);
    }
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "user") {
            b->marker("<|im_user|>");
        } else if (m.role == "assistant") {
            b->marker("<|im_assistant|>");
        } else if (m.role == "system" || m.role == "tool") {
            b->marker("<|im_system|>");
        } else {
            return invalid_argument_error("messages[" + std::to_string(i) + "].role: \"" + m.role +
                                          "\" is not system, user, assistant or tool");
        }
        b->text(m.name.empty() ? m.role : m.name);
        b->marker(kImMiddle);
        if (m.role == "tool") {
            b->text("## Return of " + m.tool_call_id + "\n" + m.content);
        } else {
            b->text(m.content);
        }
        if (!m.tool_calls.empty()) {
            b->marker("<|tool_calls_section_begin|>");
            for (const ChatToolCall& c : m.tool_calls) {
                b->marker("<|tool_call_begin|>");
                b->text(c.id);
                b->marker("<|tool_call_argument_begin|>");
                b->text(c.arguments.empty() ? "{}" : c.arguments);
                b->marker("<|tool_call_end|>");
            }
            b->marker("<|tool_calls_section_end|>");
        }
        b->marker(kImEnd);
    }
    b->marker("<|im_assistant|>");
    b->text("assistant");
    b->marker(kImMiddle);
    return ok_status();
}

}  // namespace

std::string_view tool_call_format_of(ChatFormat format) {
    switch (format) {
        case ChatFormat::kGlm45:
            return "glm4_5";
        case ChatFormat::kKimiK2:
            return "kimi_k2";
        case ChatFormat::kDeepSeekV3:
            return "deepseek_v3";
        case ChatFormat::kDeepSeekV31:
            return "deepseek_v3_1";
        case ChatFormat::kChatMl:
        case ChatFormat::kChatMlThinking:
            break;
    }
    return "hermes";
}

Result<ChatFormat> choose_chat_format(std::string_view configured, const TokenizerConfig& config,
                                      const Tokenizer& tokenizer) {
    if (configured == "chatml") {
        return ChatFormat::kChatMl;
    }
    if (configured == "chatml_thinking") {
        return ChatFormat::kChatMlThinking;
    }
    if (configured == "glm4_5") {
        return ChatFormat::kGlm45;
    }
    if (configured == "kimi_k2") {
        return ChatFormat::kKimiK2;
    }
    if (configured == "deepseek_v3") {
        return ChatFormat::kDeepSeekV3;
    }
    if (configured == "deepseek_v3_1") {
        return ChatFormat::kDeepSeekV31;
    }
    if (!configured.empty() && configured != "auto") {
        return invalid_argument_error("chat_template: unknown format \"" + std::string(configured) +
                                      "\" (known: auto, " + std::string(kChatFormatNames) + ")");
    }
    // Checkpoints ship Jinja; recognise the family by its control tokens.
    const std::string& t = config.chat_template;
    if (t.find(kImMiddle) != std::string::npos) {
        return ChatFormat::kKimiK2;
    }
    if (t.find(kGMask) != std::string::npos && t.find(kGlmAssistant) != std::string::npos) {
        return ChatFormat::kGlm45;
    }
    if (t.find(kImStart) != std::string::npos) {
        // The generation prompt of a thinking-only template, its newlines written as Jinja
        // escapes or as they are.
        const bool opens = t.find("assistant\\n<think>\\n'") != std::string::npos ||
                           t.find("assistant\\n<think>\\n\"") != std::string::npos ||
                           t.find("assistant\n<think>\n'") != std::string::npos;
        return opens ? ChatFormat::kChatMlThinking : ChatFormat::kChatMl;
    }
    if (t.find(kDsUser) != std::string::npos && t.find(kDsAssistant) != std::string::npos) {
        if (t.find("<think>") == std::string::npos) {
            return ChatFormat::kDeepSeekV3;
        }
        // V3.1 switches thinking on and off; R1's template thinks always (not recognised).
        if (t.find(kThinkEnd) != std::string::npos && t.find("thinking") != std::string::npos &&
            t.find("is_last_user") != std::string::npos) {
            return ChatFormat::kDeepSeekV31;
        }
    }
    if (t.empty()) {
        if (tokenizer.token_id(kImMiddle) >= 0 && tokenizer.token_id(kImEnd) >= 0) {
            return ChatFormat::kKimiK2;
        }
        if (tokenizer.token_id(kGMask) >= 0 && tokenizer.token_id(kGlmAssistant) >= 0) {
            return ChatFormat::kGlm45;
        }
        if (tokenizer.token_id(kImStart) >= 0 && tokenizer.token_id(kImEnd) >= 0) {
            return ChatFormat::kChatMl;
        }
        if (tokenizer.token_id(kDsUser) >= 0 && tokenizer.token_id(kDsAssistant) >= 0) {
            return ChatFormat::kDeepSeekV3;
        }
        return not_found_error(
            "chat_template: the checkpoint has no chat template and its vocabulary matches no "
            "known format; set the model's chat_template to one of: " +
            std::string(kChatFormatNames));
    }
    return not_found_error(
        "chat_template: the checkpoint's chat template is not recognised; set "
        "the model's chat_template to one of: " +
        std::string(kChatFormatNames));
}

Result<ChatTemplate> ChatTemplate::create(ChatFormat format, const Tokenizer* tokenizer,
                                          std::string_view shipped_template) {
    std::vector<std::string_view> required;
    switch (format) {
        case ChatFormat::kChatMl:
            required = {kImStart, kImEnd};
            break;
        case ChatFormat::kChatMlThinking:
            required = {kImStart, kImEnd, "<think>", "</think>"};
            break;
        case ChatFormat::kGlm45:
            required = {kGMask,     "<sop>",       "<|system|>",
                        "<|user|>", kGlmAssistant, "<|observation|>"};
            break;
        case ChatFormat::kKimiK2:
            required = {"<|im_system|>", "<|im_user|>", "<|im_assistant|>", kImMiddle, kImEnd};
            break;
        case ChatFormat::kDeepSeekV3:
            required = {kDsBos,        kDsEos,         kDsUser,     kDsAssistant, kDsCallsBegin,
                        kDsCallsEnd,   kDsCallBegin,   kDsCallEnd,  kDsSep,       kDsOutputsBegin,
                        kDsOutputsEnd, kDsOutputBegin, kDsOutputEnd};
            break;
        case ChatFormat::kDeepSeekV31:
            required = {kDsBos,       kDsEos,     kDsUser, kDsAssistant,   kDsCallsBegin,
                        kDsCallsEnd,  kDsCallBegin, kDsCallEnd, kDsSep, kDsOutputBegin,
                        kDsOutputEnd, kThinkEnd};
            break;
    }
    for (std::string_view token : required) {
        if (tokenizer->token_id(token) < 0) {
            return not_found_error("chat_template: format " +
                                   std::string(tool_call_format_of(format)) + " needs the " +
                                   std::string(token) + " token, which the tokenizer lacks");
        }
    }
    const bool thinks =
        tokenizer->token_id("<think>") >= 0 && tokenizer->token_id("</think>") >= 0 &&
        (shipped_template.empty() || shipped_template.find("think>") != std::string_view::npos);
    return ChatTemplate(format, tokenizer, thinks);
}

Result<std::vector<Piece>> ChatTemplate::pieces(std::span<const ChatMessage> messages,
                                                std::span<const ToolSpec> tools,
                                                const ChatOptions& options) const {
    if (messages.empty()) {
        return invalid_argument_error("messages: empty");
    }
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string& role = messages[i].role;
        if (role.empty() || role.find('\n') != std::string::npos) {
            return invalid_argument_error("messages[" + std::to_string(i) +
                                          "].role: empty or contains a newline");
        }
    }
    EDGE_ASSIGN_OR_RETURN(json::array tj, tools_json(tools));
    Builder b;
    switch (format_) {
        case ChatFormat::kChatMl:
        case ChatFormat::kChatMlThinking:
            EDGE_RETURN_IF_ERROR(
                chatml(messages, tj, thinks_, format_ == ChatFormat::kChatMlThinking, options, &b));
            break;
        case ChatFormat::kGlm45:
            EDGE_RETURN_IF_ERROR(glm45(messages, tj, options, &b));
            break;
        case ChatFormat::kKimiK2:
            EDGE_RETURN_IF_ERROR(kimi_k2(messages, tj, &b));
            break;
        case ChatFormat::kDeepSeekV3:
            EDGE_RETURN_IF_ERROR(deepseek_v3(messages, tj, &b));
            break;
        case ChatFormat::kDeepSeekV31:
            EDGE_RETURN_IF_ERROR(deepseek_v3_1(messages, tj, options, &b));
            break;
    }
    return std::move(b.pieces);
}

Result<std::vector<TokenId>> ChatTemplate::render(std::span<const ChatMessage> messages,
                                                  std::span<const ToolSpec> tools,
                                                  const ChatOptions& options) const {
    EDGE_ASSIGN_OR_RETURN(std::vector<Piece> ps, pieces(messages, tools, options));
    std::vector<TokenId> ids;
    for (const Piece& p : ps) {
        if (p.marker) {
            const TokenId id = tokenizer_->token_id(p.text);
            if (id >= 0) {
                ids.push_back(id);
                continue;
            }
        }
        auto encoded = tokenizer_->encode(p.text, /*parse_special=*/false);
        if (!encoded.ok()) {
            return encoded.status().with_context("messages");
        }
        ids.insert(ids.end(), encoded->begin(), encoded->end());
    }
    return ids;
}

Result<std::vector<TokenId>> ChatTemplate::render_assistant_prefix(std::string_view text) const {
    auto ids = tokenizer_->encode(text, /*parse_special=*/true);
    if (!ids.ok()) {
        return ids.status().with_context("assistant_prefix");
    }
    return ids;
}

std::vector<TokenId> ChatTemplate::tool_call_marker_ids() const {
    std::vector<std::string_view> markers;
    switch (format_) {
        case ChatFormat::kChatMl:
        case ChatFormat::kChatMlThinking:
            markers = {"<tool_call>", "</tool_call>"};
            break;
        case ChatFormat::kGlm45:
            markers = {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                       "</arg_value>"};
            break;
        case ChatFormat::kKimiK2:
            markers = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                       "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                       "<|tool_call_end|>"};
            break;
        case ChatFormat::kDeepSeekV3:
        case ChatFormat::kDeepSeekV31:
            markers = {kDsCallsBegin, kDsCallsEnd, kDsCallBegin, kDsCallEnd, kDsSep};
            break;
    }
    std::vector<TokenId> ids;
    for (std::string_view m : markers) {
        if (const TokenId id = tokenizer_->token_id(m); id >= 0) {
            ids.push_back(id);
        }
    }
    return ids;
}

std::string ChatTemplate::render_text(std::span<const ChatMessage> messages,
                                      std::span<const ToolSpec> tools,
                                      const ChatOptions& options) const {
    auto ps = pieces(messages, tools, options);
    std::string out;
    if (ps.ok()) {
        for (const Piece& p : *ps) {
            out += p.text;
        }
    }
    return out;
}

}  // namespace edge::engine::tokenizer
