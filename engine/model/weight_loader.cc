#include "engine/model/weight_loader.h"

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/log.h"
#include "engine/backend.h"
#include "engine/cpu/convert.h"
#include "engine/load_progress.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/stored_tensor.h"
#include "engine/quant/checkpoint_formats.h"
#include "engine/quant/quant_kernels.h"
#include "engine/quant/row_tiles.h"

namespace edge::engine {
namespace {

quant::TensorDType to_quant_dtype(DType d) {
    switch (d) {
        case DType::kBF16:
            return quant::TensorDType::kBF16;
        case DType::kF16:
            return quant::TensorDType::kF16;
        case DType::kF32:
            return quant::TensorDType::kF32;
        case DType::kF8E4M3:
            return quant::TensorDType::kF8E4M3;
        case DType::kI8:
            return quant::TensorDType::kI8;
        case DType::kI32:
            return quant::TensorDType::kI32;
        case DType::kI64:
            return quant::TensorDType::kI64;
    }
    return quant::TensorDType::kF32;
}

quant::TensorRef ref(const TensorView& t) {
    quant::TensorRef r;
    r.name = t.info->name;
    r.dtype = to_quant_dtype(t.dtype());
    r.shape = t.shape();
    r.data = t.data;
    r.size_bytes = t.nbytes;
    return r;
}

std::string module_of(const std::string& weight_name) {
    constexpr std::string_view kSuffix = ".weight";
    if (weight_name.size() > kSuffix.size() &&
        weight_name.compare(weight_name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
        return weight_name.substr(0, weight_name.size() - kSuffix.size());
    }
    return weight_name;
}

Status shape_error(const TensorView& t, const std::vector<int64_t>& want) {
    return invalid_argument_error(*t.file + ": tensor '" + t.info->name + "' has shape " +
                                  shape_string(t.shape()) + ", expected " + shape_string(want));
}

}  // namespace

bool is_quantized_format(WeightFormat f) {
    return f == WeightFormat::kFP8E4M3Block128 || f == WeightFormat::kInt8Row ||
           f == WeightFormat::kInt4G32 || f == WeightFormat::kInt4G128;
}

void embedding_row(const Weight& w, int64_t r, float* out) {
    switch (w.format) {
        case WeightFormat::kBF16:
            for (int64_t d = 0; d < w.cols; ++d) {
                out[d] = cpu::bf16_to_f32(cpu::load_u16(w.data, r * w.cols + d));
            }
            return;
        case WeightFormat::kF16:
            for (int64_t d = 0; d < w.cols; ++d) {
                out[d] = cpu::f16_to_f32(cpu::load_u16(w.data, r * w.cols + d));
            }
            return;
        case WeightFormat::kF32:
            for (int64_t d = 0; d < w.cols; ++d) {
                out[d] = cpu::load_f32(w.data, r * w.cols + d);
            }
            return;
        default:
            quant::dequantize_row(w, r, out);
            return;
    }
}

// compressed-tensors: every config group's `weights.symmetric` must be true (or absent): the
// asymmetric scheme (zero points) is not supported and would load as garbage. `where` names
// the config file and 'quantization_config.
Status check_symmetric(const boost::json::object& q, const std::string& where) {
    const boost::json::value* groups = q.if_contains("config_groups");
    if (groups == nullptr || !groups->is_object()) {
        return ok_status();
    }
    for (const auto& g : groups->as_object()) {
        const boost::json::value* weights =
            g.value().is_object() ? g.value().as_object().if_contains("weights") : nullptr;
        if (weights == nullptr || !weights->is_object()) {
            continue;
        }
        const boost::json::value* sym = weights->as_object().if_contains("symmetric");
        if (sym != nullptr && !(sym->is_bool() && sym->as_bool())) {
            return invalid_argument_error(
                where + ".config_groups." + std::string(g.key()) +
                ".weights.symmetric' is not true: asymmetric quantization (zero points) is not "
                "supported; use a symmetric checkpoint");
        }
    }
    return ok_status();
}

Result<StoredQuantization> parse_stored_quantization(const ConfigJson& config) {
    StoredQuantization out;
    boost::system::error_code ec;
    boost::json::value root = boost::json::parse(config.text(), ec);
    if (ec || !root.is_object()) {
        return invalid_argument_error(config.path() + ": not a JSON object");
    }
    const boost::json::value* qc = root.as_object().if_contains("quantization_config");
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
                out.ignore.emplace_back(v.as_string());
            }
        }
        EDGE_RETURN_IF_ERROR(check_symmetric(q, where));
        if (const boost::json::value* fmt = q.if_contains("format");
            fmt != nullptr && fmt->is_string()) {
            const std::string f(fmt->as_string());
            if (f != "pack-quantized" && f != "int-quantized" && f != "float-quantized" &&
                f != "mixed-precision") {
                return invalid_argument_error(
                    where + ".format' '" + f +
                    "' is not supported (supported: pack-quantized, int-quantized, "
                    "float-quantized, mixed-precision)");
            }
        }
        return out;
    }
    return invalid_argument_error(where + ".quant_method' '" + out.quant_method +
                                  "' is not supported (supported: fp8, compressed-tensors)");
}

