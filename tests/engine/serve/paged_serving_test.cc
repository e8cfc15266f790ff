// The fixture models served by the scheduler with everything on at once: batching, chunked
// prefill, preemption under a KV budget that fits only part of the load, and prefix-cache hits
// (a shared system prompt, a second wave of the same prompts). Every request's greedy tokens must
// equal the tokens of the same request run alone on an unconstrained scheduler.

#include <doctest/doctest.h>

#include <cmath>
#include <map>

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

// `echo`: the prompt comes back with its logprobs too (they do not change the tokens).
std::shared_ptr<CollectingSink> submit(Scheduler& s, const std::string& tenant,
                                       std::vector<TokenId> prompt, int max_tokens,
                                       bool echo = false) {
    auto sink = std::make_shared<CollectingSink>();
    SequenceRequest r;
    r.request_id = tenant;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = echo;
    r.echo_prompt = echo;
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
                // Some of the second wave echo their prompt with logprobs: computed whole, not
                // from the cache, and preempted like the others.
                const bool echo = wave == 1 && i % 2 == 0;
                sinks.push_back(
                    submit(*s.scheduler, i % 2 ? "b" : "a", prompts[i], kTokens, echo));
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
            CHECK_FALSE(sinks[i]->protocol_violated());
            if (i >= prompts.size() && i % 2 == 0) {
                const std::vector<TokenLogprob> echoed = sinks[i]->prompt();
                REQUIRE(echoed.size() == prompts[i % prompts.size()].size());
                for (size_t p = 1; p < echoed.size(); ++p) {
                    CHECK(std::isfinite(echoed[p].logprob));
                    CHECK(echoed[p].logprob <= 0.0f);
                }
            }
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

// echo_prompt with logprobs: the prompt's tokens come back with the log-probability the model
// gave each after the tokens before it. Checked against the fixture's independent reference (the
// top-5 logits after every prompt position, llama.cpp): log-softmax keeps the differences between
// logits, so the top alternatives' logprob gaps equal the reference's logit gaps. The prompt is
// prefilled in chunks, after the same prompt was served and cached (the echo computes it anyway:
// cached blocks have no logits).
void check_prompt_logprobs(const std::string& name) {
    const std::string dir = testing::fixture_dir(name);
    const auto refs = testing::read_reference(dir);
    Served s = serve(dir, 0, /*batch_tokens=*/5, /*prefix=*/true);
    for (const auto& ref : refs) {
        CAPTURE(ref.key);
        REQUIRE(ref.prompt_top5.size() == ref.prompt.size());
        auto warm = submit(*s.scheduler, "t", ref.prompt, 1);
        drain(*s.scheduler);
        REQUIRE(warm->wait());
        auto sink = std::make_shared<CollectingSink>();
        SequenceRequest r;
        r.request_id = "echo";
        r.prompt = ref.prompt;
        r.sampling.temperature = 0.0f;
        r.sampling.max_tokens = 2;
        r.sampling.logprobs = true;
        r.sampling.top_logprobs = 5;
        r.sink = sink;
        r.tenant = "t";
        r.echo_prompt = true;
        REQUIRE(s.scheduler->submit(std::move(r)).ok());
        drain(*s.scheduler);
        REQUIRE(sink->wait());
        CHECK_FALSE(sink->protocol_violated());
        // The ids generated equal the reference's greedy ones: the prompt was computed right.
        CHECK(sink->ids() == std::vector<TokenId>(ref.greedy.begin(), ref.greedy.begin() + 2));
        const std::vector<TokenLogprob> prompt = sink->prompt();
        REQUIRE(prompt.size() == ref.prompt.size());
        CHECK(std::isnan(prompt[0].logprob));  // Nothing predicts the first token.
        CHECK(prompt[0].top.empty());
        size_t offset = 0;
        for (size_t p = 0; p < prompt.size(); ++p) {
            CAPTURE(p);
            CHECK(prompt[p].id == ref.prompt[p]);
            CHECK(prompt[p].text_offset == offset);
            offset += prompt[p].token.size();
            if (p == 0) {
                continue;
            }
            const testing::Top5& want = ref.prompt_top5[p - 1];
            std::map<TokenId, double> got;
            double mass = 0.0;
            for (const TopLogprob& t : prompt[p].top) {
                got[t.id] = t.logprob;
                mass += std::exp(t.logprob);
            }
            CHECK(mass <= 1.0 + 1e-6);
            REQUIRE(got.count(want[0].first) == 1);
            size_t matched = 0;
            for (const auto& [id, logit] : want) {
                if (got.count(id) == 0) {
                    continue;  // A near tie at the fifth place may fall either way.
                }
                ++matched;
                CHECK(std::fabs((got[id] - got[want[0].first]) - (logit - want[0].second)) <=
                      2e-4);
            }
            CHECK(matched >= 4);
            if (got.count(ref.prompt[p]) == 1) {
                CHECK(prompt[p].logprob == doctest::Approx(got[ref.prompt[p]]).epsilon(1e-6));
            } else {
                CHECK(prompt[p].logprob <= prompt[p].top.back().logprob);
            }
        }
    }
}

TEST_CASE("paged serving: echoed prompt logprobs agree with the reference, fixture by fixture") {
    for (const char* name : {"micro-qwen3-moe", "micro-glm4-moe", "micro-deepseek-v3"}) {
        CAPTURE(name);
        check_prompt_logprobs(name);
    }
}

// In-batch prefix sharing on the real models: each reference prompt three times at once, its
// prefill chunked; the first computes the prompt's whole blocks and the other two take them from
// the cache as they are published. All three give the independent reference's greedy tokens.
void check_shared_prompt(const std::string& name) {
    const std::string dir = testing::fixture_dir(name);
    const auto refs = testing::read_reference(dir);
    Served s = serve(dir, 0, /*batch_tokens=*/5, /*prefix=*/true);
    for (const auto& ref : refs) {
        CAPTURE(ref.key);
        const size_t n = std::min<size_t>(8, ref.greedy.size());
        std::vector<std::shared_ptr<CollectingSink>> sinks;
        for (int i = 0; i < 3; ++i) {
            sinks.push_back(submit(*s.scheduler, "t", ref.prompt, static_cast<int>(n)));
        }
        drain(*s.scheduler);
        // Whole blocks of 4 tokens before the last prompt token; a second run hits them all.
        const int64_t shared = static_cast<int64_t>((ref.prompt.size() - 1) / 4 * 4);
        for (size_t i = 0; i < sinks.size(); ++i) {
            CAPTURE(i);
            auto f = sinks[i]->wait();
            REQUIRE(f);
            CHECK(sinks[i]->ids() ==
                  std::vector<TokenId>(ref.greedy.begin(), ref.greedy.begin() + n));
            if (i > 0) {
                CHECK(f->usage.cached_tokens == shared);
            }
        }
    }
}

TEST_CASE("paged serving: a prompt submitted three times at once is computed once, = reference") {
    for (const char* name : {"micro-qwen3-moe", "micro-glm4-moe", "micro-deepseek-v3"}) {
        CAPTURE(name);
        check_shared_prompt(name);
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
