#pragma once

// Command-line arguments of `edgeserve generate` (see engine/tools/generate.h) and their parser,
// kept apart from the tool so they can be tested without loading a model. Plain data.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/generator.h"
#include "engine/tools/cli.h"

namespace edge::engine {

struct GenerateArgs {
    std::string model_dir;                           // --model: checkpoint directory.
    std::optional<std::string> prompt;               // --prompt: text.
    std::optional<std::vector<TokenId>> prompt_ids;  // --prompt-ids: comma-separated ids.
    int32_t max_tokens = 64;                         // --max-tokens: tokens to generate at most.
    float temperature = 0.0f;                        // --temperature: 0 is greedy.
    std::optional<uint64_t> seed;                    // --seed: sampling seed.
    int32_t threads = 0;                             // --threads: compute threads; 0: all cores.
    bool ids = false;                                // --ids: print ids instead of text.
    bool chat = false;                               // --chat: prompt is one user message.
};

extern const char kGenerateUsage[];

// Parses argv[first..argc). kInvalidArgument naming the flag on a bad or missing value.
Result<GenerateArgs> parse_generate_args(int argc, char** argv, int first);

}  // namespace edge::engine
