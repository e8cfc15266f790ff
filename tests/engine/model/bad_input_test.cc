// Bad checkpoints and bad requests: each is a clear Status naming the file and the tensor or
// field, never a crash.

#include <doctest/doctest.h>

#include <sys/stat.h>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "common/log.h"
#include "engine/load_progress.h"
#include "engine/model/loader.h"
#include "engine/model/safetensors.h"
#include "engine/model/safetensors_writer.h"

namespace edge::engine {
namespace {

namespace fs = std::filesystem;
namespace json = boost::json;

const std::string kMicro = std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/micro-qwen3-moe";

// A fresh copy of the micro fixture in a temp dir, removed at the end.
struct TempModel {
    fs::path dir;
    explicit TempModel(const std::string& source = kMicro) {
        std::random_device rd;
        dir = fs::temp_directory_path() / ("edge_bad_input_" + std::to_string(rd()));
        fs::create_directories(dir);
        for (const char* f : {"config.json", "model.safetensors", "generation_config.json"}) {
            fs::copy_file(source + "/" + f, dir / f);
        }
    }
    ~TempModel() { fs::remove_all(dir); }
    std::string path(const char* f) const { return (dir / f).string(); }
};

std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write(const std::string& path, const std::string& data) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << data;
}

// The header object and the data section of a safetensors file.
std::pair<json::object, std::string> split(const std::string& file) {
    uint64_t len = 0;
    std::memcpy(&len, file.data(), 8);
    return {json::parse(file.substr(8, len)).as_object(), file.substr(8 + len)};
}

// `header` with spaces after it so the data section starts at a multiple of 8, as the
// safetensors library writes it (the reader refuses a misaligned data section).
std::string padded(std::string header) {
    header.append((8 - header.size() % 8) % 8, ' ');
    return header;
}

Status load_status(const TempModel& m) {
    LoadOptions o;
    o.threads = 1;
    o.max_slots = 2;
    o.max_context = 64;
    auto r = load_model(m.dir.string(), o);
    return r.ok() ? ok_status() : r.status();
}

bool contains(const Status& s, const std::string& text) {
    return s.message().find(text) != std::string::npos;
}

TEST_CASE("missing directory / config and weights") {
    LoadOptions o;
    auto r = load_model("/nonexistent/edge-model", o);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK(contains(r.status(), "/nonexistent/edge-model/config.json"));
    TempModel m;
    fs::remove(m.dir / "model.safetensors");
    Status s = load_status(m);
    CHECK(s.code() == StatusCode::kNotFound);
    CHECK(contains(s, "model.safetensors"));
    // A FIFO in its place: refused at once (an open without O_NONBLOCK waited for a writer).
    REQUIRE(::mkfifo((m.dir / "model.safetensors").c_str(), 0600) == 0);
    s = load_status(m);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(contains(s, "not a regular file"));
}

TEST_CASE("truncated safetensors names the file and the tensor") {
    TempModel m;
    std::string f = read(m.path("model.safetensors"));
    write(m.path("model.safetensors"), f.substr(0, f.size() - 1000));
    Status s = load_status(m);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, "model.safetensors"));
    CHECK(contains(s, "tensor '"));
    CHECK(contains(s, "past the data section"));
    write(m.path("model.safetensors"), f.substr(0, 5));
    s = load_status(m);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, "too short"));
    write(m.path("model.safetensors"), f.substr(0, 100));
    s = load_status(m);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, "header length"));
}

TEST_CASE("a file's header is checked before its weights are read, and checking reads none") {
    TempModel m;
    const std::string f = read(m.path("model.safetensors"));
    const int64_t size = static_cast<int64_t>(f.size());
    // Checking (check-config): the headers only.
    int64_t before = load_progress().bytes_read;
    REQUIRE(check_model_files(m.dir.string(), "none").ok());
    CHECK(load_progress().bytes_read == before);
    // Loading reads the whole file, noted as progress.
    REQUIRE(Checkpoint::open_dir(m.dir.string()).ok());
    CHECK(load_progress().bytes_read == before + size);
    // A header that does not hold is refused before any weight is read.
    std::string bad = f;
    bad[8] = '[';  // The header's JSON object opens with '[' instead.
    write(m.path("model.safetensors"), bad);
    before = load_progress().bytes_read;
    CHECK_FALSE(Checkpoint::open_dir(m.dir.string()).ok());
    CHECK(load_progress().bytes_read == before);
}

