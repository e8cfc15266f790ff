// Serving on the device (engine/cuda/device_causal_lm.h) on the fixture checkpoint: the device
// CausalLM against the CPU model through the scheduler's calls (prefill chunks longer than a
// step's rows, a batch of several slots in one bucket with padding, decode, the prefix cache with
// a copy-on-write block), the same greedy tokens through the engine API with engine.backend
// "cuda" as with "cpu" while several requests share steps, sampling with logprobs on the device
// path, for Qwen3-MoE, GLM-4.5 and DeepSeek-V3 (MLA attention over the paged latent pool).

#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/device_causal_lm.h"
#include "engine/engine.h"
#include "engine/model/loader.h"
#include "tests/engine/serve/collecting_sink.h"
#include "tests/gpu/host/serving_script.h"

namespace edge::engine::cuda {
namespace {

const std::string kMicro = EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe";
const std::string kMla = EDGE_SOURCE_DIR "/tests/fixtures/micro-deepseek-v3";

TEST_CASE("device CausalLM: prefill, mixed batches, decode and the prefix cache equal the CPU") {
    auto cpu = load_model(testing::kMicroQwen3, testing::serving_script_options("cpu"));
    REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
    auto dev = load_device_causal_lm(testing::kMicroQwen3, testing::serving_script_options("cuda"));
    REQUIRE_MESSAGE(dev.ok(), dev.status().to_string());
    // f32 activations over the same BF16 weights on both sides; only summation orders differ.
    testing::run_serving_script(**cpu, **dev, 2e-3);
    CHECK(cuda_device_health().ok());
}

TEST_CASE("device CausalLM (GLM-4.5): dense layer, shared expert, sigmoid routing, biases") {
    auto cpu = load_model(testing::kMicroGlm4, testing::serving_script_options("cpu"));
    REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
    auto dev = load_device_causal_lm(testing::kMicroGlm4, testing::serving_script_options("cuda"));
    REQUIRE_MESSAGE(dev.ok(), dev.status().to_string());
    testing::run_serving_script(**cpu, **dev, 2e-3);
    CHECK(cuda_device_health().ok());
}

TEST_CASE("device CausalLM (DeepSeek-V3): MLA over the paged latent pool, prefix copy-on-write") {
    auto cpu = load_model(kMla, testing::serving_script_options("cpu"));
    REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
    auto dev = load_device_causal_lm(kMla, testing::serving_script_options("cuda"));
    REQUIRE_MESSAGE(dev.ok(), dev.status().to_string());
    // As GLM-4.5's; the latent attention's f32 sums are bounded in mla_kernels_test.cc.
    testing::run_serving_script(**cpu, **dev, 2e-3);
    CHECK(cuda_device_health().ok());
}

GenerateRequest request(std::vector<TokenId> prompt, int max_tokens) {
    GenerateRequest r;
    r.model = "micro";
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    return r;
}

struct LogCapture {
    LogCapture() {
        log::set_sink([this](std::string_view line) {
            std::lock_guard<std::mutex> lock(mu);
            lines += std::string(line) + "\n";
        });
    }
    ~LogCapture() { log::set_sink(nullptr); }
    std::string text() {
        std::lock_guard<std::mutex> lock(mu);
        return lines;
    }
    std::mutex mu;
    std::string lines;
};

// Greedy ids of `prompts` submitted at once (they share engine steps), and a sampled request
// with logprobs; the engine log in `log`.
std::vector<std::vector<TokenId>> serve(const std::string& backend, const std::string& path,
                                        const std::vector<std::vector<TokenId>>& prompts,
                                        std::string* log) {
    LogCapture capture;
    EngineConfig config;
    config.threads = 2;
    config.backend = backend;
    config.max_batch_sequences = 4;
    config.kv_cache_bytes = 4 << 20;
    config.models.push_back(ModelConfig{"micro", path, "none", 256, "auto"});
    auto engine = create_engine(config);
    REQUIRE_MESSAGE(engine.ok(), engine.status().to_string());
    std::vector<std::shared_ptr<engine::testing::CollectingSink>> sinks;
    std::vector<std::shared_ptr<GenerationHandle>> handles;
    for (const auto& p : prompts) {
        sinks.push_back(std::make_shared<engine::testing::CollectingSink>());
        auto h = (*engine)->submit(request(p, 12), sinks.back());
        REQUIRE_MESSAGE(h.ok(), h.status().to_string());
        handles.push_back(*h);
    }
    GenerateRequest sampled = request(prompts[0], 6);
    sampled.sampling.temperature = 0.8f;
    sampled.sampling.seed = 3;
    sampled.sampling.logprobs = true;
    sampled.sampling.top_logprobs = 3;
    auto sampled_sink = std::make_shared<engine::testing::CollectingSink>();
    auto sh = (*engine)->submit(sampled, sampled_sink);
    REQUIRE(sh.ok());
    std::vector<std::vector<TokenId>> out;
    for (auto& s : sinks) {
        auto f = s->wait();
        REQUIRE(f.has_value());
        CHECK_MESSAGE(f->reason == FinishReason::kLength, f->error.to_string());
        out.push_back(s->ids());
    }
    auto f = sampled_sink->wait();
    REQUIRE(f.has_value());
    CHECK_MESSAGE(f->reason == FinishReason::kLength, f->error.to_string());
    const auto lp = sampled_sink->logprobs();
    REQUIRE(lp.size() == 6u);
    for (const TokenLogprob& l : lp) {
        CHECK(l.logprob <= 0.0f);
        CHECK(l.top.size() == 3u);
    }
    *log = capture.text();
    return out;
}

TEST_CASE("engine API with backend cuda: greedy tokens equal the CPU backend's, served on device") {
    const std::vector<std::vector<TokenId>> prompts = {
        {510, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114},
        {1, 2, 3},
        std::vector<TokenId>(40, 77),
    };
    std::string cpu_log, gpu_log;
    for (const std::string& path : {kMicro, testing::kMicroGlm4, kMla}) {
        CAPTURE(path);
        const auto want = serve("cpu", path, prompts, &cpu_log);
        const auto got = serve("cuda", path, prompts, &gpu_log);
        CHECK(gpu_log.find("engine.device_forward") != std::string::npos);
        CHECK(gpu_log.find("device_forward_fallback") == std::string::npos);
        for (size_t i = 0; i < prompts.size(); ++i) {
            CAPTURE(i);
            CHECK(want[i].size() == 12u);
            CHECK(got[i] == want[i]);
        }
    }
    CHECK(device_health().ok());
}

}  // namespace
}  // namespace edge::engine::cuda
