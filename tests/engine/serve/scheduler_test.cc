#include "engine/sched/scheduler.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>

#include "common/clock.h"
#include "engine/sampling/json_prefix.h"
#include "engine/sched/sequence.h"
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

struct Harness {
    explicit Harness(FakeOptions opts = {}, SchedulerConfig config = {})
        : options(opts), log(std::make_shared<FakeLog>()) {
        config.eos_token_ids = options.eos;
        scheduler = std::make_unique<Scheduler>(std::make_unique<FakeCausalLM>(options, log),
                                                &micro_tokenizer(), config);
    }

    std::shared_ptr<CollectingSink> submit(std::vector<TokenId> prompt, int max_tokens,
                                           SamplingParams params = greedy()) {
        auto sink = std::make_shared<CollectingSink>();
        params.max_tokens = max_tokens;
        auto handle = scheduler->submit(SequenceRequest{"r", std::move(prompt), params, 1, sink});
        REQUIRE(handle.ok());
        handles.push_back(*handle);
        return sink;
    }

    // `prompt` echoed with its logprobs (what lm-evaluation-harness asks), greedy.
    std::shared_ptr<CollectingSink> submit_echo(std::vector<TokenId> prompt, int max_tokens) {
        auto sink = std::make_shared<CollectingSink>();
        SamplingParams params = greedy();
        params.max_tokens = max_tokens;
        params.logprobs = true;
        SequenceRequest req{"r", std::move(prompt), params, 1, sink};
        req.echo_prompt = true;
        auto handle = scheduler->submit(std::move(req));
        REQUIRE(handle.ok());
        handles.push_back(*handle);
        return sink;
    }

    static SamplingParams greedy() {
        SamplingParams p;
        p.temperature = 0.0f;
        return p;
    }

    // Steps until nothing is left; bounded so a scheduler bug cannot hang the test.
    void drain() {
        for (int i = 0; i < 10000 && scheduler->step(); ++i) {
        }
    }

    FakeOptions options;
    std::shared_ptr<FakeLog> log;
    std::unique_ptr<Scheduler> scheduler;
    std::vector<std::shared_ptr<GenerationHandle>> handles;
};

std::string as_text(const std::vector<TokenId>& ids) { return micro_tokenizer().decode(ids); }

// Request r's prompt of the KV-budget tests: eight tokens of its own.
std::vector<TokenId> eight_tokens(int r) {
    std::vector<TokenId> prompt;
    for (int i = 0; i < 8; ++i) {
        prompt.push_back(100 + r * 10 + i);
    }
    return prompt;
}

TEST_CASE("scheduler: one request generates the model's greedy tokens and usage") {
    Harness h;
    auto sink = h.submit({72, 105, 33}, 6);
    h.drain();
    auto finish = sink->wait();
    REQUIRE(finish);
    const auto want = FakeCausalLM::expected(h.options, {72, 105, 33}, 6);
    CHECK(sink->ids() == want);
    CHECK(sink->text() == as_text(want));
    CHECK(finish->reason == FinishReason::kLength);
    CHECK(finish->usage.prompt_tokens == 3);
    CHECK(finish->usage.completion_tokens == 6);
    CHECK_FALSE(sink->protocol_violated());
    CHECK(h.log->slots_in_use == 0);
    // One prefill call of 3 tokens, then 5 decode calls of one token.
    const auto calls = h.log->snapshot();
    REQUIRE(calls.size() == 6);
    CHECK(calls[0].chunks[0].second == 3);
    CHECK(calls[5].chunks[0].second == 1);
}

TEST_CASE("scheduler: a request joins the running batch mid-flight and leaves when done") {
    Harness h;
    auto a = h.submit({1, 2, 3, 4}, 10);
    for (int i = 0; i < 3; ++i) {
        REQUIRE(h.scheduler->step());
    }
    auto b = h.submit({9, 8}, 3);
    h.drain();
    REQUIRE(a->wait());
    REQUIRE(b->wait());
    CHECK(a->ids() == FakeCausalLM::expected(h.options, {1, 2, 3, 4}, 10));
    CHECK(b->ids() == FakeCausalLM::expected(h.options, {9, 8}, 3));
    const auto calls = h.log->snapshot();
    // A alone for 3 steps; then B's prefill rides with A's decode; B decodes twice more with A;
    // then A continues alone.
    REQUIRE(calls.size() == 10);
    for (int i = 0; i < 3; ++i) {
        CHECK(calls[i].chunks.size() == 1);
    }
    REQUIRE(calls[3].chunks.size() == 2);
    CHECK(calls[3].chunks[0].second == 1);  // A's decode token first
    CHECK(calls[3].chunks[1].second == 2);  // B's prefill
    CHECK(calls[4].chunks.size() == 2);
    CHECK(calls[5].chunks.size() == 2);
    for (size_t i = 6; i < calls.size(); ++i) {
        CHECK(calls[i].chunks.size() == 1);
    }
}

TEST_CASE("scheduler: the advertised prefill speed comes from steps that only prefill at first") {
    // Routing costs a prompt at this speed. A step that also decoded divides its prompt tokens
    // by the decodes' time too: a pool advertised a fraction of its speed and was routed away
    // from. Until the step cost fit tells prefill apart (never here: each step takes one second
    // whatever it computes), only steps that prefilled alone give it.
    ManualClock clock;
    FakeOptions opts;
    opts.on_forward = [&clock] { clock.advance(std::chrono::seconds(1)); };
    SchedulerConfig config;
    config.clock = &clock;
    Harness h(opts, config);
    std::vector<TokenId> long_prompt(200, 7);
    auto a = h.submit(long_prompt, 4);
    REQUIRE(h.scheduler->step());  // 200 prompt tokens alone in a second.
    CHECK(h.scheduler->load().prefill_tokens_per_s == doctest::Approx(200.0));
    auto b = h.submit(std::vector<TokenId>(300, 9), 4);
    REQUIRE(h.scheduler->step());  // a's decode beside b's 300 prompt tokens: not a sample.
    CHECK(h.scheduler->load().prefill_tokens_per_s == doctest::Approx(200.0));
    h.drain();
}