TEST_CASE("header offsets past the file / overlapping / misaligned / wrong span") {
    TempModel m;
    auto [header, data] = split(read(m.path("model.safetensors")));
    const std::string victim = "model.layers.1.self_attn.k_norm.weight";
    auto rewrite = [&](auto edit) {
        json::object h = header;
        edit(h);
        REQUIRE(write_raw_safetensors(m.path("model.safetensors"), padded(json::serialize(h)), data)
                    .ok());
        return load_status(m);
    };
    Status s = rewrite([&](json::object& h) {
        h[victim].as_object()["data_offsets"] = {data.size() + 64, data.size() + 128};
    });
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, victim));
    CHECK(contains(s, "past the data section"));

    s = rewrite([&](json::object& h) {
        // Point the victim at the bytes of another tensor.
        h[victim].as_object()["data_offsets"] = {0, 64};
    });
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, "overlaps"));

    s = rewrite([&](json::object& h) {
        auto& off = h[victim].as_object()["data_offsets"].as_array();
        off = {off[0].to_number<int64_t>() + 1, off[1].to_number<int64_t>() + 1};
    });
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK((contains(s, "aligned") || contains(s, "overlaps")));

    s = rewrite([&](json::object& h) {
        auto& off = h[victim].as_object()["data_offsets"].as_array();
        off = {off[0], off[1].to_number<int64_t>() - 2};
    });
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, "needs"));

    s = rewrite([&](json::object& h) {
        h[victim].as_object()["shape"] = {int64_t{1} << 40, int64_t{1} << 40};
    });
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, "overflows"));

    s = rewrite([&](json::object& h) { h[victim].as_object()["dtype"] = "Q4_K"; });
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, "unsupported dtype"));
}

TEST_CASE("a tensor named twice, a hole or trailing bytes: the data must be tiled exactly") {
    TempModel m;
    auto [header, data] = split(read(m.path("model.safetensors")));
    const std::string victim = "model.layers.1.self_attn.k_norm.weight";
    const json::object& entry = header[victim].as_object();
    const int64_t n = entry.at("data_offsets").as_array()[1].to_number<int64_t>() -
                      entry.at("data_offsets").as_array()[0].to_number<int64_t>();
    // The victim again at the end, over zeros: two entries for one name (JSON would keep one).
    json::object dup = entry;
    dup["data_offsets"] = {static_cast<int64_t>(data.size()),
                           static_cast<int64_t>(data.size()) + n};
    std::string text = json::serialize(header);
    text.insert(text.size() - 1, ",\"" + victim + "\":" + json::serialize(dup));
    REQUIRE(write_raw_safetensors(m.path("model.safetensors"), padded(text),
                                  data + std::string(static_cast<size_t>(n), '\0'))
                .ok());
    Status s = load_status(m);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, "model.safetensors: tensor '" + victim + "' is named twice in the header"));
    // The victim left out of the header: its bytes belong to no tensor.
    json::object without = header;
    without.erase(victim);
    REQUIRE(
        write_raw_safetensors(m.path("model.safetensors"), padded(json::serialize(without)), data)
            .ok());
    s = load_status(m);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, "belong to no tensor"));
    // Bytes appended after the last tensor.
    REQUIRE(write_raw_safetensors(m.path("model.safetensors"), padded(json::serialize(header)),
                                  data + "extra")
                .ok());
    s = load_status(m);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, "after the last tensor"));
}

TEST_CASE("tensors the model does not read are named in a warning (a config with a layer less)") {
    TempModel m;
    std::string config = read(m.path("config.json"));
    config.replace(config.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": 1");
    write(m.path("config.json"), config);
    auto ckpt = Checkpoint::open_dir(m.dir.string());
    REQUIRE(ckpt.ok());
    int64_t layer1 = 0;
    for (const std::string& name : (*ckpt)->names()) {
        if (name.starts_with("model.layers.1.")) {
            layer1 += (*ckpt)->info(name)->end - (*ckpt)->info(name)->begin;
        }
    }
    CHECK(layer1 > 0);
    // Sharded across expert-parallel ranks too: they all run in this process and every expert
    // is read, so what is left unread is unused all the same.
    for (int32_t ranks : {1, 2}) {
        CAPTURE(ranks);
        std::vector<std::string> warned;
        log::set_sink([&](std::string_view line) {
            if (line.find("checkpoint_tensors_unused") != std::string_view::npos) {
                warned.emplace_back(line);
            }
        });
        LoadOptions o;
        o.max_slots = 1;
        o.max_context = 64;
        o.sharding.ranks = ranks;
        auto one_layer = load_model(m.dir.string(), o);
        log::set_sink(nullptr);
        REQUIRE(one_layer.ok());  // It loads (as a one-layer model), and says what it left out.
        REQUIRE(warned.size() == 1);
        CHECK(warned[0].find("model.layers.1.") != std::string::npos);
        // What it left out is not counted as held (its pages are released): the layer's bytes.
        CHECK((*one_layer)->spec().weight_bytes == (*ckpt)->total_bytes() - layer1);
    }
}

