#pragma once

// make-model: writes a random MoE checkpoint (Qwen3-MoE, GLM-4.5 MoE or DeepSeek-V3 / Kimi K2
// architecture, each at a `tiny` and a `bench` size) in Hugging Face layout (config.json,
// model.safetensors in BF16, tokenizer.json as byte-level BPE with the 256 byte tokens, a few
// merges and the ChatML special tokens at the end of the vocabulary, tokenizer_config.json with a
// ChatML chat_template, generation_config.json). For demos, tests and benchmarks: the weights are
// random, so the text it generates is meaningless. Generation is deterministic for a given seed.
//
// Threading: free functions; no shared state.

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace edge::engine {

struct MakeModelOptions {
    std::string preset = "tiny";  // "tiny" (about 1 MB, for tests) or "bench" (about 2.5 GB).
    std::string out_dir;          // Created if missing.
    bool overwrite = false;       // Replace a checkpoint already in out_dir (else refused).
    uint64_t seed = 1;            // Seed of the random weights.
    // Architecture: "qwen3_moe", "glm4_moe" (GLM-4.5) or "deepseek_v3" (MLA; Kimi K2's).
    std::string arch = "qwen3_moe";
};

// Names of the presets.
std::vector<std::string> make_model_presets();

Status write_random_checkpoint(const MakeModelOptions& options);

// `edgeserve make-model [--arch A] --preset NAME --out DIR [--seed N] [--force]`; argv[0] is
// "make-model".
// Returns the process exit code (0 ok, 1 failure, 2 usage).
int make_model_main(int argc, char** argv);

}  // namespace edge::engine