Result<std::unique_ptr<WeightLoader>> WeightLoader::create(const Checkpoint& checkpoint,
                                                           const ConfigJson& config,
                                                           const std::string& policy) {
    EDGE_ASSIGN_OR_RETURN(StoredQuantization stored, parse_stored_quantization(config));
    quant::QuantPolicy p;
    if (!policy.empty() && policy != "none") {
        EDGE_ASSIGN_OR_RETURN(p, quant::parse_quant_policy(policy));
    }
    return std::unique_ptr<WeightLoader>(new WeightLoader(checkpoint, std::move(stored), p));
}

Result<Weight> WeightLoader::keep(quant::QuantizedWeight w) {
    const Weight& v = w.view();
    if (row_tiles_ && quant::row_tiles_by_default(v.format) &&
        quant::row_tiles_support(v.format, v.cols) &&
        quant::matmul_kernel_for(v.format, WeightLayout::kRowTiles16) != nullptr) {
        EDGE_ASSIGN_OR_RETURN(quant::QuantizedWeight tiled, quant::tile_rows(v));
        const int64_t data_bytes = quant::weight_data_bytes(v.format, v.rows, v.cols);
        if (w.owns_data()) {  // Quantized on load: the tiles replace the row-major copy.
            added_bytes_ += tiled.size_bytes() - w.size_bytes();
        } else {  // Viewed in the mapping: those bytes are no longer read; the tiles are new.
            replaced_bytes_ += data_bytes;
            added_bytes_ += tiled.size_bytes() - w.size_bytes() + data_bytes;
            release_mapped_pages(v.data, data_bytes);
        }
        w = std::move(tiled);  // Frees the row-major copy, if any.
    }
    owned_.push_back(std::move(w));
    return owned_.back().view();
}

Result<Weight> WeightLoader::matrix_for(const Backend& backend, const std::string& weight_name,
                                        int64_t rows, int64_t cols) {
    EDGE_ASSIGN_OR_RETURN(Weight w, matrix(weight_name, rows, cols));
    if (!backend.supports(Op::kMatmul, w.format)) {
        return unimplemented_error(ckpt_.description() + ": tensor '" + weight_name +
                                   "': backend " + std::string(backend.name()) +
                                   " has no matmul for format " +
                                   std::string(quant::weight_format_name(w.format)));
    }
    return w;
}

void WeightLoader::kept_as_stored(const std::string& weight_name, std::string_view stored_as) {
    const std::optional<quant::TensorClass> cls = quant::tensor_class_for_name(weight_name);
    if (!cls || !is_quantized_format(policy_.format_for(*cls))) {
        return;
    }
    const size_t c = static_cast<size_t>(*cls);
    if (!policy_skipped_[c]) {
        policy_skipped_[c] = true;
        log::warn("quantization_policy_not_applied",
                  {{"checkpoint", ckpt_.description()},
                   {"class", quant::tensor_class_name(*cls)},
                   {"policy_format", quant::policy_format_name(policy_.format_for(*cls))},
                   {"stored_as", stored_as},
                   {"detail", "the checkpoint stores this class quantized already; a policy "
                              "quantizes float tensors only, so these stay as stored"}});
    }
}

Status WeightLoader::check_declared(const std::string& m, const TensorView& t) const {
    const std::string& name = t.info->name;
    if (name.ends_with(".weight_packed")) {
        if (stored_.quant_method != "compressed-tensors") {
            return invalid_argument_error(ckpt_.description() + ": module '" + m +
                                          "' has weight_packed but config.json's "
                                          "quantization_config.quant_method is '" +
                                          stored_.quant_method + "', not compressed-tensors");
        }
        return ok_status();
    }
    if (t.dtype() == DType::kF8E4M3 && stored_.quant_method != "fp8" &&
        stored_.quant_method != "compressed-tensors") {
        return invalid_argument_error(*t.file + ": tensor '" + name +
                                      "' is F8_E4M3 but config.json declares no "
                                      "quantization_config.quant_method");
    }
    if (t.dtype() == DType::kI8 && stored_.quant_method != "compressed-tensors") {
        return invalid_argument_error(*t.file + ": tensor '" + name +
                                      "' is I8 but config.json's quantization_config is not "
                                      "compressed-tensors");
    }
    return ok_status();
}

