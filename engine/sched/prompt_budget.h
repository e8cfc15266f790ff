#pragma once

// A prompt longer than its tenant's input_tokens_per_minute could never be admitted: the one
// wording of that refusal, for the engine's check of each prompt and the API's measure of a
// list of prompts before any is queued (daemon/api/completion.cc).

#include <cstdint>
#include <string>

#include "common/status.h"

namespace edge::engine {

// `field`: the prompt as the client's request names it (`prompt`, `prompt[2]`, `messages`).
inline Status prompt_over_input_budget(const std::string& field, int64_t tokens, int64_t budget) {
    return invalid_argument_error(field + ": the prompt (" + std::to_string(tokens) +
                                  " tokens) exceeds this tenant's input_tokens_per_minute of " +
                                  std::to_string(budget));
}

}  // namespace edge::engine
