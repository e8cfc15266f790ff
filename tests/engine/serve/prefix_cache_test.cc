// The scheduler with the paged KV cache: the tenant-isolated prefix cache (hits, isolation,
// eviction), preemption by priority under a KV budget that fits only part of the load, admission
// control, and the serving figures. Driven step by step on FakeCausalLM, whose next token is read
// back from the KV cache through the block tables (so a bad hit or block table changes output).

#include <doctest/doctest.h>

#include <tuple>

#include "common/clock.h"
#include "engine/sched/prefix_hash.h"
#include "engine/sched/scheduler.h"
#include "tests/engine/serve/collecting_sink.h"
#include "tests/engine/serve/fake_causal_lm.h"
#include "tests/engine/serve/micro_tokenizer.h"

namespace edge::engine::sched {
namespace {

using testing::CollectingSink;
using testing::FakeCausalLM;
using testing::FakeLog;
using testing::FakeOptions;
using testing::micro_tokenizer;

std::vector<TokenId> prompt_of(int32_t len, TokenId first = 40) {
    std::vector<TokenId> p;
    for (int32_t i = 0; i < len; ++i) {
        p.push_back(first + (i * 7) % 50);
    }
    return p;
}

struct Paged {
    explicit Paged(FakeOptions opts = paged_options(), SchedulerConfig config = {})
        : options(opts), log(std::make_shared<FakeLog>()) {
        config.eos_token_ids = options.eos;
        config.prefix_secret = "test secret";
        config.clock = &clock;
        scheduler = std::make_unique<Scheduler>(std::make_unique<FakeCausalLM>(options, log),
                                                &micro_tokenizer(), config);
    }

    static FakeOptions paged_options() {
        FakeOptions o;
        o.block_tokens = 4;
        o.kv_tokens = 1024;
        return o;
    }

    Result<std::shared_ptr<GenerationHandle>> try_submit(const std::string& tenant,
                                                         std::vector<TokenId> prompt,
                                                         int max_tokens,
                                                         std::shared_ptr<CollectingSink> sink,
                                                         int32_t priority = 0,
                                                         std::string cache_scope = "") {
        SequenceRequest r;
        r.request_id = tenant;
        r.prompt = std::move(prompt);
        r.sampling.temperature = 0.0f;
        r.sampling.max_tokens = max_tokens;
        r.sampling.ignore_eos = true;
        r.seed = 1;
        r.sink = std::move(sink);
        r.tenant = tenant;
        r.cache_scope = std::move(cache_scope);
        r.priority = priority;
        r.echo_prompt = echo_logprobs;
        r.sampling.logprobs = echo_logprobs;
        return scheduler->submit(std::move(r));
    }

    std::shared_ptr<CollectingSink> submit(const std::string& tenant, std::vector<TokenId> prompt,
                                           int max_tokens, int32_t priority = 0,
                                           std::string cache_scope = "") {
        auto sink = std::make_shared<CollectingSink>();
        auto handle = try_submit(tenant, std::move(prompt), max_tokens, sink, priority,
                                 std::move(cache_scope));
        REQUIRE(handle.ok());
        handles.push_back(*handle);
        return sink;
    }

    // Steps until idle (each step is 10 ms on the manual clock); returns the steps taken.
    int drain() {
        int steps = 0;
        while (steps < 10000) {
            clock.advance(std::chrono::milliseconds(10));
            if (!scheduler->step()) {
                break;
            }
            ++steps;
        }
        return steps;
    }

