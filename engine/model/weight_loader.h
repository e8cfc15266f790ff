#pragma once

// WeightLoader is how every architecture obtains its linear-layer matrices from a mapped
// checkpoint, by tensor name. For a module `m` (the name without `.weight`) it returns:
//  - the stored matrix viewed in place when `m.weight` is BF16/F16/F32 and the policy leaves its
//    class unquantized;
//  - that matrix quantized on load into the policy's format for its class (the quantized copy is
//    owned here; the full-precision tensor stays in the mapping, never copied);
//  - an FP8 block-scaled view in place for `m.weight` F8_E4M3 plus `m.weight_scale_inv` (quant
//    method `fp8`) or `m.weight_scale` (compressed-tensors `float-quantized`, block 128x128);
//  - an INT4 view in place for compressed-tensors `m.weight_packed` / `m.weight_scale` /
//    `m.weight_shape` (pack-quantized, symmetric, group 32 or 128 read from the scale's shape);
//  - an INT8 per-row view in place for `m.weight` I8 plus `m.weight_scale` F32 [rows, 1]
//    (compressed-tensors `int-quantized`, strategy `channel`).
// The config's `quantization_config` is checked when the loader is created: quant_method must be
// absent, `fp8` (fmt e4m3, weight_block_size [128, 128]) or `compressed-tensors`; anything else is
// an error naming config.json and the field. Quantized tensors in a checkpoint whose config does
// not declare the method are an error too.
//
// Threading: matrix() and matrix_for() may be called from several threads at once (the routed
// experts load in parallel: load_experts in moe_block.h); the other calls (use_row_tiles,
// float_matrix, resident_bytes) from one thread while no matrix() runs. The Weights it hands out
// are immutable and readable from any thread. Lifetime: the Checkpoint and the WeightLoader must
// both outlive every Weight handed out.

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/cpu/weight.h"
#include "engine/quant/checkpoint_formats.h"
#include "engine/quant/policy.h"
#include "engine/quant/quantized_weight.h"
#include "engine/quant/weight_arena.h"

namespace edge::engine {

class Checkpoint;
class Backend;
class ConfigJson;
struct TensorView;

// A compressed-tensors `ignore` entry's "re:" pattern: a Python regular expression, compiled by
// PCRE2 (whose syntax covers Python's, named groups and lookbehind included) and matched from
// the start of a module name, as re.match. A match is bounded (PCRE2's match and heap limits):
// one that runs past them counts as no match, never as minutes of backtracking.
class ModulePattern {
  public:
    static Result<ModulePattern> compile(std::string_view pattern);
    bool matches(std::string_view module) const;

  private:
    std::shared_ptr<const void> code_;  // pcre2_code, freed with pcre2_code_free.
};

// What the checkpoint's config.json says about stored quantization.
struct StoredQuantization {
    std::string quant_method;         // "" (none), "fp8" or "compressed-tensors".
    // compressed-tensors `ignore`, the modules left unquantized: names, and the "re:" entries'
    // Python regular expressions (matched from the start, as re.match), compiled once. One that
    // does not compile is left out with a warning: the check is a safeguard, not the load.
    std::set<std::string> ignore_names;
    std::vector<ModulePattern> ignore_patterns;
    // compressed-tensors: the schemes config_groups declare, each with the group's name, which
    // matrix() checks the stored tensors against.
    std::map<int64_t, std::string> int4_groups;  // INT4 group_size -> config group.
    std::string int8_group;                      // INT8 per channel, or "".
    std::string fp8_group;                       // FP8 128x128 blocks, or "".

    // True when `module` is listed in `ignore`, by name or by an "re:" pattern.
    bool ignores(const std::string& module) const;
};

// `t` as the quant/ format checks take a tensor (viewed, not copied).
quant::TensorRef tensor_ref(const TensorView& t);

// Stored matrix `t` quantized to `target` as the loader quantizes it on load: BF16/F16/F32
// through quant::quantize(), FP8 (`scale_inv` its block scales) through quant::requantize().
// `edgeserve quantize` calls it too, so a written checkpoint holds the bytes the same policy
// makes on load. Errors name the file and tensor.
Result<quant::QuantizedWeight> quantize_stored(const TensorView& t, const TensorView* scale_inv,
                                               WeightFormat target, const std::string& name);

// Parses and checks `quantization_config` of config.json (see the header comment).
Result<StoredQuantization> parse_stored_quantization(const ConfigJson& config);

class WeightLoader {
  public:
    // `policy` is a policy string for parse_quant_policy ("none" or "" for no quantize-on-load).
    static Result<std::unique_ptr<WeightLoader>> create(const Checkpoint& checkpoint,
                                                        const ConfigJson& config,
                                                        const std::string& policy);

