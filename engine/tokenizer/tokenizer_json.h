#pragma once

// The parts of a Hugging Face `tokenizer.json` the byte-level BPE tokenizer uses, parsed and
// checked: vocabulary and merges (token text converted from the GPT-2 byte mapping to raw bytes),
// the vocabulary entries outside that mapping, added tokens, the normaliser and the
// pre-tokenizer's split regexes. Anything the tokenizer does not implement (another model type,
// other normalisers or pre-tokenizers, byte fallback) is a kUnimplemented naming the field, never
// a silently different tokenization. Plain data.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"
#include "engine/generator.h"
#include "engine/tokenizer/normalizer.h"

namespace edge::engine::tokenizer {

// Ids at or above this are rejected: real vocabularies stay below 300k, and the id tables are
// dense, so a hostile file must not make them huge.
inline constexpr int64_t kMaxTokenId = 1 << 21;

// One entry of `added_tokens`; the flags mean what they mean to Hugging Face's AddedVocabulary
// (see added_vocabulary.h).
struct AddedToken {
    TokenId id = 0;
    std::string content;       // UTF-8 text as it appears in prompts.
    bool special = false;      // Special (control) token, e.g. <|im_start|>.
    bool single_word = false;  // Matches only where no word character touches it on either side.
    bool lstrip = false;       // Swallows the whitespace before it.
    bool rstrip = false;       // Swallows the whitespace after it.
    // Matched in the normalised text, against its normalised content; otherwise matched in the
    // raw text first. Hugging Face's default when the field is absent: not special.
    bool normalized = false;
};

struct TokenizerJson {
    std::vector<std::pair<std::string, TokenId>> vocab;       // Raw token bytes and id.
    std::vector<std::pair<std::string, std::string>> merges;  // Raw bytes, in rank order.
    // Entries whose key has a character outside GPT-2's byte alphabet, as their UTF-8 key and id:
    // DeepSeek-V3 lists its special tokens in model.vocab by their text
    // ("<｜begin▁of▁sentence｜>"). Byte-level BPE never produces them; they decode as that text.
    std::vector<std::pair<std::string, TokenId>> literal_vocab;
    std::vector<AddedToken> added_tokens;
    NormalizerKind normalizer = NormalizerKind::kNone;
    std::vector<std::string> split_patterns;  // PCRE2 patterns, applied in order.
    bool ignore_merges = false;  // A word that is itself a token is not merged piecewise.
    bool byte_level = false;     // The pre-tokenizer has a ByteLevel step (required).
};

// Errors are kInvalidArgument (malformed JSON or values) or kUnimplemented (unsupported
// features), with the JSON path in the message, e.g. "model.merges[12]".
Result<TokenizerJson> parse_tokenizer_json(std::string_view json);

}  // namespace edge::engine::tokenizer
