#pragma once

// TokenizerConfig gathers what a checkpoint directory says about special tokens and chat
// formatting outside tokenizer.json: `tokenizer_config.json` (bos/eos token text, add_bos_token,
// chat_template, or `chat_template.jinja` beside it, which wins) and `generation_config.json`
// (bos/eos ids; eos may be a list). All are optional; a file that exists but is malformed is an
// error naming the file and the field.
// Plain data.

#include <string>
#include <vector>

#include "common/result.h"
#include "engine/generator.h"

namespace edge::engine::tokenizer {

struct TokenizerConfig {
    std::string bos_token;                    // Text of the BOS token ("" when none).
    std::string eos_token;                    // Text of the EOS token ("" when none).
    bool add_bos_token = false;               // Whether prompts start with BOS.
    std::string chat_template;                // The Jinja template text as shipped ("" when none).
    // The file it came from: "tokenizer_config.json" or "chat_template.jinja" ("" when none).
    std::string chat_template_file;
    std::vector<TokenId> generation_eos_ids;  // generation_config.json eos_token_id(s).
    TokenId generation_bos_id = -1;           // generation_config.json bos_token_id, or -1.
    SamplingDefaults sampling;  // generation_config.json temperature, top_p, top_k.
};

// Reads `dir`/tokenizer_config.json and `dir`/generation_config.json when present.
Result<TokenizerConfig> load_tokenizer_config(const std::string& dir);

// Parses the two files' text (either may be empty: absent).
Result<TokenizerConfig> parse_tokenizer_config(std::string_view tokenizer_config_json,
                                               std::string_view generation_config_json);

}  // namespace edge::engine::tokenizer
