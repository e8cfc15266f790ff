#include "engine/tools/quantize.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

#include "common/json_text.h"
#include "engine/engine.h"
#include "engine/model/loader.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/safetensors_writer.h"
#include "engine/model/weight_loader.h"
#include "engine/quant/checkpoint_formats.h"
#include "engine/quant/policy.h"
#include "engine/quant/quantized_weight.h"
#include "engine/tokenizer/tiktoken.h"
#include "engine/tokenizer/tokenizer_config.h"
#include "engine/tools/cli.h"

namespace edge::engine {
namespace {

namespace json = boost::json;

// The flat index of the first NaN or Inf of a BF16/F16/F32 tensor (its exponent bits all set),
// or -1; other dtypes hold no such values.
int64_t first_non_finite(const TensorView& t) {
    auto scan = [&](auto word, uint64_t exponent_mask) -> int64_t {
        using Word = decltype(word);
        const auto* p = static_cast<const Word*>(t.data);
        const int64_t n = t.nbytes / static_cast<int64_t>(sizeof(Word));
        for (int64_t i = 0; i < n; ++i) {
            Word w;
            std::memcpy(&w, p + i, sizeof(Word));  // The mapping may be unaligned for it.
            if ((w & exponent_mask) == exponent_mask) {
                return i;
            }
        }
        return -1;
    };
    switch (t.dtype()) {
        case DType::kBF16: return scan(uint16_t{}, 0x7f80);
        case DType::kF16: return scan(uint16_t{}, 0x7c00);
        case DType::kF32: return scan(uint32_t{}, 0x7f800000);
        default: return -1;
    }
}
namespace fs = std::filesystem;

std::string_view as_bytes(const void* p, size_t n) { return {static_cast<const char*>(p), n}; }

// Owned bytes of the tensors to write, kept alive until write_safetensors returns. Deques: the
// TensorToWrite entries view these elements while more are added, so they must never move.
struct Buffers {
    std::deque<quant::QuantizedWeight> weights;
    std::deque<std::array<int32_t, 2>> shapes;  // weight_shape of each INT4 matrix written.
};

}  // namespace

Status quantize_checkpoint(const QuantizeOptions& options) {
    EDGE_ASSIGN_OR_RETURN(quant::QuantPolicy policy, quant::parse_quant_policy(options.policy));
    // What the loader would refuse (config fields, headers, the tokenizer and generation
    // config) is refused here, before hours of writing.
    EDGE_RETURN_IF_ERROR(check_model_files(options.model_dir, ""));
    EDGE_RETURN_IF_ERROR(tokenizer::load_checkpoint_tokenizer(options.model_dir).status());
    EDGE_RETURN_IF_ERROR(tokenizer::load_tokenizer_config(options.model_dir).status());
    EDGE_ASSIGN_OR_RETURN(ConfigJson config, ConfigJson::read(options.model_dir));
    EDGE_ASSIGN_OR_RETURN(StoredQuantization stored, parse_stored_quantization(config));
    if (!stored.quant_method.empty()) {
        return invalid_argument_error(config.path() + ": the checkpoint is already quantized ('" +
                                      stored.quant_method + "'); quantize reads BF16/F16/F32");
    }
    EDGE_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                          Checkpoint::open_dir(options.model_dir));
    // The format each linear layer's weight takes (kBF16: stays as stored).
    auto format_of = [&](const std::string& name, const TensorView& t) {
        const auto cls = quant::tensor_class_for_name(name);
        const bool linear = cls.has_value() && name.ends_with(".weight") && t.shape().size() == 2;
        return linear ? policy.format_for(*cls) : WeightFormat::kBF16;
    };
    // The formats this checkpoint ends up with (the policy's classes it has).
    std::set<WeightFormat> used;
    std::set<std::string> classes_present;
    for (const std::string& name : ckpt->names()) {
        EDGE_ASSIGN_OR_RETURN(TensorView t, ckpt->tensor(name));
        if (const auto cls = quant::tensor_class_for_name(name); cls && t.shape().size() == 2) {
            classes_present.insert(std::string(quant::tensor_class_name(*cls)));
        }
        if (const WeightFormat f = format_of(name, t); is_quantized_format(f)) {
            used.insert(f);
        }
    }
    const bool quantizes = std::any_of(policy.formats.begin(), policy.formats.end(),
                                       [](WeightFormat f) { return is_quantized_format(f); });
    if (!quantizes) {
        return invalid_argument_error("policy '" + options.policy +
                                      "' quantizes nothing (every class stays as stored); "
                                      "a copy of the checkpoint needs no quantize");
    }
    if (used.empty()) {
        std::string present;
        for (const std::string& c : classes_present) {
            present += (present.empty() ? "" : ", ") + c;
        }
        return invalid_argument_error("policy '" + options.policy + "' quantizes no tensor of " +
                                      options.model_dir + " (its matrices are in the classes: " +
                                      present + ")");
    }
    const bool fp8_only = used.size() == 1 && *used.begin() == WeightFormat::kFP8E4M3Block128;

