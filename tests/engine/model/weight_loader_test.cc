// WeightLoader and resident memory: a full-precision tensor quantized on load leaves the process's
// resident set (its pages of the checkpoint mapping are dropped once the quantized copy exists),
// while its bytes stay readable through the mapping. And matrix_for: a matrix in a format the
// backend has no matmul for is refused by name.

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/safetensors_writer.h"
#include "engine/model/weight_loader.h"
#include "engine/quant/quantized_weight.h"
#include "engine/quant/row_tiles.h"

namespace edge::engine {
namespace {

namespace fs = std::filesystem;

// Kilobytes of `path`'s mappings resident in this process (the Rss lines of /proc/self/smaps
// under each mapping whose file is `path`).
int64_t mapped_rss_kb(const std::string& path) {
    std::ifstream in("/proc/self/smaps");
    std::string line;
    bool ours = false;
    int64_t kb = 0;
    while (std::getline(in, line)) {
        // A mapping's first line: "start-end perms offset dev inode [path]".
        const size_t dash = line.find('-');
        if (dash != std::string::npos && dash > 0 &&
            line.find_first_not_of("0123456789abcdef") == dash) {
            ours = line.size() >= path.size() &&
                   line.compare(line.size() - path.size(), path.size(), path) == 0;
            continue;
        }
        if (ours && line.rfind("Rss:", 0) == 0) {
            kb += std::stoll(line.substr(4));
        }
    }
    return kb;
}

// A Qwen3-MoE checkpoint of the given tensors in a temp dir (removed at the end), opened, with
// its config.
struct TempCheckpoint {
    fs::path dir;
    std::string path;  // Its model.safetensors.
    std::unique_ptr<Checkpoint> ckpt;
    std::optional<ConfigJson> config;

