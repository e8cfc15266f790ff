// The DeepSeek chat formats (engine/tokenizer/chat_render.h): V3's and V3.1's.

#include <string>

#include "common/json_text.h"
#include "engine/tokenizer/chat_render.h"

namespace edge::engine::tokenizer::render {
namespace {

// One call as DeepSeek-V3 writes it, from <｜tool▁call▁begin｜> to <｜tool▁call▁end｜>.
void deepseek_call(const ChatToolCall& c, Builder* b) {
    b->marker(kDsCallBegin);
    b->text("function");
    b->marker(kDsSep);
    b->text(c.name + "\n```json\n" + (c.arguments.empty() ? "{}" : c.arguments) + "\n```");
    b->marker(kDsCallEnd);
}

// BOS, the system messages joined by "\n\n", then the offered tools (which neither template
// renders) with the call syntax the model writes: V3's "function", name and fenced JSON, or
// V3.1's name and bare JSON.
void system_and_tools(std::span<const ChatMessage> messages, const json::array& tools, bool v3_1,
                      Builder* b) {
    b->marker(kDsBos);
    std::string system;
    bool first_system = true;
    for (const ChatMessage& m : messages) {
        if (m.role == "system") {
            system += (first_system ? "" : "\n\n") + m.content;
            first_system = false;
        }
    }
    b->text(system);
    if (tools.empty()) {
        return;
    }
    b->text(system.empty() ? "" : "\n\n");
    b->text(kToolsIntro);
    for (const auto& t : tools) {
        std::string s;
        append_json(t, JsonStyle::kPython, &s);
        b->text("\n" + s);
    }
    b->text("\n</tools>\n\nTo call functions, write ");
    b->marker(kDsCallsBegin);
    b->text(", then each call as ");
    b->marker(kDsCallBegin);
    if (v3_1) {
        b->text("{function-name}");
        b->marker(kDsSep);
        b->text("{arguments as a JSON object}");
    } else {
        b->text("function");
        b->marker(kDsSep);
        b->text("{function-name}\n```json\n{arguments as a JSON object}\n```");
    }
    b->marker(kDsCallEnd);
    b->text(v3_1 ? " (calls one after another, nothing between them), and after the last call "
                 : " (calls separated by a newline), and after the last call ");
    b->marker(kDsCallsEnd);
    b->text(".");
}

}  // namespace

// DeepSeek-V3's shipped template, quirks included, since the served model saw prompts rendered by
// it: system messages are joined ("\n\n") right after BOS; only the conversation's first tool call
// opens with <｜Assistant｜><｜tool▁calls▁begin｜>, each later one (in any message) is "\n" + call
// + <｜tool▁calls▁end｜><｜end▁of▁sentence｜>; an assistant message's tool calls are rendered only
// when it has no content (OpenAI's `content: null`, here ""); the first tool result opens
// <｜tool▁outputs▁begin｜>, later ones are "\n" + result; after tool results the prompt ends with
// <｜tool▁outputs▁end｜> instead of <｜Assistant｜>. Tools, which the template never renders, are
// declared after the system prompt, with the call syntax the model writes.
Status deepseek_v3(std::span<const ChatMessage> messages, const json::array& tools, Builder* b) {
    system_and_tools(messages, tools, false, b);
    bool called = false;       // The template's ns.is_first.
    bool after_tool = false;   // ns.is_tool.
    bool first_output = true;  // ns.is_output_first.
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "system") {
            continue;
        }
        if (m.role == "user") {
            after_tool = false;
            b->marker(kDsUser);
            b->text(m.content);
        } else if (m.role == "assistant" && m.content.empty() && !m.tool_calls.empty()) {
            after_tool = false;
            for (const ChatToolCall& c : m.tool_calls) {
                if (!called) {
                    b->marker(kDsAssistant);
                    b->marker(kDsCallsBegin);
                    deepseek_call(c, b);
                    called = true;
                } else {
                    b->text("\n");
                    deepseek_call(c, b);
                    b->marker(kDsCallsEnd);
                    b->marker(kDsEos);
                }
            }
        } else if (m.role == "assistant") {
            b->marker(after_tool ? kDsOutputsEnd : kDsAssistant);
            b->text(m.content);
            b->marker(kDsEos);
            after_tool = false;
        } else if (m.role == "tool") {
            after_tool = true;
            if (first_output) {
                b->marker(kDsOutputsBegin);
                first_output = false;
            } else {
                b->text("\n");
            }
            b->marker(kDsOutputBegin);
            b->text(m.content);
            b->marker(kDsOutputEnd);
        } else {
            return invalid_argument_error("messages[" + std::to_string(i) + "].role: \"" + m.role +
                                          "\" is not system, user, assistant or tool");
        }
    }
    b->marker(after_tool ? kDsOutputsEnd : kDsAssistant);
    return ok_status();
}

