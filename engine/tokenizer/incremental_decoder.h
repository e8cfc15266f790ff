#pragma once

// IncrementalDecoder turns a stream of token ids into a stream of text that is always valid
// UTF-8: bytes of a character split across tokens are held back until the character completes;
// bytes that can never form a valid character become U+FFFD (as Hugging Face's errors="replace").
// Special tokens (e.g. <|im_end|>) add no text when `skip_special_tokens` is set, as OpenAI-style
// servers return completions, except the ids passed to keep_special() (a chat family's tool-call
// markers, which the tool-call parser reads when tools are offered).
//
// Threading: one instance per stream, used by one thread at a time. Keeps a pointer to the
// tokenizer, which must outlive it.

#include <string>
#include <vector>

#include "engine/generator.h"
#include "engine/tokenizer/tokenizer.h"

namespace edge::engine::tokenizer {

class IncrementalDecoder {
public:
    explicit IncrementalDecoder(const Tokenizer* tokenizer, bool skip_special_tokens = false)
        : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

    // Special tokens among `ids` are decoded to their text even when skipping special tokens.
    void keep_special(std::vector<TokenId> ids) { kept_special_ = std::move(ids); }

    // Text completed by appending `id`; may be empty while a character is incomplete.
    std::string push(TokenId id);

    // Whether `id`'s bytes go into the text (false for a special token that is skipped).
    bool shows(TokenId id) const;

    // Text completed by appending raw `bytes` (used by push, and by tests).
    std::string push_bytes(std::string_view bytes);

    // What is still held back, as U+FFFD (called when the stream ends).
    std::string flush();

    // Bytes held back waiting for the rest of a character (0..3).
    size_t pending_bytes() const { return pending_.size(); }

private:
    const Tokenizer* tokenizer_;
    bool skip_special_;
    std::vector<TokenId> kept_special_;  // Few (a format's markers): a linear scan is cheapest.
    std::string pending_;
};

}  // namespace edge::engine::tokenizer
