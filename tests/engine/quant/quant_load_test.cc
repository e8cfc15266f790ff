// Loading quantized weights: checkpoints written by `edgeserve quantize` against the same policy
// applied on load (bit-identical logits), quantized fixture models against their BF16 logits
// (bounds from quant-eval), and bad quantized checkpoints (clear errors).

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <tuple>

#include "engine/engine.h"
#include "engine/model/loader.h"
#include "engine/model/safetensors.h"
#include "engine/model/safetensors_writer.h"
#include "engine/model/weight_loader.h"
#include "engine/quant/checkpoint_formats.h"
#include "engine/quant/quantized_weight.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tools/quant_eval.h"
#include "engine/tools/quantize.h"

// Bounds for the quant-eval tests below, about twice the mean KL (and a margin under top-1 and
// over the perplexity ratio) that quant-eval measured with exactly these settings (256 tokens,
// chunks of 128): micro-qwen3-moe (random weights): all-fp8 KL 0.0078 top-1 0.949 ppl x0.997;
// all-int8 0.0052 / 0.969 / x1.008; experts-int4 0.0245 / 0.859 / x1.001. fortunes-qwen3-moe
// (trained; eval.txt): all-fp8 0.00042 / 0.996 / x1.0035; all-int8 0.00012 / 0.992 / x0.999;
// experts-int4 0.0014 / 0.977 / x1.002.
#define MICRO_FP8_KL 0.016
#define MICRO_FP8_TOP1 0.9
#define MICRO_FP8_PPL 1.02
#define MICRO_INT8_KL 0.011
#define MICRO_INT8_TOP1 0.93
#define MICRO_INT8_PPL 1.02
#define MICRO_INT4_KL 0.05
#define MICRO_INT4_TOP1 0.8
#define MICRO_INT4_PPL 1.02
#define FORT_FP8_KL 0.001
#define FORT_FP8_TOP1 0.98
#define FORT_FP8_PPL 1.01
#define FORT_INT8_KL 0.0003
#define FORT_INT8_TOP1 0.98
#define FORT_INT8_PPL 1.005
#define FORT_INT4_KL 0.003
#define FORT_INT4_TOP1 0.95
#define FORT_INT4_PPL 1.01