TEST_CASE("tensor with the wrong shape / wrong dtype / or missing") {
    TempModel m;
    auto [header, data] = split(read(m.path("model.safetensors")));
    const std::string victim = "model.layers.0.self_attn.q_proj.weight";
    {
        json::object h = header;
        h[victim].as_object()["shape"] = {64, 256};  // Same bytes, other shape.
        REQUIRE(write_raw_safetensors(m.path("model.safetensors"), padded(json::serialize(h)), data)
                    .ok());
        Status s = load_status(m);
        CHECK(s.code() == StatusCode::kInvalidArgument);
        CHECK(contains(s, victim));
        CHECK(contains(s, "has shape [64, 256], expected [128, 128]"));
    }
    {
        json::object h = header;
        auto& e = h[victim].as_object();
        e["dtype"] = "I32";
        e["shape"] = {64, 128};
        REQUIRE(write_raw_safetensors(m.path("model.safetensors"), padded(json::serialize(h)), data)
                    .ok());
        Status s = load_status(m);
        CHECK(s.code() == StatusCode::kInvalidArgument);
        CHECK(contains(s, victim));
        CHECK(contains(s, "dtype I32"));
    }
    {
        // Its bytes stay, under another name (the tensors must cover the data section).
        json::object h = header;
        h["filler"] = h["lm_head.weight"];
        h.erase("lm_head.weight");
        REQUIRE(write_raw_safetensors(m.path("model.safetensors"), padded(json::serialize(h)), data)
                    .ok());
        Status s = load_status(m);
        CHECK(s.code() == StatusCode::kNotFound);
        CHECK(contains(s, "'lm_head.weight' is missing"));
    }
}

TEST_CASE("config missing a field / ill-typed / unsupported architecture") {
    TempModel m;
    json::object cfg = json::parse(read(m.path("config.json"))).as_object();
    auto with = [&](auto edit) {
        json::object c = cfg;
        edit(c);
        write(m.path("config.json"), json::serialize(c));
        return load_status(m);
    };
    Status s = with([](json::object& c) { c.erase("hidden_size"); });
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(contains(s, "config.json: field 'hidden_size' is missing"));
    s = with([](json::object& c) { c["num_experts"] = "eight"; });
    CHECK(contains(s, "field 'num_experts' is not an integer"));
    s = with([](json::object& c) { c["num_key_value_heads"] = 3; });
    CHECK(contains(s, "num_key_value_heads"));
    s = with([](json::object& c) { c["architectures"] = {"LlamaForCausalLM"}; });
    CHECK(s.code() == StatusCode::kUnimplemented);
    CHECK(contains(s, "'LlamaForCausalLM' is not supported"));
    // A name with terminal escapes is printed inert.
    s = with([](json::object& c) { c["architectures"] = {"\x1b[2JEvil\nLine"}; });
    CHECK(contains(s, "'\\x1b[2JEvil\\x0aLine' is not supported"));
    CHECK(s.message().find('\x1b') == std::string::npos);
    // Without `architectures`, model_type names the class as Hugging Face pairs them.
    s = with([](json::object& c) { c.erase("architectures"); });
    CHECK_MESSAGE(s.ok(), s.to_string());
    s = with([](json::object& c) {
        c.erase("architectures");
        c["model_type"] = "llama";
    });
    CHECK(contains(s, "'llama' is not supported"));
    s = with([](json::object& c) { c["hidden_act"] = "gelu"; });
    CHECK(s.code() == StatusCode::kUnimplemented);
    CHECK(contains(s, "field 'hidden_act' 'gelu'"));
    // 1e999 parses as infinity, which would pass rope_theta > 1 and turn RoPE off.
    json::object no_theta = cfg;
    no_theta.erase("rope_theta");
    write(m.path("config.json"),
          json::serialize(no_theta).insert(1, std::string("\"rope_theta\": 1e999, ")));
    CHECK(contains(load_status(m), "config.json: field 'rope_theta' is not a finite number"));
    s = with([](json::object& c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; });
    CHECK(s.code() == StatusCode::kUnimplemented);
    CHECK(contains(s, "config.json: field 'rope_scaling.type' 'linear' is not supported"));
    s = with([](json::object& c) { c["rope_scaling"] = {{"type", "yarn"}}; });
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(contains(s, "config.json: field 'rope_scaling.factor' is missing"));
    write(m.path("config.json"), "{\"hidden_size\": ");
    s = load_status(m);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(contains(s, "config.json: not valid JSON at line 1, column 17: incomplete JSON"));
    write(m.path("config.json"), "{\n  \"hidden_size\": 1024,\n  \"x\": tru\n}");
    CHECK(
        contains(load_status(m), "config.json: not valid JSON at line 3, column 8: syntax error"));
}

