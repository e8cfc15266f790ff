// GLM-4.5 MoE against micro-glm4-moe's reference outputs (llama.cpp F32, cross-checked in
// float64): greedy tokens exact, logits within 1e-4, single and batched, teacher-forced; the
// sigmoid group router on hand-computed cases; KV bytes per token; config errors.

#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/cpu/router.h"
#include "engine/model/loader.h"
#include "reference_check.h"

namespace edge::engine {
namespace {

using testing::fixture_dir;

std::unique_ptr<CausalLM> load_fixture(const std::string& name, int threads) {
    LoadOptions options;
    options.threads = threads;
    options.max_slots = 4;
    options.max_context = 512;
    auto model = load_model(fixture_dir(name), options);
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    return std::move(model).value();
}

void check_fixture(const std::string& name, int threads) {
    auto prompts = testing::read_reference(fixture_dir(name));
    auto model = load_fixture(name, threads);
    SUBCASE("one prompt at a time") {
        testing::check_runs(prompts, testing::run_greedy(*model, prompts, false));
    }
    SUBCASE("all prompts batched") {
        testing::check_runs(prompts, testing::run_greedy(*model, prompts, true));
    }
    SUBCASE("teacher-forced batch") { testing::check_teacher_forced(*model, prompts); }
}

TEST_CASE("glm4_moe: micro-glm4-moe matches the reference on 1 thread") {
    check_fixture("micro-glm4-moe", 1);
}

TEST_CASE("glm4_moe: micro-glm4-moe matches the reference on 2 threads") {
    check_fixture("micro-glm4-moe", 2);
}

TEST_CASE("glm4_moe: spec and KV bytes per token") {
    auto model = load_fixture("micro-glm4-moe", 1);
    CHECK(model->spec().architecture == "Glm4MoeForCausalLM");
    // 3 layers x (K + V) x 2 KV heads x 32 dims x 4 bytes.
    CHECK(model->spec().kv_bytes_per_token == 3 * 2 * 2 * 32 * 4);
    CHECK(model->spec().vocab_size == 512);
}

TEST_CASE("glm4_moe: sigmoid group-limited router") {
    // 8 experts in 2 groups of 4; logits chosen so the biased and unbiased orders differ.
    const float logits[8] = {2.0f, -1.0f, 0.5f, 0.0f, 3.0f, -2.0f, -3.0f, -2.5f};
    const float bias[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    auto sig = [](float v) { return 1.0f / (1.0f + std::exp(-v)); };
    cpu::GroupRouterConfig c;
    c.experts = 8;
    c.top_k = 2;
    c.n_group = 2;
    c.topk_group = 1;
    c.norm_topk_prob = true;
    c.scaling_factor = 2.5f;
    int32_t idx[2];
    float w[2];
    float scratch[18];
    SUBCASE("group 0 wins on the sum of its two best") {
        // Group 0: s(2) + s(0.5) = 0.881 + 0.622; group 1: s(3) + s(-2) = 0.953 + 0.119.
        cpu::route_sigmoid_grouped(logits, bias, c, idx, w, scratch);
        CHECK(idx[0] == 0);
        CHECK(idx[1] == 2);
        const float sum = sig(2.0f) + sig(0.5f);
        CHECK(w[0] == doctest::Approx(2.5f * sig(2.0f) / sum));
        CHECK(w[1] == doctest::Approx(2.5f * sig(0.5f) / sum));
    }
    SUBCASE("bias picks, unbiased score weighs") {
        const float b2[8] = {0.0f, 0.0f, 0.0f, 0.9f, 0.0f, 0.0f, 0.0f, 0.0f};
        cpu::route_sigmoid_grouped(logits, b2, c, idx, w, scratch);
        CHECK(idx[0] == 3);  // s(0) + 0.9 = 1.4 beats s(2) = 0.88.
        CHECK(idx[1] == 0);
        const float sum = sig(0.0f) + sig(2.0f);
        CHECK(w[0] == doctest::Approx(2.5f * sig(0.0f) / sum));
    }
    SUBCASE("no group limit when every group is kept") {
        c.topk_group = 2;
        cpu::route_sigmoid_grouped(logits, bias, c, idx, w, scratch);
        CHECK(idx[0] == 4);
        CHECK(idx[1] == 0);
    }
    SUBCASE("without renormalisation the weights are the scaled sigmoids") {
        c.norm_topk_prob = false;
        c.scaling_factor = 1.0f;
        cpu::route_sigmoid_grouped(logits, bias, c, idx, w, scratch);
        CHECK(w[0] == doctest::Approx(sig(2.0f)));
    }
}

TEST_CASE("glm4_moe: bad config fields are named") {
    const std::string src = fixture_dir("micro-glm4-moe");
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("glm4_bad_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(src + "/model.safetensors", dir / "model.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
    std::ifstream in(src + "/config.json");
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string config = ss.str();
    auto write_with = [&](const std::string& from, const std::string& to) {
        std::string c = config;
        const size_t at = c.find(from);
        REQUIRE(at != std::string::npos);
        c.replace(at, from.size(), to);
        std::ofstream(dir / "config.json") << c;
    };
    LoadOptions options;
    options.threads = 1;
    options.max_context = 64;
    write_with("\"n_group\": 2", "\"n_group\": 3");
    auto r = load_model(dir.string(), options);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().to_string().find("n_group") != std::string::npos);
    write_with("\"partial_rotary_factor\": 0.5", "\"partial_rotary_factor\": 1.5");
    r = load_model(dir.string(), options);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().to_string().find("partial_rotary_factor") != std::string::npos);
    std::filesystem::remove(dir / "model.safetensors");
    write_with("\"n_group\": 2", "\"n_group\": 2");
    r = load_model(dir.string(), options);
    CHECK_FALSE(r.ok());
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace edge::engine