    FakeOptions options;
    ManualClock clock;
    std::shared_ptr<FakeLog> log;
    std::unique_ptr<Scheduler> scheduler;
    std::vector<std::shared_ptr<GenerationHandle>> handles;
    // Requests submitted while set echo their prompt with its logprobs.
    bool echo_logprobs = false;
};

TEST_CASE("prefix hash: chained, salted per tenant, full blocks only") {
    const auto p = prompt_of(10);
    const BlockHash a = tenant_salt("s", "a");
    const BlockHash b = tenant_salt("s", "b");
    CHECK(a != b);
    CHECK(tenant_salt("s2", "a") != a);
    const auto ca = prefix_chain(p, 4, a, SIZE_MAX);
    REQUIRE(ca.size() == 2);
    CHECK(prefix_chain(p, 4, b, SIZE_MAX)[0] != ca[0]);
    // The second block's hash depends on the first block's tokens.
    auto q = p;
    q[0] = 99;
    const auto cq = prefix_chain(q, 4, a, SIZE_MAX);
    CHECK(cq[0] != ca[0]);
    CHECK(cq[1] != ca[1]);
    CHECK(prefix_chain(p, 4, a, 1).size() == 1);
}

TEST_CASE("prefix cache: the same prompt twice from one tenant hits and gives the same tokens") {
    Paged h;
    const auto prompt = prompt_of(13);
    const auto want = FakeCausalLM::expected(h.options, prompt, 6);
    auto first = h.submit("a", prompt, 6);
    h.drain();
    auto f1 = first->wait();
    REQUIRE(f1);
    CHECK(f1->usage.cached_tokens == 0);
    CHECK(first->ids() == want);
    const size_t calls_before = h.log->snapshot().size();

    auto second = h.submit("a", prompt, 6);
    h.drain();
    auto f2 = second->wait();
    REQUIRE(f2);
    CHECK(f2->usage.cached_tokens == 12);  // Three full blocks; the 13th token is computed.
    CHECK(second->ids() == want);
    const auto calls = h.log->snapshot();
    REQUIRE(calls.size() > calls_before);
    CHECK(calls[calls_before].chunks[0].second == 1);  // Prefill of the one uncached token.

    // A prompt that is a whole number of blocks keeps its last block to compute.
    auto third = h.submit("a", prompt_of(12), 3);
    h.drain();
    auto f3 = third->wait();
    REQUIRE(f3);
    CHECK(f3->usage.cached_tokens == 8);
    CHECK(third->ids() == FakeCausalLM::expected(h.options, prompt_of(12), 3));

    const ServingStats stats = h.scheduler->serving_stats();
    CHECK(stats.tenants.at("a").prefix_query_tokens == 13 + 13 + 12);
    CHECK(stats.tenants.at("a").prefix_hit_tokens == 20);
    CHECK(h.scheduler->stats().prefix_hit_tokens == 20);

    // With the prefix cache off nothing is queried, so no hit ratio of 0% is reported.
    SchedulerConfig off;
    off.prefix_cache = false;
    Paged plain(Paged::paged_options(), off);
    for (int i = 0; i < 2; ++i) {
        auto s = plain.submit("a", prompt, 3);
        plain.drain();
        auto f = s->wait();
        REQUIRE(f);
        CHECK(f->usage.cached_tokens == 0);
    }
    CHECK(plain.scheduler->serving_stats().tenants.at("a").prefix_query_tokens == 0);
    CHECK(plain.scheduler->stats().prefix_query_tokens == 0);
}

TEST_CASE("prefix cache: a prompt echoed with its logprobs is no query, yet publishes its blocks") {
    Paged h;
    const auto prompt = prompt_of(13);
    h.echo_logprobs = true;
    for (int i = 0; i < 2; ++i) {
        auto s = h.submit("a", prompt, 3);
        h.drain();
        auto f = s->wait();
        REQUIRE(f);
        CHECK(f->usage.cached_tokens == 0);  // Computed whole: cached blocks have no logits.
        CHECK(s->prompt().size() == prompt.size());
    }
    // Never looked up, so not counted as a lookup that missed (a hit ratio of 0%).
    ServingStats stats = h.scheduler->serving_stats();
    CHECK(stats.tenants.at("a").prefix_query_tokens == 0);
    CHECK(stats.tenants.at("a").prefix_hit_tokens == 0);
    CHECK(h.scheduler->stats().prefix_query_tokens == 0);
    CHECK(h.scheduler->stats().prefix_hit_tokens == 0);

    // A plain request takes the blocks those computed.
    h.echo_logprobs = false;
    auto plain = h.submit("a", prompt, 3);
    h.drain();
    auto f = plain->wait();
    REQUIRE(f);
    CHECK(f->usage.cached_tokens == 12);
    stats = h.scheduler->serving_stats();
    CHECK(stats.tenants.at("a").prefix_query_tokens == 13);
    CHECK(stats.tenants.at("a").prefix_hit_tokens == 12);
    CHECK(h.scheduler->stats().prefix_query_tokens == 13);
}

TEST_CASE("prefix cache: tenant B never hits A's blocks and takes the same steps as alone") {
    const auto prompt = prompt_of(21);
    Paged shared;
    auto a = shared.submit("a", prompt, 5);
    shared.drain();
    REQUIRE(a->wait());
    auto b = shared.submit("b", prompt, 5);
    const int steps_after_a = shared.drain();
    auto fb = b->wait();
    REQUIRE(fb);
    CHECK(fb->usage.cached_tokens == 0);

    Paged alone;
    auto b_alone = alone.submit("b", prompt, 5);
    const int steps_alone = alone.drain();
    REQUIRE(b_alone->wait());
    CHECK(steps_after_a == steps_alone);
    CHECK(b->ids() == b_alone->ids());
    // The forward calls B caused are the same, chunk for chunk.
    const auto calls_shared = shared.log->snapshot();
    const auto calls_alone = alone.log->snapshot();
    REQUIRE(calls_shared.size() >= calls_alone.size());
    for (size_t i = 0; i < calls_alone.size(); ++i) {
        const auto& s = calls_shared[calls_shared.size() - calls_alone.size() + i];
        REQUIRE(s.chunks.size() == calls_alone[i].chunks.size());
        CHECK(s.chunks[0].second == calls_alone[i].chunks[0].second);
    }
    CHECK(shared.scheduler->serving_stats().tenants.at("b").prefix_hit_tokens == 0);
}

TEST_CASE("prefix cache: one tenant name under a new cache scope (another customer) never hits") {
    const auto prompt = prompt_of(21);
    Paged h;
    auto first = h.submit("acme", prompt, 5, 0, "acme#1");
    h.drain();
    REQUIRE(first->wait());
    auto same = h.submit("acme", prompt, 5, 0, "acme#1");
    h.drain();
    REQUIRE(same->wait());
    CHECK(same->wait()->usage.cached_tokens == 20);
    auto renamed = h.submit("acme", prompt, 5, 0, "acme#2");
    h.drain();
    REQUIRE(renamed->wait());
    CHECK(renamed->wait()->usage.cached_tokens == 0);
    CHECK(renamed->ids() == first->ids());
}

TEST_CASE("prefix cache: cached blocks are evicted least recently used when memory is needed") {
    FakeOptions opts = Paged::paged_options();
    opts.kv_tokens = 32;  // 8 blocks.
    Paged h(opts);
    const auto p1 = prompt_of(9, 40);
    const auto p2 = prompt_of(9, 41);
    const auto p3 = prompt_of(17, 42);
    for (const auto& p : {p1, p2}) {
        auto s = h.submit("a", p, 3);
        h.drain();
        REQUIRE(s->wait());
    }
    // p3 needs 5 blocks: the 4 free ones and 1 of the 4 cached (2 from p1, 2 from p2): the least
    // recently released, p1's last block (a chain loses its leaf before its root).
    auto s3 = h.submit("a", p3, 3);
    h.drain();
    REQUIRE(s3->wait());
    CHECK(s3->ids() == FakeCausalLM::expected(opts, p3, 3));
    auto again2 = h.submit("a", p2, 3);
    h.drain();
    auto f2 = again2->wait();
    REQUIRE(f2);
    CHECK(f2->usage.cached_tokens == 8);
    CHECK(again2->ids() == FakeCausalLM::expected(opts, p2, 3));
    auto again1 = h.submit("a", p1, 3);
    h.drain();
    auto f1 = again1->wait();
    REQUIRE(f1);
    CHECK(f1->usage.cached_tokens == 4);  // p1's first block is still there.
    CHECK(again1->ids() == FakeCausalLM::expected(opts, p1, 3));
}

// Tokens fed to forward() over the calls logged.
int64_t fed_tokens(const std::vector<testing::ForwardCall>& calls) {
    int64_t n = 0;
    for (const auto& call : calls) {
        for (const auto& [slot, tokens] : call.chunks) {
            n += tokens;
        }
    }
    return n;
}

// Tokens one request of `prompt` feeds when it runs alone.
int64_t fed_alone(const std::vector<TokenId>& prompt, int max_tokens, SchedulerConfig config) {
    Paged alone(Paged::paged_options(), config);
    auto s = alone.submit("a", prompt, max_tokens);
    alone.drain();
    REQUIRE(s->wait());
    return fed_tokens(alone.log->snapshot());
}

TEST_CASE("in-batch prefix sharing: one prompt submitted four times computes its blocks once") {
    SchedulerConfig config;
    config.max_batch_tokens = 8;  // The prompt takes three steps to prefill.
    Paged h(Paged::paged_options(), config);
    const auto prompt = prompt_of(21);  // Five full blocks and one token.
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (int i = 0; i < 4; ++i) {
        sinks.push_back(h.submit("a", prompt, 6));
    }
    h.drain();
    const auto want = FakeCausalLM::expected(h.options, prompt, 6);
    for (size_t i = 0; i < sinks.size(); ++i) {
        auto f = sinks[i]->wait();
        REQUIRE(f);
        CHECK(sinks[i]->ids() == want);
        // The first computes the prompt; the others find its 20 tokens of whole blocks.
        CHECK(f->usage.cached_tokens == (i == 0 ? 0 : 20));
    }
    // Alone, a request feeds the prompt and its decode steps; the other three feed all but the
    // 20 shared tokens (12 tokens each instead of 32 together).
    const int64_t alone = fed_alone(prompt, 6, config);
    CHECK(fed_tokens(h.log->snapshot()) == alone + 3 * (alone - 20));
    CHECK(h.scheduler->stats().prefix_hit_tokens == 60);
    CHECK(h.scheduler->serving_stats().tenants.at("a").prefix_hit_tokens == 60);
    CHECK(h.log->slots_in_use == 0);
}

TEST_CASE("in-batch prefix sharing: a shared system prompt is computed once, each suffix apart") {
    Paged h;
    const auto system = prompt_of(16, 60);
    std::vector<std::pair<std::vector<TokenId>, std::shared_ptr<CollectingSink>>> reqs;
    for (int i = 0; i < 3; ++i) {
        auto p = system;
        for (int j = 0; j < 3 + 4 * i; ++j) {
            p.push_back(100 + 10 * i + j);
        }
        reqs.emplace_back(p, h.submit("a", p, 4));
    }
    h.drain();
    for (size_t i = 0; i < reqs.size(); ++i) {
        auto f = reqs[i].second->wait();
        REQUIRE(f);
        CHECK(reqs[i].second->ids() == FakeCausalLM::expected(h.options, reqs[i].first, 4));
        CHECK(f->usage.cached_tokens == (i == 0 ? 0 : 16));
    }
}

TEST_CASE("in-batch prefix sharing: other tenants compute the same prompt themselves") {
    Paged h;
    const auto prompt = prompt_of(21);
    auto a = h.submit("a", prompt, 4);
    auto b = h.submit("b", prompt, 4);
    h.drain();
    for (const auto& s : {a, b}) {
        auto f = s->wait();
        REQUIRE(f);
        CHECK(f->usage.cached_tokens == 0);
        CHECK(s->ids() == FakeCausalLM::expected(h.options, prompt, 4));
    }
    CHECK(fed_tokens(h.log->snapshot()) == 2 * fed_alone(prompt, 4, {}));
}

TEST_CASE("in-batch prefix sharing: when the sequence computing the blocks goes, the next does") {
    SchedulerConfig config;
    config.max_batch_tokens = 8;
    Paged h(Paged::paged_options(), config);
    const auto prompt = prompt_of(21);
    auto first = h.submit("a", prompt, 4);
    auto second = h.submit("a", prompt, 4);
    h.clock.advance(std::chrono::milliseconds(10));
    REQUIRE(h.scheduler->step());  // The first computes two blocks; the second waits.
    auto calls = h.log->snapshot();
    REQUIRE(calls.size() == 1);
    REQUIRE(calls[0].chunks.size() == 1);
    CHECK(calls[0].chunks[0].second == 8);
    h.handles[0]->cancel();
    h.drain();
    auto f1 = first->wait();
    REQUIRE(f1);
    CHECK(f1->reason == FinishReason::kCancelled);
    auto f2 = second->wait();
    REQUIRE(f2);
    CHECK(f2->reason == FinishReason::kLength);
    CHECK(f2->usage.cached_tokens == 8);  // The two blocks published before the cancel.
    CHECK(second->ids() == FakeCausalLM::expected(h.options, prompt, 4));
    CHECK(h.log->slots_in_use == 0);
}

TEST_CASE("preemption: the lowest priority, most recent sequence goes first, all finish alike") {
    FakeOptions opts = Paged::paged_options();
    opts.kv_tokens = 48;  // 12 blocks; the load below needs 4 x 5 = 20 at its peak.
    SchedulerConfig config;
    config.max_batch_tokens = 16;
    Paged h(opts, config);
    struct Req {
        std::string tenant;
        int32_t priority;
        std::vector<TokenId> prompt;
        std::shared_ptr<CollectingSink> sink;
    };
    std::vector<Req> reqs = {{"gold", 10, prompt_of(6, 50), nullptr},
                             {"free", 0, prompt_of(6, 51), nullptr},
                             {"gold", 10, prompt_of(6, 52), nullptr},
                             {"free", 0, prompt_of(6, 53), nullptr}};
    for (Req& r : reqs) {
        r.sink = h.submit(r.tenant, r.prompt, 14, r.priority);
    }
    h.drain();
    for (Req& r : reqs) {
        auto f = r.sink->wait();
        REQUIRE(f);
        CHECK(f->reason == FinishReason::kLength);
        CHECK(r.sink->ids() == FakeCausalLM::expected(opts, r.prompt, 14));
    }
    const ServingStats stats = h.scheduler->serving_stats();
    CHECK(h.scheduler->stats().preemptions > 0);
    CHECK(stats.tenants.at("free").preemptions > 0);
    CHECK(stats.tenants.at("gold").preemptions == 0);
    CHECK(stats.tenants.at("free").running == 0);
    CHECK(stats.tenants.at("free").queued == 0);
    CHECK(h.log->slots_in_use == 0);
}

TEST_CASE("preemption with shared prefixes and cache hits: every request equals its run alone") {
    FakeOptions opts = Paged::paged_options();
    opts.kv_tokens = 96;  // 24 blocks for 12 requests of up to 8 blocks each.
    SchedulerConfig config;
    config.max_batch_tokens = 24;
    Paged h(opts, config);
    const auto system = prompt_of(16, 60);
    std::vector<std::pair<std::vector<TokenId>, std::shared_ptr<CollectingSink>>> reqs;
    for (int i = 0; i < 12; ++i) {
        auto p = system;
        for (int j = 0; j <= i % 5; ++j) {
            p.push_back(100 + i * 3 + j);
        }
        reqs.emplace_back(p, h.submit(i % 2 == 0 ? "a" : "b", p, 10 + i % 4));
        if (i < 2) {
            // The first request of each tenant prefills (and publishes) the system prompt.
            h.clock.advance(std::chrono::milliseconds(10));
            h.scheduler->step();
        }
    }
    h.drain();
    int64_t cached = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
        auto f = reqs[i].second->wait();
        REQUIRE(f);
        CHECK(reqs[i].second->ids() ==
              FakeCausalLM::expected(opts, reqs[i].first, 10 + static_cast<int>(i) % 4));
        cached += f->usage.cached_tokens;
    }
    CHECK(h.scheduler->stats().preemptions > 0);
    CHECK(cached > 0);
    CHECK(h.log->slots_in_use == 0);
}

TEST_CASE("admission control: a tenant's full queue is 429-like, the model's full queue 503-like") {
    SchedulerConfig config;
    config.max_queue = 3;
    config.max_queue_per_tenant = 2;
    Paged h(Paged::paged_options(), config);
    h.submit("a", prompt_of(4), 2);
    h.submit("a", prompt_of(4), 2);
    auto sink = std::make_shared<CollectingSink>();
    auto third = h.try_submit("a", prompt_of(4), 2, sink);
    REQUIRE_FALSE(third.ok());
    CHECK(third.status().code() == StatusCode::kResourceExhausted);
    CHECK(third.status().message().find("tenant 'a'") != std::string::npos);
    h.submit("b", prompt_of(4), 2);
    auto fourth = h.try_submit("c", prompt_of(4), 2, sink);
    REQUIRE_FALSE(fourth.ok());
    CHECK(fourth.status().code() == StatusCode::kUnavailable);
    const ServingStats stats = h.scheduler->serving_stats();
    CHECK(stats.tenants.at("a").rejected_queue_full == 1);
    CHECK(stats.tenants.at("c").rejected_model_queue_full == 1);
    CHECK(stats.tenants.at("a").queued == 2);
    h.drain();
    CHECK(h.scheduler->serving_stats().tenants.at("a").queued == 0);
}

TEST_CASE("admission control: an estimated queue wait past the limit is refused before it fills") {
    SchedulerConfig config;
    config.max_batch_sequences = 1;
    config.max_queue_wait = std::chrono::milliseconds(1000);
    ManualClock* clock = nullptr;
    FakeOptions opts = Paged::paged_options();
    opts.on_forward = [&clock] { clock->advance(std::chrono::milliseconds(100)); };
    Paged h(opts, config);
    clock = &h.clock;
    h.submit("a", prompt_of(4), 20);
    // 4 prompt tokens in 100 ms: 40 tokens/s for the estimate, too few to advertise as the
    // pool's prefill speed.
    REQUIRE(h.scheduler->step());
    CHECK(h.scheduler->load().prefill_tokens_per_s == 0.0);
    h.submit("b", prompt_of(4), 20);  // Queue empty before it: accepted.
    auto sink = std::make_shared<CollectingSink>();
    // 24 + 24 queued tokens at 40 tokens/s: 1.2 s > 1 s.
    auto c = h.try_submit("c", prompt_of(4), 20, sink);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kUnavailable);
    CHECK(c.status().message().find("estimated queue wait of 1200 ms") != std::string::npos);
    // A small request still fits: (24 + 6) / 40 = 0.75 s.
    auto d = h.try_submit("d", prompt_of(4), 2, sink);
    CHECK(d.ok());
    CHECK(h.scheduler->serving_stats().tenants.at("c").rejected_queue_wait == 1);
    h.drain();
}