namespace edge::engine {
namespace {

namespace fs = std::filesystem;

const std::string kMicro = std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/micro-qwen3-moe";
const std::string kFortunes = std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/fortunes-qwen3-moe";

struct TempDir {
    std::string path;
    explicit TempDir(const std::string& tag) {
        path =
            (fs::temp_directory_path() / ("edge_quant_" + tag + "_" + std::to_string(::getpid())))
                .string();
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

const std::vector<TokenId> kPrompt = {1, 17, 42, 99, 3, 250, 7, 64, 128, 5, 300, 11};

Result<std::vector<float>> logits_of(const std::string& dir, const std::string& policy,
                                     int64_t* weight_bytes = nullptr, bool row_tiles = true) {
    LoadOptions o;
    o.row_tiles = row_tiles;
    o.threads = 2;
    o.max_slots = 1;
    o.max_context = 64;
    o.quantization = policy;
    EDGE_ASSIGN_OR_RETURN(auto model, load_model(dir, o));
    if (weight_bytes != nullptr) {
        *weight_bytes = model->spec().weight_bytes;
    }
    EDGE_ASSIGN_OR_RETURN(int32_t slot, model->acquire_slot());
    SequenceChunk ch{slot, 0, kPrompt, true};
    std::vector<float> logits;
    EDGE_RETURN_IF_ERROR(model->forward({&ch, 1}, &logits));
    return logits;
}

bool contains(const Status& s, std::string_view text) {
    return s.message().find(text) != std::string::npos;
}

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::trunc);
    out << text;
}

// Rewrites dir/model.safetensors, letting `edit` change the tensor list (the edited tensors'
// bytes must stay alive until this returns; `keep` holds them).
void rewrite(
    const std::string& dir,
    const std::function<void(std::vector<TensorToWrite>&, std::vector<std::string>&)>& edit) {
    std::vector<TensorToWrite> ts;
    std::vector<std::string> keep;
    keep.reserve(64);
    {
        auto ckpt = Checkpoint::open_dir(dir);
        REQUIRE(ckpt.ok());
        for (const std::string& name : (*ckpt)->names()) {
            auto t = (*ckpt)->tensor(name);
            REQUIRE(t.ok());
            keep.emplace_back(static_cast<const char*>(t->data), static_cast<size_t>(t->nbytes));
            ts.push_back({name, t->dtype(), t->shape(), {}, {}});
        }
    }
    for (size_t i = 0; i < ts.size(); ++i) {
        ts[i].bytes = keep[i];
    }
    edit(ts, keep);
    REQUIRE(write_safetensors(dir + "/model.safetensors", ts).ok());
}

TensorToWrite* find(std::vector<TensorToWrite>& ts, const std::string& name) {
    for (TensorToWrite& t : ts) {
        if (t.name == name) {
            return &t;
        }
    }
    FAIL("no tensor " << name);
    return nullptr;
}

TEST_CASE("quantize: written checkpoint and quantize-on-load give identical logits") {
    for (const std::string policy :
         {"experts-int4", "all-fp8", "all-int8",
          "attention=int4-g128,routed_experts=int4-g32,lm_head=int8,embeddings=fp8"}) {
        CAPTURE(policy);
        TempDir tmp("rt");
        Status st = quantize_checkpoint({kMicro, policy, tmp.path});
        REQUIRE_MESSAGE(st.ok(), st.to_string());
        CHECK(fs::exists(tmp.path + "/tokenizer.json"));
        CHECK(fs::exists(tmp.path + "/tokenizer_config.json"));
        int64_t stored_bytes = 0, on_load_bytes = 0, bf16_bytes = 0;
        auto stored = logits_of(tmp.path, "none", &stored_bytes);
        REQUIRE_MESSAGE(stored.ok(), stored.status().to_string());
        auto on_load = logits_of(kMicro, policy, &on_load_bytes);
        REQUIRE_MESSAGE(on_load.ok(), on_load.status().to_string());
        auto bf16 = logits_of(kMicro, "none", &bf16_bytes);
        REQUIRE(bf16.ok());
        REQUIRE(stored->size() == on_load->size());
        CHECK(*stored == *on_load);  // Bit-identical.
        CHECK(*stored != *bf16);     // And really quantized.
        CHECK(stored_bytes < bf16_bytes);
        CHECK(on_load_bytes < bf16_bytes);
        const std::string cfg = read_text(tmp.path + "/config.json");
        if (std::string(policy) == "all-fp8") {
            CHECK(cfg.find("\"quant_method\":\"fp8\"") != std::string::npos);
            CHECK(cfg.find("\"weight_block_size\":[128,128]") != std::string::npos);
        } else {
            CHECK(cfg.find("\"quant_method\":\"compressed-tensors\"") != std::string::npos);
            CHECK(cfg.find("\"ignore\":[") != std::string::npos);
        }
    }
}

// Every tensor of the checkpoint in `dir` (one file or shards), by name, as bytes.
std::map<std::string, std::string> tensor_bytes_of(const std::string& dir) {
    std::map<std::string, std::string> bytes;
    auto ckpt = Checkpoint::open_dir(dir);
    REQUIRE_MESSAGE(ckpt.ok(), ckpt.status().to_string());
    for (const std::string& name : (*ckpt)->names()) {
        auto t = (*ckpt)->tensor(name);
        REQUIRE(t.ok());
        bytes[name].assign(static_cast<const char*>(t->data), static_cast<size_t>(t->nbytes));
    }
    return bytes;
}

TEST_CASE("quantize streams: one quantized matrix in memory at a time, and shards as Hugging "
          "Face writes them load to the same tensors and logits") {
    TempDir one("stream_one");
    QuantizeStats whole;
    QuantizeOptions o{kMicro, "experts-int4", one.path};
    o.stats = &whole;
    std::vector<QuantizeProgress> reports;
    o.progress = [&](const QuantizeProgress& p) { reports.push_back(p); };
    REQUIRE(quantize_checkpoint(o).ok());
    o.progress = nullptr;
    CHECK(whole.files == std::vector<std::string>{"model.safetensors"});
    // One progress report per tensor written, counting up to the totals.
    REQUIRE_FALSE(reports.empty());
    CHECK(reports.size() == tensor_bytes_of(one.path).size());
    for (size_t i = 0; i < reports.size(); ++i) {
        CHECK(reports[i].tensors_done == static_cast<int64_t>(i + 1));
        CHECK(reports[i].tensors_total == static_cast<int64_t>(reports.size()));
        CHECK(reports[i].bytes_total == whole.bytes_written);
        CHECK(reports[i].bytes_done > (i == 0 ? 0 : reports[i - 1].bytes_done));
    }
    CHECK(reports.back().bytes_done == whole.bytes_written);
    // About one matrix per thread in memory at once (the default: one thread per core),
    // against the whole output held before streaming.
    CHECK(whole.matrices == 48);  // 2 layers x 8 experts x 3 projections.
    const int64_t cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    CHECK(whole.max_matrices_held >= 1);
    CHECK(whole.max_matrices_held <= cores);
    CHECK(whole.largest_matrix_bytes > 0);
    CHECK(whole.largest_matrix_bytes * 40 < whole.bytes_written);
    CHECK(whole.quantizations >= whole.matrices);
    CHECK(whole.quantizations <= 2 * whole.matrices);

    // Threads quantizing ahead of the writer: the same bytes, each thread holding one matrix.
    for (const int threads : {1, 4}) {
        CAPTURE(threads);
        TempDir again("stream_threads");
        QuantizeStats st;
        QuantizeOptions t{kMicro, "experts-int4", again.path};
        t.threads = threads;
        t.stats = &st;
        REQUIRE(quantize_checkpoint(t).ok());
        CHECK(tensor_bytes_of(again.path) == tensor_bytes_of(one.path));
        CHECK(st.max_matrices_held >= 1);
        CHECK(st.max_matrices_held <= threads);
        if (threads == 4) {
            CHECK(st.max_matrices_held == 4);  // Three ahead of the one being written.
        }
    }

    // Shards of at most a third of the weights: at least three, named and indexed as
    // save_pretrained names and indexes them.
    TempDir sharded("stream_shards");
    QuantizeStats parts;
    o.out_dir = sharded.path;
    o.stats = &parts;
    o.max_shard_bytes = whole.bytes_written / 3 + 1;
    REQUIRE(quantize_checkpoint(o).ok());
    REQUIRE(parts.files.size() >= 4);
    const int shards = static_cast<int>(parts.files.size()) - 1;
    CHECK(parts.files.back() == "model.safetensors.index.json");
    CHECK_FALSE(fs::exists(sharded.path + "/model.safetensors"));
    for (int i = 0; i < shards; ++i) {
        CHECK(parts.files[i] == shard_file_name(i + 1, shards));
        CHECK(is_shard_file_name(parts.files[i]));
        // Tensor bytes within the limit; the header (under 64 KiB here) on top.
        CHECK(fs::file_size(sharded.path + "/" + parts.files[i]) <
              static_cast<uintmax_t>(o.max_shard_bytes) + 65536);
    }
    CHECK(shard_file_name(3, 12) == "model-00003-of-00012.safetensors");
    CHECK_FALSE(is_shard_file_name("model-1-of-2.safetensors"));
    CHECK_FALSE(is_shard_file_name("model-00001-of-0000x.safetensors"));
    CHECK_FALSE(is_shard_file_name("model.safetensors"));
    const auto index =
        boost::json::parse(read_text(sharded.path + "/model.safetensors.index.json"));
    CHECK(index.at("metadata").at("total_size").to_number<int64_t>() == whole.bytes_written);
    const auto& weight_map = index.at("weight_map").as_object();
    const auto want = tensor_bytes_of(one.path);
    CHECK(weight_map.size() == want.size());
    CHECK(tensor_bytes_of(sharded.path) == want);  // The same bytes under the same names.
    auto a = logits_of(one.path, "none");
    auto b = logits_of(sharded.path, "none");
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(*a == *b);

    // Over a sharded checkpoint: refused without --force, naming a shard; with it, the shards
    // and their index go (the loader would read the index instead of the new file).
    o.max_shard_bytes = QuantizeOptions::kDefaultShardBytes;
    o.stats = nullptr;
    Status kept = quantize_checkpoint(o);
    CHECK(kept.code() == StatusCode::kInvalidArgument);
    CHECK(contains(kept, "model-0000"));
    CHECK(contains(kept, "pass --force"));
    o.overwrite = true;
    REQUIRE(quantize_checkpoint(o).ok());
    CHECK(fs::exists(sharded.path + "/model.safetensors"));
    CHECK_FALSE(fs::exists(sharded.path + "/model.safetensors.index.json"));
    CHECK_FALSE(fs::exists(sharded.path + "/" + shard_file_name(1, shards)));
    auto c = logits_of(sharded.path, "none");
    REQUIRE(c.ok());
    CHECK(*c == *a);
    // And the other way: one file replaced by shards.
    o.max_shard_bytes = whole.bytes_written / 2 + 1;
    REQUIRE(quantize_checkpoint(o).ok());
    CHECK_FALSE(fs::exists(sharded.path + "/model.safetensors"));
    CHECK(tensor_bytes_of(sharded.path) == want);

    CHECK(quantize_checkpoint({kMicro, "experts-int4", sharded.path + "/z", false, 0}).code() ==
          StatusCode::kInvalidArgument);
}

TEST_CASE("FP8 checkpoints: the policy's INT8 and INT4 classes are requantized, on load and by "
          "quantize, the rest stays FP8 as stored") {
    // An FP8 checkpoint in the DeepSeek-V3 layout, as DeepSeek-V3 and Kimi K2 are released.
    TempDir f8("fp8_in");
    REQUIRE(quantize_checkpoint({kMicro, "all-fp8", f8.path}).ok());
    REQUIRE(read_text(f8.path + "/config.json").find("\"quant_method\":\"fp8\"") !=
            std::string::npos);
    int64_t fp8_bytes = 0, on_load_bytes = 0, written_bytes = 0;
    auto as_stored = logits_of(f8.path, "none", &fp8_bytes);
    auto on_load = logits_of(f8.path, "experts-int4", &on_load_bytes);
    REQUIRE_MESSAGE(as_stored.ok(), as_stored.status().to_string());
    REQUIRE_MESSAGE(on_load.ok(), on_load.status().to_string());
    CHECK(on_load_bytes < fp8_bytes);  // Experts at 4 bits instead of 8.
    CHECK(*on_load != *as_stored);

    TempDir out("fp8_to_int4");
    Status st = quantize_checkpoint({f8.path, "experts-int4", out.path});
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    auto written = logits_of(out.path, "none", &written_bytes);
    REQUIRE_MESSAGE(written.ok(), written.status().to_string());
    CHECK(*written == *on_load);  // Bit-identical, as for a BF16 input.
    CHECK(written_bytes < fp8_bytes);
    const std::string cfg = read_text(out.path + "/config.json");
    CHECK(cfg.find("\"quant_method\":\"compressed-tensors\"") != std::string::npos);
    CHECK(cfg.find("\"format\":\"mixed-precision\"") != std::string::npos);

    // The FP8 matrices the policy leaves alone are the input's bytes, their weight_scale_inv
    // renamed weight_scale; the experts are INT4 made from the FP8 values.
    const auto in = tensor_bytes_of(f8.path);
    const auto got = tensor_bytes_of(out.path);
    const std::string attn = "model.layers.0.self_attn.q_proj";
    REQUIRE(got.count(attn + ".weight"));
    CHECK(got.at(attn + ".weight") == in.at(attn + ".weight"));
    CHECK(got.at(attn + ".weight_scale") == in.at(attn + ".weight_scale_inv"));
    CHECK_FALSE(got.count(attn + ".weight_scale_inv"));
    const std::string expert = "model.layers.1.mlp.experts.3.down_proj";
    CHECK_FALSE(got.count(expert + ".weight"));
    REQUIRE(got.count(expert + ".weight_packed"));
    {
        auto ckpt = Checkpoint::open_dir(f8.path);
        REQUIRE(ckpt.ok());
        auto w = (*ckpt)->tensor(expert + ".weight");
        auto s = (*ckpt)->tensor(expert + ".weight_scale_inv");
        REQUIRE(w.ok());
        REQUIRE(s.ok());
        auto fp8 = quant::from_fp8_block(tensor_ref(*w), tensor_ref(*s), true);
        REQUIRE(fp8.ok());
        const Weight& v = fp8->view();
        std::vector<float> rows(static_cast<size_t>(v.rows * v.cols));
        for (int64_t r = 0; r < v.rows; ++r) {
            quant::dequantize_row(v, r, rows.data() + r * v.cols);
        }
        auto want = quant::quantize(quant::SourceMatrix::f32(rows.data(), v.rows, v.cols),
                                    WeightFormat::kInt4G32);
        REQUIRE(want.ok());
        const std::string& packed = got.at(expert + ".weight_packed");
        REQUIRE(static_cast<int64_t>(packed.size()) ==
                quant::weight_data_bytes(WeightFormat::kInt4G32, v.rows, v.cols));
        CHECK(std::memcmp(packed.data(), want->view().data, packed.size()) == 0);
    }

    // INT8 everywhere from FP8 loads too; FP8 to FP8 is no requantization (nothing to do).
    TempDir int8("fp8_to_int8");
    REQUIRE(quantize_checkpoint({f8.path, "all-int8", int8.path}).ok());
    auto all8 = logits_of(int8.path, "none");
    auto all8_on_load = logits_of(f8.path, "all-int8");
    REQUIRE(all8.ok());
    REQUIRE(all8_on_load.ok());
    CHECK(*all8 == *all8_on_load);
    CHECK_FALSE(quant::requantizes(WeightFormat::kFP8E4M3Block128,
                                   WeightFormat::kFP8E4M3Block128));
    CHECK_FALSE(quant::requantizes(WeightFormat::kInt8Row, WeightFormat::kInt4G32));
    CHECK(quant::requantizes(WeightFormat::kFP8E4M3Block128, WeightFormat::kInt4G128));

    // A compressed-tensors input is still refused, saying what is read.
    TempDir again("ct_again");
    Status ct = quantize_checkpoint({out.path, "all-int8", again.path});
    CHECK(ct.code() == StatusCode::kInvalidArgument);
    CHECK(contains(ct, "('compressed-tensors')"));
    CHECK(contains(ct, "FP8 ones in the DeepSeek-V3 layout"));
}

TEST_CASE("routed experts load on several threads: the same weights, and the first failing "
          "expert's error, as on one thread") {
    auto load = [](const std::string& dir, const std::string& policy, int threads)
        -> Result<std::vector<float>> {
        LoadOptions o;
        o.threads = threads;
        o.max_slots = 1;
        o.max_context = 64;
        o.quantization = policy;
        EDGE_ASSIGN_OR_RETURN(auto model, load_model(dir, o));
        EDGE_ASSIGN_OR_RETURN(int32_t slot, model->acquire_slot());
        SequenceChunk ch{slot, 0, kPrompt, true};
        std::vector<float> logits;
        EDGE_RETURN_IF_ERROR(model->forward({&ch, 1}, &logits));
        return logits;
    };
    for (const std::string policy : {"none", "experts-int4", "all-int8"}) {
        CAPTURE(policy);
        auto one = load(kMicro, policy, 1);
        auto four = load(kMicro, policy, 4);
        REQUIRE_MESSAGE(one.ok(), one.status().to_string());
        REQUIRE_MESSAGE(four.ok(), four.status().to_string());
        CHECK(*one == *four);
    }
    TempDir in("experts_broken");
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
        fs::copy_file(kMicro + "/" + f, in.path + "/" + f);
    }
    rewrite(in.path, [](std::vector<TensorToWrite>& ts, std::vector<std::string>&) {
        std::erase_if(ts, [](const TensorToWrite& t) {
            return t.name == "model.layers.1.mlp.experts.2.up_proj.weight" ||
                   t.name == "model.layers.1.mlp.experts.6.gate_proj.weight";
        });
    });
    for (const int threads : {1, 4}) {
        CAPTURE(threads);
        auto broken = load(in.path, "experts-int4", threads);
        REQUIRE_FALSE(broken.ok());
        CHECK(contains(broken.status(), "model.layers.1.mlp.experts.2.up_proj.weight"));
    }
}

TEST_CASE("quantize: a matrix refused as the writer reaches it leaves no shard, no index and no "
          "directory the run made") {
    TempDir in("late_nan");
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
        fs::copy_file(kMicro + "/" + f, in.path + "/" + f);
    }
    // A NaN in the last layer's last routed expert: quantized late in the write, in the last
    // shard.
    auto names = Checkpoint::open_dir(kMicro);
    REQUIRE(names.ok());
    std::string last;
    for (const std::string& n : (*names)->names()) {
        if (n.find(".mlp.experts.") != std::string::npos && n.ends_with("down_proj.weight")) {
            last = n;
        }
    }
    REQUIRE_FALSE(last.empty());
    rewrite(in.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>& keep) {
        TensorToWrite* t = find(ts, last);
        std::string bytes(t->bytes);
        const uint16_t nan = 0x7fc0;
        std::memcpy(bytes.data() + bytes.size() - 2, &nan, 2);
        keep.push_back(std::move(bytes));
        t->bytes = keep.back();
    });
    TempDir out("late_nan_out");
    QuantizeStats whole;
    QuantizeOptions o{kMicro, "experts-int4", out.path + "/probe"};
    o.stats = &whole;
    REQUIRE(quantize_checkpoint(o).ok());
    for (const bool made : {true, false}) {
        CAPTURE(made);
        const std::string dir = out.path + (made ? "/new" : "/existing");
        if (!made) {
            fs::create_directories(dir);
            std::ofstream(dir + "/NOTES.md") << "the operator's";
        }
        QuantizeOptions bad{in.path, "experts-int4", dir};
        bad.max_shard_bytes = whole.bytes_written / 4;
        bad.threads = made ? 4 : 1;  // Threads still quantizing ahead are waited for.
        Status st = quantize_checkpoint(bad);
        CHECK(st.code() == StatusCode::kInvalidArgument);
        CHECK(contains(st, last));
        CHECK(contains(st, "NaN"));
        if (made) {
            CHECK_FALSE(fs::exists(dir));
        } else {
            std::vector<std::string> left;
            for (const auto& e : fs::directory_iterator(dir)) {
                left.push_back(e.path().filename().string());
            }
            CHECK(left == std::vector<std::string>{"NOTES.md"});
        }
    }
}