TEST_CASE("every architecture refuses an unsupported activation or scoring and a bad eos id") {
    for (const char* name : {"micro-qwen3-moe", "micro-glm4-moe", "micro-deepseek-v3"}) {
        CAPTURE(name);
        TempModel m(std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/" + name);
        const json::object cfg = json::parse(read(m.path("config.json"))).as_object();
        auto with = [&](const char* key, json::value v) {
            json::object c = cfg;
            c[key] = std::move(v);
            write(m.path("config.json"), json::serialize(c));
            return load_status(m);
        };
        Status s = with("hidden_act", "gelu");
        CHECK(s.code() == StatusCode::kUnimplemented);
        CHECK(contains(s, "config.json: field 'hidden_act' 'gelu' is not supported (only silu)"));
        s = with("hidden_act", 3);
        CHECK(s.code() == StatusCode::kInvalidArgument);
        CHECK(contains(s, "field 'hidden_act'"));
        s = with("eos_token_id", json::array{1, 512});
        CHECK(s.code() == StatusCode::kInvalidArgument);
        CHECK(contains(s, "field 'eos_token_id' 512 is outside the vocabulary"));
        s = with("eos_token_id", -1);
        CHECK(contains(s, "field 'eos_token_id' -1 is outside the vocabulary"));
        if (std::string(name) != "micro-qwen3-moe") {  // Sigmoid routers only.
            s = with("scoring_func", "softmax");
            CHECK(s.code() == StatusCode::kUnimplemented);
            CHECK(contains(s, "field 'scoring_func' 'softmax' is not supported (only sigmoid)"));
        }
        s = with("hidden_act", nullptr);  // Absent or null: the default, silu.
        CHECK_MESSAGE(s.ok(), s.to_string());
    }
}

TEST_CASE("a max_context beyond the model's positions is refused by every architecture") {
    for (const char* name : {"micro-qwen3-moe", "micro-glm4-moe", "micro-deepseek-v3"}) {
        CAPTURE(name);
        const std::string dir = std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/" + name;
        LoadOptions o;
        o.threads = 1;
        o.max_slots = 1;
        o.max_context = 1 << 30;
        auto r = load_model(dir, o);
        REQUIRE_FALSE(r.ok());
        CHECK(r.status().code() == StatusCode::kInvalidArgument);
        CHECK(contains(r.status(), "max_context 1073741824 is larger than the model's "));
        CHECK(contains(r.status(), " (" + dir + "/config.json)"));
        // The preflight (check-config) says the same.
        const Status preflight = check_model_files(dir, "", {}, o.max_context);
        CHECK(preflight.to_string() == r.status().to_string());
        o.max_context = 32;  // Within: loads, and the spec reports the limit.
        auto ok = load_model(dir, o);
        REQUIRE_MESSAGE(ok.ok(), ok.status().to_string());
        CHECK((*ok)->spec().max_context == 32);
    }
}

// Resident kilobytes of this process (/proc/self/statm).
int64_t resident_kb() {
    std::ifstream in("/proc/self/statm");
    int64_t size = 0, resident = 0;
    in >> size >> resident;
    return resident * sysconf(_SC_PAGESIZE) / 1024;
}

TEST_CASE("attention scratch follows the batch's context, not max_position_embeddings") {
    for (const char* name : {"micro-qwen3-moe", "micro-glm4-moe"}) {
        CAPTURE(name);
        TempModel m(std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/" + name);
        json::object cfg = json::parse(read(m.path("config.json"))).as_object();
        cfg["max_position_embeddings"] = 1 << 24;
        write(m.path("config.json"), json::serialize(cfg));
        LoadOptions o;
        o.threads = 2;
        o.max_slots = 1;
        o.max_context = 1 << 24;
        auto model = load_model(m.dir.string(), o);
        REQUIRE_MESSAGE(model.ok(), model.status().to_string());
        CausalLM& lm = **model;
        const int32_t slot = *lm.acquire_slot();
        const std::vector<TokenId> prompt = {1, 2, 3, 4};
        std::vector<float> logits;
        SequenceChunk ch{slot, 0, prompt, false};
        const int64_t before_kb = resident_kb();
        REQUIRE(lm.forward({&ch, 1}, &logits).ok());
        // Sized by the model's maximum, the scores of 2 workers would commit at least
        // 2 x 2^24 floats (128 MiB) at this first forward.
        CHECK(resident_kb() - before_kb < 32 * 1024);
    }
}

TEST_CASE("forward rejects positions past the context / bad tokens / bad slots / full cache") {
    LoadOptions o;
    o.threads = 1;
    o.max_slots = 2;
    o.max_context = 16;
    auto model = load_model(kMicro, o);
    REQUIRE(model.ok());
    CausalLM& lm = **model;
    int32_t slot = *lm.acquire_slot();
    std::vector<TokenId> long_prompt(17, 5);
    std::vector<float> logits;
    SequenceChunk ch{slot, 0, long_prompt, false};
    Status s = lm.forward({&ch, 1}, &logits);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(contains(s, "beyond the context of 16"));
    CHECK(lm.slot_length(slot) == 0);

    std::vector<TokenId> bad = {1, 512};
    ch.tokens = bad;
    s = lm.forward({&ch, 1}, &logits);
    CHECK(contains(s, "token id 512 is outside the vocabulary"));

    std::vector<TokenId> ok = {1, 2, 3};
    ch.tokens = ok;
    ch.start_pos = 2;
    s = lm.forward({&ch, 1}, &logits);
    CHECK(contains(s, "start_pos 2 is not the slot's length 0"));
    ch.start_pos = 0;
    ch.slot = 1;
    s = lm.forward({&ch, 1}, &logits);
    CHECK(contains(s, "slot is not acquired"));
    ch.slot = slot;
    REQUIRE(lm.forward({&ch, 1}, &logits).ok());
    CHECK(lm.slot_length(slot) == 3);
    lm.truncate_slot(slot, 1);
    CHECK(lm.slot_length(slot) == 1);

    int32_t other = *lm.acquire_slot();
    CHECK(lm.acquire_slot().status().code() == StatusCode::kResourceExhausted);
    lm.release_slot(other);

    LoadOptions small = o;
    small.kv_cache_bytes = 2 * 2 * 2 * 32 * 4 * 10;  // Ten tokens,
    small.kv_block_tokens = 5;                        // in two blocks.
    auto tiny_cache = load_model(kMicro, small);
    REQUIRE(tiny_cache.ok());
    int32_t a = *(*tiny_cache)->acquire_slot();
    std::vector<TokenId> eleven(11, 7);
    SequenceChunk big{a, 0, eleven, false};
    s = (*tiny_cache)->forward({&big, 1}, &logits);
    CHECK(s.code() == StatusCode::kResourceExhausted);
    CHECK((*tiny_cache)->slot_length(a) == 0);

    // A budget beyond the machine's memory (the config allows up to 2^44 bytes) is refused at
    // load, naming the setting, instead of building block tables for minutes.
    LoadOptions huge = o;
    huge.kv_cache_bytes = int64_t{1} << 44;
    auto too_big = load_model(kMicro, huge);
    REQUIRE_FALSE(too_big.ok());
    CHECK(too_big.status().code() == StatusCode::kInvalidArgument);
    CHECK(contains(too_big.status(), "lower engine.kv_cache_bytes"));
}

TEST_CASE("header parser on hand-made headers") {
    auto parse = [](const std::string& header, uint64_t data_size) {
        std::string file(8, '\0');
        uint64_t len = padded(header).size();
        std::memcpy(file.data(), &len, 8);
        file += padded(header);
        file += std::string(data_size, '\0');
        return parse_safetensors_header(file, file.size(), "t.safetensors");
    };
    auto r = parse(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],)"
                   R"("data_offsets":[0,12]},"b":{"dtype":"F8_E4M3","shape":[4],)"
                   R"("data_offsets":[12,16]}})",
                   16);
    REQUIRE(r.ok());
    CHECK(r->tensors.size() == 2);
    CHECK(r->tensors[1].dtype == DType::kF8E4M3);
    CHECK(parse("[]", 0).status().code() == StatusCode::kDataLoss);
    CHECK(parse("{\"a\":1}", 0).status().code() == StatusCode::kDataLoss);
    CHECK(contains(parse("{\"a\":{\"dtype\" \"F32\"}}", 0).status(),
                   "t.safetensors: header (from byte 8): not valid JSON at line 1, column 15: "
                   "syntax error"));
    CHECK(parse(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4).status().code() ==
          StatusCode::kDataLoss);
    CHECK(parse(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4).status().code() ==
          StatusCode::kDataLoss);
    CHECK(parse(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("a2":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                8)
              .status()
              .code() == StatusCode::kDataLoss);
    // A name far past any module path (it fed a backtracking regex to a stack overflow).
    const std::string long_name(kMaxTensorNameBytes + 1, 'a');
    CHECK(contains(parse(R"({")" + long_name +
                             R"(":{"dtype":"F32","shape":[1],)"
                             R"("data_offsets":[0,4]}})",
                         4)
                       .status(),
                   "t.safetensors: tensor name of 1025 bytes (at most 1024)"));
    // One name with two entries over the same bytes, which differ in dtype only: the data is
    // tiled exactly whichever entry is kept, so only the names tell. Also spelled with an escape,
    // and a name holding a quote, a brace and a comma.
    struct Twice {
        std::string first, second, name;
    };
    for (const Twice& t : {Twice{"a", "a", "a"}, Twice{"a", R"(\u0061)", "a"},
                           Twice{R"(q\"{,)", R"(q\u0022{,)", "q\"{,"}}) {
        const std::string header =
            R"({")" + t.first + R"(":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},")" +
            t.second + R"(":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
        const Status twice = parse(header, 4).status();
        CHECK(twice.code() == StatusCode::kDataLoss);
        CHECK(
            contains(twice, "t.safetensors: tensor '" + t.name + "' is named twice in the header"));
    }
    // Names that repeat deeper down (a field of each entry, metadata values) are no repeat.
    CHECK(parse(R"({"__metadata__":{"a":"a"},"a":{"dtype":"F32","shape":[1],)"
                R"("data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                8)
              .ok());
    const std::string longest(kMaxTensorNameBytes, 'a');
    CHECK(parse(R"({")" + longest + R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4)
              .ok());
}

