#pragma once

// DeviceDecoder runs whole decode steps of a Qwen3-MoE, GLM-4.5 or DeepSeek-V3 / Kimi K2 model on
// one GPU, every op on the device (embedding, RMSNorm, GQA attention with optional q/k/v bias and
// per-head q/k norms, NeoX RoPE on all or the first rot_dim values of a head, paged KV cache,
// attention, or MLA attention over the paged latent cache (kernels/mla.h), dense SwiGLU
// layers, softmax top-k or sigmoid grouped top-k routing with the correction bias, permute, grouped
// expert matmuls with fused dequantization, SwiGLU, shared experts, unpermute, final norm, LM head,
// argmax), for `batch` sequences advancing one token per step. A step is captured once as a CUDA
// graph and replayed: positions and tokens live on the device and the graph advances them itself.
// Weights come either from a real checkpoint (host/checkpoint_model.h; create_from_checkpoint:
// every tensor uploaded once, experts in their stored or quantized-on-load format) or are random
// (create: Qwen3-MoE-shaped, seeded, generated on the device, experts in the chosen format, the
// bench preset's shape). It serves the GPU benchmark (bench/gpu_decode.cc) and the GPU tests
// (greedy tokens of the fixture models against the CPU engine). In serving mode
// (create_for_serving, used by engine/cuda/device_causal_lm.h) rows are any tokens of any sequences
// at any positions over a caller-assigned paged KV pool, one CUDA graph per (batch-size bucket,
// logits-rows bucket), the final norm and LM head only on the rows whose logits are asked for
// (gathered into compact rows), and those logits go back to the host. This header includes no
// CUDA header.
//
// Threading: one driving thread. All device memory comes from one arena (DeviceMemoryConfig).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/cpu/weight.h"
#include "engine/cuda/host/checkpoint_model.h"
#include "engine/cuda/host/device_memory_plan.h"
#include "engine/cuda/host/serving_plan.h"

namespace edge::engine::cuda {

struct DecoderShape {
    int32_t hidden = 1024;        // Model width.
    int32_t layers = 12;          // Decoder layers (all MoE when random).
    int32_t experts = 64;         // Routed experts per layer.
    int32_t top_k = 8;            // Experts per token.
    int32_t moe_inter = 512;      // Expert intermediate width.
    int32_t heads = 16;           // Query heads.
    int32_t kv_heads = 4;         // Key/value heads.
    int32_t head_dim = 64;        // Values per head.
    int32_t vocab = 32000;        // Vocabulary (LM head rows).
    int32_t batch = 1;            // Sequences decoded per step.
    int32_t context = 256;        // Positions each sequence starts at (its cache is filled).
    int32_t max_context = 4096;   // Positions per sequence the cache holds.
    WeightFormat expert_format = WeightFormat::kBF16;  // kBF16, kFP8E4M3Block128 or kInt4G32.
};

// The `bench` preset of make-model (engine/tools/make_model.cc) with `batch` streams.
DecoderShape bench_preset_shape(int32_t batch, WeightFormat expert_format);

struct CheckpointDecoderOptions {
    int32_t batch = 1;            // Sequences decoded per step.
    int32_t context = 0;          // Position every sequence starts at. Positions below it hold
                                  // zero keys/values (a benchmark's stand-in for a prompt);
                                  // 0: the sequences start empty and prompts are fed with
                                  // set_tokens() + step().
    int32_t max_context = 4096;   // Positions per sequence the cache holds (<= the model's).
    std::string quantization = "none";  // Quantize-on-load policy (engine/quant/policy.h), e.g.
                                        // "routed_experts=fp8" or "experts-int4".
};

struct DecodeStepStats {
    double seconds_per_step = 0.0;  // Median wall time of one replayed step.
    int64_t bytes_per_step = 0;     // Weight and KV bytes one step reads (touched experts only).
};

class DeviceDecoder {
public:
    static Result<std::unique_ptr<DeviceDecoder>> create(const DecoderShape& shape,
                                                         const DeviceMemoryConfig& memory,
                                                         uint64_t seed);
    // The checkpoint in `dir` (engine/cuda/host/checkpoint_model.h says which configs
    // run; others are kUnimplemented) on the current device. Every sequence's first input token
    // is 0 until set_tokens().
    static Result<std::unique_ptr<DeviceDecoder>> create_from_checkpoint(
        const std::string& dir, const CheckpointDecoderOptions& options,
        const DeviceMemoryConfig& memory);
    // The same from a checkpoint already read (read_checkpoint_model), so several decoders (a
    // benchmark's batch sizes) share one read and quantization; options.quantization is unused.
    static Result<std::unique_ptr<DeviceDecoder>> create_from_model(
        const CheckpointModel& model, const CheckpointDecoderOptions& options,
        const DeviceMemoryConfig& memory);
    // For serving (host/serving_plan.h: ServingDecoderOptions, StepRunner): weights from
    // `model`, a KV pool of options.kv_blocks + 1 blocks, buffers for options.max_rows rows and
    // logits for options.max_logit_rows rows;
    // driven by copy_kv_blocks(), run_rows() and copy_logits() (not set_tokens/step/run_graph).
    static Result<std::unique_ptr<DeviceDecoder>> create_for_serving(
        const CheckpointModel& model, const ServingDecoderOptions& options,
        const DeviceMemoryConfig& memory);
    ~DeviceDecoder();
    DeviceDecoder(const DeviceDecoder&) = delete;
    DeviceDecoder& operator=(const DeviceDecoder&) = delete;

    // The shape in use (for a checkpoint: read from its config).
    const DecoderShape& shape() const;
    // Sets each sequence's next input token (`tokens` has batch() entries, each < vocab): how a
    // prompt is fed, one step per token; the step after the last prompt token produces the first
    // generated one, and later steps feed their own argmax back.
    Status set_tokens(std::span<const int32_t> tokens);
    // One step without a graph (kernels launched one by one).
    Status step();
    // Captures one step as a CUDA graph (once) and replays it `steps` times, timing each replay;
    // kOutOfRange when the sequences would pass max_context.
    Result<DecodeStepStats> run_graph(int32_t steps);
    // The tokens the last step produced (batch ids), copied to the host.
    Result<std::vector<int32_t>> last_tokens();
    // Serving: copies each move's KV block (every layer, keys and values) from `from` to `to`.
    Status copy_kv_blocks(std::span<const BlockMove> moves);
    // Serving: uploads `staging` (a prefix of the StepLayout buffer, host/serving_plan.h) and runs
    // `bucket` rows (a bucket of row_buckets(max_rows)) with the final norm and LM head on the
    // `logit_bucket` rows its logit rows gather (0 or a bucket of row_buckets(max_logit_rows)) as
    // that pair's CUDA graph, captured on its first use; the compact logits stay on the device
    // for copy_logits().
    Status run_rows(int32_t bucket, int32_t logit_bucket, std::span<const int32_t> staging);
    // Serving: copies the logits of `runs` (compact logits rows of the last run_rows) into `out`
    // (row-major, vocab floats per row, at each run's out_row) and waits for them.
    Status copy_logits(std::span<const RowRun> runs, float* out);
    // Device-to-device copy bandwidth (bytes read + written per second) over `bytes`, the HBM
    // reference figure for the benchmark.
    static Result<double> measure_copy_bandwidth(int64_t bytes, int32_t repeats);

    struct Impl;

private:
    explicit DeviceDecoder(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace edge::engine::cuda