TEST_CASE("quantize: --force leaves nothing of the old checkpoint, an input that cannot load "
          "leaves no checkpoint") {
    TempDir in("in");
    TempDir out("out");
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
        fs::copy_file(kMicro + "/" + f, in.path + "/" + f);
    }
    std::ofstream(in.path + "/tiktoken.model") << "unused beside tokenizer.json\n";
    // The output held another checkpoint with a generation config (its eos would stop the new
    // model), and an interrupted write's leftovers.
    REQUIRE(quantize_checkpoint({kMicro, "all-int8", out.path}).ok());
    REQUIRE(fs::exists(out.path + "/generation_config.json"));
    std::ofstream(out.path + "/model.safetensors.partial") << "half";
    std::ofstream(out.path + "/NOTES.md") << "the operator's";
    CHECK(quantize_checkpoint({in.path, "all-int8", out.path}).code() ==
          StatusCode::kInvalidArgument);  // Without --force.
    REQUIRE(quantize_checkpoint({in.path, "all-int8", out.path, true}).ok());
    CHECK_FALSE(fs::exists(out.path + "/generation_config.json"));
    CHECK_FALSE(fs::exists(out.path + "/tokenizer_config.json"));
    CHECK_FALSE(fs::exists(out.path + "/model.safetensors.partial"));
    CHECK(fs::exists(out.path + "/tiktoken.model"));  // Kimi K2's tokenizer travels too.
    CHECK(fs::exists(out.path + "/NOTES.md"));        // Not a checkpoint file: kept.
    REQUIRE(logits_of(out.path, "none").ok());

    // An input whose headers check out but which the loader refuses (a tensor missing).
    rewrite(in.path, [](std::vector<TensorToWrite>& ts, std::vector<std::string>&) {
        std::erase_if(ts, [](const TensorToWrite& t) {
            return t.name == "model.layers.0.self_attn.k_norm.weight";
        });
    });
    Status broken = quantize_checkpoint({in.path, "all-int8", out.path, true});
    CHECK(broken.code() == StatusCode::kInvalidArgument);
    CHECK(broken.message().find("does not load") != std::string::npos);
    CHECK(broken.message().find("k_norm") != std::string::npos);
    CHECK_FALSE(fs::exists(out.path + "/config.json"));

    // A tokenizer the loader would refuse: refused before anything is written.
    TempDir bad_tok("bad_tok");
    for (const char* f : {"config.json", "model.safetensors"}) {
        fs::copy_file(kMicro + "/" + f, bad_tok.path + "/" + f);
    }
    std::ofstream(bad_tok.path + "/tokenizer.json") << "{\"model\": 3}";
    const std::string fresh = out.path + "/fresh";
    Status tok = quantize_checkpoint({bad_tok.path, "all-int8", fresh});
    CHECK_FALSE(tok.ok());
    CHECK(tok.message().find("tokenizer.json") != std::string::npos);
    CHECK_FALSE(fs::exists(fresh));
}

TEST_CASE("a directory that is not a checkpoint is named as such, before its tokenizer") {
    CHECK(check_checkpoint_loads("/nonexistent/model").message().find(
              "/nonexistent/model: not a directory") == 0);
    TempDir empty("not_ckpt");
    CHECK(check_checkpoint_loads(empty.path).message().find(empty.path +
                                                           "/config.json: cannot open") == 0);
}

TEST_CASE("row tiles: INT4 and INT8 weights in CPU row tiles give the row-major logits") {
    // Both layouts' VNNI kernels round the activations to int8 on the same groups, so only the
    // f32 summation order differs: the logits agree far below the quantization error.
    for (const std::string policy : {"experts-int4", "all-int8"}) {
        CAPTURE(policy);
        int64_t bytes_rows = 0, bytes_tiles = 0;
        auto rows = logits_of(kMicro, policy, &bytes_rows, /*row_tiles=*/false);
        auto tiles = logits_of(kMicro, policy, &bytes_tiles, /*row_tiles=*/true);
        REQUIRE(rows.ok());
        REQUIRE(tiles.ok());
        REQUIRE(rows->size() == tiles->size());
        int bad = 0;
        double worst = 0.0;
        for (size_t i = 0; i < rows->size(); ++i) {
            const double d = std::fabs((*rows)[i] - (*tiles)[i]);
            worst = std::max(worst, d);
            bad += !(d <= 1e-3 * (1.0 + std::fabs((*rows)[i])));
        }
        CAPTURE(worst);
        CHECK(bad == 0);
        // The micro model's shapes are multiples of 16 rows: no padding, the same bytes.
        CHECK(bytes_tiles == bytes_rows);
    }
}

TEST_CASE("deploy/demo-model is fortunes-qwen3-moe with experts-int4") {
    auto demo = logits_of(std::string(EDGE_SOURCE_DIR) + "/deploy/demo-model", "none");
    REQUIRE_MESSAGE(demo.ok(), demo.status().to_string());
    auto on_load = logits_of(kFortunes, "experts-int4");
    REQUIRE(on_load.ok());
    CHECK(*demo == *on_load);
}

TEST_CASE("quantize: the policy applies again on top of a quantized checkpoint's float tensors") {
    TempDir tmp("stack");
    REQUIRE(quantize_checkpoint({kMicro, "experts-int4", tmp.path}).ok());
    auto a = logits_of(tmp.path, "attention=int8");
    auto b = logits_of(kMicro, "experts-int4,attention=int8");
    REQUIRE_MESSAGE(a.ok(), a.status().to_string());
    REQUIRE(b.ok());
    CHECK(*a == *b);
}

// Bounds from quant-eval (docs/quantization.md has the tables), with headroom: micro-qwen3-moe
// (random weights, 256 tokens) and fortunes-qwen3-moe (trained, its eval.txt, 256 tokens).
struct Bound {
    const char* policy;
    double max_mean_kl;
    double min_top1;
    double max_ppl_ratio;
};

void check_bounds(const std::string& dir, std::vector<TokenId> ids, const std::string& text,
                  const std::vector<Bound>& bounds) {
    QuantEvalOptions o;
    o.model_dir = dir;
    o.token_ids = std::move(ids);
    o.text_path = text;
    o.tokens = 256;
    o.chunk = 128;
    o.threads = 2;
    o.decode_steps = 0;
    o.per_class = false;
    for (const Bound& b : bounds) {
        o.policies.push_back(b.policy);
    }
    auto rows = run_quant_eval(o);
    REQUIRE_MESSAGE(rows.ok(), rows.status().to_string());
    REQUIRE(rows->size() == bounds.size() + 1);
    MESSAGE(dir << "\n" << quant_eval_table(*rows));
    CHECK((*rows)[0].mean_kl == 0.0);
    CHECK((*rows)[0].top1 == 1.0);
    for (size_t i = 0; i < bounds.size(); ++i) {
        const QuantEvalRow& r = (*rows)[i + 1];
        CAPTURE(r.label);
        CAPTURE(r.mean_kl);
        CAPTURE(r.top1);
        CAPTURE(r.ppl_ratio);
        CHECK(r.mean_kl > 0.0);
        CHECK(r.mean_kl <= bounds[i].max_mean_kl);
        CHECK(r.top1 >= bounds[i].min_top1);
        CHECK(r.ppl_ratio <= bounds[i].max_ppl_ratio);
        CHECK(r.weight_bytes < (*rows)[0].weight_bytes);
    }
}

TEST_CASE("quant-eval: micro-qwen3-moe quantized logits stay within bounds of BF16") {
    std::vector<TokenId> ids;
    for (int i = 0; i < 256; ++i) {
        ids.push_back(static_cast<TokenId>((i * 37 + 11) % 500));
    }
    check_bounds(kMicro, ids, "",
                 {{"all-fp8", MICRO_FP8_KL, MICRO_FP8_TOP1, MICRO_FP8_PPL},
                  {"all-int8", MICRO_INT8_KL, MICRO_INT8_TOP1, MICRO_INT8_PPL},
                  {"experts-int4", MICRO_INT4_KL, MICRO_INT4_TOP1, MICRO_INT4_PPL}});
}

TEST_CASE("quant-eval: fortunes-qwen3-moe quantized logits stay within bounds of BF16") {
    check_bounds(kFortunes, {}, kFortunes + "/eval.txt",
                 {{"all-fp8", FORT_FP8_KL, FORT_FP8_TOP1, FORT_FP8_PPL},
                  {"all-int8", FORT_INT8_KL, FORT_INT8_TOP1, FORT_INT8_PPL},
                  {"experts-int4", FORT_INT4_KL, FORT_INT4_TOP1, FORT_INT4_PPL}});
}

