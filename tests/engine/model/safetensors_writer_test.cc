// write_safetensors: the tensors tile the data section with no gap (as Hugging Face's reader
// requires), the data starts on a 64-byte boundary of the file (the header padded with spaces),
// the tensors whose size is a multiple of 64 come first and so each starts on a line, and the
// file reads back through Checkpoint (which refuses gaps).

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "engine/model/safetensors_writer.h"

namespace edge::engine {
namespace {

// Writes `tensors` to a temp file and reads each back: the same bytes, starting on a line when
// its size is a multiple of 64 and at a multiple of its element size always (the reader refuses
// a misaligned tensor).
void write_and_read_back(const std::vector<TensorToWrite>& tensors) {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() /
        ("edge_st_writer_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "model.safetensors").string();
    REQUIRE(write_safetensors(path, tensors).ok());
    auto ck = Checkpoint::open_files({path});
    REQUIRE_MESSAGE(ck.ok(), ck.status().to_string());
    for (const TensorToWrite& t : tensors) {
        CAPTURE(t.name);
        auto view = (*ck)->tensor(t.name);
        REQUIRE_MESSAGE(view.ok(), view.status().to_string());
        CHECK(view->nbytes == static_cast<int64_t>(t.bytes.size()));
        CHECK(std::string(static_cast<const char*>(view->data), t.bytes.size()) == t.bytes);
        // The mapping starts on a page, so the pointer's alignment is the file offset's.
        if (t.bytes.size() % 64 == 0) {
            CHECK(reinterpret_cast<uintptr_t>(view->data) % 64 == 0);
        }
        CHECK(reinterpret_cast<uintptr_t>(view->data) % dtype_size(t.dtype) == 0);
    }
    std::filesystem::remove_all(dir);
}

TEST_CASE("safetensors writer: no gaps, line-multiple tensors on lines, bytes read back") {
    // Odd sizes (6, 2 bytes) between line multiples (128, 64 bytes): written after them.
    const std::string a(6, '\x11'), b(128, '\x22'), c(2, '\x33'), d(64, '\x44');
    write_and_read_back({
        {"a", DType::kBF16, {3}, a, {}},
        {"b", DType::kF32, {32}, b, {}},
        {"c", DType::kBF16, {1}, c, {}},
        {"d", DType::kBF16, {2, 16}, d, {}},
    });
}

TEST_CASE("safetensors writer: odd-sized tensors of mixed element sizes each start aligned") {
    // A BF16 tensor of odd length given before an F32 one left the F32 at an offset of 2 mod 4,
    // which the reader refuses: the writer wrote files it could not read (quantize on a
    // checkpoint with such tensors). The rest go by element size, largest first.
    // Held here: TensorToWrite refers to its bytes.
    const std::string a(6, '\x01'), b(5, '\x02'), c(12, '\x03'), d(64, '\x04'), e(10, '\x05');
    write_and_read_back({
        {"odd.bf16", DType::kBF16, {3}, a, {}},
        {"odd.i8", DType::kI8, {5}, b, {}},
        {"odd.f32", DType::kF32, {3}, c, {}},
        {"line.f32", DType::kF32, {16}, d, {}},
        {"odd.bf16.b", DType::kBF16, {5}, e, {}},
    });
}

TEST_CASE("safetensors writer: a name given twice is refused before anything is written") {
    // The header kept one entry of the name and the data section both tensors' bytes: a file
    // with bytes no entry points at, refused only when read back (after the whole write); across
    // shards, the index mapped the name to one of them.
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() /
        ("edge_st_dup_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir);
    const std::string a(64, '\x11'), b(64, '\x22'), c(2, '\x33');
    const std::vector<TensorToWrite> tensors = {{"m.weight_shape", DType::kBF16, {32}, a, {}},
                                                {"other", DType::kBF16, {1}, c, {}},
                                                {"m.weight_shape", DType::kBF16, {32}, b, {}}};
    const std::string path = (dir / "model.safetensors").string();
    const Status one = write_safetensors(path, tensors);
    CHECK(one.code() == StatusCode::kInvalidArgument);
    CHECK(one.message() == path + ": tensor 'm.weight_shape' is given twice; a checkpoint holds "
                                  "one tensor of each name");
    for (const uint64_t shard : {uint64_t{1} << 20, uint64_t{64}}) {  // One file, then shards.
        CAPTURE(shard);
        auto written = write_checkpoint_weights(dir.string(), tensors, shard);
        REQUIRE_FALSE(written.ok());
        CHECK(written.status().code() == StatusCode::kInvalidArgument);
        CHECK(written.status().message().find("tensor 'm.weight_shape' is given twice") !=
              std::string::npos);
    }
    CHECK(std::filesystem::is_empty(dir));  // No file, no .partial, no shard, no index.
    std::filesystem::remove_all(dir);
}

TEST_CASE("safetensors writer: a failed rename reports its own error, not the cleanup's") {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() /
        ("edge_st_rename_" + std::to_string(std::random_device{}()));
    // A non-empty directory where the file goes: the rename over it fails.
    std::filesystem::create_directories(dir / "config.json" / "inside");
    const Status st = write_text_file((dir / "config.json").string(), "{}");
    CHECK_FALSE(st.ok());
    CHECK(st.message().find("cannot replace with") != std::string::npos);
    // The removal of the partial file after it succeeded and used to overwrite the error.
    CHECK(st.message().find("Success") == std::string::npos);
    CHECK_FALSE(std::filesystem::exists(dir / "config.json.partial"));
    std::filesystem::remove_all(dir);
}

TEST_CASE("durable writes: files and directories are synced, what cannot be is named") {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("edge_st_sync_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir);
    const std::string a(64, '\x11'), b(64, '\x22');
    const std::vector<TensorToWrite> tensors = {{"a", DType::kBF16, {32}, a, {}},
                                                {"b", DType::kBF16, {32}, b, {}}};
    // One file, then shards and their index: each synced and renamed, then the directory.
    auto one = write_checkpoint_weights(dir.string(), tensors, 1 << 20);
    REQUIRE_MESSAGE(one.ok(), one.status().to_string());
    auto sharded = write_checkpoint_weights(dir.string(), tensors, 64);
    REQUIRE_MESSAGE(sharded.ok(), sharded.status().to_string());
    CHECK(sharded->size() == 3);
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        CHECK(e.path().extension() != ".partial");
    }
    CHECK(fsync_path(dir.string()).ok());
    CHECK(fsync_path((dir / "model.safetensors").string()).ok());
    const std::string missing = (dir / "missing").string();
    const Status st = fsync_path(missing);
    CHECK(st.code() == StatusCode::kInternal);
    CHECK(st.message().find(missing) != std::string::npos);
    std::filesystem::remove_all(dir);
}

TEST_CASE("durable writes: a directory that takes no new file fails cleanly, naming the file") {
    // /proc takes no new file, even from root (who writes into a mode 0555 directory).
    const Status text = write_text_file("/proc/config.json", "{}");
    CHECK(text.code() == StatusCode::kInternal);
    CHECK(text.message().find("/proc/config.json.partial") != std::string::npos);
    const std::string a(64, '\x11');
    auto weights = write_checkpoint_weights("/proc", {{"a", DType::kBF16, {32}, a, {}}}, 1 << 20);
    REQUIRE_FALSE(weights.ok());
    CHECK(weights.status().message().find("/proc/model.safetensors.partial") != std::string::npos);
}

TEST_CASE("checkpoint directory lock: one writer at a time, released on destruction") {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() /
        ("edge_st_lock_" + std::to_string(std::random_device{}()));
    auto first = prepare_checkpoint_dir(dir.string());
    REQUIRE_MESSAGE(first.ok(), first.status().to_string());
    const std::filesystem::path lock_file = dir / CheckpointDirLock::kFileName;
    CHECK(std::filesystem::exists(lock_file));
    // An interrupted write's leftover, as the other writer's file in progress looks.
    { std::ofstream(dir / "model.safetensors.partial") << "in progress"; }
    auto second = prepare_checkpoint_dir(dir.string(), {}, true);
    REQUIRE_FALSE(second.ok());
    CHECK(second.status().code() == StatusCode::kFailedPrecondition);
    CHECK(second.status().message().find("another quantize (or make-model) is writing " +
                                         dir.string()) != std::string::npos);
    CHECK(std::filesystem::exists(dir / "model.safetensors.partial"));  // Not the second's.
    { CheckpointDirLock released = std::move(first).value(); }
    CHECK_FALSE(std::filesystem::exists(lock_file));
    auto third = prepare_checkpoint_dir(dir.string(), {}, true);
    REQUIRE_MESSAGE(third.ok(), third.status().to_string());
    CHECK_FALSE(std::filesystem::exists(dir / "model.safetensors.partial"));
    third.value() = CheckpointDirLock();  // Released here.
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace edge::engine