TEST_CASE("scheduler: under sustained mixed load the advertised speeds follow the step cost") {
    // Each step takes a + b * prefill + c * decode seconds. The first prefills alone (at less
    // than 1 / b: its fixed cost is in it); from then on every step decodes, most beside prefill
    // chunks. Rates of whole steps kept that first figure for the prefill speed for good, and
    // took the decode speed from steps slowed by prefill.
    constexpr double a = 0.01;
    constexpr double b = 1e-4;  // 10000 prompt tokens/s at the margin.
    constexpr double c = 1e-3;
    constexpr TokenId kPromptIds = 200;  // Prompt ids from here on; generated ones are below.
    ManualClock clock;
    FakeOptions opts;
    opts.slots = 16;
    opts.max_context = 1024;
    int64_t last_decode = 0;  // Decode tokens of the last step that decoded.
    int steps = 0;
    opts.on_batch = [&](std::span<const SequenceChunk> batch) {
        int64_t prefill = 0;
        int64_t decode = 0;
        for (const SequenceChunk& chunk : batch) {
            const bool decoding = chunk.tokens.size() == 1 && chunk.tokens[0] < kPromptIds;
            (decoding ? decode : prefill) += static_cast<int64_t>(chunk.tokens.size());
        }
        last_decode = decode > 0 ? decode : last_decode;
        ++steps;
        clock.advance(std::chrono::nanoseconds(std::llround(
            (a + b * static_cast<double>(prefill) + c * static_cast<double>(decode)) * 1e9)));
    };
    SchedulerConfig config;
    config.clock = &clock;
    config.max_batch_sequences = 16;
    config.max_batch_tokens = 256;
    Harness h(opts, config);
    auto prompt = [&](int length, int seed) {
        std::vector<TokenId> p;
        for (int i = 0; i < length; ++i) {
            p.push_back(kPromptIds + (seed * 7 + i) % 300);
        }
        return p;
    };
    auto first = h.submit(prompt(200, 0), 700);  // Decodes through every later step.
    REQUIRE(h.scheduler->step());
    const double idle_figure = 200.0 / (a + b * 200.0);
    CHECK(h.scheduler->load().prefill_tokens_per_s == doctest::Approx(idle_figure));
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (int r = 1; r <= 60; ++r) {
        sinks.push_back(h.submit(prompt(20 + (r * 37) % 280, r), 5 + (r * 13) % 36));
    }
    for (int i = 0; i < 2000 && !std::all_of(sinks.begin(), sinks.end(), [](const auto& s) {
                        return s->finished();
                    });
         ++i) {
        REQUIRE(h.scheduler->step());
    }
    REQUIRE(first->finished() == false);  // Every step decoded.
    CHECK(steps > 100);
    const ModelLoad load = h.scheduler->load();
    CHECK(load.prefill_tokens_per_s == doctest::Approx(1.0 / b).epsilon(0.03));
    REQUIRE(last_decode > 0);
    const double n = static_cast<double>(last_decode);
    CHECK(load.decode_tokens_per_s == doctest::Approx(n / (a + c * n)).epsilon(0.03));
    h.drain();
}

TEST_CASE("scheduler: load() reports queue, running, KV use and token rates") {
    FakeOptions opts;
    opts.kv_tokens = 100;
    SchedulerConfig config;
    config.max_batch_sequences = 1;  // The second request must wait.
    Harness h(opts, config);
    ModelLoad idle = h.scheduler->load();
    CHECK(idle.queue_depth == 0);
    CHECK(idle.running == 0);
    CHECK(idle.capacity == 1);
    CHECK(idle.kv_use == 0.0);
    auto a = h.submit({1, 2, 3, 4}, 10);
    auto b = h.submit({5, 6}, 2);
    CHECK(h.scheduler->load().queue_depth == 2);
    REQUIRE(h.scheduler->step());  // A's prefill: 4 prompt tokens in the cache.
    ModelLoad after_prefill = h.scheduler->load();
    CHECK(after_prefill.queue_depth == 1);
    CHECK(after_prefill.running == 1);
    CHECK(after_prefill.kv_use == doctest::Approx(0.04));
    CHECK(after_prefill.prefill_tokens_per_s == 0.0);  // Too few tokens to time a prefill.
    CHECK(after_prefill.decode_tokens_per_s == 0.0);
    REQUIRE(h.scheduler->step());  // A's first decode token.
    CHECK(h.scheduler->load().decode_tokens_per_s > 0.0);
    h.drain();
    REQUIRE(a->wait());
    REQUIRE(b->wait());
    ModelLoad done = h.scheduler->load();
    CHECK(done.queue_depth == 0);
    CHECK(done.running == 0);
    CHECK(done.kv_use == 0.0);
}

TEST_CASE("scheduler: load() reports the model's queue bound") {
    SchedulerConfig config;
    config.max_batch_sequences = 1;
    config.max_queue = 2;
    Harness h(FakeOptions{}, config);
    CHECK(h.scheduler->load().max_queue == 2);
    // At the bound the next submit is refused: routing must see the pool full there.
    auto a = h.submit({1, 2}, 2);
    auto b = h.submit({3, 4}, 2);
    CHECK(h.scheduler->load().queue_depth == h.scheduler->load().max_queue);
    h.drain();
    REQUIRE(a->wait());
    REQUIRE(b->wait());
    CHECK(Harness().scheduler->load().max_queue == 1024);  // The default engine.max_queue.
}

