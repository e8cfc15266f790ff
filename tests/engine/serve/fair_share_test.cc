// Weighted fair sharing between tenants in the scheduler, in simulated steps on FakeCausalLM:
// the FairQueue's DRR order on its own, then a flooding tenant against a light one (share of
// generated tokens, time to first token), weights, and FIFO within a tenant.

#include <doctest/doctest.h>

#include <map>

#include "engine/sched/fair_queue.h"
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

SequenceRequest request(const std::string& tenant, int32_t weight, int32_t prompt_len,
                        int32_t max_tokens, std::shared_ptr<GenerationSink> sink) {
    SequenceRequest r;
    r.request_id = tenant;
    for (int32_t i = 0; i < prompt_len; ++i) {
        r.prompt.push_back(40 + i);
    }
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.seed = 1;
    r.sink = std::move(sink);
    r.tenant = tenant;
    r.tenant_weight = weight;
    return r;
}

std::unique_ptr<Sequence> sequence(const std::string& tenant, int32_t weight, int32_t prompt_len,
                                   int32_t max_tokens) {
    return std::make_unique<Sequence>(
        request(tenant, weight, prompt_len, max_tokens, std::make_shared<CollectingSink>()),
        &micro_tokenizer());
}

struct Tracked {
    std::string tenant;
    std::shared_ptr<CollectingSink> sink;
    int64_t submitted_step = 0;
    int64_t first_token_step = -1;
};

// A scheduler on a fake model, stepped by the test; each step's tokens are counted per tenant.
struct Sim {
    explicit Sim(int32_t batch) {
        FakeOptions options;
        options.slots = batch;
        options.max_context = 512;
        SchedulerConfig config;
        config.max_batch_sequences = batch;
        config.max_queue = 100000;
        config.fair_quantum_tokens = 16;
        config.eos_token_ids = options.eos;
        scheduler = std::make_unique<Scheduler>(
            std::make_unique<FakeCausalLM>(options, std::make_shared<FakeLog>()),
            &micro_tokenizer(), config);
    }

    size_t submit(const std::string& tenant, int32_t weight, int32_t max_tokens) {
        auto sink = std::make_shared<CollectingSink>();
        auto handle = scheduler->submit(request(tenant, weight, 4, max_tokens, sink));
        REQUIRE(handle.ok());
        handles.push_back(*handle);
        tracked.push_back(Tracked{tenant, sink, step_no, -1});
        return tracked.size() - 1;
    }

    void step() {
        REQUIRE(scheduler->step());
        ++step_no;
        for (Tracked& t : tracked) {
            if (t.first_token_step < 0 && !t.sink->ids().empty()) {
                t.first_token_step = step_no;
            }
        }
    }

    int64_t tokens(const std::string& tenant) {
        int64_t n = 0;
        for (Tracked& t : tracked) {
            if (t.tenant == tenant) {
                n += static_cast<int64_t>(t.sink->ids().size());
            }
        }
        return n;
    }

    bool all_finished(const std::string& tenant) {
        for (Tracked& t : tracked) {
            if (t.tenant == tenant && !t.sink->finished()) {
                return false;
            }
        }
        return true;
    }

    int64_t max_ttft(const std::string& tenant) {
        int64_t worst = 0;
        for (Tracked& t : tracked) {
            if (t.tenant == tenant) {
                REQUIRE(t.first_token_step >= 0);
                worst = std::max(worst, t.first_token_step - t.submitted_step);
            }
        }
        return worst;
    }

    std::unique_ptr<Scheduler> scheduler;
    std::vector<std::shared_ptr<GenerationHandle>> handles;
    std::vector<Tracked> tracked;
    int64_t step_no = 0;
};

}  // namespace

