#include <algorithm>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include "common/json_text.h"
#include "common/log.h"
#include "engine/model/model_config.h"
#include "engine/model/weight_loader.h"
#include "engine/tokenizer/pcre2_error.h"

// StoredQuantization, ModulePattern and parse_stored_quantization (declared in weight_loader.h):
// config.json's `quantization_config`, parsed and checked when a WeightLoader is created.

namespace edge::engine {

namespace {

// A JSON value's text for an error ("4", "\"float\"", "null").
std::string json_repr(const boost::json::value* v) {
    return v == nullptr ? "absent" : json_text(*v);
}

// compressed-tensors `config_groups`: each group's `weights` must be a scheme the kernels compute,
// and nothing else may be quantized (activations, the KV cache), since the engine would silently
// not apply it. Records the schemes declared in `out` (matrix() checks the tensors against them).
// `where` names the config file and 'quantization_config; `top_format` is the top-level format.
Status check_config_groups(const boost::json::object& q, const std::string& where,
                           const std::string& top_format, StoredQuantization& out) {
    if (const boost::json::value* kv = q.if_contains("kv_cache_scheme");
        kv != nullptr && !kv->is_null()) {
        return invalid_argument_error(where + ".kv_cache_scheme' is " + json_repr(kv) +
                                      ": KV cache quantization is not supported (must be null)");
    }
    const boost::json::value* groups = q.if_contains("config_groups");
    if (groups == nullptr || !groups->is_object() || groups->as_object().empty()) {
        return invalid_argument_error(where +
                                      ".config_groups' is missing, not an object or "
                                      "empty: it says how the weights are quantized");
    }
    for (const auto& g : groups->as_object()) {
        const std::string at = where + ".config_groups." + std::string(g.key());
        if (!g.value().is_object()) {
            return invalid_argument_error(at + "' is not an object");
        }
        const boost::json::object& group = g.value().as_object();
        // input_activations (W8A8, FP8 dynamic) is how the activations may be rounded for a
        // faster product: the kernels round them their own way (docs/quantization.md), never
        // coarser, so such a checkpoint runs as weight-only. Quantized outputs would change what
        // the next layer reads: refused.
        if (const boost::json::value* a = group.if_contains("output_activations");
            a != nullptr && !a->is_null()) {
            return invalid_argument_error(
                at + ".output_activations' is not null: output quantization is not supported");
        }
        const boost::json::value* wv = group.if_contains("weights");
        if (wv == nullptr || !wv->is_object()) {
            return invalid_argument_error(at + ".weights' is missing or not an object");
        }
        const boost::json::object& w = wv->as_object();
        const std::string wat = at + ".weights.";
        const boost::json::value* sym = w.if_contains("symmetric");
        if (sym != nullptr && !(sym->is_bool() && sym->as_bool())) {
            return invalid_argument_error(
                wat +
                "symmetric' is not true: asymmetric quantization (zero points) is not "
                "supported; use a symmetric checkpoint");
        }
        const boost::json::value* dyn = w.if_contains("dynamic");
        if (dyn != nullptr && !(dyn->is_bool() && !dyn->as_bool())) {
            return invalid_argument_error(wat + "dynamic' is " + json_repr(dyn) +
                                          ": weights quantized at run time are not supported "
                                          "(must be false: scales stored in the checkpoint)");
        }
        const boost::json::value* bits = w.if_contains("num_bits");
        if (bits == nullptr || !bits->is_int64() ||
            (bits->as_int64() != 4 && bits->as_int64() != 8)) {
            return invalid_argument_error(wat + "num_bits' is " + json_repr(bits) +
                                          " (supported: 4 for int, 8 for int or float)");
        }
        const boost::json::value* type = w.if_contains("type");
        const std::string type_name =
            type == nullptr ? "int" : (type->is_string() ? std::string(type->as_string()) : "");
        if (type_name != "int" && type_name != "float") {
            return invalid_argument_error(wat + "type' is " + json_repr(type) +
                                          " (supported: \"int\", \"float\")");
        }
        const int64_t nbits = bits->as_int64();
        if (type_name == "float" && nbits != 8) {
            return invalid_argument_error(wat + "num_bits' is " + std::to_string(nbits) +
                                          " with type \"float\" (supported: 8, FP8 E4M3)");
        }
        const boost::json::value* strategy = w.if_contains("strategy");
        const std::string strategy_name =
            strategy != nullptr && strategy->is_string() ? std::string(strategy->as_string()) : "";
        // The format the group's tensors are stored in: its own, else the top-level one.
        std::string format = top_format;
        if (const boost::json::value* f = group.if_contains("format"); f != nullptr) {
            format = f->is_string() ? std::string(f->as_string()) : json_repr(f);
            if (top_format != "mixed-precision" && format != top_format) {
                return invalid_argument_error(at + ".format' is '" + format +
                                              "' but the top-level format is '" + top_format +
                                              "' (groups of different formats: mixed-precision)");
            }
        }
        std::string want_format;
        std::string want_strategy;
        if (type_name == "int" && nbits == 4) {
            want_format = "pack-quantized";
            want_strategy = "group";
        } else if (type_name == "int") {
            want_format = "int-quantized";
            want_strategy = "channel";
        } else {
            want_format = "float-quantized";
            want_strategy = "block";
        }
        if (format != want_format && format != "mixed-precision") {
            return invalid_argument_error(
                at + (group.contains("format") ? ".format'" : "' (format, from the top level)") +
                " is '" + format + "', but weights of num_bits " + std::to_string(nbits) +
                " and type \"" + type_name + "\" are stored in format '" + want_format + "'");
        }
        if (strategy_name != want_strategy) {
            return invalid_argument_error(
                wat + "strategy' is " + json_repr(strategy) + "; " + type_name +
                std::to_string(nbits) + " weights are supported with strategy \"" + want_strategy +
                "\" only" +
                (want_strategy == "group"     ? " (group_size 32 or 128)"
                 : want_strategy == "channel" ? " (one scale per output row)"
                                              : " (block_structure [128, 128])"));
        }
        const std::string name(g.key());
        if (want_strategy == "group") {
            const boost::json::value* gs = w.if_contains("group_size");
            if (gs == nullptr || !gs->is_int64() ||
                (gs->as_int64() != 32 && gs->as_int64() != 128)) {
                return invalid_argument_error(wat + "group_size' is " + json_repr(gs) +
                                              " (supported: 32, 128)");
            }
            out.int4_groups.emplace(gs->as_int64(), name);
        } else if (want_strategy == "channel") {
            out.int8_group = name;
        } else {
            const boost::json::value* bs = w.if_contains("block_structure");
            if (bs == nullptr || !bs->is_array() || bs->as_array().size() != 2 ||
                !bs->as_array()[0].is_int64() || !bs->as_array()[1].is_int64() ||
                bs->as_array()[0].as_int64() != 128 || bs->as_array()[1].as_int64() != 128) {
                return invalid_argument_error(wat + "block_structure' is " + json_repr(bs) +
                                              " (supported: [128, 128])");
            }
            out.fp8_group = name;
        }
    }
    return ok_status();
}

}  // namespace

Result<ModulePattern> ModulePattern::compile(std::string_view pattern) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                      PCRE2_ANCHORED | PCRE2_UTF, &error_code, &error_offset, nullptr);
    if (code == nullptr) {
        return invalid_argument_error("at offset " + std::to_string(error_offset) + ": " +
                                      tokenizer::pcre2_error_message(error_code));
    }
    ModulePattern p;
    p.code_ = std::shared_ptr<const void>(code, [](const void* c) {
        pcre2_code_free(static_cast<pcre2_code*>(const_cast<void*>(c)));
    });
    return p;
}

