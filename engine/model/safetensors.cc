#include "engine/model/safetensors.h"

#include <algorithm>
#include <boost/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "common/json_text.h"

namespace edge::engine {
namespace {

namespace json = boost::json;

struct DTypeName {
    std::string_view name;
    DType dtype;
    int64_t size;
};
constexpr DTypeName kDTypes[] = {
    {"BF16", DType::kBF16, 2}, {"F16", DType::kF16, 2},  {"F32", DType::kF32, 4},
    {"F8_E4M3", DType::kF8E4M3, 1}, {"I8", DType::kI8, 1}, {"I32", DType::kI32, 4},
    {"I64", DType::kI64, 8},
};

std::string quote(std::string_view s) {
    std::string out = "'";
    for (char c : s.substr(0, 200)) {
        unsigned char u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
            out += '?';
        } else {
            out += c;
        }
    }
    return out + "'";
}

// Reads a JSON number that must be a non-negative integer.
bool non_negative_int(const json::value& v, int64_t* out) {
    if (v.is_int64()) {
        if (v.get_int64() < 0) {
            return false;
        }
        *out = v.get_int64();
        return true;
    }
    if (v.is_uint64()) {
        if (v.get_uint64() > static_cast<uint64_t>(INT64_MAX)) {
            return false;
        }
        *out = static_cast<int64_t>(v.get_uint64());
        return true;
    }
    return false;
}

Result<TensorInfo> parse_entry(std::string_view file, const std::string& name,
                               const json::value& v, uint64_t data_size) {
    auto bad = [&](const std::string& what) {
        return Status(StatusCode::kDataLoss,
                      std::string(file) + ": tensor " + quote(name) + ": " + what);
    };
    if (!v.is_object()) {
        return bad("header entry is not an object");
    }
    const json::object& o = v.get_object();
    TensorInfo info;
    info.name = name;

    const json::value* dt = o.if_contains("dtype");
    if (dt == nullptr || !dt->is_string()) {
        return bad("missing or non-string 'dtype'");
    }
    std::string_view dts(dt->get_string());
    const DTypeName* found = nullptr;
    for (const DTypeName& d : kDTypes) {
        if (d.name == dts) {
            found = &d;
        }
    }
    if (found == nullptr) {
        return bad("unsupported dtype " + quote(dts));
    }
    info.dtype = found->dtype;

    const json::value* sh = o.if_contains("shape");
    if (sh == nullptr || !sh->is_array()) {
        return bad("missing or non-array 'shape'");
    }
    if (sh->get_array().size() > 8) {
        return bad("shape has more than 8 dimensions");
    }
    int64_t numel = 1;
    for (const json::value& d : sh->get_array()) {
        int64_t dim = 0;
        if (!non_negative_int(d, &dim)) {
            return bad("shape has a dimension that is not a non-negative integer");
        }
        info.shape.push_back(dim);
        if (__builtin_mul_overflow(numel, dim, &numel)) {
            return bad("shape " + shape_string(info.shape) + " overflows");
        }
    }
    int64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, found->size, &nbytes)) {
        return bad("shape " + shape_string(info.shape) + " overflows");
    }

    const json::value* off = o.if_contains("data_offsets");
    if (off == nullptr || !off->is_array() || off->get_array().size() != 2) {
        return bad("missing 'data_offsets' [begin, end]");
    }
    if (!non_negative_int(off->get_array()[0], &info.begin) ||
        !non_negative_int(off->get_array()[1], &info.end)) {
        return bad("data_offsets are not non-negative integers");
    }
    if (info.end < info.begin) {
        return bad("data_offsets end " + std::to_string(info.end) + " before begin " +
                   std::to_string(info.begin));
    }
    if (static_cast<uint64_t>(info.end) > data_size) {
        return bad("data_offsets end " + std::to_string(info.end) +
                   " is past the data section (" + std::to_string(data_size) +
                   " bytes; file truncated?)");
    }
    if (info.end - info.begin != nbytes) {
        return bad("data_offsets span " + std::to_string(info.end - info.begin) +
                   " bytes but dtype " + std::string(found->name) + " shape " +
                   shape_string(info.shape) + " needs " + std::to_string(nbytes));
    }
    if (info.begin % found->size != 0) {
        return bad("data offset " + std::to_string(info.begin) + " is not aligned to " +
                   std::to_string(found->size) + " bytes");
    }
    return info;
}

// The first member name that the JSON object `text` (already parsed, so valid JSON) holds more
// than once, unescaped. Boost.JSON keeps one of the entries and drops the others, so the parsed
// object cannot tell; a header that gives one tensor two entries (another dtype, shape or
// offsets) is ambiguous, and the entry kept could be the wrong one.
std::optional<std::string> repeated_member(std::string_view text) {
    std::set<std::string, std::less<>> seen;
    int depth = 0;
    bool key_next = false;  // The next string at depth 1 is a member name.
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (c == '"') {
            size_t end = i + 1;
            while (end < text.size() && text[end] != '"') {
                end += text[end] == '\\' ? 2 : 1;
            }
            if (depth == 1 && key_next) {
                key_next = false;
                std::error_code ec;
                const json::value key = json::parse(text.substr(i, end + 1 - i), ec);
                if (!ec && key.is_string() && !seen.emplace(key.get_string()).second) {
                    return std::string(key.get_string());
                }
            }
            i = end;
        } else if (c == '{' || c == '[') {
            key_next = ++depth == 1;
        } else if (c == '}' || c == ']') {
            --depth;
        } else if (c == ',' && depth == 1) {
            key_next = true;
        }
    }
    return std::nullopt;
}

}  // namespace

