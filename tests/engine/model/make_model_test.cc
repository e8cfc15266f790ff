// make-model's tiny preset: a loadable checkpoint in Hugging Face layout, deterministic per seed.

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/model/loader.h"
#include "engine/tools/make_model.h"

namespace edge::engine {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

TEST_CASE("make-model tiny writes a loadable / deterministic checkpoint") {
    std::random_device rd;
    fs::path root = fs::temp_directory_path() / ("edge_make_model_" + std::to_string(rd()));
    MakeModelOptions o;
    o.preset = "tiny";
    o.seed = 42;
    o.out_dir = (root / "a").string();
    REQUIRE(write_random_checkpoint(o).ok());
    o.out_dir = (root / "b").string();
    REQUIRE(write_random_checkpoint(o).ok());
    o.seed = 43;
    o.out_dir = (root / "c").string();
    REQUIRE(write_random_checkpoint(o).ok());
    // A directory that already holds a checkpoint is replaced only with `overwrite` (--force).
    o.out_dir = (root / "b").string();
    Status again = write_random_checkpoint(o);
    CHECK(again.code() == StatusCode::kInvalidArgument);
    CHECK(again.message().find("(a checkpoint, or an interrupted write of one); pass --force") !=
          std::string::npos);
    o.overwrite = true;
    REQUIRE(write_random_checkpoint(o).ok());
    o.seed = 42;
    REQUIRE(write_random_checkpoint(o).ok());
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json",
                          "tokenizer_config.json", "generation_config.json"}) {
        CHECK(fs::exists(root / "a" / f));
    }
    CHECK(read(root / "a/model.safetensors") == read(root / "b/model.safetensors"));
    CHECK(read(root / "a/model.safetensors") != read(root / "c/model.safetensors"));
    CHECK(fs::file_size(root / "a/model.safetensors") < 2'000'000);

    auto tok = boost::json::parse(read(root / "a/tokenizer.json")).as_object();
    auto& vocab = tok.at("model").at("vocab").as_object();
    CHECK(vocab.at("\xc4\xa0").as_int64() == 32);  // "Ġ" is the space byte.
    CHECK(tok.at("added_tokens").as_array().size() == 3);
    CHECK(tok.at("added_tokens").as_array()[2].at("id").as_int64() == 511);
    auto cfg = boost::json::parse(read(root / "a/tokenizer_config.json")).as_object();
    CHECK(cfg.at("chat_template").as_string().find("<|im_start|>") != std::string::npos);

    LoadOptions lo;
    lo.threads = 2;
    lo.max_slots = 2;
    lo.max_context = 64;
    auto model = load_model((root / "a").string(), lo);
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    CHECK((*model)->spec().vocab_size == 512);
    int32_t slot = *(*model)->acquire_slot();
    std::vector<TokenId> prompt = {510, 1, 2, 3};
    SequenceChunk ch{slot, 0, prompt, true};
    std::vector<float> logits;
    REQUIRE((*model)->forward({&ch, 1}, &logits).ok());
    CHECK(logits.size() == 4 * 512);
    for (float v : logits) {
        REQUIRE(std::isfinite(v));
    }
    fs::remove_all(root);

    CHECK_FALSE(write_random_checkpoint({"huge", "/tmp/x", 1}).ok());
    const char* argv_bad[] = {"make-model", "--preset"};
    CHECK(make_model_main(2, const_cast<char**>(argv_bad)) == 2);
}

TEST_CASE("make-model --arch glm4_moe / deepseek_v3 tiny: loadable with the architecture's config") {
    std::random_device rd;
    fs::path root = fs::temp_directory_path() / ("edge_make_arch_" + std::to_string(rd()));
    struct Case {
        const char* arch;
        const char* architecture;
        int64_t kv_bytes_per_token;  // From the config: what the arch's KV cache holds per token.
    };
    // GLM: 3 layers x 2 (K, V) x 2 kv heads x 32 dims x 4 bytes (F32 cache);
    // DeepSeek-V3 (MLA): 3 layers x (kv_lora_rank 32 + qk_rope 16) x 4 bytes.
    for (const Case& c : {Case{"glm4_moe", "Glm4MoeForCausalLM", 3 * 2 * 2 * 32 * 4},
                          Case{"deepseek_v3", "DeepseekV3ForCausalLM", 3 * (32 + 16) * 4}}) {
        CAPTURE(c.arch);
        MakeModelOptions o;
        o.arch = c.arch;
        o.preset = "tiny";
        o.out_dir = (root / c.arch).string();
        REQUIRE(write_random_checkpoint(o).ok());
        auto cfg = boost::json::parse(read(root / c.arch / "config.json")).as_object();
        CHECK(cfg.at("architectures").as_array()[0] == c.architecture);
        LoadOptions lo;
        lo.threads = 2;
        lo.max_slots = 1;
        lo.max_context = 32;
        auto model = load_model(o.out_dir, lo);
        REQUIRE_MESSAGE(model.ok(), model.status().to_string());
        CHECK((*model)->spec().architecture == c.architecture);
        CHECK((*model)->spec().kv_bytes_per_token == c.kv_bytes_per_token);
        int32_t slot = *(*model)->acquire_slot();
        std::vector<TokenId> prompt = {510, 1, 2, 3};
        SequenceChunk ch{slot, 0, prompt, false};
        std::vector<float> logits;
        REQUIRE((*model)->forward({&ch, 1}, &logits).ok());
        REQUIRE(logits.size() == 512);
        for (float v : logits) {
            REQUIRE(std::isfinite(v));
        }
    }
    MakeModelOptions bad;
    bad.arch = "llama";
    bad.out_dir = (root / "x").string();
    Status st = write_random_checkpoint(bad);
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(st.to_string().find("llama") != std::string::npos);
    fs::remove_all(root);
}

}  // namespace
}  // namespace edge::engine
