#pragma once

// `edgeserve quantize --model IN --policy P --out DIR`: reads a BF16/F16/F32 checkpoint (or an
// FP8 one in the DeepSeek-V3 layout, whose matrices the policy gives INT8 or INT4 are requantized
// and the others kept as stored), quantizes each linear-layer matrix whose class the policy
// (engine/quant/policy.h) names, and writes
// DIR/model.safetensors (or shards and their index) and DIR/config.json with a
// `quantization_config`, copying the other files of IN that describe tokenization and generation
// (tokenizer.json, tokenizer_config.json, generation_config.json, special_tokens_map.json,
// vocab/merges files, chat_template.jinja).
// Formats written (docs/quantization.md has the details):
//  - only FP8 in the policy: DeepSeek-V3 layout, `m.weight` F8_E4M3 + `m.weight_scale_inv` F32
//    [ceil(rows/128), ceil(cols/128)], config {"quant_method": "fp8", "fmt": "e4m3",
//    "weight_block_size": [128, 128]}.
//  - otherwise compressed-tensors: INT4 as pack-quantized (`weight_packed` I32 [rows, cols/8],
//    `weight_scale` F32 [rows, cols/G], `weight_shape` I32 [2]); INT8 per row as int-quantized
//    (`weight` I8 + `weight_scale` F32 [rows, 1], strategy "channel"); FP8 as float-quantized
//    (`weight` F8_E4M3 + `weight_scale` F32 block scales, strategy "block"); one config group per
//    format, targets listing its modules; `ignore` lists the linear modules left unquantized.
// Scales are written as F32, so loading the result gives bit-identical weights to applying the
// same policy on load.
// The output is streamed: each matrix is quantized as the writer reaches it (the next few on
// other threads meanwhile), so memory holds about one quantized matrix per thread
// (QuantizeStats), never the whole output, and the input is mapped and read once in order.
// Weights larger than --shard-size (default 5 GB) are split into
// model-0000i-of-0000n.safetensors shards with model.safetensors.index.json.
//
// Threading: free functions; no shared state.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace edge::engine {

// What a quantize run did (for tests and the command's summary line).
struct QuantizeStats {
    int64_t matrices = 0;              // Matrices quantized.
    int64_t quantizations = 0;         // Times one was quantized (a matrix may be made twice).
    int64_t largest_matrix_bytes = 0;  // Data plus scales of the largest quantized matrix.
    // The most matrices quantized (or being quantized) and held at once: the run's quantized
    // bytes in memory stay under max_matrices_held x largest_matrix_bytes.
    int64_t max_matrices_held = 0;
    int64_t bytes_written = 0;         // Tensor bytes in the output (headers aside).
    std::vector<std::string> files;    // Weight files written, the index last when sharded.
};

// How far a quantize run is, after each tensor written.
struct QuantizeProgress {
    int64_t tensors_done = 0;
    int64_t tensors_total = 0;
    int64_t bytes_done = 0;  // Tensor bytes written.
    int64_t bytes_total = 0;
};

struct QuantizeOptions {
    std::string model_dir;  // Input checkpoint directory.
    std::string policy;     // Policy string (preset and/or class=format pairs).
    std::string out_dir;    // Created if missing.
    bool overwrite = false; // Replace a checkpoint already in out_dir (else refused).
    // The weights go to model.safetensors when they fit in this many bytes, else to shards of at
    // most this size with model.safetensors.index.json (Hugging Face's layout and default size).
    int64_t max_shard_bytes = kDefaultShardBytes;
    // Threads quantizing (0: one per core). Each holds one matrix ahead of the writer.
    int threads = 0;
    QuantizeStats* stats = nullptr;  // Filled when set and the run succeeds.
    // Called after each tensor written, on the calling thread (the command prints a line from
    // it every 10 s: a large model takes hours).
    std::function<void(const QuantizeProgress&)> progress = nullptr;

    static constexpr int64_t kDefaultShardBytes = 5'000'000'000;
};

// "5GB", "500MB", "2GiB", "1048576": a byte count as Hugging Face's max_shard_size writes it
// (KB/MB/GB powers of 1000, KiB/MiB/GiB of 1024, case-insensitive), positive.
Result<int64_t> parse_byte_size(std::string_view text);

// Writes the quantized checkpoint. Errors name the tensor or file.
Status quantize_checkpoint(const QuantizeOptions& options);

// `edgeserve quantize ...`; argv[0] (or argv[1]) is "quantize". Returns 0 ok, 1 failure, 2 usage.
int quantize_main(int argc, char** argv);

}  // namespace edge::engine
