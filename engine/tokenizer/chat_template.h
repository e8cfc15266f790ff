#pragma once

// ChatTemplate renders chat `messages` into prompt token ids for one model family. The family is
// chosen from the checkpoint (the shipped Jinja template's markers) or named in the model config;
// we do not run Jinja: each family is a small renderer written to match its template. Today:
// ChatML (Qwen). GLM-4.5 and Kimi K2 get their own ChatFormat value and render function.
//
// Control tokens are inserted as ids and message text is encoded with special-token parsing off,
// so a message cannot inject `<|im_start|>`. Threading: immutable; thread-safe.

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/generator.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_config.h"

namespace edge::engine::tokenizer {

enum class ChatFormat {
    kChatMl,  // <|im_start|>{role}\n{content}<|im_end|>\n ..., then <|im_start|>assistant\n
};

// "chatml" -> kChatMl; "auto" (or "") -> from the checkpoint's template, else from its vocabulary.
// kInvalidArgument for an unknown name; kNotFound when "auto" finds no known format.
Result<ChatFormat> choose_chat_format(std::string_view configured, const TokenizerConfig& config,
                                      const Tokenizer& tokenizer);

class ChatTemplate {
public:
    // kNotFound when the tokenizer lacks the format's control tokens.
    static Result<ChatTemplate> create(ChatFormat format, const Tokenizer* tokenizer);

    ChatFormat format() const { return format_; }

    // Prompt ids for `messages` followed by the assistant turn's opening. kInvalidArgument for
    // no messages, an empty or multi-line role, or text that is not valid UTF-8.
    Result<std::vector<TokenId>> render(std::span<const ChatMessage> messages) const;

    // The same prompt as text (for logs and tests).
    std::string render_text(std::span<const ChatMessage> messages) const;

private:
    ChatTemplate(ChatFormat format, const Tokenizer* tokenizer)
        : format_(format), tokenizer_(tokenizer) {}

    ChatFormat format_;
    const Tokenizer* tokenizer_;
    TokenId begin_ = -1;  // ChatML <|im_start|>
    TokenId end_ = -1;    // ChatML <|im_end|>
};

}  // namespace edge::engine::tokenizer
