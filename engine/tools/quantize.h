#pragma once

// `edgeserve quantize --model IN --policy P --out DIR`: reads a BF16/F16/F32 checkpoint, quantizes
// each linear-layer matrix whose class the policy (engine/quant/policy.h) names, and writes
// DIR/model.safetensors and DIR/config.json with a `quantization_config`, copying the other files
// of IN that describe tokenization and generation (tokenizer.json, tokenizer_config.json,
// generation_config.json, special_tokens_map.json, vocab/merges files, chat_template.jinja).
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
//
// Threading: free functions; no shared state.

#include <string>

#include "common/result.h"

namespace edge::engine {

struct QuantizeOptions {
    std::string model_dir;  // Input checkpoint directory.
    std::string policy;     // Policy string (preset and/or class=format pairs).
    std::string out_dir;    // Created if missing.
    bool overwrite = false; // Replace a checkpoint already in out_dir (else refused).
};

// Writes the quantized checkpoint. Errors name the tensor or file.
Status quantize_checkpoint(const QuantizeOptions& options);

// `edgeserve quantize ...`; argv[0] (or argv[1]) is "quantize". Returns 0 ok, 1 failure, 2 usage.
int quantize_main(int argc, char** argv);

}  // namespace edge::engine