// DeepSeek-V3.1's shipped template in its default, non-thinking mode (`thinking` unset): system
// messages joined ("\n\n") right after BOS; an assistant turn that follows a user turn opens with
// <｜Assistant｜></think> (the empty thought); an assistant message's reasoning (text up to its
// first </think>) is dropped; tool calls are <｜tool▁calls▁begin｜> then each call as
// <｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>, after the message's
// content, then <｜tool▁calls▁end｜><｜end▁of▁sentence｜>; each tool result is
// <｜tool▁output▁begin｜>{content}<｜tool▁output▁end｜>, and the reply to it follows with no
// opening. The prompt ends with <｜Assistant｜></think> after a user turn, and with nothing after
// tool results (the model writes its reply next). Tools, which the template never renders, are
// declared after the system prompt in the call syntax the model writes.
Status deepseek_v3_1(std::span<const ChatMessage> messages, const json::array& tools,
                     const ChatOptions& options, Builder* b) {
    system_and_tools(messages, tools, true, b);
    bool last_user = false;  // The template's ns.is_last_user.
    bool after_tool = false;  // ns.is_tool.
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "system") {
            continue;
        }
        if (m.role == "user") {
            after_tool = false;
            last_user = true;
            b->marker(kDsUser);
            b->text(m.content);
        } else if (m.role == "assistant" && !m.tool_calls.empty()) {
            if (last_user) {
                b->marker(kDsAssistant);
                b->marker(kThinkEnd);
            }
            last_user = false;
            after_tool = false;
            b->text(m.content);
            b->marker(kDsCallsBegin);
            for (const ChatToolCall& c : m.tool_calls) {
                b->marker(kDsCallBegin);
                b->text(c.name);
                b->marker(kDsSep);
                b->text(c.arguments.empty() ? "{}" : c.arguments);
                b->marker(kDsCallEnd);
            }
            b->marker(kDsCallsEnd);
            b->marker(kDsEos);
        } else if (m.role == "assistant") {
            if (last_user) {
                b->marker(kDsAssistant);
                b->marker(kThinkEnd);
            }
            last_user = false;
            std::string_view content = m.content;
            if (!after_tool) {
                if (const size_t at = content.find(kThinkEnd); at != std::string_view::npos) {
                    content.remove_prefix(at + kThinkEnd.size());
                }
            }
            after_tool = false;
            b->text(content);
            b->marker(kDsEos);
        } else if (m.role == "tool") {
            last_user = false;
            after_tool = true;
            b->marker(kDsOutputBegin);
            b->text(m.content);
            b->marker(kDsOutputEnd);
        } else {
            return invalid_argument_error("messages[" + std::to_string(i) + "].role: \"" + m.role +
                                          "\" is not system, user, assistant or tool");
        }
    }
    if (last_user && !after_tool) {
        b->marker(kDsAssistant);
        // `thinking` true: the model thinks first; the template's default answers at once.
        b->marker(options.thinking == true ? std::string_view("<think>") : kThinkEnd);
    }
    return ok_status();
}

}  // namespace edge::engine::tokenizer::render
