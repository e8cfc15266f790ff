#include "engine/tools/quantize.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "common/cli_flags.h"
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

// Quantizes `name` (a 2-D BF16/F16/F32 tensor, or F8_E4M3 with its `scale_inv`) to `f` as the
// loader does (quantize_stored), refusing scales the loader would refuse.
Result<quant::QuantizedWeight> quantize_tensor(const std::string& name, const TensorView& t,
                                               WeightFormat f,
                                               const std::optional<TensorView>& scale_inv) {
    EDGE_ASSIGN_OR_RETURN(quant::QuantizedWeight q,
                          quantize_stored(t, scale_inv ? &*scale_inv : nullptr, f, name));
    const auto scales = q.scales();
    for (size_t i = 0; i < scales.size(); ++i) {
        if (!quant::scale_in_range(scales[i])) {
            return invalid_argument_error(
                *t.file + ": tensor '" + name + "': quantized to " +
                std::string(quant::weight_format_name(f)) + ", scale " + std::to_string(i) +
                " would be " + std::to_string(scales[i]) +
                " (a checkpoint's scales must be in 0..2^64; weights too large)");
        }
    }
    return q;
}

// The quantized form of the matrices the writer is about to reach. Matrices are add()ed in the
// order the writer asks for them; when it asks for one, the next `ahead` are quantized on other
// threads meanwhile (quantizing is slower than writing: one core keeps up with neither the disk
// nor the page cache), and it is dropped when the writer asks for another. So at most ahead + 1
// quantized matrices are in memory, never the output. The writer's order departs from add()'s
// where write_safetensors puts a tensor whose size is not a multiple of 64 bytes last (a small
// matrix's scales) or a shard boundary falls between a matrix's tensors; such a matrix is
// quantized again when asked for (to the same bytes: quantize is deterministic).
class QuantizedMatrices {
  public:
    explicit QuantizedMatrices(int ahead) : ahead_(ahead > 0 ? static_cast<size_t>(ahead) : 0) {}
    ~QuantizedMatrices() { running_.clear(); }  // Waits for the threads still quantizing.

    void add(const std::string& name, const TensorView& t, WeightFormat f,
             std::optional<TensorView> scale_inv = std::nullopt) {
        index_[name] = order_.size();
        order_.push_back({name, t, f, scale_inv});
    }

    // The quantized `name` (add()ed before); the pointer lives until the next call.
    Result<const quant::QuantizedWeight*> get(const std::string& name) {
        const auto it = index_.find(name);
        if (it == index_.end()) {
            return internal_error("quantize: no matrix '" + name + "' was planned");
        }
        const size_t i = it->second;
        if (held_ && held_index_ == i) {
            return &*held_;
        }
        held_.reset();
        // Those before i were passed over (asked for again later, they are made again).
        running_.erase(running_.begin(), running_.lower_bound(i));
        for (size_t j = std::max(next_launch_, i + 1); j < order_.size() && j <= i + ahead_;
             ++j) {
            running_.emplace(j, launch(j));
            next_launch_ = j + 1;
        }
        const size_t held = running_.size() + (running_.count(i) != 0 ? 0 : 1);
        stats_.max_matrices_held = std::max(stats_.max_matrices_held, static_cast<int64_t>(held));
        Result<quant::QuantizedWeight> q = internal_error("unset");
        if (auto r = running_.find(i); r != running_.end()) {
            q = r->second.get();
            running_.erase(r);
        } else {
            const Matrix& m = order_[i];
            q = quantize_tensor(m.name, m.t, m.f, m.scale_inv);
        }
        if (!q.ok()) {
            return q.status();
        }
        held_ = std::move(q).value();
        held_index_ = i;
        ++stats_.quantizations;
        return &*held_;
    }
    QuantizeStats& stats() { return stats_; }

  private:
    struct Matrix {
        std::string name;
        TensorView t;
        WeightFormat f;
        std::optional<TensorView> scale_inv;  // A stored FP8 matrix's block scales.
    };

