// The fixture models served by the scheduler with everything on at once: batching, chunked
// prefill, preemption under a KV budget that fits only part of the load, and prefix-cache hits
// (a shared system prompt, a second wave of the same prompts). Every request's greedy tokens must
// equal the tokens of the same request run alone on an unconstrained scheduler.

#include <doctest/doctest.h>

#include "engine/model/loader.h"
#include "engine/sched/scheduler.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/engine/archs/reference_check.h"
#include "tests/engine/serve/collecting_sink.h"

namespace edge::engine::sched {
namespace {

using testing::CollectingSink;

struct Served {
    std::unique_ptr<tokenizer::Tokenizer> tok;
    std::unique_ptr<Scheduler> scheduler;
};

Served serve(const std::string& dir, int64_t kv_bytes, int32_t batch_tokens, bool prefix,
             int64_t swap_bytes = 0) {
    Served s;
    auto tok = tokenizer::Tokenizer::load_file(dir + "/tokenizer.json");
    REQUIRE(tok.ok());
    s.tok = std::move(tok).value();
    LoadOptions options;
    options.threads = 1;
    options.max_slots = 8;
    options.max_context = 256;
    options.kv_cache_bytes = kv_bytes;
    options.kv_block_tokens = 4;
    auto model = load_model(dir, options);
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    SchedulerConfig config;
    config.max_batch_tokens = batch_tokens;
    config.prefix_cache = prefix;
    config.prefix_secret = "test";
    config.swap_bytes = swap_bytes;
    s.scheduler = std::make_unique<Scheduler>(std::move(model).value(), s.tok.get(), config);
    return s;
}

std::shared_ptr<CollectingSink> submit(Scheduler& s, const std::string& tenant,
                                       std::vector<TokenId> prompt, int max_tokens) {
    auto sink = std::make_shared<CollectingSink>();
    SequenceRequest r;
    r.request_id = tenant;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.sink = sink;
    r.tenant = tenant;
    auto h = s.submit(std::move(r));
    REQUIRE(h.ok());
    return sink;
}

void drain(Scheduler& s) {
    for (int i = 0; i < 20000 && s.step(); ++i) {
    }
}

void check_fixture(const std::string& name) {
    const std::string dir = testing::fixture_dir(name);
    const auto refs = testing::read_reference(dir);
    REQUIRE(refs.size() >= 2);
    // Requests: each reference prompt, and each again behind a shared 13-token "system prompt".
    std::vector<TokenId> system;
    for (TokenId t : refs[0].prompt) {
        system.push_back(t);
    }
    while (system.size() < 13) {
        system.push_back(static_cast<TokenId>(100 + system.size()));
    }
    std::vector<std::vector<TokenId>> prompts;
    for (const auto& r : refs) {
        prompts.push_back(r.prompt);
        auto p = system;
        p.insert(p.end(), r.prompt.begin(), r.prompt.end());
        prompts.push_back(p);
    }
    const int kTokens = 10;

    // Alone: one at a time, no prefix cache, room for everything.
    std::vector<std::vector<TokenId>> alone;
    {
        Served s = serve(dir, int64_t{1} << 24, 2048, false);
        for (size_t i = 0; i < prompts.size(); ++i) {
            auto sink = submit(*s.scheduler, i % 2 ? "b" : "a", prompts[i], kTokens);
            drain(*s.scheduler);
            REQUIRE(sink->wait());
            alone.push_back(sink->ids());
        }
    }
    // Together, twice over (the second wave hits the first's blocks), chunked prefill of 8
    // tokens, and a KV budget of 24 blocks of 4 tokens: less than half of the load's peak.
    int64_t per_token = 0;
    {
        Served probe = serve(dir, 0, 8, true);
        per_token = probe.scheduler->spec().kv_bytes_per_token;
    }
    // Preempted sequences recomputed, then with their KV saved to host memory and put back.
    for (const int64_t swap : {int64_t{0}, int64_t{1} << 24}) {
        INFO(name << (swap > 0 ? ", KV saved on preemption" : ", recomputed on preemption"));
        Served s = serve(dir, 24 * 4 * per_token, 8, true, swap);
        std::vector<std::shared_ptr<CollectingSink>> sinks;
        for (int wave = 0; wave < 2; ++wave) {
            for (size_t i = 0; i < prompts.size(); ++i) {
                sinks.push_back(submit(*s.scheduler, i % 2 ? "b" : "a", prompts[i], kTokens));
            }
            if (wave == 0) {
                drain(*s.scheduler);
            }
        }
        drain(*s.scheduler);
        int64_t cached = 0;
        for (size_t i = 0; i < sinks.size(); ++i) {
            auto f = sinks[i]->wait();
            REQUIRE(f);
            CHECK(f->reason == FinishReason::kLength);
            INFO(name << " request " << i);
            CHECK(sinks[i]->ids() == alone[i % prompts.size()]);
            cached += f->usage.cached_tokens;
        }
        const SchedulerStats& st = s.scheduler->stats();
        MESSAGE(name << ": preemptions " << st.preemptions << " (KV saved "
                     << st.swapped_preemptions << "), recomputed tokens " << st.recompute_tokens
                     << ", cached tokens " << cached << ", steps " << st.steps);
        CHECK(st.preemptions > 0);
        CHECK(cached > 0);
        if (swap > 0) {
            CHECK(st.swapped_preemptions == st.preemptions);
            CHECK(st.recompute_tokens == 0);
        } else {
            CHECK(st.swapped_preemptions == 0);
            CHECK(st.recompute_tokens > 0);
        }
    }
}

TEST_CASE("paged serving: micro-qwen3-moe batched, chunked, preempted and cached equals alone") {
    check_fixture("micro-qwen3-moe");
}

TEST_CASE("paged serving: micro-glm4-moe batched, chunked, preempted and cached equals alone") {
    check_fixture("micro-glm4-moe");
}

TEST_CASE("paged serving: micro-deepseek-v3 (MLA) batched, chunked, preempted, cached = alone") {
    check_fixture("micro-deepseek-v3");
}

}  // namespace
}  // namespace edge::engine::sched