TEST_CASE("serving stats: queue time, time to first token, inter-token and end-to-end") {
    SchedulerConfig config;
    config.max_batch_sequences = 1;  // The second request waits for the first.
    Paged h(Paged::paged_options(), config);
    h.submit("a", prompt_of(5), 4);
    h.submit("a", prompt_of(6), 3);
    h.drain();
    const ServingStats stats = h.scheduler->serving_stats();
    const TenantServingStats& t = stats.tenants.at("a");
    CHECK(t.generated_tokens == 7);
    CHECK(t.prompt_tokens == 11);
    CHECK(t.ttft.count() == 2);
    CHECK(t.inter_token.count() == 5);
    CHECK(t.end_to_end.count() == 2);
    CHECK(t.queue_time.count() == 2);
    // Each step is 10 ms: tokens 10 ms apart; the second request waited 5 steps.
    CHECK(t.inter_token.quantile_bound(0.99) == doctest::Approx(0.01));
    CHECK(t.queue_time.sum() == doctest::Approx(0.01 + 0.05));
    CHECK(t.running == 0);
    CHECK(t.queued == 0);
    CHECK(stats.kv_blocks_total == 256);
    CHECK(stats.kv_blocks_used == 0);
    CHECK(stats.kv_blocks_cached > 0);
}