TEST_CASE("fair queue: DRR alternates by tokens, weights scale the share, FIFO per tenant") {
    FairQueue q(10);
    for (int i = 0; i < 6; ++i) {
        q.push_back(sequence("a", 1, 5, 5));  // Cost 10 each.
    }
    for (int i = 0; i < 3; ++i) {
        auto s = sequence("b", 1, 5, 5);
        s->request_id = "b" + std::to_string(i);
        q.push_back(std::move(s));
    }
    std::string order;
    std::vector<std::string> b_ids;
    while (!q.empty()) {
        std::unique_ptr<Sequence> s = q.pop();
        order += s->tenant;
        if (s->tenant == "b") {
            b_ids.push_back(s->request_id);
        }
    }
    CHECK(order == "abababaaa");
    CHECK(b_ids == std::vector<std::string>{"b0", "b1", "b2"});

    // Weight 3 against 1: three of c's requests per one of d's.
    FairQueue w(10);
    for (int i = 0; i < 9; ++i) {
        w.push_back(sequence("c", 3, 5, 5));
        w.push_back(sequence("d", 1, 5, 5));
    }
    std::string first;
    for (int i = 0; i < 8; ++i) {
        first += w.pop()->tenant;
    }
    CHECK(first == "cccdcccd");

    // A big request waits until its tenant's deficit covers it; others keep going meanwhile.
    FairQueue big(10);
    big.push_back(sequence("x", 1, 20, 20));  // Cost 40: four turns.
    for (int i = 0; i < 5; ++i) {
        big.push_back(sequence("y", 1, 5, 5));
    }
    std::string seen;
    while (!big.empty()) {
        seen += big.pop()->tenant;
    }
    CHECK(seen == "yyyxyy");

    // Preempted requests go back first in their tenant's queue, refunded.
    FairQueue pre(10);
    pre.push_back(sequence("a", 1, 5, 5));
    std::unique_ptr<Sequence> taken = pre.pop();
    taken->request_id = "again";
    pre.push_back(sequence("a", 1, 5, 5));
    pre.push_front(std::move(taken));
    CHECK(pre.size() == 2);
    CHECK(pre.pop()->request_id == "again");
    auto cancelled = pre.take_if([](const Sequence&) { return true; });
    CHECK(cancelled.size() == 1);
    CHECK(pre.empty());
    CHECK(pre.pop() == nullptr);
}

TEST_CASE("fair share: a tenant sending 20x the requests gets half the tokens, not 20/21") {
    Sim sim(4);
    // A floods first: 800 requests queued before B's 40.
    for (int i = 0; i < 800; ++i) {
        sim.submit("a", 1, 8);
    }
    for (int i = 0; i < 40; ++i) {
        sim.submit("b", 1, 8);
    }
    int steps = 0;
    while (!sim.all_finished("b") && steps < 5000) {
        sim.step();
        ++steps;
    }
    REQUIRE(sim.all_finished("b"));
    const double a = static_cast<double>(sim.tokens("a"));
    const double b = static_cast<double>(sim.tokens("b"));
    const double share = b / (a + b);
    MESSAGE("a tokens " << a << ", b tokens " << b << ", steps " << steps);
    CHECK(share >= 0.45);
    CHECK(share <= 0.55);
    // FIFO within B: its requests got their first tokens in submission order.
    int64_t last = 0;
    for (const Tracked& t : sim.tracked) {
        if (t.tenant == "b") {
            CHECK(t.first_token_step >= last);
            last = t.first_token_step;
        }
    }

    // B alone, for the time-to-first-token bound.
    Sim alone(4);
    for (int i = 0; i < 40; ++i) {
        alone.submit("b", 1, 8);
    }
    while (!alone.all_finished("b")) {
        alone.step();
    }
    const int64_t ttft_flooded = sim.max_ttft("b");
    const int64_t ttft_alone = alone.max_ttft("b");
    MESSAGE("B's worst time to first token: " << ttft_flooded << " steps flooded, " << ttft_alone
                                           << " alone");
    // Half the capacity: about twice as long, plus one request's length of slack.
    CHECK(ttft_flooded <= 2 * ttft_alone + 10);
}

TEST_CASE("fair share: a late light request starts within one request's length of a flood") {
    Sim sim(4);
    for (int i = 0; i < 400; ++i) {
        sim.submit("a", 1, 8);
    }
    for (int i = 0; i < 30; ++i) {
        sim.step();
    }
    size_t b = sim.submit("b", 1, 8);
    while (sim.tracked[b].first_token_step < 0 && sim.step_no < 1000) {
        sim.step();
    }
    // FIFO would make it wait for ~370 requests of 9 steps / 4 slots; DRR lets it in as soon as a
    // slot frees (at most one request's length, 8 decode steps) plus its prefill step.
    CHECK(sim.tracked[b].first_token_step - sim.tracked[b].submitted_step <= 10);
}

TEST_CASE("fair share: weights 3:1 give 3:1 token shares while both are backlogged") {
    Sim sim(4);
    for (int i = 0; i < 200; ++i) {
        sim.submit("heavy", 3, 8);
        sim.submit("light", 1, 8);
    }
    for (int i = 0; i < 300; ++i) {
        sim.step();
    }
    const double h = static_cast<double>(sim.tokens("heavy"));
    const double l = static_cast<double>(sim.tokens("light"));
    MESSAGE("heavy " << h << ", light " << l);
    CHECK(h / (h + l) == doctest::Approx(0.75).epsilon(0.1));
}

}  // namespace edge::engine::sched
