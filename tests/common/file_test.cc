// read_small_file on real files: a regular file, and the things a model directory can hold
// instead (nothing, a directory, a FIFO, a link to a device, an oversized file).

#include "common/file.h"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace edge {
namespace {

namespace fs = std::filesystem;

struct Dir {
    fs::path path = fs::temp_directory_path() / ("edge_file_test_" + std::to_string(::getpid()));
    Dir() { fs::create_directories(path); }
    ~Dir() { fs::remove_all(path); }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

TEST_CASE("read_small_file reads a regular file whole") {
    Dir d;
    std::ofstream(d.file("a.json"), std::ios::binary) << std::string("{\"x\":\0}", 7);
    Result<std::string> text = read_small_file(d.file("a.json"));
    REQUIRE(text.ok());
    CHECK(*text == std::string("{\"x\":\0}", 7));
    std::ofstream(d.file("empty.json"));
    CHECK(read_small_file(d.file("empty.json")).value().empty());
}

TEST_CASE("read_small_file refuses what is not a bounded regular file, naming it") {
    Dir d;
    Result<std::string> missing = read_small_file(d.file("none.json"));
    CHECK(missing.status().code() == StatusCode::kNotFound);
    CHECK(missing.status().message().find(d.file("none.json") + ": cannot open") == 0);

    fs::create_directory(d.path / "config.json");
    Result<std::string> dir = read_small_file(d.file("config.json"));
    CHECK(dir.status().code() == StatusCode::kInvalidArgument);
    CHECK(dir.status().message() == d.file("config.json") + ": not a regular file");

    // A FIFO would block a plain open until a writer came.
    REQUIRE(::mkfifo(d.file("fifo.json").c_str(), 0600) == 0);
    CHECK(read_small_file(d.file("fifo.json")).status().message().find("not a regular file") !=
          std::string::npos);

    // A link to an endless device.
    fs::create_symlink("/dev/zero", d.path / "tokenizer.json");
    CHECK(read_small_file(d.file("tokenizer.json")).status().message().find(
              "not a regular file") != std::string::npos);

    std::ofstream(d.file("big.json")) << std::string(100, 'x');
    Result<std::string> big = read_small_file(d.file("big.json"), 99);
    CHECK(big.status().code() == StatusCode::kInvalidArgument);
    CHECK(big.status().message() == d.file("big.json") + ": larger than 99 bytes (100)");
    CHECK(read_small_file(d.file("big.json"), 100).ok());
}

}  // namespace
}  // namespace edge