std::string_view dtype_name(DType dtype) {
    for (const DTypeName& d : kDTypes) {
        if (d.dtype == dtype) {
            return d.name;
        }
    }
    return "?";
}

int64_t dtype_size(DType dtype) {
    for (const DTypeName& d : kDTypes) {
        if (d.dtype == dtype) {
            return d.size;
        }
    }
    return 1;
}

std::string shape_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        s += (i ? ", " : "") + std::to_string(shape[i]);
    }
    return s + "]";
}

int64_t TensorView::numel() const { return nbytes / dtype_size(info->dtype); }

Result<SafetensorsHeader> parse_safetensors_header(std::string_view prefix, uint64_t file_size,
                                                   std::string_view file_name) {
    const std::string file(file_name);
    if (file_size < 8 || prefix.size() < 8) {
        return data_loss_error(file + ": " + std::to_string(file_size) +
                               " bytes is too short for a safetensors header");
    }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) {
        header_len = (header_len << 8) | static_cast<uint8_t>(prefix[i]);
    }
    if (header_len > kMaxSafetensorsHeaderBytes) {
        return data_loss_error(file + ": header length " + std::to_string(header_len) +
                               " is larger than the limit " +
                               std::to_string(kMaxSafetensorsHeaderBytes));
    }
    if (header_len > file_size - 8 || header_len > prefix.size() - 8) {
        return data_loss_error(file + ": header length " + std::to_string(header_len) +
                               " is past the end of the file (" + std::to_string(file_size) +
                               " bytes; truncated?)");
    }
    std::string_view text = prefix.substr(8, header_len);
    EDGE_ASSIGN_OR_RETURN(
        const json::object root,
        parse_json_object(text, file + ": header (from byte 8)", StatusCode::kDataLoss));
    if (const std::optional<std::string> twice = repeated_member(text)) {
        return data_loss_error(file + ": tensor " + quote(*twice) +
                               " is named twice in the header (which entry holds its dtype, " +
                               "shape and offsets?)");
    }
    SafetensorsHeader header;
    header.data_offset = static_cast<int64_t>(8 + header_len);
    const uint64_t data_size = file_size - 8 - header_len;
    for (const auto& kv : root) {
        std::string name(kv.key());
        if (name == "__metadata__") {
            if (!kv.value().is_object()) {
                return data_loss_error(file + ": __metadata__ is not an object");
            }
            continue;
        }
        if (name.empty()) {
            return data_loss_error(file + ": tensor with an empty name");
        }
        if (name.size() > kMaxTensorNameBytes) {
            // Real names are module paths of a few dozen bytes; a megabyte-long one only costs
            // every later step that matches or copies it.
            return data_loss_error(file + ": tensor name of " + std::to_string(name.size()) +
                                   " bytes (at most " + std::to_string(kMaxTensorNameBytes) +
                                   "), beginning " + quote(name.substr(0, 64)));
        }
        EDGE_ASSIGN_OR_RETURN(TensorInfo info, parse_entry(file, name, kv.value(), data_size));
        header.tensors.push_back(std::move(info));
    }
    std::sort(header.tensors.begin(), header.tensors.end(),
              [](const TensorInfo& a, const TensorInfo& b) {
                  return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
              });
    // The tensors tile the data section exactly, as the format requires. Bytes that belong to
    // no tensor are a corrupt offset, a tensor left out of the header or bytes appended.
    int64_t covered = 0;
    const TensorInfo* prev = nullptr;
    for (const TensorInfo& t : header.tensors) {
        if (prev != nullptr && t.begin < prev->end) {
            return data_loss_error(file + ": tensor " + quote(t.name) + " (bytes " +
                                   std::to_string(t.begin) + ".." + std::to_string(t.end) +
                                   ") overlaps tensor " + quote(prev->name) + " (bytes " +
                                   std::to_string(prev->begin) + ".." +
                                   std::to_string(prev->end) + ")");
        }
        if (t.begin != covered) {
            return data_loss_error(
                file + ": data bytes " + std::to_string(covered) + ".." + std::to_string(t.begin) +
                " belong to no tensor (before " + quote(t.name) +
                "; a tensor left out of the header, or a corrupt data_offsets?)");
        }
        covered = t.end;
        prev = &t;
    }
    if (static_cast<uint64_t>(covered) != data_size) {
        return data_loss_error(file + ": data bytes " + std::to_string(covered) + ".." +
                               std::to_string(data_size) +
                               " after the last tensor belong to no tensor (a tensor left "
                               "out of the header, or bytes appended to the file?)");
    }
    // The offsets above are aligned within the data section; the section itself must start at a
    // multiple of 8 for the tensors to be aligned in the mapping (BF16 and F32 weights are read
    // through typed pointers). The safetensors library pads its headers to that; checked last, so
    // the checks of the entries still run on a file that fails only this one.
    if (header.data_offset % 8 != 0) {
        return data_loss_error(
            file + ": header length " + std::to_string(header_len) +
            " puts the data section at byte " + std::to_string(header.data_offset) +
            ", not a multiple of 8, so its tensors would be misaligned; re-save the checkpoint "
            "with the safetensors library (which pads the header to a multiple of 8)");
    }
    return header;
}

}  // namespace edge::engine