TEST_CASE("scheduler: a step's batch is in serving_stats() while its forward runs") {
    // The daemon's watchdog (daemon/liveness.cc) takes batch_sequences 0 for an idle engine. The
    // first step after a quiet spell must not run under the 0 published when the scheduler went
    // idle: a forward stalled there would never be noticed.
    FakeOptions opts;
    Scheduler* scheduler = nullptr;
    std::vector<int64_t> seen;
    opts.on_forward = [&] { seen.push_back(scheduler->serving_stats().batch_sequences); };
    Harness h(opts);
    scheduler = h.scheduler.get();
    h.submit({1, 2, 3}, 2);
    h.drain();
    CHECK(h.scheduler->serving_stats().batch_sequences == 0);  // Idle again.
    h.submit({4, 5}, 1);
    h.submit({6}, 1);
    h.drain();
    REQUIRE(seen.size() >= 3);
    for (size_t i = 0; i < seen.size(); ++i) {
        CAPTURE(i);
        CHECK(seen[i] > 0);
    }
}

TEST_CASE("scheduler: chunked prefill stays within max_batch_tokens, decode first") {
    SchedulerConfig config;
    config.max_batch_tokens = 4;
    Harness h({}, config);
    auto a = h.submit({5, 6}, 8);
    REQUIRE(h.scheduler->step());  // A's prefill
    std::vector<TokenId> long_prompt;
    for (int i = 0; i < 11; ++i) {
        long_prompt.push_back(40 + i);
    }
    auto b = h.submit(long_prompt, 2);
    h.drain();
    REQUIRE(b->wait());
    CHECK(a->ids() == FakeCausalLM::expected(h.options, {5, 6}, 8));
    CHECK(b->ids() == FakeCausalLM::expected(h.options, long_prompt, 2));
    const auto calls = h.log->snapshot();
    for (const auto& call : calls) {
        int total = 0;
        for (const auto& [slot, n] : call.chunks) {
            total += n;
        }
        CHECK(total <= 4);
    }
    // B's 11 prompt tokens arrive as 3 + 3 + 3 + 2 beside A's decode token.
    CHECK(calls[1].chunks.size() == 2);
    CHECK(calls[1].chunks[0].second == 1);
    CHECK(calls[1].chunks[1].second == 3);
    CHECK(calls[4].chunks[1].second == 2);
}

TEST_CASE("scheduler: cancel takes effect at the next step") {
    Harness h;
    auto sink = h.submit({1, 2}, 50);
    REQUIRE(h.scheduler->step());
    REQUIRE(h.scheduler->step());
    h.handles.back()->cancel();
    h.drain();
    auto finish = sink->wait();
    REQUIRE(finish);
    CHECK(finish->reason == FinishReason::kCancelled);
    CHECK(finish->usage.completion_tokens == 2);
    CHECK(sink->ids().size() == 2);
    CHECK(h.log->slots_in_use == 0);
    h.handles.back()->cancel();  // After the finish: a no-op.
    CHECK_FALSE(sink->protocol_violated());
}

TEST_CASE("scheduler: a request cancelled while queued finishes without running") {
    Harness h;
    auto sink = h.submit({1, 2}, 5);
    h.handles.back()->cancel();
    h.drain();
    auto finish = sink->wait();
    REQUIRE(finish);
    CHECK(finish->reason == FinishReason::kCancelled);
    CHECK(finish->usage.completion_tokens == 0);
    CHECK(h.log->snapshot().empty());
}

TEST_CASE("scheduler: a request no slot can take while nothing runs fails instead of spinning") {
    // Every slot is held outside the scheduler (as a leaked slot would be): with nothing running
    // none will come free, so the waiting request ends with 503 rather than loop forever.
    FakeOptions options;
    options.slots = 2;
    auto log = std::make_shared<FakeLog>();
    auto model = std::make_unique<FakeCausalLM>(options, log);
    REQUIRE(model->acquire_slot().ok());
    REQUIRE(model->acquire_slot().ok());
    SchedulerConfig config;
    config.eos_token_ids = options.eos;
    Scheduler scheduler(std::move(model), &micro_tokenizer(), config);
    auto sink = std::make_shared<CollectingSink>();
    SamplingParams params = Harness::greedy();
    params.max_tokens = 3;
    auto handle = scheduler.submit(SequenceRequest{"r", {1, 2}, params, 1, sink});
    REQUIRE(handle.ok());
    CHECK(scheduler.step());
    auto finish = sink->wait();
    REQUIRE(finish);
    CHECK(finish->reason == FinishReason::kError);
    CHECK(finish->error.code() == StatusCode::kUnavailable);
    CHECK(finish->error.message() == "the model has no free sequence slot");
    CHECK_FALSE(scheduler.step());  // Nothing is left.
    CHECK(log->snapshot().empty());
}

TEST_CASE("scheduler: a full queue answers kUnavailable") {
    SchedulerConfig config;
    config.max_queue = 2;
    Harness h({}, config);
    h.submit({1}, 1);
    h.submit({2}, 1);
    auto sink = std::make_shared<CollectingSink>();
    auto third = h.scheduler->submit(SequenceRequest{"r3", {3}, Harness::greedy(), 1, sink});
    CHECK(third.status().code() == StatusCode::kUnavailable);
    h.drain();
    auto fourth = h.scheduler->submit(SequenceRequest{"r4", {3}, Harness::greedy(), 1, sink});
    CHECK(fourth.ok());
}

TEST_CASE("scheduler: preemption under a small KV budget still completes with the same tokens") {
    FakeOptions opts;
    opts.kv_tokens = 40;  // Four requests of 8 + 12 tokens would need 80.
    Harness h(opts);
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    std::vector<std::vector<TokenId>> prompts;
    for (int r = 0; r < 4; ++r) {
        prompts.push_back(eight_tokens(r));
        sinks.push_back(h.submit(prompts.back(), 12));
    }
    h.drain();
    for (int r = 0; r < 4; ++r) {
        auto finish = sinks[r]->wait();
        REQUIRE(finish);
        CHECK(finish->reason == FinishReason::kLength);
        CHECK(finish->usage.completion_tokens == 12);
        CHECK(sinks[r]->ids() == FakeCausalLM::expected(opts, prompts[r], 12));
        CHECK_FALSE(sinks[r]->protocol_violated());
    }
    CHECK(h.scheduler->stats().preemptions > 0);
    CHECK(h.log->slots_in_use == 0);
}

