// Qwen3-MoE against the fixtures' reference outputs (llama.cpp, F32, cross-checked in float64):
// greedy tokens exact, logits within 1e-4, one prompt at a time and all prompts in one batch.

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "engine/model/loader.h"
#include "engine/tools/make_model.h"
#include "tests/testing/test_certs.h"
#include "tests/engine/archs/reference_check.h"

namespace edge::engine {
namespace {

std::unique_ptr<CausalLM> load(const std::string& name, int threads) {
    LoadOptions options;
    options.threads = threads;
    options.max_slots = 4;
    options.max_context = 512;
    auto model = load_model(std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/" + name, options);
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    return std::move(model).value();
}

void check_fixture(const std::string& name, int threads) {
    auto prompts = testing::read_reference(std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/" + name);
    auto model = load(name, threads);
    SUBCASE("one prompt at a time") {
        testing::check_runs(prompts, testing::run_greedy(*model, prompts, false));
    }
    SUBCASE("all prompts batched") {
        testing::check_runs(prompts, testing::run_greedy(*model, prompts, true));
    }
    SUBCASE("teacher-forced batch") { testing::check_teacher_forced(*model, prompts); }
}

TEST_CASE("micro-qwen3-moe matches the reference / 1 thread") { check_fixture("micro-qwen3-moe", 1); }
TEST_CASE("micro-qwen3-moe matches the reference / 2 threads") {
    check_fixture("micro-qwen3-moe", 2);
}
TEST_CASE("fortunes-qwen3-moe matches the reference") { check_fixture("fortunes-qwen3-moe", 2); }

TEST_CASE("spec reports the checkpoint") {
    auto model = load("micro-qwen3-moe", 1);
    const ModelSpec& s = model->spec();
    CHECK(s.architecture == "Qwen3MoeForCausalLM");
    CHECK(s.vocab_size == 512);
    CHECK(s.max_context == 512);
    CHECK(s.eos_token_ids == std::vector<TokenId>{509});
    CHECK(s.bos_token_id == 509);
    CHECK(s.version.size() == 64);
    CHECK(s.weight_bytes == 625408 * 2);
    CHECK(s.kv_bytes_per_token == 2 * 2 * 2 * 32 * 4);
    auto again = load("micro-qwen3-moe", 2);
    CHECK(again->spec().version == s.version);
    auto other = load("fortunes-qwen3-moe", 1);
    CHECK(other->spec().version != s.version);
}

TEST_CASE("layers_run counts each decoder layer of every step, for every architecture") {
    // The watchdog's sign that a long step is moving (daemon/liveness.h).
    for (const auto& [name, layers] : std::map<std::string, int64_t>{
             {"micro-qwen3-moe", 2}, {"micro-glm4-moe", 3}, {"micro-deepseek-v3", 3}}) {
        CAPTURE(name);
        auto model = load(name, 1);
        CHECK(model->layers_run() == 0);
        auto slot = model->acquire_slot();
        REQUIRE(slot.ok());
        const std::vector<TokenId> prompt{1, 2, 3, 4};
        SequenceChunk ch{*slot, 0, prompt, false};
        std::vector<float> logits;
        REQUIRE(model->forward({&ch, 1}, &logits).ok());
        CHECK(model->layers_run() == layers);
        const std::vector<TokenId> next{5};
        ch = SequenceChunk{*slot, 4, next, false};
        REQUIRE(model->forward({&ch, 1}, &logits).ok());
        CHECK(model->layers_run() == 2 * layers);
    }
}

TEST_CASE("the version follows the weights: another seed differs, a copy elsewhere does not") {
    edge::testing::TempDir tmp;
    auto version_of = [](const std::string& dir) {
        LoadOptions options;
        options.max_slots = 1;
        auto model = load_model(dir, options);
        REQUIRE_MESSAGE(model.ok(), model.status().to_string());
        return (*model)->spec().version;
    };
    for (uint64_t seed : {1, 2}) {
        MakeModelOptions mo;
        mo.out_dir = tmp.file("seed" + std::to_string(seed));
        mo.seed = seed;
        REQUIRE(write_random_checkpoint(mo).ok());
    }
    std::filesystem::copy(tmp.file("seed1"), tmp.file("copy"));
    const std::string one = version_of(tmp.file("seed1"));
    CHECK(version_of(tmp.file("copy")) == one);
    // Same config, same tensor names and shapes, other weights (as a fine-tune has).
    CHECK(version_of(tmp.file("seed2")) != one);
}

}  // namespace
}  // namespace edge::engine