    std::future<Result<quant::QuantizedWeight>> launch(size_t j) {
        const Matrix& m = order_[j];
        try {
            return std::async(std::launch::async,
                              [&m] { return quantize_tensor(m.name, m.t, m.f, m.scale_inv); });
        } catch (const std::system_error&) {  // No thread to be had: made when asked for.
            return std::async(std::launch::deferred,
                              [&m] { return quantize_tensor(m.name, m.t, m.f, m.scale_inv); });
        }
    }

    size_t ahead_;
    std::vector<Matrix> order_;  // Never resized once get() runs: the threads read it.
    std::map<std::string, size_t> index_;
    std::map<size_t, std::future<Result<quant::QuantizedWeight>>> running_;
    size_t next_launch_ = 0;
    std::optional<quant::QuantizedWeight> held_;
    size_t held_index_ = 0;
    QuantizeStats stats_;
};

// The bytes `bytes` of the quantized weight's data (`scales` false) or scales, checked against
// what the header promised.
Status copy_quantized(const quant::QuantizedWeight& q, bool scales, int64_t expected, char* out) {
    const void* from = scales ? static_cast<const void*>(q.scales().data()) : q.view().data;
    const int64_t have =
        scales ? static_cast<int64_t>(q.scales().size() * sizeof(float))
               : quant::weight_data_bytes(q.view().format, q.view().rows, q.view().cols);
    if (have != expected) {
        return internal_error("quantize: " + std::to_string(have) + " bytes of " +
                              (scales ? "scales" : "data") + " where the header has " +
                              std::to_string(expected));
    }
    std::memcpy(out, from, static_cast<size_t>(expected));
    return ok_status();
}

}  // namespace