TEST_CASE("preemption by swap leaves a shared system prompt in the cache and admission open") {
    // Six requests of tenant a share a system prompt of 8 blocks (4 tokens each), plus 2 tokens
    // and 16 generated of their own (5 blocks at most); 20 blocks hold the prompt and 2 or 3 of
    // them, so KV preemptions swap some out. A swap copies their own blocks only: the system
    // prompt stays cached for the others and is attached again, so the restore needs no more
    // blocks than the preemption freed. (Copied, the prompt had to come back in private blocks
    // while the others held it: the restore failed and closed admission, for b too, until the
    // next request ended.) Tenant b sends a request at one of several steps of that run.
    constexpr int kOwnBlocks = 5;
    for (int at = 14; at <= 26; at += 2) {
        CAPTURE(at);
        FakeOptions opts = Paged::paged_options();
        opts.kv_tokens = 4 * 20;
        SchedulerConfig config;
        config.max_batch_tokens = 32;
        config.swap_bytes = int64_t{1} << 20;
        Paged h(opts, config);
        const auto system = prompt_of(32, 60);
        std::vector<std::pair<std::vector<TokenId>, std::shared_ptr<CollectingSink>>> reqs;
        for (int i = 0; i < 6; ++i) {
            auto p = system;
            p.push_back(100 + i * 3);
            p.push_back(101 + i * 3);
            reqs.emplace_back(p, h.submit("a", p, 16));
        }
        const int64_t block_bytes = int64_t{opts.block_tokens} * 2 * 4;  // K and V, one f32.
        std::shared_ptr<CollectingSink> b;
        int b_first = -1;
        int64_t most_swap = 0;
        int64_t most_over = INT64_MIN;  // Swap bytes over the bound below, the worst step's.
        for (int step = 0; step < 1000; ++step) {
            if (step == at) {
                b = h.submit("b", prompt_of(5, 200), 4);
            }
            h.clock.advance(std::chrono::milliseconds(10));
            if (!h.scheduler->step()) {
                break;
            }
            const ServingStats stats = h.scheduler->serving_stats();
            most_swap = std::max(most_swap, stats.kv_swap_bytes);
            // At most each waiting request's own blocks: never a copy of the system prompt.
            most_over = std::max(most_over, stats.kv_swap_bytes - stats.tenants.at("a").queued *
                                                                      kOwnBlocks * block_bytes);
            if (b && b_first < 0 && !b->ids().empty()) {
                b_first = step;
            }
        }
        for (auto& [prompt, sink] : reqs) {
            REQUIRE(sink->wait());
            CHECK(sink->ids() == FakeCausalLM::expected(opts, prompt, 16));
        }
        REQUIRE(b);
        REQUIRE(b->wait());
        CHECK(b->ids() == FakeCausalLM::expected(opts, prompt_of(5, 200), 4));
        // b's first token comes at the step it is submitted, or the next.
        CHECK(b_first - at <= 1);
        const SchedulerStats& st = h.scheduler->stats();
        CHECK(st.swapped_preemptions > 0);
        CHECK(st.swapped_preemptions == st.preemptions);
        CHECK(most_swap > 0);
        CHECK(most_over <= 0);
        CHECK(st.recompute_tokens == 0);  // Every system prompt was attached again.
        CHECK(h.scheduler->serving_stats().kv_swap_bytes == 0);
        CHECK(h.log->slots_in_use == 0);
    }
}