// Two requests of eight-token prompts under a KV cache of ten 4-token blocks, each step one
// second on `clock`: both decode until the cache is full (20 positions each), then the newer
// (`b`) is preempted without a saved copy, `a` finishes, and `b` comes back. Its two prompt blocks
// are still in the prefix cache, so it attaches them and recomputes positions 8-19 (the 12 the
// cache lost) with its pending token 20 in one chunk of 13. Steps until idle; the decode rate
// after each step goes to `decode_rates`.
struct RecomputeRun {
    std::shared_ptr<FakeLog> log;
    SchedulerStats stats;
    std::vector<double> decode_rates;
};

RecomputeRun run_recompute_after_preemption() {
    ManualClock clock;
    FakeOptions opts;
    opts.block_tokens = 4;
    opts.kv_tokens = 40;
    opts.on_forward = [&clock] { clock.advance(std::chrono::seconds(1)); };
    SchedulerConfig config;
    config.clock = &clock;
    Harness h(opts, config);
    auto a = h.submit(eight_tokens(0), 14);
    auto b = h.submit(eight_tokens(1), 20);
    RecomputeRun run;
    for (int i = 0; i < 200 && h.scheduler->step(); ++i) {
        run.decode_rates.push_back(h.scheduler->load().decode_tokens_per_s);
    }
    REQUIRE(a->wait());
    REQUIRE(b->wait());
    CHECK(a->ids() == FakeCausalLM::expected(opts, eight_tokens(0), 14));
    CHECK(b->ids() == FakeCausalLM::expected(opts, eight_tokens(1), 20));
    run.log = h.log;
    run.stats = h.scheduler->stats();
    return run;
}

TEST_CASE("scheduler: a recompute chunk past the prompt is prefill, not decode tokens") {
    const RecomputeRun run = run_recompute_after_preemption();
    REQUIRE(run.stats.preemptions == 1);
    REQUIRE(run.stats.swapped_preemptions == 0);
    // The recompute ran: one chunk of more than one token that starts past the prompt.
    bool recomputed = false;
    for (const testing::ForwardCall& call : run.log->snapshot()) {
        for (const auto& [slot, tokens] : call.chunks) {
            recomputed = recomputed || tokens == 13;
        }
    }
    REQUIRE(recomputed);
    // A step decodes at most one token per sequence, two here, in one second: the rate (a
    // moving average of the steps' rates, then the step cost fit's decode-only step of the last
    // batch, rounding aside) never exceeds 2 tokens/s. The recompute chunk counted as decode
    // tokens would have taken it past 4.
    for (size_t i = 0; i < run.decode_rates.size(); ++i) {
        CAPTURE(i);
        CHECK(run.decode_rates[i] <= 2.0 * (1.0 + 1e-6));
    }
}

TEST_CASE("scheduler: recompute_tokens counts the positions computed again, not those cached") {
    // b held 20 positions when preempted; its two prompt blocks (8 positions) are attached from
    // the prefix cache at its return, so 12 are computed again.
    const RecomputeRun run = run_recompute_after_preemption();
    REQUIRE(run.stats.preemptions == 1);
    CHECK(run.stats.recompute_tokens == 12);
}

TEST_CASE("scheduler: echoed prompts with logprobs survive preemption, sent once, whole") {
    // As above, every request echoing its prompt with logprobs: those preempted after their
    // first token are recomputed without asking for the prompt's logits again.
    FakeOptions opts;
    opts.kv_tokens = 40;
    Harness h(opts);
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    std::vector<std::vector<TokenId>> prompts;
    for (int r = 0; r < 4; ++r) {
        prompts.push_back(eight_tokens(r));
        sinks.push_back(h.submit_echo(prompts.back(), 12));
    }
    h.drain();
    for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        REQUIRE(sinks[r]->wait());
        CHECK(sinks[r]->ids() == FakeCausalLM::expected(opts, prompts[r], 12));
        CHECK_FALSE(sinks[r]->protocol_violated());
        const std::vector<TokenLogprob> echoed = sinks[r]->prompt();
        REQUIRE(echoed.size() == 8);
        CHECK(std::isnan(echoed[0].logprob));
        for (size_t p = 1; p < echoed.size(); ++p) {
            CHECK(echoed[p].id == prompts[r][p]);
            CHECK(std::isfinite(echoed[p].logprob));
        }
    }
    CHECK(h.scheduler->stats().preemptions > 0);
    CHECK(h.scheduler->stats().recompute_tokens > 0);
    CHECK(h.log->slots_in_use == 0);
}

TEST_CASE("scheduler: the logits of an echoed prompt's every position are not kept after it") {
    // A chunk of prompt positions with logits grew the buffer to rows x vocab, and the buffer
    // kept that size for good (1.2 GB for 2048 positions of a 152k vocabulary).
    SchedulerConfig config;
    config.max_batch_sequences = 2;
    Harness h({}, config);
    std::vector<TokenId> prompt;
    for (int i = 0; i < 40; ++i) {
        prompt.push_back(100 + i);
    }
    auto sink = h.submit_echo(prompt, 3);
    REQUIRE(h.scheduler->step());  // The prompt in one chunk, each position's logits.
    const size_t vocab = static_cast<size_t>(h.options.vocab_size);
    CHECK(h.scheduler->logits_buffer_bytes() <= 2 * vocab * sizeof(float));
    h.drain();
    REQUIRE(sink->wait());
    REQUIRE(sink->prompt().size() == 40);
    for (size_t p = 1; p < 40; ++p) {
        CHECK(std::isfinite(sink->prompt()[p].logprob));
    }
    CHECK(sink->ids() == FakeCausalLM::expected(h.options, prompt, 3));
}

