#pragma once

// PreTokenizer splits normalised text into the pieces ("words") that BPE encodes one at a time,
// as `tokenizer.json`'s `pre_tokenizer` describes: a Sequence of Split steps (a regex with the
// "Isolated" behaviour: matches and the gaps between them both become pieces, and an empty match,
// a look-ahead's, splits where it is) and a ByteLevel step (which, with use_regex, adds the GPT-2
// split pattern). Regexes run with PCRE2 in UTF + UCP mode (JIT-compiled when available), so
// \p{L}, \p{N}, \s follow Unicode.
//
// Threading: immutable after create(); split() is thread-safe (match data is per call).

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace edge::engine::tokenizer {

class PreTokenizer {
public:
    // `patterns` are applied in order; each splits every piece the previous one produced.
    // kInvalidArgument when a pattern does not compile (with PCRE2's message and offset).
    static Result<std::unique_ptr<PreTokenizer>> create(const std::vector<std::string>& patterns);

    // The GPT-2 pattern ByteLevel(use_regex = true) stands for.
    static const char* gpt2_pattern();

    ~PreTokenizer();
    PreTokenizer(const PreTokenizer&) = delete;
    PreTokenizer& operator=(const PreTokenizer&) = delete;

    // Splits valid UTF-8 `text` into pieces that concatenate back to `text`. Empty pieces are
    // never returned. PCRE2's match limit grows with the text, so a long run of one class (a
    // character repeated, a base64 blob) splits under every supported pattern; kInvalidArgument
    // only if PCRE2 still reports a matching error (a pathological pattern's match or heap limit).
    // `searches`, when given, gets the number of regex searches made: at most one per match found
    // plus one per piece searched (tests check with it that splitting stays linear).
    Status split(std::string_view text, std::vector<std::string_view>* pieces,
                 size_t* searches = nullptr) const;

private:
    struct Compiled;
    PreTokenizer() = default;
    Status split_one(const Compiled& re, std::string_view text, std::vector<std::string_view>* out,
                     size_t* searches) const;

    std::vector<std::unique_ptr<Compiled>> regexes_;
};

}  // namespace edge::engine::tokenizer
