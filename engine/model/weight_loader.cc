#include "engine/model/weight_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

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

quant::TensorRef ref(const TensorView& t) { return tensor_ref(t); }

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

Result<quant::QuantizedWeight> quantize_stored(const TensorView& t, const TensorView* scale_inv,
                                               WeightFormat target, const std::string& name) {
    const int64_t rows = t.shape().size() == 2 ? t.shape()[0] : 0;
    const int64_t cols = t.shape().size() == 2 ? t.shape()[1] : 0;
    // Every error names the file the tensor is in (quantize's name only the tensor).
    auto in_file = [&](Result<quant::QuantizedWeight> r) -> Result<quant::QuantizedWeight> {
        if (!r.ok()) {
            return r.status().with_context(*t.file);
        }
        return r;
    };
    if (t.dtype() == DType::kF8E4M3 && scale_inv != nullptr) {
        Result<quant::QuantizedWeight> fp8 =
            quant::from_fp8_block(tensor_ref(t), tensor_ref(*scale_inv), /*scan_for_nan=*/true);
        if (!fp8.ok()) {
            return in_file(std::move(fp8));
        }
        return in_file(quant::requantize(fp8->view(), target, name));
    }
    if (t.dtype() == DType::kBF16) {
        return in_file(quant::quantize(
            quant::SourceMatrix::bf16(static_cast<const uint16_t*>(t.data), rows, cols), target,
            name));
    }
    if (t.dtype() != DType::kF16 && t.dtype() != DType::kF32) {
        return invalid_argument_error(*t.file + ": tensor '" + name + "' is " +
                                      std::string(dtype_name(t.dtype())) +
                                      "; only BF16/F16/F32 (or FP8 with its scales) quantize");
    }
    std::vector<float> widened(static_cast<size_t>(rows * cols));
    embedding_row(Weight{float_format_of(t.dtype()), 1, rows * cols, t.data, nullptr}, 0,
                  widened.data());
    return in_file(
        quant::quantize(quant::SourceMatrix::f32(widened.data(), rows, cols), target, name));
}

