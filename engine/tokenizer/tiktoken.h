#pragma once

// Loading a tiktoken BPE model (Kimi K2's `tiktoken.model`: one "base64-token rank" pair per
// line) into the ordinary Tokenizer: the ranks become byte-level BPE merges (a token of rank r
// merges any two tokens that concatenate to it, at rank r, which is tiktoken's "merge the pair
// whose concatenation ranks lowest"), the family's pre-tokenizer regex splits the text, and the
// special tokens of tokenizer_config.json's `added_tokens_decoder` are added tokens.
// Known difference: when two different splits of one token are adjacent in a word at once,
// tiktoken merges the leftmost and this table the split listed first; real vocabularies almost
// never reach that state.
//
// Threading: free functions; the Tokenizer they return is as thread-safe as any.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_json.h"

namespace edge::engine::tokenizer {

// Kimi K2's pre-tokenizer pattern (tokenization_kimi.py), with its `[...&&[^\p{Han}]]` class
// intersections written for PCRE2 as negated classes of the other general categories (one class
// per character, so that no run of letters, however long, needs a backtracking frame per letter).
const char* kimi_k2_pattern();

// Token bytes and ranks of tiktoken model text; errors name `where` and the line.
Result<std::vector<std::pair<std::string, TokenId>>> parse_tiktoken(std::string_view text,
                                                                    const std::string& where);

// A Tokenizer over tiktoken model text, split by `pattern`, with `specials` as added tokens.
Result<std::unique_ptr<Tokenizer>> tokenizer_from_tiktoken(std::string_view model_text,
                                                           const std::string& pattern,
                                                           const std::vector<AddedToken>& specials,
                                                           const std::string& where);

// `dir`/tiktoken.model with the special tokens of `dir`/tokenizer_config.json, split by Kimi K2's
// pattern.
Result<std::unique_ptr<Tokenizer>> load_tiktoken_dir(const std::string& dir);

// The tokenizer of checkpoint directory `dir`, as the engine loads it: `dir`/tokenizer.json
// (byte-level BPE), else `dir`/tiktoken.model (Kimi K2). Errors name the file.
Result<std::unique_ptr<Tokenizer>> load_checkpoint_tokenizer(const std::string& dir);

}  // namespace edge::engine::tokenizer