TEST_CASE("preemption by swap: a shared prefix evicted meanwhile is computed again, no hit") {
    // x and y share a system prompt of 8 blocks. c (priority 10, a 60-token prompt) is owed a
    // place: y goes for it, saving only its own blocks. c's prefill then takes the KV cache: x
    // goes too (saved whole, as no one shares its prompt blocks any more), and c's blocks evict
    // the cached prompt. When c ends, y finds its prefix gone: it is computed again instead.
    FakeOptions opts = Paged::paged_options();
    opts.kv_tokens = 4 * 20;
    SchedulerConfig config;
    config.max_batch_tokens = 32;
    config.max_batch_sequences = 2;
    config.swap_bytes = int64_t{1} << 20;
    Paged h(opts, config);
    const auto system = prompt_of(32, 60);
    auto x = system;
    x.insert(x.end(), {100, 101});
    auto y = system;
    y.insert(y.end(), {103, 104});
    const auto c = prompt_of(60, 150);
    auto sx = h.submit("a", x, 20);
    auto sy = h.submit("a", y, 20);
    h.clock.advance(std::chrono::milliseconds(10));
    REQUIRE(h.scheduler->step());
    auto sc = h.submit("c", c, 4, 10);
    h.drain();
    // No request reports a hit: y's attached prompt was evicted and computed again, and x's KV
    // put back after its swap is what it computed itself.
    for (const auto& [sink, prompt, n] :
         {std::tuple{sx, x, 20}, std::tuple{sy, y, 20}, std::tuple{sc, c, 4}}) {
        auto f = sink->wait();
        REQUIRE(f);
        CHECK(sink->ids() == FakeCausalLM::expected(opts, prompt, n));
        CHECK(f->usage.cached_tokens == 0);
    }
    const SchedulerStats& st = h.scheduler->stats();
    CHECK(st.fair_preemptions == 1);
    CHECK(st.swapped_preemptions == st.preemptions);
    CHECK(st.recompute_tokens > 0);  // Saved, all of them, yet y was computed again.
    CHECK(h.scheduler->serving_stats().kv_swap_bytes == 0);
    CHECK(h.log->slots_in_use == 0);
    CHECK(st.prefix_hit_tokens == 0);
    CHECK(h.scheduler->serving_stats().tenants.at("a").prefix_hit_tokens == 0);
}