    // The checks of matrix() that need no weight's bytes, over every tensor of the checkpoint:
    // tensors stored quantized (weight_packed, F8_E4M3 or I8 weights) that the config's
    // quantization_config does not declare, and matrices the policy would quantize into a format
    // their shape does not allow. For check_model_files; it asks for every matrix-like tensor,
    // so a WeightLoader that loads a model afterwards would not see which went unused.
    Status check_headers() const;

    // The matrix named `weight_name` (ending in ".weight"), checked to be rows x cols. Errors name
    // the checkpoint and tensor.
    Result<Weight> matrix(const std::string& weight_name, int64_t rows, int64_t cols);
    // matrix(), refused (kUnimplemented, naming the checkpoint and tensor) when `backend` has no
    // matmul for the format it comes in.
    Result<Weight> matrix_for(const Backend& backend, const std::string& weight_name, int64_t rows,
                              int64_t cols);

    // The matrix in float whatever the policy: a BF16/F16/F32 tensor viewed in place, a stored
    // quantized one (FP8, INT8, INT4, as matrix() reads them) dequantized into an F32 copy owned
    // here. For matrices read element by element (MLA's kv_b_proj), which real FP8 checkpoints
    // (DeepSeek-V3, Kimi K2) store quantized like the rest.
    Result<Weight> float_matrix(const std::string& weight_name, int64_t rows, int64_t cols);
    // From now on, INT8 and INT4 matrices are handed out in row tiles (WeightLayout::kRowTiles16,
    // engine/cpu/weight.h) when quant::row_tiles_by_default(format) (INT8, INT4-G32), this CPU has
    // a kernel for that layout and the shape allows it; the
    // row-major copy made on load is freed, and a matrix viewed in a mapped checkpoint is copied
    // into tiles (its mapped bytes are no longer read). Only for a backend whose
    // supports_row_tiles() is true (the CPU); off by default.
    void use_row_tiles(bool on) { row_tiles_ = on; }

    // Bytes of weights as held in memory: the checkpoint's tensors, minus the mapped tensors no
    // longer read (full-precision matrices replaced by quantized copies, mapped quantized data
    // replaced by row tiles, stored scale tensors read into f32), plus what is held instead
    // (the quantized copies and tiles, the f32 scales of every quantized matrix, float_matrix()'s
    // F32 copies).
    int64_t resident_bytes() const;
    const quant::QuantPolicy& policy() const { return policy_; }
    const StoredQuantization& stored() const { return stored_; }

  private:
    WeightLoader(const Checkpoint& checkpoint, StoredQuantization stored, quant::QuantPolicy policy)
        : ckpt_(checkpoint), stored_(std::move(stored)), policy_(policy) {}
    // Keeps `w` (in row tiles when use_row_tiles() asks) and counts the bytes it holds.
    Result<Weight> keep(quant::QuantizedWeight w);
    // `bytes` of the mapping at `data` are no longer read (a copy made on load is read instead):
    // left out of resident_bytes(), and their whole pages released.
    void replace_mapped(const void* data, int64_t bytes);
    // OK unless `t` (module `m`'s weight_packed, or its weight) is stored in a quantized format
    // config.json's quantization_config does not declare.
    Status check_declared(const std::string& m, const TensorView& t) const;
    // A matrix stored quantized whose class the policy would quantize: warned once per class.
    void kept_as_stored(const std::string& weight_name, std::string_view stored_as);

    const Checkpoint& ckpt_;
    StoredQuantization stored_;
    quant::QuantPolicy policy_;
    quant::WeightArena arena_;                  // The row tiles' bytes; outlives owned_.
    std::mutex mu_;                             // Guards owned_ and policy_skipped_.
    std::deque<quant::QuantizedWeight> owned_;  // Stable addresses for the views handed out.
    std::deque<std::vector<float>> float_copies_;  // float_matrix() of quantized tensors.
    std::atomic<int64_t> replaced_bytes_{0};    // Mapped bytes no longer read.
    std::atomic<int64_t> added_bytes_{0};       // Bytes owned_ and float_copies_ hold.
    bool row_tiles_ = false;                    // use_row_tiles().
    bool policy_skipped_[quant::kTensorClassCount] = {};  // kept_as_stored() warned.
};

// True for the formats a kernel dequantizes (FP8, INT8, INT4).
bool is_quantized_format(WeightFormat format);

// Row `r` of an embedding table in any format, as f32 (`out` holds w.cols floats).
void embedding_row(const Weight& w, int64_t r, float* out);

}  // namespace edge::engine
