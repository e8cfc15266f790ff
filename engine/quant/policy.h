#pragma once

// QuantPolicy says, per class of weight tensor, which format quantize-on-load (and
// `edgeserve quantize`) puts it in. It is parsed from the config's policy string: a preset name
// (`none`, `experts-int4`, `experts-int4-g128`, `all-fp8`, `all-int8`), a comma-separated list of
// `class=format` pairs, or a preset followed by pairs that override it, e.g.
// `experts-int4,attention=fp8`. tensor_class_for_name() maps a Hugging Face tensor name
// (Qwen3-MoE, GLM-4.5, DeepSeek-V3 / Kimi K2 naming) to its class. Values are plain data;
// functions are pure and thread-safe.

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"
#include "engine/cpu/weight.h"

namespace edge::engine::quant {

enum class TensorClass {
    kAttention,      // q/k/v/o projections, MLA's q_a/q_b/kv_a/kv_b projections.
    kDenseMlp,       // gate/up/down of layers without experts.
    kSharedExpert,   // gate/up/down of the always-active shared expert(s).
    kRoutedExperts,  // gate/up/down of every routed expert.
    kEmbeddings,     // Token embedding table.
    kLmHead,         // Output projection to the vocabulary.
};
inline constexpr size_t kTensorClassCount = 6;

// "attention", "dense_mlp", "shared_expert", "routed_experts", "embeddings", "lm_head".
const char* tensor_class_name(TensorClass c);

struct QuantPolicy {
    // Format per TensorClass (indexed by its value). kBF16 means "not quantized on load": the
    // tensor stays as the checkpoint stores it. Allowed: kBF16, kFP8E4M3Block128, kInt8Row,
    // kInt4G32, kInt4G128.
    std::array<WeightFormat, kTensorClassCount> formats{WeightFormat::kBF16, WeightFormat::kBF16,
                                                        WeightFormat::kBF16, WeightFormat::kBF16,
                                                        WeightFormat::kBF16, WeightFormat::kBF16};

    WeightFormat format_for(TensorClass c) const { return formats[static_cast<size_t>(c)]; }
    void set(TensorClass c, WeightFormat f) { formats[static_cast<size_t>(c)] = f; }
    // Whether any class is quantized.
    bool quantizes_anything() const;
    // Canonical "attention=bf16,dense_mlp=bf16,...", which parses back to the same policy.
    std::string to_string() const;
    bool operator==(const QuantPolicy&) const = default;
};

// Parses a policy string (see the header comment). Errors (kInvalidArgument) name the offending
// token and list the valid classes, formats or presets: unknown class or format, a preset after a
// pair, a class given twice, an empty string or an empty item.
Result<QuantPolicy> parse_quant_policy(std::string_view text);

// The preset named `name`, or kInvalidArgument listing the presets.
// none: nothing quantized. experts-int4 / experts-int4-g128: routed experts INT4 (group 32 / 128),
// the rest BF16. all-fp8 / all-int8: every linear layer (attention, dense MLP, shared and routed
// experts) in FP8 / INT8, embeddings and lm_head left BF16, as DeepSeek-V3 and Kimi K2 ship.
Result<QuantPolicy> quant_policy_preset(std::string_view name);

// The policy spelling of a format: "bf16", "fp8", "int8", "int4-g32", "int4-g128".
const char* policy_format_name(WeightFormat f);

// The class of a weight tensor from its Hugging Face name, or nullopt for tensors that are never
// quantized (norms, biases, the MoE router `mlp.gate`, score-correction biases, MLA's
// `kv_b_proj`, which the attention reads in float) and for names this
// does not recognise. Suffixes of quantized checkpoints (.weight, .weight_scale_inv,
// .weight_packed, .weight_scale, .weight_shape) map to the class of their module.
std::optional<TensorClass> tensor_class_for_name(std::string_view name);

}  // namespace edge::engine::quant