    explicit TempCheckpoint(
        const std::vector<TensorToWrite>& tensors,
        const std::string& config_json = R"({"architectures": ["Qwen3MoeForCausalLM"]})") {
        dir = fs::temp_directory_path() /
              ("edge_weight_loader_" + std::to_string(std::random_device{}()));
        fs::create_directories(dir);
        std::ofstream(dir / "config.json") << config_json;
        path = fs::canonical(dir).string() + "/model.safetensors";
        REQUIRE(write_safetensors(path, tensors).ok());
        auto ck = Checkpoint::open_files({path});
        REQUIRE_MESSAGE(ck.ok(), ck.status().to_string());
        ckpt = std::move(ck).value();
        auto cfg = ConfigJson::read(dir.string());
        REQUIRE_MESSAGE(cfg.ok(), cfg.status().to_string());
        config = std::move(cfg).value();
    }
    ~TempCheckpoint() { fs::remove_all(dir); }
};

TEST_CASE("a tensor quantized on load leaves resident memory, its mapped bytes stay readable") {
    // One routed-expert matrix of 2 MiB of BF16 (1024 x 1024) with random small values.
    const int64_t rows = 1024, cols = 1024;
    std::string bytes(static_cast<size_t>(rows * cols * 2), '\0');
    std::mt19937 rng(7);
    for (size_t i = 0; i < bytes.size(); i += 2) {
        const uint16_t bf16 = static_cast<uint16_t>(0x3C00 + rng() % 0x200);  // ~0.008-0.03.
        std::memcpy(&bytes[i], &bf16, 2);
    }
    const std::string name = "model.layers.0.mlp.experts.0.gate_proj.weight";
    TempCheckpoint tmp({{name, DType::kBF16, {rows, cols}, bytes, {}}});
    const std::string& path = tmp.path;
    const int64_t before_kb = mapped_rss_kb(path);
    CHECK(before_kb >= rows * cols * 2 / 1024);  // The whole file is read in at open.

    auto loader = WeightLoader::create(*tmp.ckpt, *tmp.config, "experts-int4");
    REQUIRE_MESSAGE(loader.ok(), loader.status().to_string());
    auto w = (*loader)->matrix(name, rows, cols);
    REQUIRE_MESSAGE(w.ok(), w.status().to_string());
    CHECK(w->format == WeightFormat::kInt4G32);
    const int64_t after_kb = mapped_rss_kb(path);
    CAPTURE(before_kb);
    CAPTURE(after_kb);
    // What stays: the header's page and the partial pages at the tensor's ends.
    CHECK(after_kb <= 3 * sysconf(_SC_PAGESIZE) / 1024);
    CHECK((*loader)->resident_bytes() < rows * cols);  // INT4 plus scales, not the BF16 bytes.

    // The mapping still reads the tensor as written (faulted back in).
    auto view = tmp.ckpt->tensor(name);
    REQUIRE(view.ok());
    CHECK(std::memcmp(view->data, bytes.data(), bytes.size()) == 0);
}

TEST_CASE("float_matrix of a compressed-tensors INT4 matrix releases its packed pages") {
    // MLA's kv_b_proj stored INT4 (weight_packed): the F32 copy is what is read from then on, but
    // only a tensor named `weight` was compared and released, so the packed words and their scales
    // stayed resident and counted in weight_bytes beside the F32 copy.
    const int64_t rows = 1024, cols = 1024;
    std::vector<float> values(static_cast<size_t>(rows * cols));
    std::mt19937 rng(11);
    for (float& v : values) {
        v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 8000.0f;
    }
    auto q = quant::quantize(quant::SourceMatrix::f32(values.data(), rows, cols),
                             WeightFormat::kInt4G32);
    REQUIRE_MESSAGE(q.ok(), q.status().to_string());
    const std::string packed(
        static_cast<const char*>(q->view().data),
        static_cast<size_t>(quant::weight_data_bytes(WeightFormat::kInt4G32, rows, cols)));
    const std::string scales(reinterpret_cast<const char*>(q->scales().data()),
                             q->scales().size() * sizeof(float));
    const int32_t dims[2] = {static_cast<int32_t>(rows), static_cast<int32_t>(cols)};
    const std::string shape(reinterpret_cast<const char*>(dims), sizeof dims);
    const std::string m = "model.layers.0.self_attn.kv_b_proj";
    TempCheckpoint tmp(
        {{m + ".weight_packed", DType::kI32, {rows, cols / 8}, packed, {}},
         {m + ".weight_scale", DType::kF32, {rows, cols / 32}, scales, {}},
         {m + ".weight_shape", DType::kI32, {2}, shape, {}}},
        R"({"architectures": ["DeepseekV3ForCausalLM"], "quantization_config": {
              "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": [],
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                  "num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                  "symmetric": true, "dynamic": false}}}}})");
    const int64_t before_kb = mapped_rss_kb(tmp.path);
    CHECK(before_kb >= static_cast<int64_t>(packed.size() + scales.size()) / 1024);

    auto loader = WeightLoader::create(*tmp.ckpt, *tmp.config, "none");
    REQUIRE_MESSAGE(loader.ok(), loader.status().to_string());
    auto w = (*loader)->float_matrix(m + ".weight", rows, cols);
    REQUIRE_MESSAGE(w.ok(), w.status().to_string());
    REQUIRE(w->format == WeightFormat::kF32);
    std::vector<float> want(static_cast<size_t>(cols));
    for (const int64_t r : {int64_t{0}, rows / 2, rows - 1}) {
        quant::dequantize_row(q->view(), r, want.data());
        CHECK(std::memcmp(static_cast<const float*>(w->data) + r * cols, want.data(),
                          want.size() * sizeof(float)) == 0);
    }
    // Held: the F32 copy; the three stored tensors are no longer read.
    CHECK((*loader)->resident_bytes() ==
          tmp.ckpt->total_bytes() -
              static_cast<int64_t>(packed.size() + scales.size() + shape.size()) +
              rows * cols * static_cast<int64_t>(sizeof(float)));
    const int64_t after_kb = mapped_rss_kb(tmp.path);
    CAPTURE(before_kb);
    CAPTURE(after_kb);
    // What stays: the pages the header and the tensors' ends share.
    CHECK(after_kb <= 3 * sysconf(_SC_PAGESIZE) / 1024);
}

// `values` as BF16 bits (truncated), the dtype Kimi K2 Thinking stores its INT4 scales in.
std::string bf16_bytes(std::span<const float> values) {
    std::string out(values.size() * 2, '\0');
    for (size_t i = 0; i < values.size(); ++i) {
        uint32_t bits = 0;
        std::memcpy(&bits, &values[i], sizeof bits);
        const auto high = static_cast<uint16_t>(bits >> 16);
        std::memcpy(&out[2 * i], &high, sizeof high);
    }
    return out;
}

TEST_CASE("the f32 scales of a matrix viewed in place count as held, the stored ones do not") {
    // A matrix stored quantized is viewed in the mapping, but its scales are read into an f32
    // copy held for the model's life, and the stored scale tensor is not read again. The count
    // was the other way round: for Kimi K2 Thinking's INT4-g32 experts (BF16 scales) 0.5625 bytes
    // a weight against 0.6875 held. One expert stored three ways, each with BF16 scales; 1000
    // rows, so that row tiles (where this CPU has their kernels) add padding rows.
    const int64_t rows = 1000, cols = 1024;
    std::vector<float> values(static_cast<size_t>(rows * cols));
    std::mt19937 rng(13);
    for (float& v : values) {
        v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 8000.0f;
    }
    const int32_t dims[2] = {static_cast<int32_t>(rows), static_cast<int32_t>(cols)};
    const std::string shape(reinterpret_cast<const char*>(dims), sizeof dims);
    struct Stored {
        std::string weight_name;  // What matrix() is asked for.
        quant::QuantizedWeight q;  // The values stored.
        std::string data, scales;  // Their bytes in the checkpoint (scales in BF16).
    };
    std::deque<Stored> stored;  // Stable: the tensors below view the bytes.
    std::vector<TensorToWrite> tensors;
    const std::string e = "model.layers.0.mlp.experts.0.";
    for (const auto& [proj, format] : {std::pair{"gate_proj", WeightFormat::kInt4G32},
                                       std::pair{"up_proj", WeightFormat::kFP8E4M3Block128},
                                       std::pair{"down_proj", WeightFormat::kInt8Row}}) {
        auto q = quant::quantize(quant::SourceMatrix::f32(values.data(), rows, cols), format);
        REQUIRE_MESSAGE(q.ok(), q.status().to_string());
        const std::string m = e + proj;
        std::string data(static_cast<const char*>(q->view().data),
                         static_cast<size_t>(quant::weight_data_bytes(format, rows, cols)));
        std::string scales = bf16_bytes(q->scales());
        Stored& s = stored.emplace_back(
            Stored{m + ".weight", std::move(*q), std::move(data), std::move(scales)});
        if (format == WeightFormat::kInt4G32) {
            tensors.push_back({m + ".weight_packed", DType::kI32, {rows, cols / 8}, s.data, {}});
            tensors.push_back({m + ".weight_scale", DType::kBF16, {rows, cols / 32}, s.scales, {}});
            tensors.push_back({m + ".weight_shape", DType::kI32, {2}, shape, {}});
        } else {
            const bool fp8 = format == WeightFormat::kFP8E4M3Block128;
            tensors.push_back({m + ".weight", fp8 ? DType::kF8E4M3 : DType::kI8, {rows, cols},
                               s.data, {}});
            tensors.push_back({m + ".weight_scale", DType::kBF16,
                               fp8 ? std::vector<int64_t>{(rows + 127) / 128, cols / 128}
                                   : std::vector<int64_t>{rows, 1},
                               s.scales, {}});
        }
    }
    TempCheckpoint tmp(tensors, R"({"architectures": ["Qwen3MoeForCausalLM"],
        "quantization_config": {"quant_method": "compressed-tensors", "ignore": [],
            "config_groups": {
                "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
                    "strategy": "group", "group_size": 32, "symmetric": true, "dynamic": false}},
                "group_1": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int",
                    "strategy": "channel", "symmetric": true, "dynamic": false}},
                "group_2": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
                    "strategy": "block", "block_structure": [128, 128], "symmetric": true,
                    "dynamic": false}}}}})");

    for (const bool tiles : {false, true}) {
        CAPTURE(tiles);
        const int64_t before_kb = mapped_rss_kb(tmp.path);
        auto loader = WeightLoader::create(*tmp.ckpt, *tmp.config, "none");
        REQUIRE_MESSAGE(loader.ok(), loader.status().to_string());
        (*loader)->use_row_tiles(tiles);
        int64_t want = tmp.ckpt->total_bytes();
        for (const Stored& s : stored) {
            CAPTURE(s.weight_name);
            auto w = (*loader)->matrix(s.weight_name, rows, cols);
            REQUIRE_MESSAGE(w.ok(), w.status().to_string());
            const Weight& v = s.q.view();
            REQUIRE(w->format == v.format);
            want -= static_cast<int64_t>(s.scales.size());
            if (w->layout == WeightLayout::kRowTiles16) {
                // Copied into tiles (data and scales, padding rows included): the mapped data is
                // not read either.
                auto tiled = quant::tile_rows(v, nullptr);
                REQUIRE_MESSAGE(tiled.ok(), tiled.status().to_string());
                want += tiled->size_bytes() - static_cast<int64_t>(s.data.size());
            } else {
                want += static_cast<int64_t>(s.q.scales().size() * sizeof(float));
            }
            CHECK((*loader)->resident_bytes() == want);
        }
        if (!tiles) {
            // The stored INT4 scales (62.5 KiB) leave the resident set, but for the pages they
            // share with their neighbours.
            const int64_t after_kb = mapped_rss_kb(tmp.path);
            CAPTURE(before_kb);
            CAPTURE(after_kb);
            CHECK(before_kb - after_kb >=
                  (static_cast<int64_t>(stored[0].scales.size()) - 2 * sysconf(_SC_PAGESIZE)) /
                      1024);
        }
    }
}