    Buffers buf;
    std::vector<TensorToWrite> out;
    std::map<WeightFormat, std::vector<std::string>> targets;  // Modules per format.
    std::vector<std::string> ignore;
    for (const std::string& name : ckpt->names()) {
        EDGE_ASSIGN_OR_RETURN(TensorView t, ckpt->tensor(name));
        const bool linear = quant::tensor_class_for_name(name).has_value() &&
                            name.ends_with(".weight") && t.shape().size() == 2;
        const WeightFormat f = format_of(name, t);
        if (!is_quantized_format(f)) {
            // Copied as is: a NaN or Inf here (a norm's weight) would make every logit NaN.
            if (const int64_t at = first_non_finite(t); at >= 0) {
                return invalid_argument_error(*t.file + ": tensor '" + name +
                                              "': a NaN or Inf at element " + std::to_string(at) +
                                              "; refusing to write a checkpoint that cannot run");
            }
            if (linear) {
                ignore.push_back(name.substr(0, name.size() - 7));
            }
            out.push_back(
                {name, t.dtype(), t.shape(), as_bytes(t.data, static_cast<size_t>(t.nbytes)), {}});
            continue;
        }
        const std::string m = name.substr(0, name.size() - 7);
        const int64_t rows = t.shape()[0];
        const int64_t cols = t.shape()[1];
        // Quantize exactly as the loader would (same entry point, same source).
        quant::SourceMatrix src;
        std::vector<float> tmp;
        if (t.dtype() == DType::kBF16) {
            src = quant::SourceMatrix::bf16(static_cast<const uint16_t*>(t.data), rows, cols);
        } else if (t.dtype() == DType::kF16 || t.dtype() == DType::kF32) {
            tmp.resize(static_cast<size_t>(rows * cols));
            embedding_row(Weight{t.dtype() == DType::kF16 ? WeightFormat::kF16 : WeightFormat::kF32,
                                 1, rows * cols, t.data, nullptr},
                          0, tmp.data());
            src = quant::SourceMatrix::f32(tmp.data(), rows, cols);
        } else {
            return invalid_argument_error(*t.file + ": tensor '" + name + "' is " +
                                          std::string(dtype_name(t.dtype())) +
                                          "; quantize reads BF16/F16/F32");
        }
        EDGE_ASSIGN_OR_RETURN(quant::QuantizedWeight q, quant::quantize(src, f, name));
        buf.weights.push_back(std::move(q));
        const quant::QuantizedWeight& qw = buf.weights.back();
        const Weight& v = qw.view();
        const auto scales = qw.scales();
        // The loader refuses scales above the shared limit: refused here, before any writing,
        // rather than in the check after it.
        for (size_t i = 0; i < scales.size(); ++i) {
            if (!quant::scale_in_range(scales[i])) {
                return invalid_argument_error(
                    *t.file + ": tensor '" + name + "': quantized to " +
                    std::string(quant::weight_format_name(f)) + ", scale " + std::to_string(i) +
                    " would be " + std::to_string(scales[i]) +
                    " (a checkpoint's scales must be in 0..2^64; weights too large)");
            }
        }
        const std::string_view scale_bytes = as_bytes(scales.data(), scales.size() * 4);
        const int64_t data_bytes = quant::weight_data_bytes(f, rows, cols);
        targets[f].push_back(m);
        switch (f) {
            case WeightFormat::kFP8E4M3Block128: {
                const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
                out.push_back({name,
                               DType::kF8E4M3,
                               {rows, cols},
                               as_bytes(v.data, static_cast<size_t>(data_bytes)),
                               {}});
                out.push_back({m + (fp8_only ? ".weight_scale_inv" : ".weight_scale"),
                               DType::kF32,
                               {br, bc},
                               scale_bytes,
                               {}});
                break;
            }
            case WeightFormat::kInt8Row:
                out.push_back({name,
                               DType::kI8,
                               {rows, cols},
                               as_bytes(v.data, static_cast<size_t>(data_bytes)),
                               {}});
                out.push_back({m + ".weight_scale", DType::kF32, {rows, 1}, scale_bytes, {}});
                break;
            case WeightFormat::kInt4G32:
            case WeightFormat::kInt4G128: {
                // Byte for byte the pack-quantized int32 words (see engine/cpu/weight.h).
                const int64_t g = quant::int4_group_size(f);
                out.push_back({m + ".weight_packed",
                               DType::kI32,
                               {rows, cols / 8},
                               as_bytes(v.data, static_cast<size_t>(data_bytes)),
                               {}});
                out.push_back(
                    {m + ".weight_scale", DType::kF32, {rows, cols / g}, scale_bytes, {}});
                buf.shapes.push_back({static_cast<int32_t>(rows), static_cast<int32_t>(cols)});
                out.push_back({m + ".weight_shape",
                               DType::kI32,
                               {2},
                               as_bytes(buf.shapes.back().data(), 8),
                               {}});
                break;
            }
            default:
                return internal_error("quantize: unexpected format");
        }
    }
    json::object qc;  // `used` is not empty: refused above.
    if (fp8_only) {
        qc["quant_method"] = "fp8";
        qc["fmt"] = "e4m3";
        qc["activation_scheme"] = "dynamic";
        qc["weight_block_size"] = json::array{128, 128};
    } else {
        qc["quant_method"] = "compressed-tensors";
        qc["format"] =
            used.size() == 1
                ? (*used.begin() == WeightFormat::kInt8Row
                       ? "int-quantized"
                       : (*used.begin() == WeightFormat::kFP8E4M3Block128 ? "float-quantized"
                                                                          : "pack-quantized"))
                : "mixed-precision";
        qc["quantization_status"] = "compressed";
        json::object groups;
        int gi = 0;
        for (const auto& [f, mods] : targets) {
            json::object w;
            w["symmetric"] = true;
            w["dynamic"] = false;
            if (f == WeightFormat::kFP8E4M3Block128) {
                w["num_bits"] = 8;
                w["type"] = "float";
                w["strategy"] = "block";
                w["block_structure"] = json::array{128, 128};
            } else if (f == WeightFormat::kInt8Row) {
                w["num_bits"] = 8;
                w["type"] = "int";
                w["strategy"] = "channel";
            } else {
                w["num_bits"] = 4;
                w["type"] = "int";
                w["strategy"] = "group";
                w["group_size"] = quant::int4_group_size(f);
            }
            json::array tg;
            for (const std::string& mod : mods) {
                tg.emplace_back(mod);
            }
            json::object g;
            g["targets"] = std::move(tg);
            g["weights"] = std::move(w);
            g["input_activations"] = nullptr;
            g["output_activations"] = nullptr;
            g["format"] = f == WeightFormat::kFP8E4M3Block128 ? "float-quantized"
                          : f == WeightFormat::kInt8Row       ? "int-quantized"
                                                              : "pack-quantized";
            groups["group_" + std::to_string(gi++)] = std::move(g);
        }
        qc["config_groups"] = std::move(groups);
        json::array ig;
        for (const std::string& mod : ignore) {
            ig.emplace_back(mod);
        }
        qc["ignore"] = std::move(ig);
    }

