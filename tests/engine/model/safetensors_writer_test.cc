// write_safetensors: the tensors tile the data section with no gap (as Hugging Face's reader
// requires), the data starts on a 64-byte boundary of the file (the header padded with spaces),
// the tensors whose size is a multiple of 64 come first and so each starts on a line, and the
// file reads back through Checkpoint (which refuses gaps).

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "engine/model/safetensors_writer.h"

namespace edge::engine {
namespace {

TEST_CASE("safetensors writer: no gaps, line-multiple tensors on lines, bytes read back") {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() /
        ("edge_st_writer_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "model.safetensors").string();
    // Odd sizes (6, 2 bytes) between line multiples (128, 64 bytes): written after them.
    const std::string a(6, '\x11'), b(128, '\x22'), c(2, '\x33'), d(64, '\x44');
    const std::vector<TensorToWrite> tensors = {
        {"a", DType::kBF16, {3}, a, {}},
        {"b", DType::kF32, {32}, b, {}},
        {"c", DType::kBF16, {1}, c, {}},
        {"d", DType::kBF16, {2, 16}, d, {}},
    };
    REQUIRE(write_safetensors(path, tensors).ok());
    auto ck = Checkpoint::open_files({path});
    REQUIRE_MESSAGE(ck.ok(), ck.status().to_string());
    for (const TensorToWrite& t : tensors) {
        auto view = (*ck)->tensor(t.name);
        REQUIRE_MESSAGE(view.ok(), view.status().to_string());
        CHECK(view->nbytes == static_cast<int64_t>(t.bytes.size()));
        CHECK(std::string(static_cast<const char*>(view->data), t.bytes.size()) == t.bytes);
        // The mapping starts on a page, so the pointer's alignment is the file offset's.
        if (t.bytes.size() % 64 == 0) {
            CHECK(reinterpret_cast<uintptr_t>(view->data) % 64 == 0);
        }
    }
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace edge::engine