TEST_CASE("prefix cache: a hit dropped by a preemption and computed again is not cached_tokens") {
    // r's prompt is cached (3 blocks). s and r are admitted together and r attaches the 3
    // blocks, but their first forward needs more blocks than the cache has: r, the newest, is
    // preempted before anything ran, and s's prefill evicts the blocks r let go. When s ends r
    // computes its whole prompt: none of it came from the cache.
    FakeOptions opts = Paged::paged_options();
    opts.kv_tokens = 32;  // 8 blocks.
    Paged h(opts);
    const auto prompt = prompt_of(13);
    auto warm = h.submit("a", prompt, 1);
    h.drain();
    REQUIRE(warm->wait());
    const auto s_prompt = prompt_of(29, 90);  // 8 blocks, the whole cache.
    auto s = h.submit("a", s_prompt, 1);
    auto r = h.submit("a", prompt, 3);
    h.drain();
    auto fs = s->wait();
    auto fr = r->wait();
    REQUIRE(fs);
    REQUIRE(fr);
    CHECK(s->ids() == FakeCausalLM::expected(opts, s_prompt, 1));
    CHECK(r->ids() == FakeCausalLM::expected(opts, prompt, 3));
    const SchedulerStats& st = h.scheduler->stats();
    REQUIRE(st.preemptions == 1);
    CHECK(fr->usage.cached_tokens == 0);
    CHECK(fs->usage.cached_tokens == 0);
    CHECK(st.prefix_hit_tokens == 0);
    CHECK(h.scheduler->serving_stats().tenants.at("a").prefix_hit_tokens == 0);
    CHECK(h.log->slots_in_use == 0);
}