Status quantize_checkpoint(const QuantizeOptions& options) {
    EDGE_ASSIGN_OR_RETURN(quant::QuantPolicy policy, quant::parse_quant_policy(options.policy));
    if (options.max_shard_bytes <= 0) {
        return invalid_argument_error("quantize: the shard size must be positive, not " +
                                      std::to_string(options.max_shard_bytes));
    }
    // What the loader would refuse (config fields, headers, the tokenizer and generation
    // config) is refused here, before hours of writing.
    EDGE_RETURN_IF_ERROR(check_model_files(options.model_dir, ""));
    EDGE_RETURN_IF_ERROR(tokenizer::load_checkpoint_tokenizer(options.model_dir).status());
    EDGE_RETURN_IF_ERROR(tokenizer::load_tokenizer_config(options.model_dir).status());
    EDGE_ASSIGN_OR_RETURN(ConfigJson config, ConfigJson::read(options.model_dir));
    EDGE_ASSIGN_OR_RETURN(StoredQuantization stored, parse_stored_quantization(config));
    // FP8 (DeepSeek-V3's and Kimi K2's releases) is read too: the policy's INT8 and INT4 classes
    // are requantized from it, the rest stays FP8 as stored (quant::requantizes).
    const bool fp8_input = stored.quant_method == "fp8";
    if (!stored.quant_method.empty() && !fp8_input) {
        return invalid_argument_error(config.path() + ": the checkpoint is already quantized ('" +
                                      stored.quant_method +
                                      "'); quantize reads BF16/F16/F32 checkpoints and FP8 ones "
                                      "in the DeepSeek-V3 layout (quant_method fp8)");
    }
    // Mapped without reading it all in first: the input may be larger than this machine's
    // memory, and each tensor is read once, in order, as it is written out.
    EDGE_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                          Checkpoint::open_dir(options.model_dir, false));
    // The format each linear layer's weight is written in: a float one the policy quantizes or
    // an FP8 one it requantizes gets the policy's format; kBF16 stays as stored (float, or FP8
    // with its scales: `stored_fp8`).
    auto stored_fp8 = [&](const std::string& name, const TensorView& t) {
        return fp8_input && t.dtype() == DType::kF8E4M3 && name.ends_with(".weight");
    };
    auto format_of = [&](const std::string& name, const TensorView& t) {
        const auto cls = quant::tensor_class_for_name(name);
        const bool linear = cls.has_value() && name.ends_with(".weight") && t.shape().size() == 2;
        const WeightFormat f = linear ? policy.format_for(*cls) : WeightFormat::kBF16;
        if (stored_fp8(name, t)) {
            return quant::requantizes(WeightFormat::kFP8E4M3Block128, f) ? f : WeightFormat::kBF16;
        }
        return t.dtype() == DType::kBF16 || t.dtype() == DType::kF16 || t.dtype() == DType::kF32
                   ? f
                   : WeightFormat::kBF16;
    };
    // The formats this run makes (the policy's classes the checkpoint has).
    std::set<WeightFormat> used;
    std::set<std::string> classes_present;
    for (const std::string& name : ckpt->names()) {
        EDGE_ASSIGN_OR_RETURN(TensorView t, ckpt->tensor(name));
        if (const auto cls = quant::tensor_class_for_name(name); cls && t.shape().size() == 2) {
            classes_present.insert(std::string(quant::tensor_class_name(*cls)));
        }
        if (const WeightFormat f = format_of(name, t); is_quantized_format(f)) {
            EDGE_RETURN_IF_ERROR(quant::check_quantizable_shape(f, t.shape()[1], name));
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
    // All FP8, made or kept: the DeepSeek-V3 layout; else compressed-tensors.
    const bool fp8_only = used.size() == 1 && *used.begin() == WeightFormat::kFP8E4M3Block128;

    // What to write, each tensor with a fill that makes its bytes when the writer gets to it.
    const int threads = options.threads > 0
                            ? options.threads
                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    QuantizedMatrices matrices(threads - 1);
    std::vector<TensorToWrite> out;
    std::map<WeightFormat, std::vector<std::string>> targets;  // Modules per format.
    std::vector<std::string> ignore;
    for (const std::string& name : ckpt->names()) {
        if (fp8_input && name.ends_with(".weight_scale_inv")) {
            continue;  // Written with its weight below.
        }
        EDGE_ASSIGN_OR_RETURN(TensorView t, ckpt->tensor(name));
        const bool linear = quant::tensor_class_for_name(name).has_value() &&
                            name.ends_with(".weight") && t.shape().size() == 2;
        const WeightFormat f = format_of(name, t);
        std::optional<TensorView> scale_inv;
        if (stored_fp8(name, t)) {
            const std::string scale_name = name.substr(0, name.size() - 7) + ".weight_scale_inv";
            EDGE_ASSIGN_OR_RETURN(scale_inv, ckpt->tensor(scale_name));
        }
        if (!is_quantized_format(f) && scale_inv) {
            // FP8 kept as stored: its bytes, and its block scales under the output layout's name
            // (compressed-tensors calls them weight_scale; the values are the same multipliers).
            const std::string m = name.substr(0, name.size() - 7);
            targets[WeightFormat::kFP8E4M3Block128].push_back(m);
            out.push_back(
                {name, t.dtype(), t.shape(), as_bytes(t.data, static_cast<size_t>(t.nbytes)), {}});
            out.push_back({m + (fp8_only ? ".weight_scale_inv" : ".weight_scale"),
                           scale_inv->dtype(),
                           scale_inv->shape(),
                           as_bytes(scale_inv->data, static_cast<size_t>(scale_inv->nbytes)),
                           {}});
            continue;
        }
        if (!is_quantized_format(f)) {
            if (linear) {
                ignore.push_back(name.substr(0, name.size() - 7));
            }
            // Copied as is: a NaN or Inf here (a norm's weight) would make every logit NaN.
            // Checked now, before anything is written (a quantized matrix's are refused by
            // quantize() as the writer reaches it).
            if (const int64_t at = first_non_finite(t); at >= 0) {
                return invalid_argument_error(*t.file + ": tensor '" + name +
                                              "': a NaN or Inf at element " + std::to_string(at) +
                                              "; refusing to write a checkpoint that cannot run");
            }
            out.push_back(
                {name, t.dtype(), t.shape(), as_bytes(t.data, static_cast<size_t>(t.nbytes)), {}});
            continue;
        }
        const std::string m = name.substr(0, name.size() - 7);
        const int64_t rows = t.shape()[0];
        const int64_t cols = t.shape()[1];
        const int64_t data_bytes = quant::weight_data_bytes(f, rows, cols);
        const int64_t scale_bytes = quant::weight_scale_count(f, rows, cols) * 4;
        auto part = [&matrices, name](bool scales, int64_t bytes) {
            return [&matrices, name, scales, bytes](char* dst) -> Status {
                EDGE_ASSIGN_OR_RETURN(const quant::QuantizedWeight* q, matrices.get(name));
                return copy_quantized(*q, scales, bytes, dst);
            };
        };
        matrices.add(name, t, f, scale_inv);
        targets[f].push_back(m);
        ++matrices.stats().matrices;
        matrices.stats().largest_matrix_bytes =
            std::max(matrices.stats().largest_matrix_bytes, data_bytes + scale_bytes);
        switch (f) {
            case WeightFormat::kFP8E4M3Block128: {
                const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
                out.push_back({name, DType::kF8E4M3, {rows, cols}, {}, part(false, data_bytes)});
                out.push_back({m + (fp8_only ? ".weight_scale_inv" : ".weight_scale"),
                               DType::kF32,
                               {br, bc},
                               {},
                               part(true, scale_bytes)});
                break;
            }
            case WeightFormat::kInt8Row:
                out.push_back({name, DType::kI8, {rows, cols}, {}, part(false, data_bytes)});
                out.push_back(
                    {m + ".weight_scale", DType::kF32, {rows, 1}, {}, part(true, scale_bytes)});
                break;
            case WeightFormat::kInt4G32:
            case WeightFormat::kInt4G128: {
                // Byte for byte the pack-quantized int32 words (see engine/cpu/weight.h).
                const int64_t g = quant::int4_group_size(f);
                out.push_back({m + ".weight_packed",
                               DType::kI32,
                               {rows, cols / 8},
                               {},
                               part(false, data_bytes)});
                out.push_back({m + ".weight_scale",
                               DType::kF32,
                               {rows, cols / g},
                               {},
                               part(true, scale_bytes)});
                const std::array<int32_t, 2> shape{static_cast<int32_t>(rows),
                                                   static_cast<int32_t>(cols)};
                out.push_back({m + ".weight_shape", DType::kI32, {2}, {}, [shape](char* dst) {
                                   std::memcpy(dst, shape.data(), sizeof shape);
                                   return ok_status();
                               }});
                break;
            }
            default:
                return internal_error("quantize: unexpected format");
        }
    }
    // An input tensor copied as stored under a name the output gives a quantized module's tensor
    // (an unused m.weight_scale or m.weight_shape beside m.weight): both were written, and the
    // checkpoint refused only when read back. Refused now, before --out is touched.
    std::set<std::string_view> out_names;
    for (const TensorToWrite& t : out) {
        if (out_names.insert(t.name).second) {
            continue;
        }
        const std::string module = t.name.substr(0, t.name.rfind('.'));
        const std::string where =
            ckpt->has(t.name) ? *ckpt->tensor(t.name)->file : options.model_dir;
        return invalid_argument_error(where + ": tensor '" + t.name +
                                      "' is copied as stored, and module '" + module +
                                      "', quantized, is written with a tensor of that name too; "
                                      "remove the unused tensor from the input");
    }
    json::object qc;  // `used` is not empty: refused above.
    if (fp8_only) {
        qc["quant_method"] = "fp8";
        qc["fmt"] = "e4m3";
        qc["activation_scheme"] = "dynamic";
        qc["weight_block_size"] = json::array{128, 128};
    } else {
        qc["quant_method"] = "compressed-tensors";
        // One format written (made, or FP8 kept as stored) names it; several are mixed.
        const WeightFormat only = targets.begin()->first;
        qc["format"] = targets.size() == 1
                           ? (only == WeightFormat::kInt8Row
                                  ? "int-quantized"
                                  : (only == WeightFormat::kFP8E4M3Block128 ? "float-quantized"
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
    const bool made_out_dir = !fs::exists(options.out_dir, ec);
    EDGE_ASSIGN_OR_RETURN(
        CheckpointDirLock lock,
        prepare_checkpoint_dir(options.out_dir, options.model_dir, options.overwrite));
    QuantizeProgress progress;
    progress.tensors_total = static_cast<int64_t>(out.size());
    for (const TensorToWrite& t : out) {
        progress.bytes_total += static_cast<int64_t>(tensor_bytes(t));
    }
    TensorWritten on_written;
    if (options.progress) {
        on_written = [&](const TensorToWrite& t) {
            ++progress.tensors_done;
            progress.bytes_done += static_cast<int64_t>(tensor_bytes(t));
            options.progress(progress);
        };
    }
    Result<std::vector<std::string>> written = write_checkpoint_weights(
        options.out_dir, out, static_cast<uint64_t>(options.max_shard_bytes), on_written);
    if (!written.ok()) {
        // A matrix quantize() refused (a NaN in it) as the writer reached it: the weight files
        // are gone already, and a directory this run made goes too when nothing else is in it.
        { CheckpointDirLock released = std::move(lock); }
        if (made_out_dir) {
            fs::remove(options.out_dir, ec);
        }
        return written.status();
    }
    std::vector<std::string> files = std::move(written).value();
    json::object root = config.root();
    root["quantization_config"] = std::move(qc);
    root["edgeserve_quantization_policy"] = policy.to_string();
    // The tokenizer and generation files (kCheckpointFiles); not reference outputs or other
    // artefacts, which describe the unquantized model.
    for (const char* name : kCheckpointFiles) {
        const fs::path from = fs::path(options.model_dir) / name;
        const std::string_view fname = name;
        if (fname == "config.json" || fname == "model.safetensors" ||
            !fs::is_regular_file(from, ec)) {
            continue;
        }
        const fs::path to = fs::path(options.out_dir) / name;
        fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
        if (ec) {
            return internal_error("cannot copy " + from.string() + ": " + ec.message());
        }
        EDGE_RETURN_IF_ERROR(fsync_path(to.string()));
    }
    // The weights, their index and the copies durable, names included, before config.json can
    // be: after a power loss the directory is a whole checkpoint or has no config.json.
    EDGE_RETURN_IF_ERROR(fsync_path(options.out_dir));
    // Last: config.json marks the checkpoint complete (prepare_checkpoint_dir).
    EDGE_RETURN_IF_ERROR(write_text_file(options.out_dir + "/config.json", json_text(root)));
    // The checks before cover the config and the headers; the loader checks every tensor, the
    // tokenizer and the generation config. What it refuses is not left as a checkpoint.
    if (Status loads = check_checkpoint_loads(options.out_dir); !loads.ok()) {
        fs::remove(fs::path(options.out_dir) / "config.json", ec);
        // Best effort: the load error is the one to report.
        (void)fsync_path(options.out_dir);
        return invalid_argument_error(
            "the quantized checkpoint in " + options.out_dir + " does not load (its config.json "
            "removed), because of its input " + options.model_dir + ": " + loads.to_string());
    }
    // config.json's rename, durable: only now is the run's checkpoint on disk.
    if (Status synced = fsync_path(options.out_dir); !synced.ok()) {
        fs::remove(fs::path(options.out_dir) / "config.json", ec);
        return synced;
    }
    if (options.stats != nullptr) {
        *options.stats = matrices.stats();
        options.stats->files = std::move(files);
        options.stats->bytes_written = progress.bytes_total;
    }
    return ok_status();
}

Result<int64_t> parse_byte_size(std::string_view text) {
    size_t digits = 0;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') {
        ++digits;
    }
    std::string unit(text.substr(digits));
    std::transform(unit.begin(), unit.end(), unit.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    static const std::map<std::string, int64_t> kUnits = {
        {"", 1},          {"b", 1},           {"kb", 1'000},     {"mb", 1'000'000},
        {"gb", 1'000'000'000}, {"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", int64_t{1} << 30}};
    const auto unit_it = kUnits.find(unit);
    const std::string bad = "'" + std::string(text) +
                            "' is not a positive byte count (e.g. 5GB, 500MB, 2GiB or 1048576)";
    if (digits == 0 || digits > 15 || unit_it == kUnits.end()) {
        return invalid_argument_error(bad);
    }
    const int64_t value = std::stoll(std::string(text.substr(0, digits)));
    if (value <= 0 || value > (int64_t{1} << 50) / unit_it->second) {
        return invalid_argument_error(bad);
    }
    return value * unit_it->second;
}

int quantize_main(int argc, char** argv) {
    int i = argc > 1 && std::string_view(argv[1]) == "quantize" ? 2 : 1;
    QuantizeOptions o;
    const char* usage =
        "usage: edgeserve quantize --model IN --policy P --out DIR [--shard-size 5GB] "
        "[--threads N] [--force]\n";
    if (wants_help(argc, argv, i)) {
        std::fputs(usage, stdout);
        return 0;
    }
    auto wrong = [usage](const std::string& what) { return usage_error("quantize", what, usage); };
    SeenFlags seen;
    for (; i < argc; ++i) {
        const std::string_view a = argv[i];
        // With --force a second --out would wipe a directory the user may not have meant.
        if (std::string twice = seen.repeated(a); !twice.empty()) {
            return wrong(twice);
        }
        if (a == "--force") {
            o.overwrite = true;
            continue;
        }
        if (a != "--model" && a != "--policy" && a != "--out" && a != "--shard-size" &&
            a != "--threads") {
            return wrong("unknown argument '" + std::string(a) + "'");
        }
        if (i + 1 >= argc) {
            return wrong("missing the value of " + std::string(a));
        }
        const std::string v = argv[++i];
        if (a == "--model") {
            o.model_dir = v;
        } else if (a == "--policy") {
            // Checked now: a policy that does not parse is a usage error, not a failed run.
            if (Result<quant::QuantPolicy> p = quant::parse_quant_policy(v); !p.ok()) {
                return wrong("--policy: " + p.status().message());
            }
            o.policy = v;
        } else if (a == "--out") {
            o.out_dir = v;
        } else if (a == "--shard-size") {
            Result<int64_t> size = parse_byte_size(v);
            if (!size.ok()) {
                return wrong("--shard-size " + size.status().message());
            }
            o.max_shard_bytes = *size;
        } else {
            int n = 0;
            const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
            // 0 is one per core, the default (as for generate and quant-eval).
            if (ec != std::errc() || end != v.data() + v.size() || n < 0 || n > 1024) {
                return wrong("--threads '" + v + "' is not 0 (one per core) to 1024");
            }
            o.threads = n;
        }
    }
    for (const auto& [value, flag] :
         {std::pair{&o.model_dir, "--model"}, std::pair{&o.policy, "--policy"},
          std::pair{&o.out_dir, "--out"}}) {
        if (value->empty()) {
            return wrong("missing " + std::string(flag) + " (or an empty value for it)");
        }
    }
    QuantizeStats stats;
    o.stats = &stats;
    // A line every 10 s on stderr: tensors and bytes written, and the time left at this rate.
    const auto start = std::chrono::steady_clock::now();
    auto last = start;
    o.progress = [&](const QuantizeProgress& p) {
        const auto now = std::chrono::steady_clock::now();
        if (now - last < std::chrono::seconds(10) || p.tensors_done == p.tensors_total) {
            return;
        }
        last = now;
        const double elapsed = std::chrono::duration<double>(now - start).count();
        const double left = p.bytes_done > 0
                                ? elapsed * static_cast<double>(p.bytes_total - p.bytes_done) /
                                      static_cast<double>(p.bytes_done)
                                : 0.0;
        std::fprintf(stderr,
                     "quantize: %lld/%lld tensors, %.2f of %.2f GB written, %.0f s so far, "
                     "about %.0f s left\n",
                     static_cast<long long>(p.tensors_done),
                     static_cast<long long>(p.tensors_total),
                     static_cast<double>(p.bytes_done) / 1e9,
                     static_cast<double>(p.bytes_total) / 1e9, elapsed, left);
    };
    Status st = quantize_checkpoint(o);
    if (!st.ok()) {
        std::fprintf(stderr, "edgeserve quantize: %s\n", st.to_string().c_str());
        return 1;
    }
    std::printf("wrote %s (policy %s): %lld matrices quantized, %.1f MB of tensors in %zu file%s\n",
                o.out_dir.c_str(), o.policy.c_str(), static_cast<long long>(stats.matrices),
                static_cast<double>(stats.bytes_written) / 1e6, stats.files.size(),
                stats.files.size() == 1 ? "" : "s");
    return 0;
}

}  // namespace edge::engine