double rmse(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double sq = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = a[i] - b[i];
        sq += d * d;
    }
    return std::sqrt(sq / static_cast<double>(a.size()));
}

TEST_CASE("GLM-4.5 and DeepSeek-V3 quantize on load and load quantized checkpoints") {
    // Bounds: quant-eval measured logit RMSE 0.36 (GLM) and 0.47 (DeepSeek-V3) for experts-int4
    // on 1024 tokens of these random-weight fixtures; 1.0 leaves room for this short prompt.
    // The embeddings class applies to them as to Qwen3-MoE (the table is read through
    // embedding_row); INT8 rows change the logits only a little.
    for (const char* name : {"micro-glm4-moe", "micro-deepseek-v3"}) {
        CAPTURE(name);
        const std::string dir = std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/" + name;
        int64_t bf16_bytes = 0;
        auto bf16 = logits_of(dir, "none", &bf16_bytes);
        REQUIRE_MESSAGE(bf16.ok(), bf16.status().to_string());
        // all-fp8 and all-int8 take the attention too; DeepSeek-V3's kv_b_proj stays float.
        for (const std::string policy : {"experts-int4", "embeddings=int8", "all-fp8", "all-int8"}) {
            CAPTURE(policy);
            int64_t bytes = 0;
            auto on_load = logits_of(dir, policy, &bytes);
            REQUIRE_MESSAGE(on_load.ok(), on_load.status().to_string());
            if (policy == "experts-int4") {
                CHECK(bytes < bf16_bytes * 3 / 4);  // The routed experts are most of the bytes.
            } else {
                CHECK(bytes < bf16_bytes);
            }
            const double err = rmse(*on_load, *bf16);
            CHECK(err > 0);
            CHECK(err < 1.0);
            // The same policy written by `edgeserve quantize` loads and gives the same logits
            // as quantizing on load.
            TempDir tmp(std::string("arch_") + name);
            REQUIRE(quantize_checkpoint({dir, policy, tmp.path}).ok());
            auto written = logits_of(tmp.path, "none");
            REQUIRE_MESSAGE(written.ok(), written.status().to_string());
            CHECK(*written == *on_load);
        }
    }
}

TEST_CASE("DeepSeek-V3: kv_b_proj stored in FP8, as the real checkpoints have it, loads") {
    const std::string dir = std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/micro-deepseek-v3";
    TempDir tmp("kvb_fp8");
    REQUIRE(quantize_checkpoint({dir, "all-fp8", tmp.path}).ok());
    int64_t float_bytes = 0;
    auto float_kvb = logits_of(tmp.path, "none", &float_bytes);  // quantize leaves it in BF16.
    REQUIRE_MESSAGE(float_kvb.ok(), float_kvb.status().to_string());
    int64_t kvb_elements = 0;
    std::deque<std::string> bytes;  // The rewritten tensors' bytes (stable addresses).
    int rewritten = 0;
    rewrite(tmp.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>&) {
        const size_t n = ts.size();
        for (size_t i = 0; i < n; ++i) {
            if (!ts[i].name.ends_with("kv_b_proj.weight")) {
                continue;
            }
            REQUIRE(ts[i].dtype == DType::kBF16);
            const int64_t rows = ts[i].shape[0], cols = ts[i].shape[1];
            kvb_elements += rows * cols;
            auto q = quant::quantize(
                quant::SourceMatrix::bf16(reinterpret_cast<const uint16_t*>(ts[i].bytes.data()),
                                          rows, cols),
                WeightFormat::kFP8E4M3Block128, ts[i].name);
            REQUIRE(q.ok());
            const std::string& data = bytes.emplace_back(
                static_cast<const char*>(q->view().data),
                static_cast<size_t>(quant::weight_data_bytes(WeightFormat::kFP8E4M3Block128, rows,
                                                             cols)));
            const std::string& scales = bytes.emplace_back(
                reinterpret_cast<const char*>(q->scales().data()), q->scales().size() * 4);
            ts[i].dtype = DType::kF8E4M3;
            ts[i].bytes = data;
            const std::string module = ts[i].name.substr(0, ts[i].name.size() - 7);
            ts.push_back({module + ".weight_scale_inv",
                          DType::kF32,
                          {(rows + 127) / 128, (cols + 127) / 128},
                          scales,
                          {}});
            ++rewritten;
        }
    });
    REQUIRE(rewritten > 0);
    int64_t fp8_bytes = 0;
    auto fp8_kvb = logits_of(tmp.path, "none", &fp8_bytes);
    REQUIRE_MESSAGE(fp8_kvb.ok(), fp8_kvb.status().to_string());
    // Held: the F32 copies (4 bytes an element) instead of the BF16 views (2) and their f32
    // widened copies (4); the FP8 tensors and their scales are read once and released, not
    // counted.
    CHECK(fp8_bytes == float_bytes - 2 * kvb_elements);
    // FP8's rounding of kv_b_proj moves the logits a little, and only a little.
    const double err = rmse(*fp8_kvb, *float_kvb);
    CHECK(err > 0);
    CHECK(err < 0.5);
}

TEST_CASE("compressed-tensors weight_shape loads stored as I32 or as I64") {
    // `edgeserve quantize` writes I32; Kimi K2 Thinking's checkpoint stores I64.
    TempDir tmp("i64shape");
    REQUIRE(quantize_checkpoint({kMicro, "experts-int4", tmp.path}).ok());
    auto as_i32 = logits_of(tmp.path, "none");
    REQUIRE_MESSAGE(as_i32.ok(), as_i32.status().to_string());
    std::deque<std::string> wide;
    int rewritten = 0;
    rewrite(tmp.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>&) {
        for (TensorToWrite& t : ts) {
            if (t.name.ends_with(".weight_shape")) {
                REQUIRE(t.dtype == DType::kI32);
                int32_t dims[2];
                std::memcpy(dims, t.bytes.data(), 8);
                const int64_t dims64[2] = {dims[0], dims[1]};
                wide.emplace_back(reinterpret_cast<const char*>(dims64), 16);
                t.dtype = DType::kI64;
                t.bytes = wide.back();
                ++rewritten;
            }
        }
    });
    CHECK(rewritten > 0);
    auto ckpt = Checkpoint::open_dir(tmp.path);
    REQUIRE(ckpt.ok());
    auto shape = (*ckpt)->tensor("model.layers.0.mlp.experts.0.gate_proj.weight_shape");
    REQUIRE(shape.ok());
    CHECK(shape->dtype() == DType::kI64);
    auto as_i64 = logits_of(tmp.path, "none");
    REQUIRE_MESSAGE(as_i64.ok(), as_i64.status().to_string());
    CHECK(*as_i64 == *as_i32);
}

TEST_CASE("quantize copies an input's own weight_shape tensors as stored") {
    // An unused I32 [2] tensor named like an INT4 shape: quantize used to re-point every such
    // output entry at its own shape buffer, reading past its end (a SIGSEGV) or writing wrong
    // bytes.
    TempDir in("extra_ws");
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
        fs::copy_file(kMicro + "/" + f, in.path + "/" + f);
    }
    const int32_t dims[2] = {7, 7};
    const std::string extra(reinterpret_cast<const char*>(dims), 8);
    for (const std::string name : {"model.extra_thing.weight_shape", "zzz.weight_shape"}) {
        rewrite(in.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>&) {
            ts.push_back({name, DType::kI32, {2}, extra, {}});
        });
    }
    for (const std::string policy : {"all-int8", "experts-int4", "lm_head=int4-g32"}) {
        CAPTURE(policy);
        TempDir out("extra_ws_out");
        Status st = quantize_checkpoint({in.path, policy, out.path, true});
        REQUIRE_MESSAGE(st.ok(), st.to_string());
        auto ckpt = Checkpoint::open_dir(out.path);
        REQUIRE(ckpt.ok());
        for (const std::string name : {"model.extra_thing.weight_shape", "zzz.weight_shape"}) {
            auto t = (*ckpt)->tensor(name);
            REQUIRE(t.ok());
            CHECK(std::string(static_cast<const char*>(t->data), 8) == extra);
        }
        auto on_load = logits_of(in.path, policy);
        REQUIRE_MESSAGE(on_load.ok(), on_load.status().to_string());
        auto stored = logits_of(out.path, "none");
        REQUIRE_MESSAGE(stored.ok(), stored.status().to_string());
        CHECK(*stored == *on_load);
    }
}

TEST_CASE("quantize refuses an input tensor named as a quantized module's output, before --out") {
    // An unused tensor named as the output names a quantized module's scales or shape: both were
    // written (the header keeping one), and only the load check after the whole write refused
    // the file, with --force's old checkpoint already gone.
    const std::string expert = "model.layers.0.mlp.experts.0.gate_proj";
    const std::string attn = "model.layers.0.self_attn.q_proj";
    const float one = 1.0f;
    const std::string f32(reinterpret_cast<const char*>(&one), 4);
    for (const auto& [policy, stray] :
         {std::pair<std::string, std::string>{"experts-int4", expert + ".weight_shape"},
          {"all-int8", attn + ".weight_scale"},
          {"all-fp8", attn + ".weight_scale_inv"}}) {
        CAPTURE(policy);
        TempDir in("stray_in");
        for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
            fs::copy_file(kMicro + "/" + f, in.path + "/" + f);
        }
        rewrite(in.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>&) {
            ts.push_back({stray, DType::kF32, {1}, f32, {}});
        });
        REQUIRE(logits_of(in.path, "none").ok());  // The input loads: the tensor is not read.
        TempDir out("stray_out");
        REQUIRE(quantize_checkpoint({kMicro, "all-int8", out.path}).ok());
        Status st = quantize_checkpoint({in.path, policy, out.path, true});
        CHECK(st.code() == StatusCode::kInvalidArgument);
        CHECK(contains(st, in.path + "/model.safetensors: tensor '" + stray +
                               "' is copied as stored"));
        CHECK(fs::exists(out.path + "/config.json"));  // The old checkpoint is left whole.
        REQUIRE(logits_of(out.path, "none").ok());
    }
}

