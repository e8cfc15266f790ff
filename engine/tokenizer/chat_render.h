#pragma once

// Internal to the chat templates (engine/tokenizer/chat_template.h): the prompt builder the
// families render into, the JSON writer of their `tojson`, and the DeepSeek families' renderers
// (chat_render_deepseek.cc), which share the DeepSeek control tokens.
//
// Threading: free functions and a value type; no shared state.

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json.hpp>

#include "common/result.h"
#include "engine/generator.h"
#include "engine/tokenizer/chat_template.h"

namespace edge::engine::tokenizer::render {

namespace json = boost::json;
using Piece = ChatTemplate::Piece;

constexpr std::string_view kDsBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kDsEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kDsUser = "<｜User｜>";
constexpr std::string_view kDsAssistant = "<｜Assistant｜>";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kDsOutputsBegin = "<｜tool▁outputs▁begin｜>";
constexpr std::string_view kDsOutputsEnd = "<｜tool▁outputs▁end｜>";
constexpr std::string_view kDsOutputBegin = "<｜tool▁output▁begin｜>";
constexpr std::string_view kDsOutputEnd = "<｜tool▁output▁end｜>";
constexpr std::string_view kThinkEnd = "</think>";  // V3.1: a special token.

constexpr std::string_view kToolsIntro =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>";

// The prompt as pieces: control tokens (markers) and text, adjacent text merged.
struct Builder {
    std::vector<Piece> pieces;
    void marker(std::string_view m) { pieces.push_back({true, std::string(m)}); }
    void text(std::string_view t) {
        if (t.empty()) {
            return;
        }
        if (!pieces.empty() && !pieces.back().marker) {
            pieces.back().text.append(t);
        } else {
            pieces.push_back({false, std::string(t)});
        }
    }
    // Template-authored text whose <tool_call>-style tags are markers (never message content).
    void tagged(std::string_view t) {
        static constexpr std::string_view kTags[] = {"<tool_call>", "</tool_call>",
                                                     "<tool_response>", "</tool_response>"};
        while (!t.empty()) {
            size_t best = std::string_view::npos;
            std::string_view tag;
            for (std::string_view k : kTags) {
                const size_t at = t.find(k);
                if (at < best) {
                    best = at;
                    tag = k;
                }
            }
            if (best == std::string_view::npos) {
                text(t);
                return;
            }
            text(t.substr(0, best));
            marker(tag);
            t.remove_prefix(best + tag.size());
        }
    }
};

// DeepSeek-V3's and V3.1's (non-thinking) chat formats; `tools` as tools_json() makes them.
Status deepseek_v3(std::span<const ChatMessage> messages, const json::array& tools, Builder* b);
Status deepseek_v3_1(std::span<const ChatMessage> messages, const json::array& tools,
                     const ChatOptions& options, Builder* b);

}  // namespace edge::engine::tokenizer::render