TEST_CASE("scheduler: a json_object reply ends when the object closes, and is valid throughout") {
    // The model wants {"a":1} and then 'x' for ever: the reply is the object, ended "stop".
    FakeOptions opts;
    const std::string object = R"({"a":1})";
    opts.next = [object](std::span<const TokenId> history) -> TokenId {
        const size_t at = history.size() - 2;  // After the two prompt tokens.
        return at < object.size() ? static_cast<unsigned char>(object[at]) : 'x';
    };
    Harness h(opts);
    SamplingParams json = Harness::greedy();
    json.json.schema = sampling::JsonSchema::any_object();
    auto closed = h.submit({1, 2}, 40, json);
    // A model that wants what JSON does not allow ('x' and the end of sequence at once): the
    // filter picks the likeliest allowed token each time, never a special one.
    FakeOptions stubborn;
    stubborn.next = [](std::span<const TokenId> history) -> TokenId {
        return history.size() % 2 == 0 ? 'x' : 509;
    };
    Harness g(stubborn);
    auto forced = g.submit({1, 2}, 40, json);
    h.drain();
    g.drain();
    auto f = closed->wait();
    REQUIRE(f);
    CHECK(f->reason == FinishReason::kStop);
    CHECK(closed->text() == object);
    CHECK(f->usage.completion_tokens == static_cast<int64_t>(object.size()));
    auto g_finish = forced->wait();
    REQUIRE(g_finish);
    CHECK(g_finish->reason != FinishReason::kError);
    const std::string text = forced->text();
    REQUIRE_FALSE(text.empty());
    CHECK(text[0] == '{');
    sampling::JsonPrefix check;
    CHECK(check.feed(text));  // Every prefix of the reply is an object's beginning.
    CHECK(check.complete() == (g_finish->reason == FinishReason::kStop));
    for (TokenId id : forced->ids()) {
        CHECK_FALSE(micro_tokenizer().is_special(id));
    }
}

TEST_CASE(
    "scheduler: a json_schema reply keeps to the schema and ends when the document "
    "closes") {
    // A model that wants 'x' and the end of sequence, never what the schema asks for: the
    // filter still leads it to a document with the required keys, in order, and ends it there.
    auto schema = sampling::JsonSchema::compile(boost::json::parse(
        R"({"type":"object","properties":{"ok":{"type":"boolean"},)"
        R"("n":{"type":"array","items":{"enum":[7,"x"]},"minItems":2,"maxItems":2}},)"
        R"("required":["ok","n"],"additionalProperties":false})"));
    REQUIRE(schema.ok());
    FakeOptions stubborn;
    stubborn.next = [](std::span<const TokenId> history) -> TokenId {
        return history.size() % 2 == 0 ? 'x' : 509;
    };
    Harness h(stubborn);
    SamplingParams params = Harness::greedy();
    params.json.schema = *schema;
    auto sink = h.submit({1, 2}, 400, params);
    h.drain();
    auto finish = sink->wait();
    REQUIRE(finish);
    CHECK(finish->reason == FinishReason::kStop);
    const std::string text = sink->text();
    CAPTURE(text);
    const boost::json::value doc = boost::json::parse(text);
    const boost::json::object& o = doc.as_object();
    REQUIRE(o.size() == 2);
    CHECK(o.at("ok").is_bool());
    REQUIRE(o.at("n").as_array().size() == 2);
    for (const boost::json::value& e : o.at("n").as_array()) {
        CHECK((e == boost::json::value(7) || e == boost::json::value("x")));
    }
}

TEST_CASE(
    "scheduler: a triggered JSON reply is held from the trigger to the tail, again and again") {
    // As tool_choice "auto" with a strict tool: free text, then the trigger (a call's opening),
    // a head, a document, the tail; then free text again. Tokens may span the trigger's end.
    auto schema = sampling::JsonSchema::compile(boost::json::parse(
        R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],)"
        R"("additionalProperties":false})"));
    REQUIRE(schema.ok());
    sched::SequenceRequest request;
    request.prompt = {1, 2};
    request.sampling.json.heads = {{"f:", *schema}, {"g:", *schema}};
    request.sampling.json.tail = "]";
    request.sampling.json.trigger = "<call>";
    request.sampling.json.again = true;
    sched::Sequence seq(std::move(request), &micro_tokenizer());
    CHECK_FALSE(seq.json);
    CHECK(seq.trigger_end("Hi <ca") == std::string::npos);
    CHECK(seq.follow_json("Hi <ca"));
    CHECK_FALSE(seq.json);
    CHECK(seq.trigger_end("ll>") == 3);    // Completed across tokens,
    CHECK(seq.trigger_end("ll>f:") == 3);  // and followed by a head's bytes.
    CHECK(seq.follow_json("ll>f:"));
    REQUIRE(seq.json);
    CHECK_FALSE(seq.json->accepts("{\"b\""));  // Held to the schema.
    CHECK(seq.follow_json("{\"a\":1}"));
    REQUIRE(seq.json);
    CHECK(seq.follow_json("]"));  // The tail: the reply is free again.
    CHECK_FALSE(seq.json);
    CHECK(seq.follow_json(" and <call"));
    CHECK_FALSE(seq.json);
    CHECK(seq.follow_json(">g:{\"a\":2}]"));  // Trigger, head, document and tail in one.
    CHECK_FALSE(seq.json);
    CHECK(seq.trigger_end("<call>") == 6);
    CHECK(seq.trigger_end("x<cal") == std::string::npos);

    // As tool_choice "required": held from the start (the first opening is in the prompt), then
    // with parallel calls free until the next opening; without them the reply ends with the
    // tail (its prefix stays complete, which the scheduler ends the reply on).
    for (const bool again : {true, false}) {
        CAPTURE(again);
        sched::SequenceRequest required;
        required.prompt = {1, 2};
        required.sampling.json.heads = {{"f:", *schema}};
        required.sampling.json.tail = "]";
        required.sampling.json.trigger = "<call>";
        required.sampling.json.held_at_start = true;
        required.sampling.json.again = again;
        sched::Sequence first(std::move(required), &micro_tokenizer());
        REQUIRE(first.json);
        CHECK_FALSE(first.json->accepts("<call>"));
        CHECK(first.follow_json("f:{\"a\":1}]"));
        CHECK(first.json.has_value() == !again);
        if (!again) {
            CHECK(first.json->complete());
            CHECK_FALSE(first.follow_json("<call>"));  // Nothing after the tail.
            continue;
        }
        CHECK(first.follow_json("then <call>f:"));
        REQUIRE(first.json);
        CHECK_FALSE(first.json->accepts("{\"b\""));
    }
}