TEST_CASE("an FP8 matrix requantized on load that cannot be is refused naming its file") {
    // requantize names the tensor only: the other quantize-on-load paths add the file
    // (quantize_stored), this one did not.
    TempDir f8("fp8_big_scale");
    REQUIRE(quantize_checkpoint({kMicro, "all-fp8", f8.path}).ok());
    const std::string expert = "model.layers.0.mlp.experts.0.gate_proj";
    rewrite(f8.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>& keep) {
        TensorToWrite* t = find(ts, expert + ".weight_scale_inv");
        REQUIRE(t->dtype == DType::kF32);
        std::string bytes(t->bytes);
        // Within FP8's limit (2^64); INT4's scale, max|w| / 7 with |w| up to 448 times it, is not.
        const float big = 0x1p63f;
        std::memcpy(bytes.data(), &big, 4);
        keep.push_back(std::move(bytes));
        t->bytes = keep.back();
    });
    auto loaded = logits_of(f8.path, "experts-int4");
    REQUIRE_FALSE(loaded.ok());
    CHECK(loaded.status().code() == StatusCode::kInvalidArgument);
    CHECK(contains(loaded.status(), f8.path + "/model.safetensors"));
    CHECK(contains(loaded.status(), "tensor '" + expert + ".weight'"));
    CHECK(contains(loaded.status(), "2^64"));
    // quantize refuses it the same way (quantize_stored).
    TempDir out("fp8_big_scale_out");
    Status st = quantize_checkpoint({f8.path, "experts-int4", out.path + "/q"});
    CHECK(contains(st, f8.path + "/model.safetensors"));
    CHECK(contains(st, "tensor '" + expert + ".weight'"));
}

TEST_CASE("check_model_files refuses what the load refuses, from config and headers alone") {
    // Quantized tensors without the quantization_config that declares them: check-config said
    // "ok" and quantize wrote (or crashed) before the load refused them.
    for (const auto& [policy, dtype] : {std::pair{"all-int8", "is I8"},
                                        std::pair{"experts-int4", "has weight_packed"},
                                        std::pair{"all-fp8", "is F8_E4M3"}}) {
        CAPTURE(policy);
        TempDir tmp("undeclared");
        REQUIRE(quantize_checkpoint({kMicro, policy, tmp.path}).ok());
        fs::copy_file(kMicro + "/config.json", tmp.path + "/config.json",
                      fs::copy_options::overwrite_existing);
        const Status checked = check_model_files(tmp.path, "");
        CHECK(contains(checked, dtype));
        auto loaded = logits_of(tmp.path, "none");
        REQUIRE_FALSE(loaded.ok());
        CHECK(contains(loaded.status(), dtype));
        TempDir out("undeclared_out");
        const Status q = quantize_checkpoint({tmp.path, "lm_head=int8", out.path + "/q"});
        CHECK(contains(q, dtype));
        CHECK_FALSE(fs::exists(out.path + "/q"));
    }
    // A policy whose INT4 group does not divide a matrix it quantizes (micro's down_proj is 64
    // wide): the load's error, named the same way.
    CHECK(check_model_files(kMicro, "experts-int4").ok());
    const Status g128 = check_model_files(kMicro, "experts-int4-g128");
    CHECK(contains(g128, "down_proj.weight': 64 input features are not a multiple of the int4 "
                         "group 128"));
    auto loaded = logits_of(kMicro, "experts-int4-g128");
    REQUIRE_FALSE(loaded.ok());
    CHECK(contains(loaded.status(), "not a multiple of the int4 group 128"));
}