Status WeightLoader::check_headers() const {
    static const std::vector<DType> kFloat = {DType::kBF16, DType::kF16, DType::kF32};
    for (const std::string& name : ckpt_.names()) {
        const bool packed = name.ends_with(".weight_packed");
        if (!packed && !name.ends_with(".weight")) {
            continue;
        }
        EDGE_ASSIGN_OR_RETURN(TensorView t, ckpt_.tensor(name));
        const std::string m = name.substr(0, name.rfind('.'));
        EDGE_RETURN_IF_ERROR(check_declared(m, t));
        // A float matrix the policy quantizes on load: what quantize() refuses by shape alone.
        const std::optional<quant::TensorClass> cls = quant::tensor_class_for_name(name);
        if (packed || !cls || t.shape().size() != 2 ||
            std::find(kFloat.begin(), kFloat.end(), t.dtype()) == kFloat.end()) {
            continue;
        }
        const WeightFormat target = policy_.format_for(*cls);
        if (Status s = quant::check_quantizable_shape(target, t.shape()[1], name); !s.ok()) {
            return s.with_context(*t.file);
        }
    }
    return ok_status();
}

Result<Weight> WeightLoader::matrix(const std::string& weight_name, int64_t rows, int64_t cols) {
    note_matrix_loading();
    const std::string m = module_of(weight_name);
    const std::string where = ckpt_.description() + ": module '" + m + "'";
    // Tensors of quantization schemes the kernels do not compute: loading without them would
    // run the model with wrong weights, silently.
    if (ckpt_.has(m + ".weight_zero_point")) {
        return invalid_argument_error(
            where + ": tensor '" + m +
            ".weight_zero_point' holds zero points of asymmetric quantization, which is not "
            "supported (only symmetric INT4, INT8 and FP8 weights load)");
    }
    if (ckpt_.has(m + ".weight_g_idx")) {
        return invalid_argument_error(
            where + ": tensor '" + m +
            ".weight_g_idx' maps columns to scale groups (GPTQ activation order, actorder: "
            "group), which is not supported (groups must be runs of consecutive columns)");
    }
    // compressed-tensors INT4, viewed in place.
    if (ckpt_.has(m + ".weight_packed")) {
        EDGE_ASSIGN_OR_RETURN(TensorView packed, ckpt_.tensor(m + ".weight_packed"));
        EDGE_RETURN_IF_ERROR(check_declared(m, packed));
        EDGE_ASSIGN_OR_RETURN(TensorView scale, ckpt_.tensor(m + ".weight_scale"));
        EDGE_ASSIGN_OR_RETURN(TensorView shape, ckpt_.tensor(m + ".weight_shape"));
        if (scale.shape().size() != 2 || scale.shape()[1] <= 0 || scale.shape()[0] != rows ||
            cols % scale.shape()[1] != 0) {
            return invalid_argument_error(*scale.file + ": tensor '" + scale.info->name +
                                          "' has shape " + shape_string(scale.shape()) +
                                          ", expected [" + std::to_string(rows) + ", " +
                                          std::to_string(cols) + " / group size]");
        }
        const int64_t group = cols / scale.shape()[1];
        // The format's checks name the tensor; the shard is named here.
        Result<quant::QuantizedWeight> parsed =
            quant::from_compressed_tensors(ref(packed), ref(scale), ref(shape), group, rows, cols);
        if (!parsed.ok()) {
            return parsed.status().with_context(*packed.file);
        }
        quant::QuantizedWeight w = std::move(parsed).value();
        kept_as_stored(weight_name, "int4");
        return keep(std::move(w));
    }
    EDGE_ASSIGN_OR_RETURN(TensorView t, ckpt_.tensor(weight_name));
    EDGE_RETURN_IF_ERROR(check_declared(m, t));
    if (t.dtype() == DType::kF8E4M3) {
        const std::string scale_name =
            m + (stored_.quant_method == "fp8" ? ".weight_scale_inv" : ".weight_scale");
        if (t.shape() != std::vector<int64_t>{rows, cols}) {
            return shape_error(t, {rows, cols});
        }
        EDGE_ASSIGN_OR_RETURN(TensorView scale, ckpt_.tensor(scale_name));
        Result<quant::QuantizedWeight> parsed =
            quant::from_fp8_block(ref(t), ref(scale), /*scan_for_nan=*/true);
        if (!parsed.ok()) {
            return parsed.status().with_context(*t.file);
        }
        kept_as_stored(weight_name, "fp8");
        return keep(std::move(parsed).value());
    }
    if (t.dtype() == DType::kI8) {
        if (t.shape() != std::vector<int64_t>{rows, cols}) {
            return shape_error(t, {rows, cols});
        }
        EDGE_ASSIGN_OR_RETURN(TensorView scale, ckpt_.tensor(m + ".weight_scale"));
        const bool shape_ok = (scale.shape() == std::vector<int64_t>{rows, 1} ||
                               scale.shape() == std::vector<int64_t>{rows});
        if (!shape_ok || scale.dtype() != DType::kF32) {
            return invalid_argument_error(*scale.file + ": tensor '" + scale.info->name + "' is " +
                                          std::string(dtype_name(scale.dtype())) + " " +
                                          shape_string(scale.shape()) + ", expected F32 [" +
                                          std::to_string(rows) + ", 1]");
        }
        std::vector<float> scales(rows);
        std::memcpy(scales.data(), scale.data, rows * sizeof(float));
        for (int64_t r = 0; r < rows; ++r) {
            if (!std::isfinite(scales[r]) || scales[r] < 0) {
                return invalid_argument_error(*scale.file + ": tensor '" + scale.info->name +
                                              "': row " + std::to_string(r) +
                                              " has a negative or non-finite scale");
            }
        }
        kept_as_stored(weight_name, "int8");
        return keep(
            quant::QuantizedWeight(WeightFormat::kInt8Row, rows, cols, t.data, std::move(scales)));
    }
    static const std::vector<DType> kFloat = {DType::kBF16, DType::kF16, DType::kF32};
    EDGE_ASSIGN_OR_RETURN(t, ckpt_.tensor(weight_name, kFloat, {rows, cols}));
    const std::optional<quant::TensorClass> cls = quant::tensor_class_for_name(weight_name);
    const WeightFormat target = cls ? policy_.format_for(*cls) : WeightFormat::kBF16;
    if (is_quantized_format(target)) {
        quant::SourceMatrix src;
        std::vector<float> tmp;
        if (t.dtype() == DType::kBF16) {
            src = quant::SourceMatrix::bf16(static_cast<const uint16_t*>(t.data), rows, cols);
        } else {
            tmp.resize(static_cast<size_t>(rows * cols));
            embedding_row(Weight{float_format_of(t.dtype()), 1, rows * cols, t.data, nullptr}, 0,
                          tmp.data());
            src = quant::SourceMatrix::f32(tmp.data(), rows, cols);
        }
        EDGE_ASSIGN_OR_RETURN(quant::QuantizedWeight w, quant::quantize(src, target, weight_name));
        replaced_bytes_ += t.nbytes;
        added_bytes_ += w.size_bytes();
        release_mapped_pages(t.data, t.nbytes);  // The quantized copy is what is read from now.
        return keep(std::move(w));
    }
    Weight w;
    w.format = float_format_of(t.dtype());
    w.rows = rows;
    w.cols = cols;
    w.data = t.data;
    return w;
}

