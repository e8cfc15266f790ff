#include "engine/quant/policy.h"

#include <cctype>
#include <vector>

namespace edge::engine::quant {
namespace {

constexpr TensorClass kAllClasses[kTensorClassCount] = {
    TensorClass::kAttention,     TensorClass::kDenseMlp,   TensorClass::kSharedExpert,
    TensorClass::kRoutedExperts, TensorClass::kEmbeddings, TensorClass::kLmHead};

constexpr WeightFormat kPolicyFormats[] = {WeightFormat::kBF16, WeightFormat::kFP8E4M3Block128,
                                           WeightFormat::kInt8Row, WeightFormat::kInt4G32,
                                           WeightFormat::kInt4G128};

constexpr std::string_view kPresets[] = {"none", "experts-int4", "experts-int4-g128", "all-fp8",
                                         "all-int8"};

std::string_view trim(std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) {
        s.remove_prefix(1);
    }
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) {
        s.remove_suffix(1);
    }
    return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
    std::vector<std::string_view> out;
    size_t start = 0;
    while (true) {
        const size_t pos = s.find(sep, start);
        if (pos == std::string_view::npos) {
            out.push_back(s.substr(start));
            return out;
        }
        out.push_back(s.substr(start, pos - start));
        start = pos + 1;
    }
}

std::string class_list() {
    std::string s;
    for (TensorClass c : kAllClasses) {
        s += (s.empty() ? "" : ", ") + std::string(tensor_class_name(c));
    }
    return s;
}

std::string format_list() {
    std::string s;
    for (WeightFormat f : kPolicyFormats) {
        s += (s.empty() ? "" : ", ") + std::string(policy_format_name(f));
    }
    return s;
}

std::string preset_list() {
    std::string s;
    for (std::string_view p : kPresets) {
        s += (s.empty() ? "" : ", ") + std::string(p);
    }
    return s;
}

std::optional<TensorClass> parse_class(std::string_view s) {
    for (TensorClass c : kAllClasses) {
        if (s == tensor_class_name(c)) {
            return c;
        }
    }
    return std::nullopt;
}

std::optional<WeightFormat> parse_format(std::string_view s) {
    for (WeightFormat f : kPolicyFormats) {
        if (s == policy_format_name(f)) {
            return f;
        }
    }
    return std::nullopt;
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// gate_proj, up_proj, down_proj and fused gate_up_proj.
bool is_mlp_projection(std::string_view leaf) {
    return leaf == "gate_proj" || leaf == "up_proj" || leaf == "down_proj" ||
           leaf == "gate_up_proj" || leaf == "w1" || leaf == "w2" || leaf == "w3";
}

}  // namespace

const char* tensor_class_name(TensorClass c) {
    switch (c) {
        case TensorClass::kAttention:
            return "attention";
        case TensorClass::kDenseMlp:
            return "dense_mlp";
        case TensorClass::kSharedExpert:
            return "shared_expert";
        case TensorClass::kRoutedExperts:
            return "routed_experts";
        case TensorClass::kEmbeddings:
            return "embeddings";
        case TensorClass::kLmHead:
            return "lm_head";
    }
    return "?";
}

const char* policy_format_name(WeightFormat f) {
    switch (f) {
        case WeightFormat::kBF16:
            return "bf16";
        case WeightFormat::kFP8E4M3Block128:
            return "fp8";
        case WeightFormat::kInt8Row:
            return "int8";
        case WeightFormat::kInt4G32:
            return "int4-g32";
        case WeightFormat::kInt4G128:
            return "int4-g128";
        case WeightFormat::kF32:
            return "f32";
        case WeightFormat::kF16:
            return "f16";
    }
    return "?";
}

bool QuantPolicy::quantizes_anything() const {
    for (WeightFormat f : formats) {
        if (f != WeightFormat::kBF16) {
            return true;
        }
    }
    return false;
}

std::string QuantPolicy::to_string() const {
    std::string s;
    for (TensorClass c : kAllClasses) {
        s += (s.empty() ? "" : ",") + std::string(tensor_class_name(c)) + "=" +
             policy_format_name(format_for(c));
    }
    return s;
}

Result<QuantPolicy> quant_policy_preset(std::string_view name) {
    QuantPolicy p;
    if (name == "none") {
        return p;
    }
    if (name == "experts-int4" || name == "experts-int4-g128") {
        p.set(TensorClass::kRoutedExperts,
              name == "experts-int4" ? WeightFormat::kInt4G32 : WeightFormat::kInt4G128);
        return p;
    }
    if (name == "all-fp8" || name == "all-int8") {
        const WeightFormat f =
            name == "all-fp8" ? WeightFormat::kFP8E4M3Block128 : WeightFormat::kInt8Row;
        for (TensorClass c : {TensorClass::kAttention, TensorClass::kDenseMlp,
                              TensorClass::kSharedExpert, TensorClass::kRoutedExperts}) {
            p.set(c, f);
        }
        return p;
    }
    return invalid_argument_error("unknown quantization preset '" + std::string(name) +
                                  "' (presets: " + preset_list() + ")");
}