TEST_CASE("scheduler: requests cancelled while queued do not reopen admission after a KV "
          "preemption") {
    // Three requests outgrow the KV budget, so some are preempted; ten more arrive once that
    // happened and are cancelled while queued (clients that time out under load). Their
    // finishing frees no KV blocks: it must not reopen admission, which would only preempt
    // again at once.
    auto run = [](bool queued_cancels) {
        FakeOptions opts;
        opts.kv_tokens = 48;
        Harness h(opts);
        std::vector<std::shared_ptr<CollectingSink>> sinks;
        for (int r = 0; r < 3; ++r) {
            sinks.push_back(h.submit({static_cast<TokenId>(100 + r), 7, 8, 9}, 20));
        }
        for (int i = 0; i < 10000 && h.scheduler->stats().preemptions == 0; ++i) {
            REQUIRE(h.scheduler->step());
        }
        if (queued_cancels) {
            for (int r = 0; r < 10; ++r) {
                h.submit({static_cast<TokenId>(200 + r), 1, 2}, 4);
                h.handles.back()->cancel();
            }
        }
        h.drain();
        for (const auto& sink : sinks) {
            auto finish = sink->wait();
            REQUIRE(finish);
            CHECK(finish->reason == FinishReason::kLength);
        }
        CHECK(h.log->slots_in_use == 0);
        return h.scheduler->stats().preemptions;
    };
    const int64_t alone = run(false);
    CHECK(alone > 0);
    CHECK(run(true) == alone);
}

TEST_CASE("scheduler: seeded sampling gives the same tokens alone and batched with preemption") {
    SamplingParams p;
    p.temperature = 1.5f;
    p.top_k = 40;
    p.top_p = 0.9f;
    auto run = [&](int64_t kv_tokens, int requests) {
        FakeOptions opts;
        opts.kv_tokens = kv_tokens;
        Harness h(opts);
        std::vector<std::shared_ptr<CollectingSink>> sinks;
        for (int r = 0; r < requests; ++r) {
            sinks.push_back(h.submit({static_cast<TokenId>(200 + r), 7, 7, 7}, 10, p));
        }
        h.drain();
        std::vector<std::vector<TokenId>> out;
        for (auto& sink : sinks) {
            REQUIRE(sink->wait());
            out.push_back(sink->ids());
        }
        return std::make_pair(out, h.scheduler->stats().preemptions);
    };
    const auto [batched, preemptions] = run(30, 4);
    CHECK(preemptions > 0);
    for (int r = 0; r < 4; ++r) {
        FakeOptions opts;
        Harness alone(opts);
        auto sink = alone.submit({static_cast<TokenId>(200 + r), 7, 7, 7}, 10, p);
        alone.drain();
        REQUIRE(sink->wait());
        CHECK(sink->ids() == batched[r]);
    }
}

TEST_CASE("scheduler: slots limit the batch, the rest wait their turn") {
    FakeOptions opts;
    opts.slots = 2;
    Harness h(opts);
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (int r = 0; r < 5; ++r) {
        sinks.push_back(h.submit({static_cast<TokenId>(r + 1)}, 4));
    }
    h.drain();
    for (int r = 0; r < 5; ++r) {
        REQUIRE(sinks[r]->wait());
        CHECK(sinks[r]->ids() == FakeCausalLM::expected(opts, {static_cast<TokenId>(r + 1)}, 4));
    }
    CHECK(h.scheduler->stats().max_running == 2);
}

TEST_CASE("scheduler: a sequence the KV cache cannot hold alone ends with an error") {
    FakeOptions opts;
    opts.kv_tokens = 5;
    Harness h(opts);
    auto sink = h.submit({1, 2, 3, 4, 5, 6, 7, 8}, 2);
    h.drain();
    auto finish = sink->wait();
    REQUIRE(finish);
    CHECK(finish->reason == FinishReason::kError);
    // The server's capacity, not the client's rate: a 503, not a 429 (api_error.cc).
    CHECK(finish->error.code() == StatusCode::kUnavailable);
    CHECK(h.log->slots_in_use == 0);
}

TEST_CASE("scheduler: a failing forward ends that batch's requests with the error") {
    FakeOptions opts;
    opts.fail_call = 2;
    Harness h(opts);
    auto a = h.submit({1, 2}, 5);
    auto b = h.submit({3, 4}, 5);
    h.drain();
    for (auto* sink : {a.get(), b.get()}) {
        auto finish = sink->wait();
        REQUIRE(finish);
        CHECK(finish->reason == FinishReason::kError);
        CHECK(finish->error.code() == StatusCode::kInternal);
        CHECK(finish->usage.completion_tokens == 2);
    }
    CHECK(h.log->slots_in_use == 0);
    auto c = h.submit({5}, 3);
    h.drain();
    REQUIRE(c->wait());
    CHECK(c->wait()->reason == FinishReason::kLength);
}