bool ModulePattern::matches(std::string_view module) const {
    // Far past what a pattern over a module name needs, and milliseconds at most.
    constexpr uint32_t kMatchLimit = 100'000;
    constexpr uint32_t kHeapLimitKiB = 1024;
    const auto* code = static_cast<const pcre2_code*>(code_.get());
    std::unique_ptr<pcre2_match_context, void (*)(pcre2_match_context*)> context(
        pcre2_match_context_create(nullptr), pcre2_match_context_free);
    std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
        pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
    if (context == nullptr || match == nullptr) {
        return false;
    }
    pcre2_set_match_limit(context.get(), kMatchLimit);
    pcre2_set_heap_limit(context.get(), kHeapLimitKiB);
    // PCRE2_NO_UTF_CHECK is not given: a name that is not UTF-8 is an error, not a match.
    return pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(module.data()), module.size(), 0, 0,
                       match.get(), context.get()) >= 0;
}

bool StoredQuantization::ignores(const std::string& module) const {
    return ignore_names.contains(module) ||
           std::any_of(ignore_patterns.begin(), ignore_patterns.end(),
                       [&](const ModulePattern& p) { return p.matches(module); });
}

Result<StoredQuantization> parse_stored_quantization(const ConfigJson& config) {
    StoredQuantization out;
    const boost::json::value* qc = config.root().if_contains("quantization_config");
    if (qc == nullptr || qc->is_null()) {
        return out;
    }
    const std::string where = config.path() + ": field 'quantization_config";
    if (!qc->is_object()) {
        return invalid_argument_error(where + "' is not an object");
    }
    const boost::json::object& q = qc->as_object();
    const boost::json::value* method = q.if_contains("quant_method");
    if (method == nullptr || !method->is_string()) {
        return invalid_argument_error(where + ".quant_method' is missing or not a string");
    }
    out.quant_method = std::string(method->as_string());
    if (out.quant_method == "fp8") {
        const boost::json::value* fmt = q.if_contains("fmt");
        if (fmt != nullptr && !(fmt->is_string() && fmt->as_string() == "e4m3")) {
            return invalid_argument_error(where + ".fmt' must be \"e4m3\"");
        }
        const boost::json::value* bs = q.if_contains("weight_block_size");
        if (bs == nullptr || !bs->is_array() || bs->as_array().size() != 2 ||
            !bs->as_array()[0].is_int64() || !bs->as_array()[1].is_int64() ||
            bs->as_array()[0].as_int64() != 128 || bs->as_array()[1].as_int64() != 128) {
            return invalid_argument_error(where +
                                          ".weight_block_size' must be [128, 128] (the only "
                                          "FP8 block size supported)");
        }
        return out;
    }
    if (out.quant_method == "compressed-tensors") {
        if (const boost::json::value* ig = q.if_contains("ignore"); ig != nullptr) {
            if (!ig->is_array()) {
                return invalid_argument_error(where + ".ignore' is not a list");
            }
            for (const boost::json::value& v : ig->as_array()) {
                if (!v.is_string()) {
                    return invalid_argument_error(where + ".ignore' holds a non-string");
                }
                const std::string entry(v.as_string());
                if (!entry.starts_with("re:")) {
                    out.ignore_names.insert(entry);
                    continue;
                }
                Result<ModulePattern> pattern = ModulePattern::compile(entry.substr(3));
                if (!pattern.ok()) {
                    log::warn("quantization_ignore_pattern_skipped",
                              {{"config", config.path()},
                               {"pattern", entry},
                               {"error", pattern.status().message()}});
                    continue;
                }
                out.ignore_patterns.push_back(*std::move(pattern));
            }
        }
        std::string format = "mixed-precision";  // Absent: each group says.
        if (const boost::json::value* fmt = q.if_contains("format"); fmt != nullptr) {
            format = fmt->is_string() ? std::string(fmt->as_string()) : json_repr(fmt);
            if (format != "pack-quantized" && format != "int-quantized" &&
                format != "float-quantized" && format != "mixed-precision") {
                return invalid_argument_error(
                    where + ".format' '" + format +
                    "' is not supported (supported: pack-quantized, int-quantized, "
                    "float-quantized, mixed-precision)");
            }
        }
        EDGE_RETURN_IF_ERROR(check_config_groups(q, where, format, out));
        return out;
    }
    return invalid_argument_error(where + ".quant_method' '" + out.quant_method +
                                  "' is not supported (supported: fp8, compressed-tensors)");
}

}  // namespace edge::engine