TEST_CASE("sharded checkpoint through model.safetensors.index.json") {
    TempModel m;
    std::string f = read(m.path("model.safetensors"));
    auto [header, data] = split(f);
    // Move lm_head.weight into a second shard.
    auto& lm = header["lm_head.weight"].as_object();
    auto off = lm["data_offsets"].as_array();
    int64_t b = off[0].to_number<int64_t>(), e = off[1].to_number<int64_t>();
    std::string lm_bytes = data.substr(b, e - b);
    json::object first = header;
    first["filler"] = first["lm_head.weight"];  // Its bytes stay in the first shard.
    first.erase("lm_head.weight");
    REQUIRE(write_raw_safetensors(m.path("model-00001-of-00002.safetensors"),
                                  padded(json::serialize(first)), data)
                .ok());
    json::object second{{"lm_head.weight",
                         {{"dtype", lm["dtype"]}, {"shape", lm["shape"]},
                          {"data_offsets", {0, e - b}}}}};
    REQUIRE(write_raw_safetensors(m.path("model-00002-of-00002.safetensors"),
                                  padded(json::serialize(second)), lm_bytes)
                .ok());
    json::object map;
    for (const auto& kv : first) {
        if (kv.key() != "__metadata__") {
            map[kv.key()] = "model-00001-of-00002.safetensors";
        }
    }
    map["lm_head.weight"] = "model-00002-of-00002.safetensors";
    fs::remove(m.dir / "model.safetensors");
    write(m.path("model.safetensors.index.json"),
          json::serialize(json::object{{"metadata", json::object{}}, {"weight_map", map}}));
    CHECK(load_status(m).ok());

    map["lm_head.weight"] = "../escape.safetensors";
    write(m.path("model.safetensors.index.json"),
          json::serialize(json::object{{"weight_map", map}}));
    Status s = load_status(m);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(contains(s, "invalid file"));
    write(m.path("model.safetensors.index.json"), "{\"weight_map\": {\"a\": \"b\",}}");
    CHECK(contains(load_status(m),
                   "model.safetensors.index.json: not valid JSON at line 1, column 26: "
                   "syntax error"));
}

}  // namespace
}  // namespace edge::engine