TEST_CASE("scheduler: NaN logits end that request with an error, not with garbage tokens") {
    FakeOptions opts;
    opts.nan_slot = 0;  // The first request's; its prompt's logits are fine.
    Harness h(opts);
    auto bad = h.submit({1, 2}, 5);
    auto good = h.submit({3, 4}, 5);
    h.drain();
    auto finish = bad->wait();
    REQUIRE(finish);
    CHECK(finish->reason == FinishReason::kError);
    CHECK(finish->error.code() == StatusCode::kInternal);
    CHECK(finish->error.message().find("NaN") != std::string::npos);
    CHECK(finish->usage.completion_tokens == 1);
    REQUIRE(good->wait());
    CHECK(good->wait()->reason == FinishReason::kLength);
    CHECK(h.log->slots_in_use == 0);
}

TEST_CASE("scheduler: an infinite logit ends that request with an error, as NaN does") {
    // +inf makes the softmax NaN (inf - inf): the sampler's walk found no token (an index of -1
    // read before the candidates, with top_p) or drew a zero-probability one.
    FakeOptions opts;
    opts.nan_slot = 0;
    opts.fault_value = std::numeric_limits<float>::infinity();
    Harness h(opts);
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_p = 0.9f;
    auto bad = h.submit({1, 2}, 5, p);
    auto good = h.submit({3, 4}, 5);
    h.drain();
    auto finish = bad->wait();
    REQUIRE(finish);
    CHECK(finish->reason == FinishReason::kError);
    CHECK(finish->error.message().find("infinite") != std::string::npos);
    REQUIRE(good->wait());
    CHECK(good->wait()->reason == FinishReason::kLength);
    // Minus infinity is a logit masked out, not a fault.
    opts.fault_value = -std::numeric_limits<float>::infinity();
    Harness masked(opts);
    auto fine = masked.submit({1, 2}, 5, p);
    masked.drain();
    REQUIRE(fine->wait());
    CHECK(fine->wait()->reason == FinishReason::kLength);
}

FakeOptions scripted(std::string script) {
    FakeOptions opts;
    opts.next = [script](std::span<const TokenId> history) -> TokenId {
        // The script continues after the prompt, which is one token here.
        const size_t i = history.size() - 1;
        return i < script.size() ? static_cast<unsigned char>(script[i]) : 'z';
    };
    return opts;
}

TEST_CASE("scheduler: a stop string ends generation and is not returned") {
    Harness h(scripted("Hello END more"));
    SamplingParams p = Harness::greedy();
    p.stop = {"END"};
    auto sink = h.submit({1}, 20, p);
    h.drain();
    auto finish = sink->wait();
    REQUIRE(finish);
    CHECK(finish->reason == FinishReason::kStop);
    CHECK(sink->text() == "Hello ");
    CHECK(finish->usage.completion_tokens == 9);  // "Hello END"
}

TEST_CASE("scheduler: held-back text is released when generation ends by length") {
    Harness h(scripted("abcEN"));
    SamplingParams p = Harness::greedy();
    p.stop = {"END"};
    auto sink = h.submit({1}, 5, p);
    h.drain();
    auto finish = sink->wait();
    REQUIRE(finish);
    CHECK(finish->reason == FinishReason::kLength);
    CHECK(sink->text() == "abcEN");
}

TEST_CASE("scheduler: logprobs travel with their text and end where a stop string starts") {
    // Tokens are single characters: "EN" is held as a possible "END", then shown when "E" breaks
    // it; the second "END" stops the sequence and its three tokens' logprobs are never sent.
    Harness h(scripted("Hi ENEND more"));
    SamplingParams p = Harness::greedy();
    p.stop = {"END"};
    p.logprobs = true;
    auto sink = h.submit({1}, 20, p);
    h.drain();
    auto finish = sink->wait();
    REQUIRE(finish);
    CHECK(finish->reason == FinishReason::kStop);
    CHECK(sink->text() == "Hi EN");
    CHECK(finish->usage.completion_tokens == 8);
    const auto lps = sink->logprobs();
    REQUIRE(lps.size() == 5);
    for (size_t i = 0; i < lps.size(); ++i) {
        CHECK(lps[i].token == std::string(1, "Hi EN"[i]));
        CHECK(lps[i].text_offset == i);
    }
    CHECK_FALSE(sink->protocol_violated());

    // Ended by length, the held tail and its logprobs are all released.
    Harness by_length(scripted("abcEN"));
    auto sink2 = by_length.submit({1}, 5, p);
    by_length.drain();
    REQUIRE(sink2->wait());
    CHECK(sink2->text() == "abcEN");
    CHECK(sink2->logprobs().size() == 5);
    CHECK(sink2->logprobs().back().text_offset == 4);
    CHECK_FALSE(sink2->protocol_violated());
}

TEST_CASE("scheduler: EOS ends generation, is counted, and adds no text") {
    FakeOptions opts = scripted("hi");
    opts.next = [](std::span<const TokenId> history) -> TokenId {
        return history.size() == 3 ? 509 : 'h';
    };
    Harness h(opts);
    SamplingParams with_logprobs = Harness::greedy();
    with_logprobs.logprobs = true;
    auto sink = h.submit({1}, 10, with_logprobs);
    h.drain();
    auto finish = sink->wait();
    REQUIRE(finish);
    CHECK(finish->reason == FinishReason::kStop);
    CHECK(sink->text() == "hh");
    CHECK(sink->ids() == std::vector<TokenId>{'h', 'h', 509});
    CHECK(finish->usage.completion_tokens == 3);
    // Its logprob is not reported: the tokens of the logprobs join to the text.
    const auto lps = sink->logprobs();
    REQUIRE(lps.size() == 2);
    CHECK(lps[1].token == "h");

    Harness ignoring(opts);
    SamplingParams p = Harness::greedy();
    p.ignore_eos = true;
    auto sink2 = ignoring.submit({1}, 4, p);
    ignoring.drain();
    REQUIRE(sink2->wait());
    CHECK(sink2->wait()->reason == FinishReason::kLength);
    CHECK(sink2->ids().size() == 4);
}

