// Serving on the device (engine/cuda/device_causal_lm.h) on the fixture checkpoint: the device
// CausalLM against the CPU model through the scheduler's calls (prefill chunks longer than a
// step's rows, a batch of several slots in one bucket with padding, decode, the prefix cache with
// a copy-on-write block), the same greedy tokens through the engine API with engine.backend
// "cuda" as with "cpu" while several requests share steps, sampling with logprobs on the device
// path, and the logged fall back for an architecture the device forward does not run.

#include <doctest/doctest.h>

#include <algorithm>
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
#include "tests/gpu/testing_gpu.h"

namespace edge::engine::cuda {
namespace {

const std::string kMicro = EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe";
const std::string kGlm = EDGE_SOURCE_DIR "/tests/fixtures/micro-glm4-moe";

LoadOptions micro_options(const std::string& backend) {
    LoadOptions lo;
    lo.threads = 2;
    lo.backend = backend;
    lo.max_slots = 4;  // max_rows 64: a 70-token chunk runs as two device steps.
    lo.max_context = 256;
    lo.kv_cache_bytes = 4 << 20;
    return lo;
}

TokenId argmax(const std::vector<float>& logits, size_t row, int32_t vocab) {
    const auto begin = logits.begin() + static_cast<int64_t>(row) * vocab;
    return static_cast<TokenId>(std::max_element(begin, begin + vocab) - begin);
}

// Runs the same batch on both models; checks the logits agree and returns the CPU's.
std::vector<float> forward_both(CausalLM& cpu, CausalLM& dev,
                                const std::vector<SequenceChunk>& batch, const char* what) {
    std::vector<float> want, got;
    Status c = cpu.forward(batch, &want);
    REQUIRE_MESSAGE(c.ok(), c.to_string());
    Status d = dev.forward(batch, &got);
    REQUIRE_MESSAGE(d.ok(), d.to_string());
    // f32 activations over the same BF16 weights on both sides; only summation orders differ.
    edge::testing::check_close(got, want, 2e-3, 2e-3, what);
    const int32_t V = cpu.spec().vocab_size;
    for (size_t r = 0; r < want.size() / static_cast<size_t>(V); ++r) {
        CAPTURE(r);
        CHECK(argmax(got, r, V) == argmax(want, r, V));
    }
    for (const SequenceChunk& ch : batch) {
        CHECK(dev.slot_length(ch.slot) == cpu.slot_length(ch.slot));
    }
    return want;
}

TEST_CASE("device CausalLM: prefill, mixed batches, decode and the prefix cache equal the CPU") {
    auto cpu_model = load_model(kMicro, micro_options("cpu"));
    REQUIRE_MESSAGE(cpu_model.ok(), cpu_model.status().to_string());
    auto dev_model = load_device_causal_lm(kMicro, micro_options("cuda"));
    REQUIRE_MESSAGE(dev_model.ok(), dev_model.status().to_string());
    CausalLM& cpu = **cpu_model;
    CausalLM& dev = **dev_model;
    CHECK(dev.spec().version == cpu.spec().version);
    CHECK(dev.kv_block_tokens() == cpu.kv_block_tokens());
    const int32_t V = cpu.spec().vocab_size;

    const int32_t a = *cpu.acquire_slot(), b = *cpu.acquire_slot();
    REQUIRE(*dev.acquire_slot() == a);
    REQUIRE(*dev.acquire_slot() == b);
    std::vector<TokenId> pa = {510, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114};
    std::vector<TokenId> pb(70);
    for (size_t i = 0; i < pb.size(); ++i) {
        pb[i] = static_cast<TokenId>((i * 37 + 11) % 500);
    }
    // Both prompts in one forward: 81 rows, two steps; b wants every row's logits.
    std::vector<float> logits = forward_both(
        cpu, dev, {{a, 0, pa, false}, {b, 0, pb, true}}, "prefill of two prompts");
    REQUIRE(logits.size() == static_cast<size_t>(71 * V));
    std::vector<TokenId> ta = {argmax(logits, 0, V)}, tb = {argmax(logits, 70, V)};
    std::vector<TokenId> gen_a;
    // Decode both for 10 steps (2 rows in the bucket of 2), then a alone (bucket 1).
    for (int step = 0; step < 14; ++step) {
        CAPTURE(step);
        std::vector<SequenceChunk> batch = {{a, cpu.slot_length(a), ta, false}};
        if (step < 10) {
            batch.push_back({b, cpu.slot_length(b), tb, false});
        }
        logits = forward_both(cpu, dev, batch, "decode");
        gen_a.push_back(ta[0]);
        ta = {argmax(logits, 0, V)};
        if (step < 10) {
            tb = {argmax(logits, 1, V)};
        }
    }
    // The prefix cache: a's first block is published and attached to a new slot c, which is cut
    // back into that block (now shared) and continues there: the host cache copies the block on
    // write and the device must copy it too, leaving a's copy intact.
    BlockHash h{};
    h[0] = 42;
    const std::vector<BlockHash> chain = {h};
    cpu.publish_prefix(a, chain);
    dev.publish_prefix(a, chain);
    const int32_t c = *cpu.acquire_slot();
    REQUIRE(*dev.acquire_slot() == c);
    REQUIRE(cpu.attach_prefix(c, chain) == 16);
    REQUIRE(dev.attach_prefix(c, chain) == 16);
    cpu.truncate_slot(c, 10);
    dev.truncate_slot(c, 10);
    const std::vector<TokenId> tc = {7, 8, 9};
    forward_both(cpu, dev, {{c, 10, tc, true}, {a, cpu.slot_length(a), ta, false}},
                 "copy-on-write continuation next to the block's owner");
    // a still reads its own (unchanged) block 0.
    forward_both(cpu, dev, {{a, cpu.slot_length(a), std::vector<TokenId>{5}, false}},
                 "the owner after the copy");
    // Bad input is a Status, never a device launch.
    std::vector<float> out;
    const std::vector<TokenId> outside = {V};
    const std::vector<SequenceChunk> wrong_pos = {{b, 0, tb, false}};
    const std::vector<SequenceChunk> wrong_token = {{b, dev.slot_length(b), outside, false}};
    CHECK_FALSE(dev.forward(wrong_pos, &out).ok());  // Not at the slot's length.
    CHECK_FALSE(dev.forward(wrong_token, &out).ok());
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
    const auto want = serve("cpu", kMicro, prompts, &cpu_log);
    const auto got = serve("cuda", kMicro, prompts, &gpu_log);
    CHECK(gpu_log.find("engine.device_forward") != std::string::npos);
    CHECK(gpu_log.find("device_forward_fallback") == std::string::npos);
    for (size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(i);
        CHECK(want[i].size() == 12u);
        CHECK(got[i] == want[i]);
    }
    CHECK(device_health().ok());
}

TEST_CASE("engine API with backend cuda: another architecture falls back, with a log line") {
    std::string log;
    const std::vector<std::vector<TokenId>> prompts = {{1, 2, 3}};
    const auto got = serve("cuda", kGlm, prompts, &log);
    CHECK(log.find("engine.device_forward_fallback") != std::string::npos);
    CHECK(log.find("config.json") != std::string::npos);
    REQUIRE(got.size() == 1u);
    CHECK(got[0].size() == 12u);
}

}  // namespace
}  // namespace edge::engine::cuda