TEST_CASE("quantized checkpoints: bad input gets clear errors") {
    const std::string mod = "model.layers.0.mlp.experts.0.gate_proj";
    SUBCASE("a NaN in a tensor quantize keeps as it is") {
        TempDir in("nan_in");
        for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
            fs::copy_file(kMicro + "/" + f, in.path + "/" + f);
        }
        rewrite(in.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>& keep) {
            TensorToWrite* t = find(ts, "model.norm.weight");
            std::string bytes(t->bytes);
            const uint16_t nan = 0x7fc0;  // A BF16 quiet NaN, element 3.
            std::memcpy(bytes.data() + 6, &nan, 2);
            keep.push_back(std::move(bytes));
            t->bytes = keep.back();
        });
        TempDir out("nan_out");
        Status s = quantize_checkpoint({in.path, "experts-int4", out.path + "/q"});
        CHECK(s.code() == StatusCode::kInvalidArgument);
        CHECK(s.message().find("tensor 'model.norm.weight': a NaN or Inf at element 3") !=
              std::string::npos);
        CHECK_FALSE(fs::exists(out.path + "/q"));
    }
    SUBCASE("unknown quant_method") {
        TempDir tmp("method");
        REQUIRE(quantize_checkpoint({kMicro, "experts-int4", tmp.path}).ok());
        std::string cfg = read_text(tmp.path + "/config.json");
        const auto at = cfg.find("compressed-tensors");
        REQUIRE(at != std::string::npos);
        cfg.replace(at, 18, "awq");
        write_text(tmp.path + "/config.json", cfg);
        auto r = logits_of(tmp.path, "none");
        REQUIRE(!r.ok());
        CHECK(contains(r.status(), "quant_method' 'awq' is not supported"));
        CHECK(contains(r.status(), "config.json"));
    }
    SUBCASE("INT4 scale tensor of the wrong shape") {
        TempDir tmp("scale");
        REQUIRE(quantize_checkpoint({kMicro, "experts-int4", tmp.path}).ok());
        rewrite(tmp.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>&) {
            TensorToWrite* t = find(ts, mod + ".weight_scale");
            // [64, 4] -> [32, 8]: same bytes, wrong shape.
            t->shape = {t->shape[0] / 2, t->shape[1] * 2};
        });
        auto r = logits_of(tmp.path, "none");
        REQUIRE(!r.ok());
        CHECK(contains(r.status(), mod + ".weight_scale"));
        CHECK(contains(r.status(), "shape"));
    }
    SUBCASE("FP8 scale_inv of the wrong shape") {
        TempDir tmp("fp8scale");
        REQUIRE(quantize_checkpoint({kMicro, "all-fp8", tmp.path}).ok());
        rewrite(tmp.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>& keep) {
            TensorToWrite* t = find(ts, mod + ".weight_scale_inv");
            keep.push_back(std::string(8, '\0'));  // Two f32 zeros: [1, 2] instead of [1, 1].
            t->shape = {1, 2};
            t->bytes = keep.back();
        });
        auto r = logits_of(tmp.path, "none");
        REQUIRE(!r.ok());
        CHECK(contains(r.status(), "weight_scale_inv"));
    }
    SUBCASE("scale errors name the scale as stored: INT8 and compressed-tensors FP8") {
        TempDir tmp("i8scale");
        REQUIRE(quantize_checkpoint({kMicro, "all-int8", tmp.path}).ok());
        rewrite(tmp.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>&) {
            TensorToWrite* t = find(ts, mod + ".weight_scale");
            t->shape = {t->shape[0] / 2, 2};  // Same bytes, neither [rows, 1] nor [rows].
        });
        auto r = logits_of(tmp.path, "none");
        REQUIRE_FALSE(r.ok());
        CHECK(contains(r.status(), "expected [64, 1] or [64]"));
        // FP8 in compressed-tensors (beside INT4): its scale is weight_scale, not _inv.
        TempDir mixed("ctfp8scale");
        REQUIRE(quantize_checkpoint({kMicro, "experts-int4,attention=fp8", mixed.path}).ok());
        const std::string q = "model.layers.0.self_attn.q_proj";
        rewrite(mixed.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>& keep) {
            TensorToWrite* t = find(ts, q + ".weight_scale");
            keep.push_back(std::string(static_cast<size_t>(t->bytes.size()) * 2, '\0'));
            t->shape = {t->shape[0], t->shape[1] * 2};
            t->bytes = keep.back();
        });
        r = logits_of(mixed.path, "none");
        REQUIRE_FALSE(r.ok());
        CHECK(contains(r.status(), q + ".weight_scale' (weight_scale, 128x128 blocks)"));
    }
    SUBCASE("packed tensor shorter than weight_shape implies") {
        TempDir tmp("short");
        REQUIRE(quantize_checkpoint({kMicro, "experts-int4", tmp.path}).ok());
        rewrite(tmp.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>& keep) {
            TensorToWrite* t = find(ts, mod + ".weight_packed");
            t->shape = {t->shape[0] / 2, t->shape[1]};
            keep.push_back(std::string(t->bytes.substr(0, t->bytes.size() / 2)));
            t->bytes = keep.back();
        });
        auto r = logits_of(tmp.path, "none");
        REQUIRE(!r.ok());
        CHECK(contains(r.status(), mod + ".weight_packed"));
    }
    SUBCASE("quantized tensors without a quantization_config") {
        TempDir tmp("nocfg");
        REQUIRE(quantize_checkpoint({kMicro, "all-int8", tmp.path}).ok());
        fs::copy_file(kMicro + "/config.json", tmp.path + "/config.json",
                      fs::copy_options::overwrite_existing);
        auto r = logits_of(tmp.path, "none");
        REQUIRE(!r.ok());
        CHECK(contains(r.status(), "I8"));
    }
    SUBCASE("policy naming an unknown class") {
        auto r = logits_of(kMicro, "experts=int4-g32");
        REQUIRE(!r.ok());
        CHECK(contains(r.status(), "experts"));
        CHECK(contains(r.status(), "routed_experts"));  // The valid classes are listed.
        TempDir tmp("badpolicy");
        Status st = quantize_checkpoint({kMicro, "mlp=int8", tmp.path});
        CHECK(!st.ok());
        CHECK(contains(st, "mlp"));
    }
    SUBCASE("asymmetric INT4: symmetric false in the config, or zero-point tensors") {
        TempDir tmp("asym");
        REQUIRE(quantize_checkpoint({kMicro, "experts-int4", tmp.path}).ok());
        std::string cfg = read_text(tmp.path + "/config.json");
        const auto at = cfg.find("\"symmetric\":true");
        REQUIRE(at != std::string::npos);
        std::string asym = cfg;
        asym.replace(at, 16, "\"symmetric\":false");
        write_text(tmp.path + "/config.json", asym);
        auto r = logits_of(tmp.path, "none");
        REQUIRE(!r.ok());
        CHECK(contains(r.status(), "config.json"));
        CHECK(contains(r.status(), ".weights.symmetric'"));
        CHECK(contains(r.status(), "asymmetric"));

        write_text(tmp.path + "/config.json", cfg);
        std::deque<std::string> zeros;
        rewrite(tmp.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>&) {
            const TensorToWrite* scale = find(ts, mod + ".weight_scale");
            zeros.emplace_back(static_cast<size_t>(scale->shape[0] * scale->shape[1]), '\0');
            ts.push_back({mod + ".weight_zero_point", DType::kI8, scale->shape, zeros.back(), {}});
        });
        r = logits_of(tmp.path, "none");
        REQUIRE(!r.ok());
        CHECK(contains(r.status(), mod + ".weight_zero_point"));
        CHECK(contains(r.status(), "asymmetric"));
    }
    SUBCASE("GPTQ activation order: a weight_g_idx tensor maps columns to groups") {
        TempDir tmp("gidx");
        REQUIRE(quantize_checkpoint({kMicro, "experts-int4", tmp.path}).ok());
        std::deque<std::string> maps;
        rewrite(tmp.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>&) {
            const int64_t cols = 64;  // One I32 per column; its presence alone refuses.
            maps.emplace_back(static_cast<size_t>(cols * 4), '\0');
            ts.push_back({mod + ".weight_g_idx", DType::kI32, {cols}, maps.back(), {}});
        });
        auto r = logits_of(tmp.path, "none");
        REQUIRE(!r.ok());
        CHECK(contains(r.status(), mod + ".weight_g_idx"));
        CHECK(contains(r.status(), "activation order"));
    }
    SUBCASE("quantization_config that contradicts the tensors or declares what is not run") {
        // Each edit of a config quantize wrote, and a text of the error it must give (naming
        // the field).
        using Edit = std::function<void(boost::json::object&)>;
        auto weights = [](boost::json::object& qc, const char* group) -> boost::json::object& {
            return qc["config_groups"].as_object()[group].as_object()["weights"].as_object();
        };
        auto group_of = [](boost::json::object& qc, std::string_view type) -> std::string {
            for (auto& g : qc["config_groups"].as_object()) {
                if (g.value().at("weights").at("type").as_string() == type) {
                    return std::string(g.key());
                }
            }
            FAIL("no group of type " << type);
            return "";
        };
        const std::vector<std::tuple<std::string, Edit, std::string>> cases = {
            {"experts-int4", [&](auto& qc) { weights(qc, "group_0")["group_size"] = 128; },
             "group_0.weights.group_size is 128"},
            {"experts-int4", [&](auto& qc) { weights(qc, "group_0")["group_size"] = 64; },
             "group_0.weights.group_size' is 64"},
            {"experts-int4", [&](auto& qc) { weights(qc, "group_0")["group_size"] = "32"; },
             "group_0.weights.group_size' is \"32\""},
            {"experts-int4", [&](auto& qc) { weights(qc, "group_0").erase("group_size"); },
             "group_0.weights.group_size' is absent"},
            {"experts-int4", [&](auto& qc) { weights(qc, "group_0")["num_bits"] = 8; },
             "num_bits 8"},
            {"experts-int4", [&](auto& qc) { weights(qc, "group_0")["num_bits"] = 2; },
             "group_0.weights.num_bits' is 2"},
            {"experts-int4", [&](auto& qc) { weights(qc, "group_0")["type"] = "float"; },
             "group_0.weights.num_bits' is 4 with type \"float\""},
            {"experts-int4", [&](auto& qc) { weights(qc, "group_0")["strategy"] = "channel"; },
             "group_0.weights.strategy' is \"channel\""},
            {"experts-int4", [&](auto& qc) { weights(qc, "group_0")["dynamic"] = true; },
             "group_0.weights.dynamic' is true"},
            {"experts-int4",
             [&](auto& qc) {
                 qc["config_groups"].as_object()["group_0"].as_object()["output_activations"] =
                     boost::json::object{{"num_bits", 8}, {"type", "int"}, {"dynamic", true},
                                         {"strategy", "token"}};
             },
             "group_0.output_activations' is not null"},
            {"experts-int4", [&](auto& qc) { qc["config_groups"] = boost::json::object{}; },
             "config_groups' is missing"},
            {"experts-int4", [&](auto& qc) { qc["format"] = "int-quantized"; },
             "group_0.format' is 'pack-quantized' but the top-level format is 'int-quantized'"},
            {"experts-int4",
             [&](auto& qc) {
                 qc["config_groups"].as_object()["group_0"].as_object()["format"] = "bogus";
             },
             "group_0.format' is 'bogus'"},
            {"experts-int4",
             [&](auto& qc) { qc["ignore"].as_array().emplace_back("re:.*experts\\.0\\."); },
             "ignore lists module 'model.layers.0.mlp.experts.0."},
            {"experts-int4", [&](auto& qc) { qc["kv_cache_scheme"] = boost::json::object{}; },
             "kv_cache_scheme' is {}"},
            {"all-int8", [&](auto& qc) { weights(qc, "group_0")["num_bits"] = 4; },
             "num_bits 4"},
            {"all-int8", [&](auto& qc) { weights(qc, "group_0")["strategy"] = "tensor"; },
             "group_0.weights.strategy' is \"tensor\""},
            {"all-int8", [&](auto& qc) { weights(qc, "group_0")["type"] = "float"; },
             "type \"float\" are stored in format 'float-quantized'"},
            {"experts-int4,attention=fp8",
             [&](auto& qc) {
                 weights(qc, group_of(qc, "float").c_str())["block_structure"] =
                     boost::json::array{64, 64};
             },
             ".weights.block_structure' is [64,64]"},
            {"experts-int4,attention=fp8",
             [&](auto& qc) {
                 auto& groups = qc["config_groups"].as_object();
                 groups.erase(group_of(qc, "float"));
             },
             "no config.json's quantization_config.config_groups entry declares float8"},
        };
        std::map<std::string, std::unique_ptr<TempDir>> bases;
        for (const auto& [policy, edit, error] : cases) {
            CAPTURE(policy);
            CAPTURE(error);
            auto& dir = bases[policy];
            if (!dir) {
                dir = std::make_unique<TempDir>("qc" + std::to_string(bases.size()));
                REQUIRE(quantize_checkpoint({kMicro, policy, dir->path}).ok());
                fs::copy_file(dir->path + "/config.json", dir->path + "/config.json.orig");
            }
            auto root = boost::json::parse(read_text(dir->path + "/config.json.orig"));
            edit(root.as_object()["quantization_config"].as_object());
            write_text(dir->path + "/config.json", boost::json::serialize(root));
            auto r = logits_of(dir->path, "none");
            REQUIRE_FALSE(r.ok());
            CHECK(contains(r.status(), error));
            CHECK(contains(r.status(), "config.json"));
            CHECK(contains(check_model_files(dir->path, ""), error));
        }
        // Unedited, each loads: what quantize writes is what the checks take.
        for (const auto& [policy, dir] : bases) {
            CAPTURE(policy);
            fs::copy_file(dir->path + "/config.json.orig", dir->path + "/config.json",
                          fs::copy_options::overwrite_existing);
            auto r = logits_of(dir->path, "none");
            CHECK_MESSAGE(r.ok(), r.status().to_string());
        }
        // A W8A8 config (dynamic per-token int8 activations) runs as weight-only, the same
        // logits: the kernels round activations their own way.
        const std::string& int4 = bases.at("experts-int4")->path;
        const auto plain = logits_of(int4, "none");
        REQUIRE(plain.ok());
        auto root = boost::json::parse(read_text(int4 + "/config.json.orig"));
        root.at("quantization_config").at("config_groups").at("group_0").as_object()
            ["input_activations"] = boost::json::object{
            {"num_bits", 8}, {"type", "int"}, {"dynamic", true}, {"strategy", "token"}};
        write_text(int4 + "/config.json", boost::json::serialize(root));
        const auto w8a8 = logits_of(int4, "none");
        REQUIRE_MESSAGE(w8a8.ok(), w8a8.status().to_string());
        CHECK(*w8a8 == *plain);
    }
    SUBCASE("scales above the limit every format shares: refused on load, and by quantize") {
        // An INT8 scale of 3e38 loaded (only FP8 and INT4 scales were limited) and made NaN
        // logits at run time.
        TempDir tmp("i8huge");
        REQUIRE(quantize_checkpoint({kMicro, "all-int8", tmp.path}).ok());
        const std::string q = "model.layers.0.self_attn.q_proj";
        rewrite(tmp.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>& keep) {
            TensorToWrite* t = find(ts, q + ".weight_scale");
            std::string bytes(t->bytes);
            const float huge = 3e38f;
            std::memcpy(bytes.data() + 4, &huge, 4);  // Row 1.
            keep.push_back(std::move(bytes));
            t->bytes = keep.back();
        });
        auto r = logits_of(tmp.path, "none");
        REQUIRE_FALSE(r.ok());
        CHECK(contains(r.status(), q + ".weight_scale': scale 1 is"));
        CHECK(contains(r.status(), "(must be in 0..2^64)"));

        // A finite BF16 weight of 2^80 would get a scale of 2^80 / 127 (or / 7, / 448): quantize
        // refuses before writing, where it used to write and then fail its load check.
        TempDir in("bighuge_in");
        for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
            fs::copy_file(kMicro + "/" + f, in.path + "/" + f);
        }
        rewrite(in.path, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>& keep) {
            TensorToWrite* t = find(ts, q + ".weight");
            REQUIRE(t->dtype == DType::kBF16);
            std::string bytes(t->bytes);
            const uint16_t big = 0x6780;  // BF16 2^80.
            std::memcpy(bytes.data(), &big, 2);
            keep.push_back(std::move(bytes));
            t->bytes = keep.back();
        });
        TempDir out("bighuge_out");
        for (const std::string policy : {"all-int8", "attention=int4-g32", "all-fp8"}) {
            CAPTURE(policy);
            Status st = quantize_checkpoint({in.path, policy, out.path + "/q"});
            CHECK(contains(st, "tensor '" + q + ".weight': quantized to"));
            CHECK(contains(st, "must be in 0..2^64"));
            CHECK(contains(st, in.path + "/model.safetensors"));
            CHECK_FALSE(fs::exists(out.path + "/q"));
            // Quantized on load, the same weights are refused too: they loaded, and the AVX2 FP8
            // kernel (which takes a block's scale times 2^56) computed inf where the scalar one
            // stayed finite.
            auto loaded = logits_of(in.path, policy);
            REQUIRE_FALSE(loaded.ok());
            CHECK(contains(loaded.status(), "tensor '" + q + ".weight': quantized to"));
            CHECK(contains(loaded.status(), "must be in 0..2^64"));
            CHECK(contains(loaded.status(), in.path + "/model.safetensors"));
        }
    }
    SUBCASE("INT4 group that does not divide the input width") {
        // micro's experts are 64 wide on down_proj's input: group 128 cannot apply.
        auto r = logits_of(kMicro, "experts-int4-g128");
        REQUIRE(!r.ok());
        CHECK(contains(r.status(), "down_proj"));
    }
}

}  // namespace
}  // namespace edge::engine