quant::TensorRef tensor_ref(const TensorView& t) {
    quant::TensorRef r;
    r.name = t.info->name;
    r.dtype = to_quant_dtype(t.dtype());
    r.shape = t.shape();
    r.data = t.data;
    r.size_bytes = t.nbytes;
    return r;
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

namespace {

// Bytes `w` holds in memory: its data and scales, or only its f32 scales when its data is viewed
// in the mapping (a stored scale tensor of any dtype is converted into an owned f32 copy).
int64_t held_bytes(const quant::QuantizedWeight& w) {
    return w.owns_data() ? w.size_bytes()
                         : static_cast<int64_t>(w.scales().size() * sizeof(float));
}

}  // namespace

void WeightLoader::replace_mapped(const void* data, int64_t bytes) {
    replaced_bytes_ += bytes;
    release_mapped_pages(data, bytes);
}

Result<Weight> WeightLoader::keep(quant::QuantizedWeight w) {
    const Weight& v = w.view();
    if (row_tiles_ && quant::row_tiles_by_default(v.format) &&
        quant::row_tiles_support(v.format, v.cols) &&
        quant::matmul_kernel_for(v.format, WeightLayout::kRowTiles16) != nullptr) {
        EDGE_ASSIGN_OR_RETURN(quant::QuantizedWeight tiled, quant::tile_rows(v, &arena_));
        if (!w.owns_data()) {  // Viewed in the mapping: the tiles are read instead.
            replace_mapped(v.data, quant::weight_data_bytes(v.format, v.rows, v.cols));
        }
        w = std::move(tiled);  // Frees the row-major copy, if any.
    }
    // Counted here, once, as what is kept: the f32 scales are held whether the data is owned or
    // viewed in the mapping.
    added_bytes_ += held_bytes(w);
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
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
    const bool ct = stored_.quant_method == "compressed-tensors";
    const bool packed = name.ends_with(".weight_packed");
    const bool fp8 = !packed && t.dtype() == DType::kF8E4M3;
    const bool int8 = !packed && t.dtype() == DType::kI8;
    if (packed && !ct) {
        return invalid_argument_error(ckpt_.description() + ": module '" + m +
                                      "' has weight_packed but config.json's "
                                      "quantization_config.quant_method is '" +
                                      stored_.quant_method + "', not compressed-tensors");
    }
    if (fp8 && stored_.quant_method != "fp8" && !ct) {
        return invalid_argument_error(*t.file + ": tensor '" + name +
                                      "' is F8_E4M3 but config.json declares no "
                                      "quantization_config.quant_method");
    }
    if (int8 && !ct) {
        return invalid_argument_error(*t.file + ": tensor '" + name +
                                      "' is I8 but config.json's quantization_config is not "
                                      "compressed-tensors");
    }
    if (!ct || !(packed || fp8 || int8)) {
        return ok_status();
    }
    // compressed-tensors: the config's groups must declare the scheme the tensors are in.
    const std::string field = "config.json's quantization_config";
    if (stored_.ignores(m)) {
        return invalid_argument_error(*t.file + ": tensor '" + name +
                                      "' is stored quantized, but " + field +
                                      ".ignore lists module '" + m + "' as left unquantized");
    }
    if (int8 && stored_.int8_group.empty()) {
        return invalid_argument_error(*t.file + ": tensor '" + name + "' is I8, but no " + field +
                                      ".config_groups entry declares int8 channel weights");
    }
    if (fp8 && stored_.fp8_group.empty()) {
        return invalid_argument_error(*t.file + ": tensor '" + name + "' is F8_E4M3, but no " +
                                      field + ".config_groups entry declares float8 block "
                                      "weights");
    }
    if (packed) {
        if (stored_.int4_groups.empty()) {
            return invalid_argument_error(*t.file + ": tensor '" + name + "' is packed int4, " +
                                          "but no " + field + ".config_groups entry declares "
                                          "int4 group weights");
        }
        // The group the scale's shape implies (cols from weight_packed's 8 per word): a shape
        // that does not divide is left to the format's shape checks, which name it.
        const TensorInfo* scale = ckpt_.info(m + ".weight_scale");
        int64_t cols = 0;  // Overflow-checked: a zero-row tensor may claim any width.
        if (scale != nullptr && scale->shape.size() == 2 && scale->shape[1] > 0 &&
            t.shape().size() == 2 && !__builtin_mul_overflow(t.shape()[1], int64_t{8}, &cols) &&
            cols % scale->shape[1] == 0) {
            const int64_t group = cols / scale->shape[1];
            if (!stored_.int4_groups.contains(group)) {
                const auto& [size, group_name] = *stored_.int4_groups.begin();
                return invalid_argument_error(
                    *t.file + ": tensor '" + m + ".weight_scale' has shape " +
                    shape_string(scale->shape) + ", groups of " + std::to_string(group) +
                    " columns, but " + field + ".config_groups." + group_name +
                    ".weights.group_size is " + std::to_string(size));
            }
        }
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
        // A float matrix the policy quantizes on load, or an FP8 one it requantizes: what
        // quantize() refuses by shape alone.
        const std::optional<quant::TensorClass> cls = quant::tensor_class_for_name(name);
        const bool is_float =
            std::find(kFloat.begin(), kFloat.end(), t.dtype()) != kFloat.end();
        if (packed || !cls || t.shape().size() != 2) {
            continue;
        }
        const WeightFormat target = policy_.format_for(*cls);
        if (!is_float && !(t.dtype() == DType::kF8E4M3 &&
                           quant::requantizes(WeightFormat::kFP8E4M3Block128, target))) {
            continue;
        }
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
        // The scales were read into f32 (kept with `w`); the stored tensor is not read again.
        replace_mapped(scale.data, scale.nbytes);
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
        // A policy that gives its class INT8 or INT4 requantizes it (quant::requantizes).
        const std::optional<quant::TensorClass> cls = quant::tensor_class_for_name(weight_name);
        const WeightFormat target = cls ? policy_.format_for(*cls) : WeightFormat::kBF16;
        if (quant::requantizes(WeightFormat::kFP8E4M3Block128, target)) {
            // Named in its file, as quantize_stored names it (requantize names only the tensor).
            Result<quant::QuantizedWeight> requantized =
                quant::requantize(parsed->view(), target, weight_name);
            if (!requantized.ok()) {
                return requantized.status().with_context(*t.file);
            }
            replace_mapped(t.data, t.nbytes);  // Neither is read again.
            replace_mapped(scale.data, scale.nbytes);
            return keep(std::move(requantized).value());
        }
        kept_as_stored(weight_name, "fp8");
        replace_mapped(scale.data, scale.nbytes);  // Read into f32 scales, as for INT4.
        return keep(std::move(parsed).value());
    }
    if (t.dtype() == DType::kI8) {
        if (t.shape() != std::vector<int64_t>{rows, cols}) {
            return shape_error(t, {rows, cols});
        }
        EDGE_ASSIGN_OR_RETURN(TensorView scale, ckpt_.tensor(m + ".weight_scale"));
        const bool shape_ok = (scale.shape() == std::vector<int64_t>{rows, 1} ||
                               scale.shape() == std::vector<int64_t>{rows});
        if (!shape_ok) {
            return invalid_argument_error(
                *scale.file + ": tensor '" + scale.info->name + "' is " +
                std::string(dtype_name(scale.dtype())) + " " + shape_string(scale.shape()) +
                ", expected [" + std::to_string(rows) + ", 1] or [" + std::to_string(rows) + "]");
        }
        // One per row, in any float dtype, within the limit of every format's scales.
        Result<std::vector<float>> scales =
            quant::read_float_scales(tensor_ref(scale), scale.shape(), "weight_scale, one per row");
        if (!scales.ok()) {
            return scales.status().with_context(*scale.file);
        }
        kept_as_stored(weight_name, "int8");
        replace_mapped(scale.data, scale.nbytes);  // Read into f32 scales, as for INT4.
        return keep(quant::QuantizedWeight(WeightFormat::kInt8Row, rows, cols, t.data,
                                           std::move(scales).value()));
    }
    static const std::vector<DType> kFloat = {DType::kBF16, DType::kF16, DType::kF32};
    EDGE_ASSIGN_OR_RETURN(t, ckpt_.tensor(weight_name, kFloat, {rows, cols}));
    const std::optional<quant::TensorClass> cls = quant::tensor_class_for_name(weight_name);
    const WeightFormat target = cls ? policy_.format_for(*cls) : WeightFormat::kBF16;
    if (is_quantized_format(target)) {
        EDGE_ASSIGN_OR_RETURN(quant::QuantizedWeight w,
                              quantize_stored(t, nullptr, target, weight_name));
        replace_mapped(t.data, t.nbytes);  // The quantized copy is what is read from now.
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
    // Read in place from the mapping (FP8 or INT8 as stored, or compressed-tensors INT4 from
    // weight_packed), the tensors matrix() read are not read again: their pages go back and are
    // not counted as held (DeepSeek-V3 and Kimi K2 store every kv_b_proj in FP8, ~1 GB). Only
    // those: another of these names, unread, is release_unread_tensors()'s to count. The scale
    // tensor, and an FP8 tensor requantized on load, matrix() counted as replaced already.
    const std::string m = module_of(weight_name);
    const bool packed = q->data != nullptr && q->data == ckpt_.mapped_data(m + ".weight_packed");
    if (packed || (q->data != nullptr && q->data == ckpt_.mapped_data(weight_name))) {
        const std::vector<std::string> read =
            packed ? std::vector<std::string>{m + ".weight_packed", m + ".weight_shape"}
                   : std::vector<std::string>{weight_name};
        for (const std::string& name : read) {
            if (const TensorInfo* t = ckpt_.has(name) ? ckpt_.info(name) : nullptr) {
                replace_mapped(ckpt_.mapped_data(name), t->end - t->begin);
            }
        }
    }
    // The QuantizedWeight matrix() kept (its f32 scales, or a copy requantized on load) was read
    // only to widen it, and nothing points into it now: it is freed, and no longer counted.
    std::lock_guard<std::mutex> lock(mu_);
    if (!owned_.empty() && owned_.back().view().data == q->data) {
        added_bytes_ -= held_bytes(owned_.back());
        owned_.pop_back();
    }
    return Weight{WeightFormat::kF32, rows, cols, copy.data(), nullptr};
}

int64_t WeightLoader::resident_bytes() const {
    return ckpt_.total_bytes() - replaced_bytes_ + added_bytes_;
}

}  // namespace edge::engine