// A backend with matmuls for BF16 only (nothing runs on it).
class Bf16OnlyBackend final : public Backend {
public:
    std::string_view name() const override { return "bf16-only"; }
    bool supports(Op, WeightFormat format) const override {
        return format == WeightFormat::kBF16;
    }
    int threads() const override { return 1; }
    void matmul(const Weight&, const float*, int64_t, float*, int64_t) override {}
    void matmul_batch(std::span<const MatmulJob>) override {}

protected:
    void run_tasks(int64_t, void (*)(void*, int64_t, int), void*) override {}
};

TEST_CASE("matrix_for refuses a format the backend has no matmul for, naming the tensor") {
    const int64_t rows = 64, cols = 64;
    std::string bytes(static_cast<size_t>(rows * cols * 2), '\0');
    for (size_t i = 0; i < bytes.size(); i += 2) {
        const uint16_t bf16 = 0x3C00;  // 1/128.
        std::memcpy(&bytes[i], &bf16, 2);
    }
    const std::string expert = "model.layers.0.mlp.experts.0.gate_proj.weight";
    const std::string attn = "model.layers.0.self_attn.q_proj.weight";
    TempCheckpoint tmp({{expert, DType::kBF16, {rows, cols}, bytes, {}},
                        {attn, DType::kBF16, {rows, cols}, bytes, {}}});
    auto loader = WeightLoader::create(*tmp.ckpt, *tmp.config, "experts-int4");
    REQUIRE_MESSAGE(loader.ok(), loader.status().to_string());
    const Bf16OnlyBackend backend;
    // The routed expert is quantized to INT4 by the policy: refused.
    auto w = (*loader)->matrix_for(backend, expert, rows, cols);
    REQUIRE_FALSE(w.ok());
    CHECK(w.status().code() == StatusCode::kUnimplemented);
    CHECK(w.status().message().find("tensor '" + expert + "': backend bf16-only has no matmul "
                                    "for format int4-g32") != std::string::npos);
    CHECK(w.status().message().find(tmp.path) != std::string::npos);
    // Attention stays BF16 under the same policy: handed out.
    auto a = (*loader)->matrix_for(backend, attn, rows, cols);
    REQUIRE_MESSAGE(a.ok(), a.status().to_string());
    CHECK(a->format == WeightFormat::kBF16);
}

