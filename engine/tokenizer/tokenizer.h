#pragma once

// Tokenizer turns text into token ids and back for a byte-level BPE checkpoint described by a
// Hugging Face `tokenizer.json`: added/special tokens are matched first (AddedVocabulary, with
// Hugging Face's lstrip, rstrip, single_word and normalized semantics), the rest is normalised
// (NFC when asked), split by the pre-tokenizer's regexes and BPE-encoded word by word. decode()
// concatenates token bytes, so encode then decode gives back any valid UTF-8 input that is
// already in the normal form, less the whitespace an lstrip/rstrip added token took.
//
// Threading: immutable after loading; every method is thread-safe. Share one instance per model
// through std::shared_ptr<const Tokenizer>.

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/generator.h"
#include "engine/tokenizer/added_vocabulary.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "engine/tokenizer/tokenizer_json.h"

namespace edge::engine::tokenizer {

class Tokenizer {
  public:
    // Reads and parses `path` (a tokenizer.json); errors name the file and the JSON field.
    static Result<std::unique_ptr<Tokenizer>> load_file(const std::string& path);
    // Parses tokenizer.json text; errors name the JSON field.
    static Result<std::unique_ptr<Tokenizer>> from_json(std::string_view json);

    // Ids of `text`. With `parse_special`, added tokens written in the text become their ids;
    // without, all of them (special or not) are encoded as ordinary text, so that text from a
    // client cannot produce one (Hugging Face's split_special_tokens still matches the
    // non-special ones). kInvalidArgument for invalid UTF-8 (with the
    // byte offset).
    Result<std::vector<TokenId>> encode(std::string_view text, bool parse_special = true) const;

    // The pieces ("words") BPE encodes one at a time for plain `text` (no added tokens matched):
    // the normalised text split by the pre-tokenizer. For tests and tools that compare the
    // split with another implementation.
    Result<std::vector<std::string>> pre_tokenize(std::string_view text) const;

    // Concatenated bytes of the tokens (added tokens as their content). May end inside a UTF-8
    // character when the ids do; ids without a token contribute nothing.
    std::string decode(std::span<const TokenId> ids) const;

    // Bytes of one token (the content of an added token); empty for an unknown id.
    std::string_view token_bytes(TokenId id) const;

    // Id of an added token or vocabulary entry spelled exactly `content`, or -1.
    TokenId token_id(std::string_view content) const;

    // One more than the largest id the tokenizer knows.
    int32_t vocab_size() const { return vocab_size_; }

    bool is_added(TokenId id) const;
    // An added token marked special (control tokens such as <|im_end|>).
    bool is_special(TokenId id) const;

  private:
    Tokenizer() = default;
    // Normalises `text`, then encodes it (with the normalized added tokens when `added`).
    Status encode_plain(std::string_view text, bool added, std::vector<TokenId>* out) const;
    // Pre-tokenizes and BPE-encodes text the normaliser produced.
    Status encode_normalized(std::string_view text, std::vector<TokenId>* out) const;

    std::unique_ptr<BpeModel> bpe_;
    Normalizer normalizer_;
    std::unique_ptr<PreTokenizer> pre_tokenizer_;
    bool ignore_merges_ = false;
    AddedVocabulary added_;
    int32_t vocab_size_ = 0;
};

}  // namespace edge::engine::tokenizer