Result<QuantPolicy> parse_quant_policy(std::string_view text) {
    const std::string_view whole = trim(text);
    if (whole.empty()) {
        return invalid_argument_error("empty quantization policy (use a preset: " + preset_list() +
                                      ", or class=format pairs)");
    }
    QuantPolicy policy;
    bool assigned[kTensorClassCount] = {};
    bool saw_pair = false;
    std::string_view preset_name;
    for (std::string_view raw : split(whole, ',')) {
        const std::string_view item = trim(raw);
        const std::string where = " in quantization policy '" + std::string(whole) + "'";
        if (item.empty()) {
            return invalid_argument_error("empty item" + where);
        }
        const size_t eq = item.find('=');
        if (eq == std::string_view::npos) {
            if (saw_pair) {
                return invalid_argument_error("preset '" + std::string(item) +
                                              "' must come before class=format pairs" + where);
            }
            if (!preset_name.empty()) {
                // Presets do not combine (the second would replace the first): one preset, then
                // class=format pairs that change it.
                return invalid_argument_error("preset '" + std::string(item) + "' after preset '" +
                                              std::string(preset_name) + "'" + where +
                                              ": give one preset, then class=format pairs");
            }
            preset_name = item;
            auto preset = quant_policy_preset(item);
            if (!preset.ok()) {
                return invalid_argument_error("unknown preset '" + std::string(item) + "'" + where +
                                              " (presets: " + preset_list() +
                                              "; or class=format pairs)");
            }
            policy = *preset;
            continue;
        }
        saw_pair = true;
        const std::string_view cls = trim(item.substr(0, eq));
        const std::string_view fmt = trim(item.substr(eq + 1));
        const std::optional<TensorClass> c = parse_class(cls);
        if (!c) {
            return invalid_argument_error("unknown tensor class '" + std::string(cls) + "'" +
                                          where + " (classes: " + class_list() + ")");
        }
        const std::optional<WeightFormat> f = parse_format(fmt);
        if (!f) {
            return invalid_argument_error("unknown format '" + std::string(fmt) + "' for " +
                                          std::string(cls) + where + " (formats: " + format_list() +
                                          ")");
        }
        if (assigned[static_cast<size_t>(*c)]) {
            return invalid_argument_error("tensor class '" + std::string(cls) + "' given twice" +
                                          where);
        }
        assigned[static_cast<size_t>(*c)] = true;
        policy.set(*c, *f);
    }
    return policy;
}

std::optional<TensorClass> tensor_class_for_name(std::string_view name) {
    // Strip the tensor suffix to get the module path.
    std::string_view module;
    bool found = false;
    for (std::string_view suffix :
         {".weight_scale_inv", ".weight_packed", ".weight_scale", ".weight_shape", ".weight"}) {
        if (ends_with(name, suffix)) {
            module = name.substr(0, name.size() - suffix.size());
            found = true;
            break;
        }
    }
    if (!found) {
        return std::nullopt;  // Biases and other non-matrix tensors.
    }
    const std::vector<std::string_view> parts = split(module, '.');
    const std::string_view leaf = parts.back();
    if (leaf == "embed_tokens" || leaf == "embed_in" || leaf == "wte") {
        return TensorClass::kEmbeddings;
    }
    if (leaf == "lm_head" || leaf == "embed_out") {
        return TensorClass::kLmHead;
    }
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
        const std::string_view p = parts[i];
        if (p == "self_attn" || p == "attention" || p == "attn") {
            // Projections only; q_norm, k_norm, q_a_layernorm, kv_a_layernorm are not matrices.
            // MLA's kv_b_proj neither: the absorbed attention reads it element by element, so
            // it stays in float (WeightLoader::float_matrix dequantizes a stored quantized one).
            if (leaf == "kv_b_proj") {
                return std::nullopt;
            }
            if (ends_with(leaf, "_proj") || leaf == "kv_a_proj_with_mqa") {
                return TensorClass::kAttention;
            }
            return std::nullopt;
        }
        if (p == "mlp" || p == "block_sparse_moe" || p == "feed_forward") {
            const std::string_view next = parts[i + 1];
            if (next == "experts") {
                // experts.<n>.gate_proj, or fused experts.gate_up_proj / experts.down_proj.
                return is_mlp_projection(leaf) ? std::optional(TensorClass::kRoutedExperts)
                                               : std::nullopt;
            }
            if (next == "shared_experts" || next == "shared_expert") {
                return is_mlp_projection(leaf) ? std::optional(TensorClass::kSharedExpert)
                                               : std::nullopt;
            }
            if (i + 2 == parts.size() && is_mlp_projection(leaf)) {
                return TensorClass::kDenseMlp;  // mlp.gate_proj etc. directly.
            }
            return std::nullopt;  // The router (mlp.gate), shared_expert_gate, ...
        }
    }
    return std::nullopt;
}

}  // namespace edge::engine::quant
