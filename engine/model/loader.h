#pragma once

// Loading a Hugging Face checkpoint directory into a CausalLM: reads config.json, picks the
// architecture, maps the safetensors files and checks every tensor's name, dtype and shape.
// Every failure is a Status naming the file and the tensor or field; nothing here aborts on bad
// input.

#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"
#include "engine/cpu/matmul_job.h"
#include "engine/model/causal_lm.h"
#include "engine/shard/sharding_config.h"

namespace edge::engine {

struct LoadOptions {
    int32_t threads = 0;            // Compute threads for forward(); 0: one per core.
    int32_t max_slots = 64;         // Sequences the KV cache holds at once.
    int32_t max_context = 0;        // Positions per sequence; 0: the model's maximum.
    int64_t kv_cache_bytes = 0;     // KV memory budget; 0: max_slots * max_context tokens.
    int32_t kv_block_tokens = 16;   // Positions per KV-cache block (the prefix cache's unit).
    // Quantize-on-load policy (engine/quant/policy.h): a preset such as "experts-int4", class=format
    // pairs, or both; "none" keeps every tensor as stored.
    std::string quantization = "none";
    std::string backend = "cpu";    // Where forward() runs: "cpu", or "cuda" when compiled in.
    // Activations of multi-token BF16 products on the CPU (engine.activation_precision).
    ActivationPrecision activation_precision = ActivationPrecision::kExact;
    std::string cpu_kernels = "auto";  // engine.cpu_kernels (BackendOptions::cpu_kernels).
    // Expert-parallel sharding of the MoE layers (engine/shard/sharding_config.h).
    shard::ShardingConfig sharding;
    // INT4/INT8 matrices in CPU row tiles (WeightLayout::kRowTiles16, engine/cpu/weight.h) where
    // the backend takes them and this CPU has the kernels; false keeps them row-major (A/B tests).
    bool row_tiles = true;
};

Result<std::unique_ptr<CausalLM>> load_model(const std::string& dir, const LoadOptions& options);

// The checks of load_model that read no weight, for `edgeserve check-config` (run does the same
// before its slow load): config.json (the architecture and its fields), every safetensors header
// (offsets, dtypes, shapes against the file sizes), the stored quantization_config and the
// quantization `policy` ("" or "none": none), `sharding` against the model's routed experts, and
// `max_context` (LoadOptions::max_context; 0 takes the model's own) against the positions the
// model serves (with YaRN, the stretched length; the error says so). Cheap: headers only,
// nothing is quantized.
Status check_model_files(const std::string& dir, const std::string& policy,
                         const shard::ShardingConfig& sharding = {}, int64_t max_context = 0);

}  // namespace edge::engine