Result<Weight> WeightLoader::float_matrix(const std::string& weight_name, int64_t rows,
                                         int64_t cols) {
    note_matrix_loading();
    static const std::vector<DType> kFloat = {DType::kBF16, DType::kF16, DType::kF32};
    if (ckpt_.has(weight_name)) {
        EDGE_ASSIGN_OR_RETURN(TensorView t, ckpt_.tensor(weight_name));
        if (std::find(kFloat.begin(), kFloat.end(), t.dtype()) != kFloat.end()) {
            EDGE_ASSIGN_OR_RETURN(t, ckpt_.tensor(weight_name, kFloat, {rows, cols}));
            return Weight{float_format_of(t.dtype()), rows, cols, t.data, nullptr};
        }
    }
    // Stored quantized: read as matrix() does (a float tensor was handled above, so no policy
    // applies), row-major, then widened row by row.
    const bool tiles = row_tiles_;
    row_tiles_ = false;
    Result<Weight> q = matrix(weight_name, rows, cols);
    row_tiles_ = tiles;
    if (!q.ok()) {
        return q.status();
    }
    std::vector<float>& copy = float_copies_.emplace_back(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
        embedding_row(*q, r, copy.data() + r * cols);
    }
    added_bytes_ += rows * cols * static_cast<int64_t>(sizeof(float));
    return Weight{WeightFormat::kF32, rows, cols, copy.data(), nullptr};
}

int64_t WeightLoader::resident_bytes() const {
    return ckpt_.total_bytes() - replaced_bytes_ + added_bytes_;
}

}  // namespace edge::engine