    std::error_code ec;
    // The input checked out: only now is --out made (a failed run leaves no empty directory).
    // Locked until this returns (another run into it is refused, not interleaved).
    EDGE_ASSIGN_OR_RETURN(
        CheckpointDirLock lock,
        prepare_checkpoint_dir(options.out_dir, options.model_dir, options.overwrite));
    EDGE_RETURN_IF_ERROR(write_safetensors(options.out_dir + "/model.safetensors", out));
    boost::system::error_code jec;
    json::value root = json::parse(config.text(), jec);
    if (jec || !root.is_object()) {
        return invalid_argument_error(config.path() + ": not a JSON object");
    }
    root.as_object()["quantization_config"] = std::move(qc);
    root.as_object()["edgeserve_quantization_policy"] = policy.to_string();
    // The tokenizer and generation files (kCheckpointFiles); not reference outputs or other
    // artefacts, which describe the unquantized model.
    for (const char* name : kCheckpointFiles) {
        const fs::path from = fs::path(options.model_dir) / name;
        const std::string_view fname = name;
        if (fname == "config.json" || fname == "model.safetensors" ||
            !fs::is_regular_file(from, ec)) {
            continue;
        }
        fs::copy_file(from, fs::path(options.out_dir) / name,
                      fs::copy_options::overwrite_existing, ec);
        if (ec) {
            return internal_error("cannot copy " + from.string() + ": " + ec.message());
        }
    }
    // Last: config.json marks the checkpoint complete (prepare_checkpoint_dir).
    EDGE_RETURN_IF_ERROR(write_text_file(options.out_dir + "/config.json", json_text(root)));
    // The checks before cover the config and the headers; the loader checks every tensor, the
    // tokenizer and the generation config. What it refuses is not left as a checkpoint.
    if (Status loads = check_checkpoint_loads(options.out_dir); !loads.ok()) {
        fs::remove(fs::path(options.out_dir) / "config.json", ec);
        return invalid_argument_error(
            "the quantized checkpoint in " + options.out_dir + " does not load (its config.json "
            "removed), because of its input " + options.model_dir + ": " + loads.to_string());
    }
    return ok_status();
}

