#include "engine/tokenizer/chat_template.h"

namespace edge::engine::tokenizer {

namespace {
constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";
}  // namespace

Result<ChatFormat> choose_chat_format(std::string_view configured, const TokenizerConfig& config,
                                      const Tokenizer& tokenizer) {
    if (configured == "chatml") {
        return ChatFormat::kChatMl;
    }
    if (!configured.empty() && configured != "auto") {
        return invalid_argument_error("chat_template: unknown format \"" + std::string(configured) +
                                      "\" (known: auto, chatml)");
    }
    // Checkpoints ship Jinja; recognise the family by its control tokens.
    if (config.chat_template.find(kImStart) != std::string::npos) {
        return ChatFormat::kChatMl;
    }
    if (config.chat_template.empty() && tokenizer.token_id(kImStart) >= 0 &&
        tokenizer.token_id(kImEnd) >= 0) {
        return ChatFormat::kChatMl;
    }
    return not_found_error(
        "chat_template: the checkpoint's chat format is not recognised; set "
        "the model's chat_template to one of: chatml");
}

Result<ChatTemplate> ChatTemplate::create(ChatFormat format, const Tokenizer* tokenizer) {
    ChatTemplate t(format, tokenizer);
    switch (format) {
        case ChatFormat::kChatMl:
            t.begin_ = tokenizer->token_id(kImStart);
            t.end_ = tokenizer->token_id(kImEnd);
            if (t.begin_ < 0 || t.end_ < 0) {
                return not_found_error(
                    "chat_template: ChatML needs <|im_start|> and <|im_end|> "
                    "tokens, which the tokenizer lacks");
            }
            break;
    }
    return t;
}

Result<std::vector<TokenId>> ChatTemplate::render(std::span<const ChatMessage> messages) const {
    if (messages.empty()) {
        return invalid_argument_error("messages: empty");
    }
    std::vector<TokenId> ids;
    auto append_text = [&](std::string_view text, const std::string& where) -> Status {
        auto encoded = tokenizer_->encode(text, /*parse_special=*/false);
        if (!encoded.ok()) {
            return encoded.status().with_context(where);
        }
        ids.insert(ids.end(), encoded->begin(), encoded->end());
        return ok_status();
    };
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (m.role.empty() || m.role.find('\n') != std::string::npos) {
            return invalid_argument_error(where + ".role: empty or contains a newline");
        }
        ids.push_back(begin_);
        EDGE_RETURN_IF_ERROR(append_text(m.role + "\n" + m.content, where));
        ids.push_back(end_);
        EDGE_RETURN_IF_ERROR(append_text("\n", where));
    }
    ids.push_back(begin_);
    EDGE_RETURN_IF_ERROR(append_text("assistant\n", "generation prompt"));
    return ids;
}

std::string ChatTemplate::render_text(std::span<const ChatMessage> messages) const {
    std::string out;
    for (const ChatMessage& m : messages) {
        out.append(kImStart).append(m.role).append("\n").append(m.content).append(kImEnd).append(
            "\n");
    }
    out.append(kImStart).append("assistant\n");
    return out;
}

}  // namespace edge::engine::tokenizer