TEST_CASE("prefix cache: blocks attached after a preemption, never computed, are cached_tokens") {
    // x waits for y to compute their shared system prompt (4 blocks) and is preempted for b's
    // fair share before it attached any. Admitted again, it attaches the 4 blocks y published:
    // 16 prompt tokens it took from the cache and never computed.
    SchedulerConfig config;
    config.max_batch_tokens = 8;
    config.max_batch_sequences = 2;
    config.fair_preempt_min_steps = 0;
    Paged h(Paged::paged_options(), config);
    const auto system = prompt_of(16, 60);
    auto y_prompt = system;
    y_prompt.push_back(100);
    auto x_prompt = system;
    x_prompt.push_back(101);
    auto y = h.submit("a", y_prompt, 4);
    auto x = h.submit("a", x_prompt, 4);
    h.clock.advance(std::chrono::milliseconds(10));
    REQUIRE(h.scheduler->step());  // y computes 2 blocks; x waits for them.
    auto b = h.submit("b", prompt_of(5, 200), 4);
    h.drain();
    for (const auto& [sink, prompt, cached] :
         {std::tuple{y, y_prompt, 0}, std::tuple{x, x_prompt, 16},
          std::tuple{b, prompt_of(5, 200), 0}}) {
        auto f = sink->wait();
        REQUIRE(f);
        CHECK(sink->ids() == FakeCausalLM::expected(h.options, prompt, 4));
        CHECK(f->usage.cached_tokens == cached);
    }
    const SchedulerStats& st = h.scheduler->stats();
    REQUIRE(st.fair_preemptions == 1);
    CHECK(st.recompute_tokens == 0);  // x had computed nothing.
    CHECK(st.prefix_hit_tokens == 16);
    CHECK(h.scheduler->serving_stats().tenants.at("a").prefix_hit_tokens == 16);
}