int quantize_main(int argc, char** argv) {
    int i = argc > 1 && std::string_view(argv[1]) == "quantize" ? 2 : 1;
    QuantizeOptions o;
    const char* usage = "usage: edgeserve quantize --model IN --policy P --out DIR [--force]\n";
    if (wants_help(argc, argv, i)) {
        std::fputs(usage, stdout);
        return 0;
    }
    for (; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "--force") {
            o.overwrite = true;
            continue;
        }
        if (a != "--model" && a != "--policy" && a != "--out") {
            std::fprintf(stderr, "unknown argument '%s'\n%s", argv[i], usage);
            return 2;
        }
        if (i + 1 >= argc) {
            std::fprintf(stderr, "missing value for %s\n%s", argv[i], usage);
            return 2;
        }
        if (a == "--model") {
            o.model_dir = argv[++i];
        } else if (a == "--policy") {
            o.policy = argv[++i];
        } else if (a == "--out") {
            o.out_dir = argv[++i];
        } else {
            std::fprintf(stderr, "unknown argument '%s'\n%s", argv[i], usage);
            return 2;
        }
    }
    for (const auto& [value, flag] : {std::pair{&o.model_dir, "--model"},
                                       std::pair{&o.policy, "--policy"},
                                       std::pair{&o.out_dir, "--out"}}) {
        if (value->empty()) {
            std::fprintf(stderr, "quantize: missing %s (or an empty value for it)\n%s", flag,
                         usage);
            return 2;
        }
    }
    Status st = quantize_checkpoint(o);
    if (!st.ok()) {
        std::fprintf(stderr, "quantize: %s\n", st.to_string().c_str());
        return 1;
    }
    std::printf("wrote %s (policy %s)\n", o.out_dir.c_str(), o.policy.c_str());
    return 0;
}

}  // namespace edge::engine
