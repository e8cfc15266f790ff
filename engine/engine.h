#pragma once

// The engine: loads the configured models and serves them through the Generator interface, with
// its own threads (a scheduler loop per model plus the backend's compute pool). create_engine()
// loads every model before it returns; the Generator it returns is thread-safe. Destroying it
// cancels what is still running and joins its threads.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/cpu/matmul_job.h"
#include "engine/generator.h"
#include "engine/shard/sharding_config.h"

namespace edge::engine {

struct ModelConfig {
    std::string name;                  // Name clients ask for in `model`.
    std::string path;                  // Hugging Face checkpoint directory.
    std::string quantization = "none"; // Quantization policy preset applied on load ("none").
    int64_t max_context = 0;           // Max prompt + output tokens; 0: the model's own maximum.
    std::string chat_template = "auto";  // Chat format; "auto": chosen from the checkpoint.

    bool operator==(const ModelConfig&) const = default;
};

struct EngineConfig {
    int32_t threads = 0;                 // Compute threads; 0: one per core.
    std::string backend = "cpu";         // Where forward() runs: "cpu", "cuda" or "auto" (cuda
                                         // when a device is visible, else cpu); see
                                         // resolve_backend() in engine/backend.h.
    int32_t max_batch_sequences = 64;    // Sequences in the running batch at most.
    int32_t max_batch_tokens = 2048;     // Tokens per engine step (decode + prefill chunks).
    int32_t max_decode_sequences = 0;    // Running sequences that decode in one step at most,
                                         // picked by tenant weight when more are ready; 0: all.
    int64_t kv_cache_bytes = 256 << 20;  // KV-cache memory budget per model, bytes.
    int32_t kv_block_tokens = 16;        // Tokens per KV-cache block.
    // Host memory per model for the KV of preempted sequences, put back when they run again
    // (SchedulerConfig::swap_bytes); 0: preempted sequences are recomputed.
    int64_t kv_swap_bytes = 256 << 20;
    int32_t max_queue = 1024;            // Waiting requests per model before kUnavailable (503).
    int32_t max_queue_per_tenant = 256;  // Waiting requests of one tenant per model before
                                         // kResourceExhausted (429); 0: no per-tenant bound.
    int64_t max_queue_wait_ms = 0;       // Estimated queue wait before kUnavailable (503), ms;
                                         // 0: off (only the queue bounds apply).
    bool prefix_cache = true;            // Reuse cached prompt blocks within a tenant.
    // Activations of multi-token steps' BF16 products on the CPU: kExact (bf16 hi + lo pairs,
    // ~16 bits) or kBf16 (one bf16 each, 8 bits, about half the multiply work).
    ActivationPrecision activation_precision = ActivationPrecision::kExact;
    // The CPU's matmul kernels: "auto" (the best this CPU runs) or one at most that good
    // ("amx_bf16", "avx512_bf16", "avx512", "avx2", "scalar"), for comparisons and fallbacks.
    std::string cpu_kernels = "auto";
    shard::ShardingConfig sharding;      // Expert-parallel ranks and placement (docs/sharding.md).
    std::vector<ModelConfig> models;

    // Same settings (the daemon compares a reloaded config with the running one).
    bool operator==(const EngineConfig&) const = default;
};

Result<std::unique_ptr<Generator>> create_engine(const EngineConfig& config);

// Loads the checkpoint in `dir` as the engine loads a model (tokenizer, its config, every weight
// checked against the architecture, mapped as stored, with a small KV cache) and drops it. For
// the tools that write checkpoints; the generator's own checks at start (the BOS token, the chat
// format) are not run.
Status check_checkpoint_loads(const std::string& dir);

}  // namespace edge::engine