namespace edge::engine {
namespace {

int call(int (*fn)(int, char**), std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) {
        argv.push_back(a.data());
    }
    return fn(static_cast<int>(argv.size()), argv.data());
}

TEST_CASE("quantize and quant-eval command lines") {
    CHECK(call(quantize_main, {"edgeserve", "quantize"}) == 2);
    CHECK(call(quantize_main, {"edgeserve", "quantize", "--model", kMicro, "--bogus", "x"}) == 2);
    CHECK(call(quant_eval_main, {"edgeserve", "quant-eval", "--model", kMicro}) == 2);
    CHECK(call(quant_eval_main, {"edgeserve", "quant-eval", "--model", kMicro, "--policies",
                                 "all-int8", "--tokens", "many"}) == 2);
    // No eval.txt in micro and no --text: a failure, not a usage error.
    CHECK(call(quant_eval_main,
               {"edgeserve", "quant-eval", "--model", kMicro, "--policies", "all-int8"}) == 1);
    TempDir tmp("cli");
    CHECK(call(quantize_main, {"edgeserve", "quantize", "--model", kMicro, "--policy",
                               "experts-int4", "--out", tmp.path}) == 0);
    CHECK(fs::exists(tmp.path + "/model.safetensors"));
    // A second write to the same --out replaces the checkpoint only when asked to.
    CHECK(call(quantize_main, {"edgeserve", "quantize", "--model", kMicro, "--policy",
                               "all-int8", "--out", tmp.path}) == 1);
    CHECK(call(quantize_main, {"edgeserve", "quantize", "--model", kMicro, "--policy",
                               "experts-int4", "--out", tmp.path, "--force"}) == 0);
    // A policy that does not parse is a usage error, refused before the input is read.
    CHECK(call(quantize_main, {"edgeserve", "quantize", "--model", kMicro, "--policy", "int4",
                               "--out", tmp.path}) == 2);
    // A quantized checkpoint is not quantized again.
    TempDir tmp2("cli2");
    CHECK(call(quantize_main, {"edgeserve", "quantize", "--model", tmp.path, "--policy", "all-int8",
                               "--out", tmp2.path}) == 1);
    CHECK(call(quant_eval_main, {"edgeserve", "quant-eval", "--model", kMicro, "--policies",
                                 "all-int8", "--chunk", "12abc"}) == 2);
    // A policy that quantizes nothing would write a plain copy.
    TempDir tmp3("cli3");
    Status none = quantize_checkpoint({kMicro, "none", tmp3.path});
    CHECK(none.code() == StatusCode::kInvalidArgument);
    CHECK(none.message().find("quantizes nothing") != std::string::npos);
    CHECK(quantize_checkpoint({kMicro, "attention=bf16", tmp3.path}).code() ==
          StatusCode::kInvalidArgument);
    CHECK(call(quant_eval_main, {"edgeserve", "quant-eval", "--model", kMicro, "--policies",
                                 "all-int8", "--threads", "100000"}) == 2);
    // Help is not an error; an unknown flag at the end is named as such.
    CHECK(call(quantize_main, {"edgeserve", "quantize", "--help"}) == 0);
    CHECK(call(quant_eval_main, {"edgeserve", "quant-eval", "--model", kMicro, "-h"}) == 0);
    CHECK(call(quantize_main, {"edgeserve", "quantize", "--model", kMicro, "--bogus"}) == 2);
    // An empty item in --policies, or a second --policies, is a usage error, not skipped or
    // appended.
    CHECK(call(quant_eval_main, {"edgeserve", "quant-eval", "--model", kMicro, "--policies",
                                 "all-int8,,all-fp8"}) == 2);
    CHECK(call(quant_eval_main, {"edgeserve", "quant-eval", "--model", kMicro, "--policies",
                                 "all-int8,"}) == 2);
    CHECK(call(quant_eval_main, {"edgeserve", "quant-eval", "--model", kMicro, "--policies",
                                 "all-int8", "--policies", "all-fp8"}) == 2);
}

TEST_CASE("quant-eval: a policy that changes nothing is an error, the JSON line parses") {
    QuantEvalOptions o;
    o.model_dir = kMicro;
    for (int i = 0; i < 64; ++i) {
        o.token_ids.push_back(static_cast<TokenId>((i * 37 + 11) % 500));
    }
    o.chunk = 32;
    o.decode_steps = 0;
    o.per_class = false;
    o.policies = {"dense_mlp=int8"};  // Qwen3-MoE has no dense MLP.
    auto none = run_quant_eval(o);
    REQUIRE_FALSE(none.ok());
    CHECK(contains(none.status(), "policy 'dense_mlp=int8' changes no tensor"));
    // A label with a character JSON must escape, and per-class rows only where they change
    // something (dense_mlp and shared_expert are absent).
    o.policies = {"experts-int4,\tattention=int8"};
    o.per_class = true;
    auto rows = run_quant_eval(o);
    REQUIRE_MESSAGE(rows.ok(), rows.status().to_string());
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(quant_eval_json(*rows), ec);
    REQUIRE_MESSAGE(!ec, quant_eval_json(*rows));
    const boost::json::array& out = v.at("rows").as_array();
    REQUIRE(out.size() == rows->size());
    CHECK(out[1].at("label") == "experts-int4,\tattention=int8");
    CHECK(out[1].at("positions") == 64);
    CHECK(out[1].at("scored_tokens") == 62);  // Two chunks of 32: 31 next tokens each.
    for (const QuantEvalRow& r : *rows) {
        CHECK(r.label.find("dense_mlp") == std::string::npos);
        CHECK(r.label.find("shared_expert") == std::string::npos);
    }
}

// quant-eval of `o`'s text scores the same as of the first `n` ids of `all` (what the whole text
// tokenizes to): the text was read as far as its tokens needed. Returns the text's rows.
std::vector<QuantEvalRow> check_text_reads_as_ids(QuantEvalOptions o,
                                                  const std::vector<TokenId>& all, size_t n) {
    auto from_text = run_quant_eval(o);
    REQUIRE_MESSAGE(from_text.ok(), from_text.status().to_string());
    o.token_ids.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
    auto from_ids = run_quant_eval(o);
    REQUIRE(from_ids.ok());
    CHECK((*from_text)[0].positions == static_cast<int64_t>(n));
    CHECK((*from_text)[1].mean_kl == (*from_ids)[1].mean_kl);
    CHECK((*from_text)[1].perplexity == (*from_ids)[1].perplexity);
    return *from_text;
}

TEST_CASE("quant-eval: the text's first tokens, the baseline's label, a tokenizer too large") {
    // A text far longer than the tokens scored gives the ids of tokenizing it whole.
    TempDir dir("text");
    std::string text;
    for (int i = 0; text.size() < (4 << 20); ++i) {
        text += "line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog\n";
    }
    write_text(dir.path + "/long.txt", text);
    auto tok = tokenizer::Tokenizer::load_file(kMicro + "/tokenizer.json");
    REQUIRE(tok.ok());
    auto all = (*tok)->encode(text, false);
    REQUIRE(all.ok());
    QuantEvalOptions o;
    o.model_dir = kMicro;
    o.text_path = dir.path + "/long.txt";
    o.tokens = 300;
    o.chunk = 100;
    o.decode_steps = 0;
    o.per_class = false;
    o.policies = {"all-int8"};
    const auto from_text = check_text_reads_as_ids(o, *all, 300);
    CHECK(from_text[0].label == "bf16");

    // A FIFO or a device is refused before it is opened (one would block, the other never end),
    // and a huge --tokens on a short text reads the text, not tokens x 8 bytes.
    REQUIRE(mkfifo((dir.path + "/fifo").c_str(), 0600) == 0);
    for (const std::string& odd : {dir.path + "/fifo", std::string("/dev/zero")}) {
        o.text_path = odd;
        auto refused = run_quant_eval(o);
        REQUIRE_FALSE(refused.ok());
        CHECK(contains(refused.status(), "not a regular file"));
    }
    write_text(dir.path + "/short.txt", "a short text\n");
    o.text_path = dir.path + "/short.txt";
    o.tokens = int64_t{1} << 30;
    auto short_text = run_quant_eval(o);
    REQUIRE_MESSAGE(short_text.ok(), short_text.status().to_string());
    CHECK((*short_text)[0].positions < 20);
    o.text_path = dir.path + "/long.txt";
    o.tokens = 300;

    // A checkpoint that stores quantized tensors is compared against itself as stored.
    TempDir q("stored");
    REQUIRE(quantize_checkpoint({kMicro, "experts-int4", q.path, true}).ok());
    o.model_dir = q.path;
    auto stored = run_quant_eval(o);
    REQUIRE_MESSAGE(stored.ok(), stored.status().to_string());
    CHECK((*stored)[0].label == "as-stored");

    // A tokenizer with more tokens than the model: the engine's load error, not a token id.
    TempDir big("bigtok");
    for (const char* f : {"config.json", "model.safetensors"}) {
        fs::copy_file(kMicro + "/" + f, big.path + "/" + f);
    }
    auto tj = boost::json::parse(read_text(kMicro + "/tokenizer.json")).as_object();
    tj["added_tokens"].as_array().push_back(
        boost::json::object{{"id", 520}, {"content", "<|extra|>"}, {"single_word", false},
                            {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                            {"special", true}});
    write_text(big.path + "/tokenizer.json", boost::json::serialize(tj));
    o.model_dir = big.path;
    o.token_ids.clear();
    auto mismatch = run_quant_eval(o);
    REQUIRE_FALSE(mismatch.ok());
    CHECK(contains(mismatch.status(), "tokenizer.json has 521 tokens but the model's vocab_size "
                                      "is 512"));
}

TEST_CASE("quant-eval: a text is read only as far as its tokens need, whatever its size says") {
    QuantEvalOptions o;
    o.model_dir = kMicro;
    o.tokens = 8;
    o.chunk = 8;
    o.decode_steps = 0;
    o.per_class = false;
    o.policies = {"all-int8"};
    // procfs files say they hold 0 bytes: reads capped at that size never reached the end.
    for (const char* proc : {"/proc/self/status", "/proc/cpuinfo"}) {
        CAPTURE(proc);
        o.text_path = proc;
        auto rows = run_quant_eval(o);
        REQUIRE_MESSAGE(rows.ok(), rows.status().to_string());
        CHECK((*rows)[0].positions == 8);
    }

    // One line, no newline anywhere: cut at whitespace, not read to its end. The byte 0xFF far
    // past the tokens needed (not UTF-8) is never reached, so never refused.
    TempDir dir("oneline");
    std::string line;
    for (int i = 0; line.size() < (1 << 20); ++i) {
        line += "word" + std::to_string(i) + " the quick brown fox jumps over the lazy dog. ";
    }
    write_text(dir.path + "/oneline.txt", line + "\xff");
    auto tok = tokenizer::Tokenizer::load_file(kMicro + "/tokenizer.json");
    REQUIRE(tok.ok());
    auto all = (*tok)->encode(line, false);
    REQUIRE(all.ok());
    o.text_path = dir.path + "/oneline.txt";
    o.tokens = 300;
    o.chunk = 100;
    check_text_reads_as_ids(o, *all, 300);

    // Neither whitespace nor ASCII: cut before a character, never inside one (a cut inside
    // would be invalid UTF-8).
    std::string wide;
    while (wide.size() < (1 << 20)) {
        wide += "\xc3\xa9\xe2\x82\xac\xf0\x9f\x99\x82";  // e-acute, euro sign, a smiley.
    }
    write_text(dir.path + "/wide.txt", wide + "\xff");
    o.text_path = dir.path + "/wide.txt";
    auto from_wide = run_quant_eval(o);
    REQUIRE_MESSAGE(from_wide.ok(), from_wide.status().to_string());
    CHECK((*from_wide)[0].positions == 300);
}

TEST_CASE("quantize takes a model of fewer than 16 positions (its load check stays inside them)") {
    TempDir in("fewpositions");
    TempDir out("fewpositions_out");
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
        fs::copy_file(kMicro + "/" + f, in.path + "/" + f);
    }
    std::string cfg = read_text(in.path + "/config.json");
    const auto at = cfg.find("\"max_position_embeddings\"");
    REQUIRE(at != std::string::npos);
    const auto value = cfg.find_first_of("0123456789", at);
    cfg.replace(value, cfg.find_first_not_of("0123456789", value) - value, "8");
    write_text(in.path + "/config.json", cfg);
    Status st = quantize_checkpoint({in.path, "experts-int4", out.path + "/q"});
    CHECK_MESSAGE(st.ok(), st.to_string());
}

TEST_CASE("quantize refuses to write over its input or beside another checkpoint's shards") {
    // Into the input directory: the writer would truncate the very file it copies tensors from.
    TempDir in("inplace");
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
        fs::copy_file(kMicro + "/" + f, in.path + "/" + f);
    }
    const auto size = fs::file_size(in.path + "/model.safetensors");
    for (const std::string& out :
         {in.path, in.path + "/.", in.path + "/../" + fs::path(in.path).filename().string()}) {
        CAPTURE(out);
        Status st = quantize_checkpoint({in.path, "experts-int4", out});
        REQUIRE_FALSE(st.ok());
        CHECK(contains(st, "is the input checkpoint"));
    }
    CHECK(fs::file_size(in.path + "/model.safetensors") == size);
    CHECK(logits_of(in.path, "none").ok());