TEST_CASE("scheduler: special tokens that are not EOS add no text") {
    FakeOptions opts;
    opts.next = [](std::span<const TokenId> history) -> TokenId {
        return history.size() == 2 ? 511 : 'k';  // <|im_end|> is not an EOS of this model
    };
    Harness h(opts);
    auto sink = h.submit({1}, 3);
    h.drain();
    REQUIRE(sink->wait());
    CHECK(sink->ids() == std::vector<TokenId>{'k', 511, 'k'});
    CHECK(sink->text() == "kk");
}

TEST_CASE("scheduler: a character split over tokens streams whole") {
    // U+00E9 as the two byte tokens 0xC3 0xA9.
    FakeOptions opts;
    opts.next = [](std::span<const TokenId> history) -> TokenId {
        return history.size() % 2 == 1 ? 0xC3 : 0xA9;
    };
    Harness h(opts);
    auto sink = h.submit({1}, 4);
    h.drain();
    REQUIRE(sink->wait());
    CHECK(sink->text() == "\xC3\xA9\xC3\xA9");
}

TEST_CASE("scheduler: a stop string's byte tokens send no logprob, not even while incomplete") {
    // "a", then U+00E9 as the byte tokens 0xC3 0xA9 (the stop string), then "b".
    FakeOptions opts;
    opts.next = [](std::span<const TokenId> history) -> TokenId {
        static constexpr TokenId kScript[] = {'a', 0xC3, 0xA9, 'b'};
        return kScript[std::min<size_t>(history.size() - 1, 3)];
    };
    for (const bool stream_stop : {true, false}) {
        CAPTURE(stream_stop);
        Harness h(opts);
        SamplingParams p = Harness::greedy();
        if (stream_stop) {
            p.stop = {"\xC3\xA9"};
        }
        p.logprobs = true;
        auto sink = h.submit({1}, 4, p);
        h.drain();
        REQUIRE(sink->wait());
        const auto lps = sink->logprobs();
        if (stream_stop) {
            CHECK(sink->text() == "a");
            REQUIRE(lps.size() == 1);  // 0xC3 was held by the UTF-8 decoder, then stopped.
            CHECK(lps[0].token == "a");
        } else {
            CHECK(sink->text() == "a\xC3\xA9" "b");
            CHECK(sink->ids() == std::vector<TokenId>{'a', 0xC3, 0xA9, 'b'});
            CHECK(lps.size() == 4);
        }
        CHECK_FALSE(sink->protocol_violated());
    }
}

TEST_CASE("scheduler: logprobs of the chosen token and alternatives are streamed") {
    Harness h;
    SamplingParams p = Harness::greedy();
    p.logprobs = true;
    p.top_logprobs = 3;
    auto sink = h.submit({7}, 3, p);
    h.drain();
    REQUIRE(sink->wait());
    const auto lps = sink->logprobs();
    REQUIRE(lps.size() == 3);
    const auto ids = sink->ids();
    for (size_t i = 0; i < 3; ++i) {
        CHECK(lps[i].id == ids[i]);
        // The chosen logit is 10, the 511 others are in [0, 1): log(1 / (1 + 511 e^-9.5)) is
        // about -0.04.
        CHECK(lps[i].logprob < -0.02f);
        CHECK(lps[i].logprob > -0.06f);
        REQUIRE(lps[i].top.size() == 3);
        CHECK(lps[i].top[0].id == ids[i]);
        CHECK(lps[i].top[0].logprob == lps[i].logprob);
        CHECK(lps[i].top[1].logprob >= lps[i].top[2].logprob);
        CHECK(lps[i].top[1].logprob < -9.0f);
        CHECK(lps[i].token == std::string(1, static_cast<char>(ids[i])));
    }
}

TEST_CASE("scheduler: stop() cancels queued and running requests") {
    Harness h;
    auto running = h.submit({1}, 100);
    REQUIRE(h.scheduler->step());
    auto queued = h.submit({2}, 100);
    h.scheduler->stop();
    REQUIRE(running->wait());
    REQUIRE(queued->wait());
    CHECK(running->wait()->reason == FinishReason::kCancelled);
    CHECK(queued->wait()->reason == FinishReason::kCancelled);
    CHECK(h.log->slots_in_use == 0);
    auto sink = std::make_shared<CollectingSink>();
    CHECK(h.scheduler->submit(SequenceRequest{"late", {1}, Harness::greedy(), 1, sink})
              .status()
              .code() == StatusCode::kUnavailable);
}

TEST_CASE(
    "scheduler: the sequences of a step are sampled on the model's threads at once, = in turn") {
    // Eight sampled requests (top-p, logprobs) through one batch: sampled each on a thread of
    // its own, all at once, they give the tokens and logprobs they give in turn.
    auto run = [](bool threads) {
        FakeOptions opts;
        opts.host_threads = threads;
        Harness h(opts);
        std::vector<std::shared_ptr<CollectingSink>> sinks;
        for (int r = 0; r < 8; ++r) {
            SamplingParams p;
            p.temperature = 1.5f;
            p.top_p = 0.9f;
            p.logprobs = true;
            p.top_logprobs = 2;
            sinks.push_back(h.submit(eight_tokens(r), 12, p));
        }
        h.drain();
        CHECK(h.log->most_host_tasks == 8);
        std::vector<std::pair<std::vector<TokenId>, std::vector<float>>> out;
        for (const auto& sink : sinks) {
            REQUIRE(sink->wait());
            std::vector<float> lps;
            for (const TokenLogprob& lp : sink->logprobs()) {
                lps.push_back(lp.logprob);
            }
            out.emplace_back(sink->ids(), lps);
            CHECK(sink->ids().size() == 12);
        }
        return out;
    };
    const auto in_turn = run(false);
    CHECK(run(true) == in_turn);
    CHECK(in_turn[0].first != in_turn[1].first);  // Drawn, each from its own prompt.
}

}  // namespace
}  // namespace edge::engine::sched
