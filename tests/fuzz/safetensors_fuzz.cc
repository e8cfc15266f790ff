// libFuzzer target: the safetensors header parser on arbitrary bytes (the whole input is the
// file). It must return a Status for anything malformed; every tensor it accepts must lie inside
// the data section, be aligned and not overlap the next.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "engine/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string_view bytes(reinterpret_cast<const char*>(data), size);
    auto header = edge::engine::parse_safetensors_header(bytes, size, "fuzz.safetensors");
    if (!header.ok()) {
        return 0;
    }
    const uint64_t data_size = size - static_cast<uint64_t>(header->data_offset);
    int64_t prev_end = 0;
    for (const edge::engine::TensorInfo& t : header->tensors) {
        if (t.begin < prev_end || t.end < t.begin || static_cast<uint64_t>(t.end) > data_size ||
            t.begin % edge::engine::dtype_size(t.dtype) != 0) {
            std::abort();
        }
        prev_end = t.end;
    }
    return 0;
}