    // Beside a sharded checkpoint, whose index the loader would read instead.
    TempDir out("stale");
    write_text(out.path + "/model.safetensors.index.json", "{}");
    Status st = quantize_checkpoint({kMicro, "experts-int4", out.path});
    REQUIRE_FALSE(st.ok());
    CHECK(contains(st, "model.safetensors.index.json"));
    fs::remove(out.path + "/model.safetensors.index.json");
    write_text(out.path + "/model-00001-of-00002.safetensors", "x");
    CHECK(contains(quantize_checkpoint({kMicro, "experts-int4", out.path}),
                   "model-00001-of-00002.safetensors"));
    fs::remove(out.path + "/model-00001-of-00002.safetensors");
    // An earlier checkpoint is replaced only when asked to, and no partial file is left.
    REQUIRE(quantize_checkpoint({kMicro, "experts-int4", out.path}).ok());
    CHECK(contains(quantize_checkpoint({kMicro, "all-int8", out.path}),
                   "(a checkpoint, or an interrupted write of one)"));
    REQUIRE(quantize_checkpoint({kMicro, "all-int8", out.path, true}).ok());
    CHECK_FALSE(fs::exists(out.path + "/model.safetensors.partial"));
    CHECK(logits_of(out.path, "none").ok());

    // Another run writing into the same directory (holding its lock): refused, its files left.
    {
        auto other = CheckpointDirLock::acquire(out.path);
        REQUIRE(other.ok());
        Status busy = quantize_checkpoint({kMicro, "all-int8", out.path, true});
        CHECK(busy.code() == StatusCode::kFailedPrecondition);
        CHECK(contains(busy, "another quantize (or make-model) is writing " + out.path));
        CHECK(logits_of(out.path, "none").ok());
    }
    REQUIRE(quantize_checkpoint({kMicro, "all-int8", out.path, true}).ok());
    CHECK_FALSE(fs::exists(out.path + "/" + CheckpointDirLock::kFileName));

    // A policy that would quantize nothing here (Qwen3-MoE has no dense MLP) is an error, and a
    // refused run makes no output directory.
    const std::string never = out.path + "/never";
    CHECK(contains(quantize_checkpoint({kMicro, "dense_mlp=int8", never}),
                   "policy 'dense_mlp=int8' quantizes no tensor"));
    CHECK_FALSE(fs::exists(never));
}

TEST_CASE("quantize --shard-size takes Hugging Face's sizes, --threads a count") {
    CHECK(*parse_byte_size("5GB") == 5'000'000'000);
    CHECK(*parse_byte_size("500mb") == 500'000'000);
    CHECK(*parse_byte_size("2GiB") == int64_t{2} << 30);
    CHECK(*parse_byte_size("64KiB") == 65536);
    CHECK(*parse_byte_size("1048576") == 1048576);
    CHECK(*parse_byte_size("10B") == 10);
    for (const char* bad : {"", "GB", "0", "0GB", "-5GB", "5 GB", "5TB", "1.5GB",
                            "99999999999999999999", "2000000GiB"}) {
        CAPTURE(bad);
        auto r = parse_byte_size(bad);
        REQUIRE_FALSE(r.ok());
        CHECK(contains(r.status(), "is not a positive byte count"));
    }
    TempDir tmp("cli_shards");
    CHECK(call(quantize_main, {"edgeserve", "quantize", "--model", kMicro, "--policy",
                               "experts-int4", "--out", tmp.path, "--shard-size", "5XB"}) == 2);
    CHECK_FALSE(fs::exists(tmp.path + "/config.json"));
    // 0 is one per core (as for generate and quant-eval): edgeserve_cli_test.cc runs it.
    for (const char* threads : {"-1", "x", "2x", "1025"}) {
        CAPTURE(threads);
        CHECK(call(quantize_main, {"edgeserve", "quantize", "--model", kMicro, "--policy",
                                   "experts-int4", "--out", tmp.path, "--threads", threads}) == 2);
    }
    CHECK(call(quantize_main, {"edgeserve", "quantize", "--model", kMicro, "--policy",
                               "experts-int4", "--out", tmp.path, "--shard-size", "200KB",
                               "--threads", "3"}) == 0);
    CHECK(fs::exists(tmp.path + "/model.safetensors.index.json"));
    CHECK(logits_of(tmp.path, "none").ok());
}

TEST_CASE("stored scales in BF16 or F16 (Qwen3's FP8 checkpoints) load as the values they hold") {
    // DeepSeek-V3's FP8 block scales are F32; Qwen3's FP8 checkpoints store them as BF16 (some
    // as F16), and were refused. Each narrow dtype loads to the logits of F32 scales holding the
    // same values; INT8 row scales likewise.
    for (const auto& [policy, suffix] :
         {std::pair<std::string, std::string>{"all-fp8", ".weight_scale_inv"},
          {"all-int8", ".weight_scale"}}) {
        for (const DType narrow : {DType::kBF16, DType::kF16}) {
            CAPTURE(policy);
            CAPTURE(dtype_name(narrow));
            TempDir wide("scale32");
            TempDir half("scale16");
            REQUIRE(quantize_checkpoint({kMicro, policy, wide.path}).ok());
            REQUIRE(quantize_checkpoint({kMicro, policy, half.path}).ok());
            std::deque<std::string> bytes;  // Stable: the written tensors point into it.
            size_t rewritten = 0;
            auto narrow_scales = [&](const std::string& dir, bool as_f32) {
                rewrite(dir, [&](std::vector<TensorToWrite>& ts, std::vector<std::string>&) {
                    for (TensorToWrite& t : ts) {
                        if (!t.name.ends_with(suffix)) {
                            continue;
                        }
                        REQUIRE(t.dtype == DType::kF32);
                        const size_t n = t.bytes.size() / 4;
                        std::string f32(n * 4, '\0');
                        std::string f16(n * 2, '\0');
                        for (size_t i = 0; i < n; ++i) {
                            float v;
                            std::memcpy(&v, t.bytes.data() + 4 * i, 4);
                            uint16_t h;
                            float back;
                            if (narrow == DType::kBF16) {
                                h = static_cast<uint16_t>(std::bit_cast<uint32_t>(v) >> 16);
                                back = std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
                            } else {
                                const auto x = static_cast<_Float16>(v);
                                std::memcpy(&h, &x, 2);
                                back = static_cast<float>(x);
                            }
                            std::memcpy(f32.data() + 4 * i, &back, 4);
                            std::memcpy(f16.data() + 2 * i, &h, 2);
                        }
                        bytes.push_back(as_f32 ? std::move(f32) : std::move(f16));
                        t.bytes = bytes.back();
                        t.dtype = as_f32 ? DType::kF32 : narrow;
                        ++rewritten;
                    }
                });
            };
            narrow_scales(wide.path, true);
            narrow_scales(half.path, false);
            CHECK(rewritten > 2);
            auto a = logits_of(wide.path, "none");
            auto b = logits_of(half.path, "none");
            REQUIRE(a.ok());
            REQUIRE_MESSAGE(b.ok(), b.status().message());
            CHECK(*a == *b);
        }
    }
}

}  // namespace
}  // namespace edge::engine
