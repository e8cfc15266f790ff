// The safetensors reader against files that change under it while it loads them and files whose
// data section would leave the tensors misaligned: each is a Status naming the file, never a
// SIGBUS or a misaligned read.

#include "engine/model/safetensors.h"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "engine/model/loader.h"
#include "engine/model/safetensors_writer.h"
#include "tests/testing/test_certs.h"

namespace edge::engine {
namespace {

const std::string kFixtures = std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/";

bool contains(const Status& s, const std::string& text) {
    return s.message().find(text) != std::string::npos;
}

TEST_CASE("populate: a file truncated after it was mapped is an error, not a SIGBUS") {
    // The reviewer's reproduction: the file shrinks between open (which maps its old size) and
    // the read of the weights. MADV_POPULATE_READ reports the pages past the new end as EFAULT;
    // touching them, as the fallback did for any error, raised SIGBUS.
    testing::TempDir dir;
    const std::string path = dir.write("w.safetensors", std::string(size_t{4} << 20, '\x5a'));
    auto file = MappedFile::open(path);
    REQUIRE_MESSAGE(file.ok(), file.status().to_string());
    REQUIRE(::truncate(path.c_str(), 4096) == 0);
    const Status s = (*file)->populate();
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, path + ": bytes 0.."));
    CHECK(contains(s, "truncated"));
}

TEST_CASE("populate: a file whose size changed while it was read is refused") {
    testing::TempDir dir;
    const std::string path = dir.write("w.safetensors", std::string(64 << 10, '\x5a'));
    auto file = MappedFile::open(path);
    REQUIRE_MESSAGE(file.ok(), file.status().to_string());
    // Grown: every mapped byte is still readable, but the file is not what was opened.
    REQUIRE(::truncate(path.c_str(), 128 << 10) == 0);
    const Status s = (*file)->populate();
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, path + ": changed size while loading (65536 bytes when opened, 131072 now)"));
    // An unchanged file populates.
    auto same = MappedFile::open(path);
    REQUIRE(same.ok());
    CHECK((*same)->populate().ok());
}

TEST_CASE("safetensors: a data section that does not start at a multiple of 8 is refused") {
    // An F32 tensor at data offset 0, with the header 1 byte longer than a multiple of 8: the
    // data section starts at an odd byte and the floats would be read misaligned.
    std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    while ((8 + header.size()) % 8 != 1) {
        header += ' ';
    }
    testing::TempDir dir;
    const std::string path = dir.file("model.safetensors");
    REQUIRE(write_raw_safetensors(path, header, std::string(8, '\0')).ok());
    auto odd = Checkpoint::open_files({path});
    REQUIRE_FALSE(odd.ok());
    CHECK(odd.status().code() == StatusCode::kDataLoss);
    CHECK(odd.status().message() ==
          path + ": header length " + std::to_string(header.size()) +
              " puts the data section at byte " + std::to_string(8 + header.size()) +
              ", not a multiple of 8, so its tensors would be misaligned; re-save the checkpoint "
              "with the safetensors library (which pads the header to a multiple of 8)");
    // The same header padded to a multiple of 8, as the safetensors library writes it, loads.
    header += std::string(7, ' ');
    REQUIRE(write_raw_safetensors(path, header, std::string(8, '\0')).ok());
    auto padded = Checkpoint::open_files({path});
    REQUIRE_MESSAGE(padded.ok(), padded.status().to_string());
    CHECK((*padded)->has("a"));
}

TEST_CASE("safetensors: every fixture's data section is 8-aligned and its checkpoint opens") {
    for (const char* fixture :
         {"micro-qwen3-moe", "micro-glm4-moe", "micro-deepseek-v3", "fortunes-qwen3-moe"}) {
        CAPTURE(fixture);
        auto ckpt = Checkpoint::open_dir(kFixtures + fixture, /*populate=*/false);
        REQUIRE_MESSAGE(ckpt.ok(), ckpt.status().to_string());
        CHECK(check_model_files(kFixtures + fixture, "").ok());
    }
}

}  // namespace
}  // namespace edge::engine