TEST_CASE("prefix cache: a swapped sequence's shared prefix attached again counts once") {
    // y attaches the system prompt x published (32 tokens), is preempted for c's fair share with
    // its own blocks saved, and is put back with the prompt attached again: still 32.
    SchedulerConfig config;
    config.max_batch_tokens = 64;
    config.max_batch_sequences = 2;
    config.fair_preempt_min_steps = 0;
    config.swap_bytes = int64_t{1} << 20;
    Paged h(Paged::paged_options(), config);
    const auto system = prompt_of(32, 60);
    auto x = system;
    x.insert(x.end(), {100, 101});
    auto y = system;
    y.insert(y.end(), {103, 104});
    auto sx = h.submit("a", x, 12);
    h.clock.advance(std::chrono::milliseconds(10));
    REQUIRE(h.scheduler->step());  // x computes its prompt.
    auto sy = h.submit("a", y, 12);
    h.clock.advance(std::chrono::milliseconds(10));
    REQUIRE(h.scheduler->step());  // y attaches the system prompt.
    auto sc = h.submit("c", prompt_of(6, 150), 3);
    h.drain();
    for (const auto& [sink, prompt, n, cached] :
         {std::tuple{sx, x, 12, 0}, std::tuple{sy, y, 12, 32},
          std::tuple{sc, prompt_of(6, 150), 3, 0}}) {
        auto f = sink->wait();
        REQUIRE(f);
        CHECK(sink->ids() == FakeCausalLM::expected(h.options, prompt, n));
        CHECK(f->usage.cached_tokens == cached);
    }
    const SchedulerStats& st = h.scheduler->stats();
    REQUIRE(st.fair_preemptions == 1);
    REQUIRE(st.swapped_preemptions == 1);
    CHECK(st.recompute_tokens == 0);
    CHECK(st.prefix_hit_tokens == 32);
    CHECK(h.scheduler->serving_stats().tenants.at("a").prefix_hit_tokens == 32);
}

TEST_CASE("admission control: a tenant's preempted sequences do not fill its queue bound") {
    // Three sequences of tenant a need more KV blocks than the cache has: some are preempted
    // and wait to resume. That is the server's shortage, not a's rate: a's next request is
    // accepted, and only one waiting for its first admission fills the bound of 1.
    FakeOptions opts = Paged::paged_options();
    opts.kv_tokens = 48;  // 12 blocks; three sequences grow to 5 each.
    SchedulerConfig config;
    config.max_batch_tokens = 16;
    config.max_queue_per_tenant = 1;
    Paged h(opts, config);
    std::vector<std::pair<std::vector<TokenId>, std::shared_ptr<CollectingSink>>> reqs;
    for (int i = 0; i < 3; ++i) {
        const auto p = prompt_of(6, 50 + i);
        reqs.emplace_back(p, h.submit("a", p, 14));
        h.clock.advance(std::chrono::milliseconds(10));
        REQUIRE(h.scheduler->step());  // Admitted: nothing of a's waits.
    }
    int steps = 0;
    while (h.scheduler->stats().preemptions == 0 && steps++ < 100) {
        h.clock.advance(std::chrono::milliseconds(10));
        REQUIRE(h.scheduler->step());
    }
    REQUIRE(h.scheduler->stats().preemptions > 0);
    REQUIRE(h.scheduler->serving_stats().tenants.at("a").queued > 0);
    const auto p = prompt_of(5, 70);
    auto sink = std::make_shared<CollectingSink>();
    auto accepted = h.try_submit("a", p, 4, sink);
    REQUIRE(accepted.ok());
    h.handles.push_back(*accepted);
    reqs.emplace_back(p, sink);
    auto refused = h.try_submit("a", prompt_of(5, 71), 4, std::make_shared<CollectingSink>());
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == StatusCode::kResourceExhausted);
    CHECK(h.scheduler->serving_stats().tenants.at("a").rejected_queue_full == 1);
    h.drain();
    for (size_t i = 0; i < reqs.size(); ++i) {
        auto f = reqs[i].second->wait();
        REQUIRE(f);
        CHECK(reqs[i].second->ids() == FakeCausalLM::expected(opts, reqs[i].first, i < 3 ? 14 : 4));
    }
    CHECK(h.scheduler->serving_stats().tenants.at("a").queued == 0);
    CHECK(h.log->slots_in_use == 0);
}

}  // namespace
}  // namespace edge::engine::sched