TEST_CASE("compressed-tensors ignore patterns: Python's syntax, matched from the start, bounded") {
    auto compiled = [](std::string_view pattern) {
        Result<ModulePattern> p = ModulePattern::compile(pattern);
        REQUIRE_MESSAGE(p.ok(), p.status().to_string());
        return *std::move(p);
    };
    const ModulePattern attention = compiled(".*self_attn.*");  // Kimi K2 Thinking's.
    CHECK(attention.matches("model.layers.3.self_attn.q_proj"));
    CHECK_FALSE(attention.matches("model.layers.3.mlp.experts.0.up_proj"));
    // re.match: anchored at the start, not at the end.
    const ModulePattern head = compiled("lm_");
    CHECK(head.matches("lm_head"));
    CHECK_FALSE(head.matches("model.lm_head"));
    // Python's named groups and lookbehind, which std::regex refused (the entry was dropped).
    CHECK(compiled(R"((?P<layer>model\.layers\.\d+)\.mlp\.gate$)")
              .matches("model.layers.12.mlp.gate"));
    CHECK(compiled(R"(.*(?<!shared_)experts)").matches("model.layers.1.mlp.experts.0"));
    Result<ModulePattern> broken = ModulePattern::compile("model.(layers");
    REQUIRE_FALSE(broken.ok());
    CHECK(broken.status().message().find("at offset 13") != std::string::npos);
    // Catastrophic backtracking (std::regex ran for minutes) and a name of a megabyte (its
    // recursion overflowed the stack) end at the match limit: no match.
    CHECK_FALSE(compiled("(.*.*)*X").matches(std::string(60, 'a')));
    CHECK(attention.matches("model.layers.0." + std::string(1 << 20, 'a') + ".self_attn.w"));
    CHECK_FALSE(attention.matches("model.layers.0." + std::string(1 << 20, 'a') + ".weight"));
}

}  // namespace
}  // namespace edge::engine
