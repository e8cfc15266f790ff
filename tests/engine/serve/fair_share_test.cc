// Weighted fair sharing between tenants in the scheduler, in simulated steps on FakeCausalLM:
// the FairQueue's DRR order on its own, then a flooding tenant against a light one (share of
// generated tokens, time to first token), weights, and FIFO within a tenant; then fair shares of
// the batch: a tenant below its share takes a place from one above it (slots or KV cache full),
// without swapping back and forth, never from a higher priority, with unchanged outputs.

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
                        int32_t max_tokens, std::shared_ptr<GenerationSink> sink,
                        TokenId first = 40) {
    SequenceRequest r;
    r.request_id = tenant;
    for (int32_t i = 0; i < prompt_len; ++i) {
        r.prompt.push_back(first + i);
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
    std::vector<TokenId> prompt = {};
    int32_t max_tokens = 0;
};

// A scheduler on a fake model, stepped by the test; each step's tokens are counted per tenant.
struct Sim {
    explicit Sim(int32_t batch, int64_t kv_tokens = 1 << 14, int64_t swap_bytes = 0) {
        options.slots = batch;
        options.max_context = 512;
        options.kv_tokens = kv_tokens;
        SchedulerConfig config;
        config.max_batch_sequences = batch;
        config.max_queue = 100000;
        config.fair_quantum_tokens = 16;
        config.eos_token_ids = options.eos;
        config.swap_bytes = swap_bytes;
        scheduler = std::make_unique<Scheduler>(
            std::make_unique<FakeCausalLM>(options, std::make_shared<FakeLog>()),
            &micro_tokenizer(), config);
    }

    // `first`: the prompt's first token (distinct prompts give distinct outputs).
    size_t submit(const std::string& tenant, int32_t weight, int32_t max_tokens,
                  int32_t priority = 0, TokenId first = 40, int32_t prompt_len = 4) {
        auto sink = std::make_shared<CollectingSink>();
        SequenceRequest r = request(tenant, weight, prompt_len, max_tokens, sink, first);
        r.priority = priority;
        std::vector<TokenId> prompt = r.prompt;
        auto handle = scheduler->submit(std::move(r));
        REQUIRE(handle.ok());
        handles.push_back(*handle);
        tracked.push_back(Tracked{tenant, sink, step_no, -1, std::move(prompt), max_tokens});
        return tracked.size() - 1;
    }

    // `n` requests of tenant "heavy" (weight 1), distinct prompts, `max_tokens` each.
    void submit_heavy(int n, int32_t max_tokens) {
        for (int i = 0; i < n; ++i) {
            submit("heavy", 1, max_tokens, 0, static_cast<TokenId>(40 + i));
        }
    }

    // Every finished request generated what it generates alone.
    void check_outputs() {
        for (const Tracked& t : tracked) {
            if (t.sink->finished()) {
                CHECK(t.sink->ids() == FakeCausalLM::expected(options, t.prompt, t.max_tokens));
                CHECK_FALSE(t.sink->protocol_violated());
            }
        }
    }

    int64_t ttft(size_t i) const { return tracked[i].first_token_step - tracked[i].submitted_step; }

    // Steps until request i has its first token (at most `limit` steps).
    void step_until_first_token(size_t i, int limit = 1000) {
        for (int n = 0; n < limit && tracked[i].first_token_step < 0; ++n) {
            step();
        }
        REQUIRE(tracked[i].first_token_step >= 0);
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

    FakeOptions options;
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

TEST_CASE("fair queue: a preempted request cancelled while waiting stays charged for its use") {
    // Admitted (charged prompt + max_tokens), preempted (push_front refunds all of it), then
    // cancelled before re-admission: its tenant used 500 prompt tokens and must pay for them,
    // not come out with a free admission.
    FairQueue q(10);
    q.push_back(sequence("a", 1, 500, 500));  // Cost 1000.
    for (int i = 0; i < 5; ++i) {
        q.push_back(sequence("a", 1, 5, 5));
        q.push_back(sequence("b", 1, 5, 5));
    }
    std::unique_ptr<Sequence> big = q.pop_tenant("a");
    REQUIRE(big);
    CHECK(big->prompt_len == 500);
    big->request_id = "big";
    ++big->preemptions;
    q.push_front(std::move(big));
    CHECK(q.take_if([](const Sequence& s) { return s.request_id == "big"; }).size() == 1);
    // a owes 500 tokens: b's five requests (cost 10 each) go first.
    std::string order;
    while (!q.empty()) {
        order += q.pop()->tenant;
    }
    CHECK(order == "bbbbbaaaaa");
}

TEST_CASE("fair queue: a tenant's new-request count leaves its preempted requests out") {
    // The scheduler bounds a tenant's queue by its requests that never ran: preempted ones wait
    // for the server's room, counted apart however they leave (admitted again or cancelled).
    FairQueue q(10);
    q.push_back(sequence("a", 1, 5, 5));
    q.push_back(sequence("a", 1, 5, 5));
    q.push_back(sequence("b", 1, 5, 5));
    CHECK(q.tenant_new_size("a") == 2);
    std::unique_ptr<Sequence> p1 = q.pop_tenant("a");
    std::unique_ptr<Sequence> p2 = q.pop_tenant("a");
    REQUIRE(p1);
    REQUIRE(p2);
    p1->request_id = "p1";
    p2->request_id = "p2";
    ++p1->preemptions;
    ++p2->preemptions;
    q.push_front(std::move(p2));
    q.push_front(std::move(p1));
    CHECK(q.size() == 3);
    CHECK(q.tenant_new_size("a") == 0);
    CHECK(q.tenant_new_size("b") == 1);
    q.push_back(sequence("a", 1, 5, 5));
    CHECK(q.tenant_new_size("a") == 1);
    CHECK(q.take_if([](const Sequence& s) { return s.request_id == "p1"; }).size() == 1);
    CHECK(q.tenant_new_size("a") == 1);
    p2 = q.pop_tenant("a");
    REQUIRE(p2);
    CHECK(p2->request_id == "p2");
    CHECK(q.tenant_new_size("a") == 1);
    REQUIRE(q.pop_tenant("a"));
    CHECK(q.tenant_new_size("a") == 0);
    CHECK(q.tenant_new_size("c") == 0);
}

TEST_CASE("fair queue: what a request gives back after its tenant went idle is no credit") {
    // a's big request (cost 1000) is admitted while a is alone, and a's queue empties: its
    // deficit goes (idle time earns no credit). The request then ends without output, or is
    // preempted and cancelled while waiting: its unused 500 tokens were charged to the backlog
    // that is gone, so a's new one gets nothing of them, and a and b alternate.
    for (const bool cancelled_while_waiting : {false, true}) {
        CAPTURE(cancelled_while_waiting);
        FairQueue q(10);
        q.push_back(sequence("a", 1, 500, 500));  // Cost 1000.
        std::unique_ptr<Sequence> big = q.pop();
        REQUIRE(big);
        REQUIRE(q.empty());
        for (int i = 0; i < 5; ++i) {
            q.push_back(sequence("a", 1, 5, 5));
            q.push_back(sequence("b", 1, 5, 5));
        }
        if (cancelled_while_waiting) {
            big->request_id = "big";
            ++big->preemptions;
            q.push_front(std::move(big));
            CHECK(q.take_if([](const Sequence& s) { return s.request_id == "big"; }).size() == 1);
        } else {
            q.refund(*big, 500);
        }
        std::string order;
        while (!q.empty()) {
            order += q.pop()->tenant;
        }
        CHECK(order == "ababababab");
    }
}

TEST_CASE("fair queue: a tenant whose turns pass while it is ineligible banks no more than one") {
    // The scheduler restricts pops to the tenants lowest in places per weight: a tends to get one
    // request per turn and then be passed over (b's pops), so each turn it keeps most of its
    // quantum. That credit must not pile up: once both may go, a gets at most one turn's worth
    // (quantum + its head request) before b's turn, not a run of everything it banked.
    FairQueue q(10);
    for (int i = 0; i < 200; ++i) {
        q.push_back(sequence("a", 1, 1, 1));  // Cost 2.
        q.push_back(sequence("b", 1, 1, 1));
    }
    const auto only = [](const std::string& who) {
        return [who](const std::string& tenant) { return tenant == who; };
    };
    for (int i = 0; i < 50; ++i) {
        REQUIRE(q.pop_if(only("a")));
        REQUIRE(q.pop_if(only("b")));
    }
    std::string order;
    for (int i = 0; i < 16; ++i) {
        order += q.pop()->tenant;
    }
    MESSAGE("order once both may go: " << order);
    // At most (10 + 2) / 2 of a's in a row, wherever the turn stood.
    CHECK(order.find("aaaaaaa") == std::string::npos);
    CHECK(order.find("bbbbbbb") == std::string::npos);
}

TEST_CASE("fair queue: the cap at a turn's opening leaves a preempted request's refund alone") {
    // a's two requests were admitted on time-shared places (not charged), then preempted:
    // push_front gave back their 1000 + 1300, which their re-admissions take back. Capped with
    // the banked quantum at a's turn (to 10 + 1000), the refund would pay for the first only,
    // and the second would wait 130 turns of b's for credit it had been given.
    FairQueue q(10);
    q.push_back(sequence("a", 1, 500, 500));  // Cost 1000.
    q.push_back(sequence("a", 1, 650, 650));  // Cost 1300.
    for (int i = 0; i < 5; ++i) {
        q.push_back(sequence("b", 1, 5, 5));  // Cost 10.
    }
    std::unique_ptr<Sequence> first = q.pop_tenant("a", /*charge=*/false);
    std::unique_ptr<Sequence> second = q.pop_tenant("a", /*charge=*/false);
    REQUIRE(first);
    REQUIRE(second);
    ++first->preemptions;
    ++second->preemptions;
    q.push_front(std::move(second));
    q.push_front(std::move(first));
    std::string order;
    while (!q.empty()) {
        order += q.pop()->tenant;
    }
    CHECK(order == "baabbbb");  // a came back after b (its queue emptied): b's turn first.
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

TEST_CASE("fair share: a weight below one place's share is time-shared, not starved") {
    // Heavy's weight is above the places times light's: with light's weight share (1/6 of 4
    // places, 2/3 of one; 1/3 of one place) under one place, places per weight alone never
    // give light one while heavy has requests waiting (heavy with one more place stays below
    // light with its first). Light gets its weight's share of the tokens all the same, by
    // places handed out in turn, and is served while heavy stays backlogged. Heavy's prompts
    // repeat after 80 requests and then come from the prefix cache (light's do not): they
    // still count against its share, as its generated tokens do.
    struct Case {
        int32_t places;
        int32_t heavy_weight;
    };
    for (const Case c : {Case{4, 5}, Case{1, 2}}) {
        CAPTURE(c.places);
        CAPTURE(c.heavy_weight);
        Sim sim(c.places);
        for (int i = 0; i < 400; ++i) {
            sim.submit("heavy", c.heavy_weight, 8, 0, static_cast<TokenId>(40 + i % 80));
            sim.submit("light", 1, 8, 0, static_cast<TokenId>(130 + i % 80));
        }
        for (int i = 0; i < 600; ++i) {
            sim.step();
        }
        REQUIRE(sim.scheduler->serving_stats().tenants.at("heavy").queued > 0);
        REQUIRE(sim.scheduler->serving_stats().tenants.at("light").queued > 0);
        const double h = static_cast<double>(sim.tokens("heavy"));
        const double l = static_cast<double>(sim.tokens("light"));
        const double share = 1.0 / (1.0 + c.heavy_weight);
        MESSAGE("heavy " << h << ", light " << l << ", light's weight share " << share);
        // Within 15% of it.
        CHECK(l / (h + l) >= 0.85 * share);
        CHECK(l / (h + l) <= 1.15 * share);
        // Time sharing hands out free places: nothing is preempted for it.
        CHECK(sim.scheduler->stats().preemptions == 0);
        sim.check_outputs();
    }
}

TEST_CASE("fair share: a time-shared place is not taken while another tenant is owed it") {
    // 4 places: r (weight 2) holds 2, x (weight 5) holds 2, one of them short; both long
    // prompts make x further ahead in tokens served per weight than l (weight 1), which comes
    // later with x. When x's short request ends, x is owed the free place (r's level with one
    // fewer, 0.5, is not below x's with it, 0.4): time-sharing it to l, behind x in tokens
    // served, would leave x owed, and r's newest would be preempted for it in the same step.
    Sim sim(4);
    sim.submit("r", 2, 200, 0, 40);
    sim.submit("r", 2, 200, 0, 45);
    sim.submit("x", 5, 200, 0, 50, 60);
    sim.submit("x", 5, 12, 0, 55, 60);
    sim.step();
    for (int i = 0; i < 4; ++i) {
        sim.submit("x", 5, 200, 0, static_cast<TokenId>(120 + i));
        sim.submit("l", 1, 200, 0, static_cast<TokenId>(130 + i));
    }
    for (int i = 0; i < 40; ++i) {
        sim.step();
    }
    REQUIRE(sim.tracked[3].sink->finished());
    CHECK(sim.scheduler->stats().preemptions == 0);
    CHECK(sim.scheduler->serving_stats().tenants.at("r").preemptions == 0);
    sim.check_outputs();
}

TEST_CASE("fair share: a preempted sequence's recomputed tokens count as served once") {
    // One tenant, two sequences of 4 + 100 positions in a KV cache of 128 tokens: one is
    // preempted (nothing saved), and computes its positions again once the other ends. Its
    // tenant's tokens served per weight (rebased to 0 at each step's admission, with no other
    // tenant) grow by what each step charges: over the run, each position once.
    Sim sim(2, 128);
    sim.submit("a", 1, 100, 0, 40);
    sim.submit("a", 1, 100, 0, 60);
    double charged = 0.0;
    for (int i = 0; i < 2000 && !sim.all_finished("a"); ++i) {
        sim.step();
        charged += sim.scheduler->served_for_test("a");
    }
    REQUIRE(sim.all_finished("a"));
    REQUIRE(sim.scheduler->stats().preemptions > 0);
    REQUIRE(sim.scheduler->stats().recompute_tokens > 0);
    MESSAGE("recomputed " << sim.scheduler->stats().recompute_tokens);
    // The last token of each is sampled, never computed.
    CHECK(charged == doctest::Approx(2 * (4 + 100 - 1)));
    sim.check_outputs();
}

TEST_CASE("fair share: prompt blocks attached from a sequence in the same batch count as served") {
    // Two sequences of one tenant with the same 40-token prompt, admitted together: the second
    // waits for the first to compute the shared blocks and attaches them in-batch. Its tenant
    // is served those tokens all the same: each position counts once (as above), computed or
    // attached.
    Sim sim(2);
    sim.submit("a", 1, 20, 0, 40, 40);
    sim.submit("a", 1, 20, 0, 40, 40);
    double charged = 0.0;
    for (int i = 0; i < 200 && !sim.all_finished("a"); ++i) {
        sim.step();
        charged += sim.scheduler->served_for_test("a");
    }
    REQUIRE(sim.all_finished("a"));
    const int32_t cached = sim.tracked[1].sink->wait()->usage.cached_tokens;
    MESSAGE("second's cached tokens " << cached);
    REQUIRE(cached > 0);
    CHECK(charged == doctest::Approx(2 * (40 + 20 - 1)));
    sim.check_outputs();
}

TEST_CASE("fair batch: a light tenant gets a place within steps while a heavy one holds them all") {
    Sim sim(8);
    // Heavy opens 16 long requests: 8 run, 8 wait.
    for (int i = 0; i < 16; ++i) {
        sim.submit("heavy", 1, 200, 0, static_cast<TokenId>(40 + i));
    }
    for (int i = 0; i < 20; ++i) {
        sim.step();
    }
    // Light (weight 3) sends 20-token requests one after another, a few steps apart (heavy
    // takes the place each one leaves). Without fair places in the batch each waited for a
    // heavy request to finish (about 180 steps here).
    int64_t worst = 0;
    for (int r = 0; r < 5; ++r) {
        const size_t light = sim.submit("light", 3, 20, 0, static_cast<TokenId>(100 + r));
        sim.step_until_first_token(light);
        worst = std::max(worst, sim.ttft(light));
        while (!sim.tracked[light].sink->finished()) {
            sim.step();
        }
        for (int i = 0; i < 3 && !sim.all_finished("heavy"); ++i) {
            sim.step();
        }
    }
    MESSAGE("light's worst time to first token: " << worst << " steps");
    // Admitted at the next step, its first token from its prefill.
    CHECK(worst <= 2);
    // One heavy sequence preempted per light request, none for anything else.
    const SchedulerStats& stats = sim.scheduler->stats();
    CHECK(stats.fair_preemptions == 5);
    CHECK(stats.preemptions == 5);
    CHECK(stats.max_running == 8);
    const ServingStats serving = sim.scheduler->serving_stats();
    CHECK(serving.tenants.at("heavy").fair_preemptions == 5);
    CHECK(serving.tenants.at("light").preemptions == 0);
    // The preempted heavy requests recompute and finish with the tokens they produce alone.
    for (int i = 0; i < 5000 && !sim.all_finished("heavy"); ++i) {
        sim.step();
    }
    REQUIRE(sim.all_finished("heavy"));
    sim.check_outputs();
    CHECK(sim.scheduler->serving_stats().tenants.at("heavy").running == 0);
    CHECK(sim.scheduler->serving_stats().tenants.at("heavy").queued == 0);
}

TEST_CASE("fair batch: with the KV cache full, a light tenant takes a heavy tenant's place") {
    // Room for about 4 of heavy's 8 sequences of 4 + 120 tokens: the cache, not the slots,
    // bounds the batch, and admission waits after each KV preemption.
    Sim sim(8, 4 * 124);
    sim.submit_heavy(8, 120);
    for (int i = 0; i < 80; ++i) {
        sim.step();
    }
    REQUIRE(sim.scheduler->stats().preemptions > 0);
    REQUIRE(sim.scheduler->serving_stats().tenants.at("heavy").queued > 0);
    const size_t light = sim.submit("light", 1, 10, 0, 200);
    sim.step_until_first_token(light);
    MESSAGE("light's time to first token: " << sim.ttft(light) << " steps");
    CHECK(sim.ttft(light) <= 2);
    CHECK(sim.scheduler->stats().fair_preemptions >= 1);
    for (int i = 0; i < 5000 && !(sim.all_finished("heavy") && sim.all_finished("light")); ++i) {
        sim.step();
    }
    REQUIRE(sim.all_finished("heavy"));
    REQUIRE(sim.all_finished("light"));
    CHECK(sim.scheduler->serving_stats().tenants.at("light").preemptions == 0);
    sim.check_outputs();
}

TEST_CASE("fair batch: preempted sequences with their KV saved resume from it, every output whole") {
    // As above, with the preempted sequences' KV kept in host memory: the fake model's next
    // token depends on every position it reads back from the cache, so a block restored wrong
    // or out of order changes the output. Preemptions for KV and for a fair share both save.
    Sim sim(8, 4 * 124, int64_t{1} << 20);
    sim.submit_heavy(8, 120);
    for (int i = 0; i < 80; ++i) {
        sim.step();
    }
    const size_t light = sim.submit("light", 1, 10, 0, 200);
    sim.step_until_first_token(light);
    CHECK(sim.ttft(light) <= 2);
    for (int i = 0; i < 5000 && !(sim.all_finished("heavy") && sim.all_finished("light")); ++i) {
        sim.step();
    }
    REQUIRE(sim.all_finished("heavy"));
    REQUIRE(sim.all_finished("light"));
    sim.check_outputs();
    const SchedulerStats& stats = sim.scheduler->stats();
    MESSAGE("preemptions " << stats.preemptions << " (fair " << stats.fair_preemptions
                           << "), KV saved " << stats.swapped_preemptions);
    CHECK(stats.fair_preemptions >= 1);
    CHECK(stats.preemptions > stats.fair_preemptions);
    CHECK(stats.swapped_preemptions == stats.preemptions);
    CHECK(stats.recompute_tokens == 0);
    CHECK(sim.scheduler->serving_stats().kv_swap_bytes == 0);  // All given back.
}

TEST_CASE("fair batch: a swap budget of about one sequence saves what fits, the rest recompute") {
    // 8 bytes a position here (one layer, one head of one value, K and V): 1000 bytes hold one
    // preempted sequence of up to 125 positions at a time.
    constexpr int64_t kBudget = 1000;
    Sim sim(8, 4 * 124, kBudget);
    sim.submit_heavy(8, 120);
    int64_t most = 0;
    for (int i = 0; i < 5000 && !sim.all_finished("heavy"); ++i) {
        sim.step();
        most = std::max(most, sim.scheduler->serving_stats().kv_swap_bytes);
    }
    REQUIRE(sim.all_finished("heavy"));
    sim.check_outputs();
    const SchedulerStats& stats = sim.scheduler->stats();
    MESSAGE("preemptions " << stats.preemptions << ", KV saved " << stats.swapped_preemptions
                           << ", recomputed tokens " << stats.recompute_tokens
                           << ", most swap bytes " << most);
    CHECK(stats.swapped_preemptions > 0);
    CHECK(stats.swapped_preemptions < stats.preemptions);
    CHECK(stats.recompute_tokens > 0);
    CHECK(most > 0);
    CHECK(most <= kBudget);
}

TEST_CASE("fair batch: tenants at their shares do not swap places back and forth") {
    // Three equal tenants (8 / 3 places each) and one of weight 2, each keeping more requests
    // open than its share, of varied lengths: places change hands as requests finish, not by
    // preemption.
    Sim sim(8);
    const std::vector<std::pair<std::string, int32_t>> tenants = {
        {"a", 1}, {"b", 1}, {"c", 1}, {"d", 2}};
    int next = 0;
    auto open = [&](const std::string& tenant, int32_t weight) {
        ++next;
        sim.submit(tenant, weight, 5 + (next * 37) % 60, 0, static_cast<TokenId>(40 + next % 80));
    };
    for (const auto& [tenant, weight] : tenants) {
        for (int i = 0; i < 5; ++i) {
            open(tenant, weight);
        }
    }
    std::vector<bool> seen(sim.tracked.size(), false);
    for (int s = 0; s < 3000; ++s) {
        sim.step();
        for (size_t i = 0; i < sim.tracked.size(); ++i) {
            if (i < seen.size() && !seen[i] && sim.tracked[i].sink->finished()) {
                seen[i] = true;
                const std::string tenant = sim.tracked[i].tenant;
                open(tenant, tenant == "d" ? 2 : 1);
            }
        }
        seen.resize(sim.tracked.size(), false);
    }
    const SchedulerStats& stats = sim.scheduler->stats();
    MESSAGE("requests " << sim.tracked.size() << ", fair preemptions " << stats.fair_preemptions);
    CHECK(sim.tracked.size() > 400);
    CHECK(stats.fair_preemptions == 0);
    CHECK(stats.preemptions == 0);
    // Weight 2 against 1: about twice the tokens of each equal tenant.
    const double d = static_cast<double>(sim.tokens("d"));
    const double a = static_cast<double>(sim.tokens("a"));
    MESSAGE("tokens a " << a << ", d " << d);
    CHECK(d / a == doctest::Approx(2.0).epsilon(0.2));
    sim.check_outputs();
}

TEST_CASE("fair batch: a light tenant arriving and leaving preempts once per request, no more") {
    // Two equal heavy tenants keep the batch full; a third comes in bursts. Each burst takes
    // places from the others once; nothing is preempted twice in a row for the same place.
    Sim sim(6);
    for (int i = 0; i < 30; ++i) {
        sim.submit("x", 1, 80, 0, static_cast<TokenId>(40 + i));
        sim.submit("y", 1, 80, 0, static_cast<TokenId>(70 + i));
    }
    int64_t light_requests = 0;
    int64_t worst = 0;
    for (int round = 0; round < 6; ++round) {
        for (int i = 0; i < 30; ++i) {
            sim.step();
        }
        std::vector<size_t> burst;
        for (int i = 0; i < 2; ++i) {
            burst.push_back(sim.submit("z", 1, 15, 0, static_cast<TokenId>(150 + round * 2 + i)));
            ++light_requests;
        }
        for (size_t b : burst) {
            sim.step_until_first_token(b);
            worst = std::max(worst, sim.ttft(b));
        }
    }
    for (int i = 0;
         i < 5000 && !(sim.all_finished("x") && sim.all_finished("y") && sim.all_finished("z"));
         ++i) {
        sim.step();
    }
    const SchedulerStats& stats = sim.scheduler->stats();
    MESSAGE("z requests " << light_requests << ", fair preemptions " << stats.fair_preemptions
                          << ", z's worst time to first token " << worst);
    // z's share of 6 places is 2: each of its requests takes at most one place.
    CHECK(stats.fair_preemptions <= light_requests);
    CHECK(worst <= 3);
    sim.check_outputs();
}

TEST_CASE("fair batch: a higher priority is never preempted for a lower one") {
    SUBCASE("the heavy tenant's higher priority keeps its places") {
        Sim sim(4);
        for (int i = 0; i < 8; ++i) {
            sim.submit("heavy", 1, 60, 10, static_cast<TokenId>(40 + i));
        }
        for (int i = 0; i < 20; ++i) {
            sim.step();
        }
        const size_t light = sim.submit("light", 3, 10, 0, 200);
        sim.step_until_first_token(light);
        // It waits for a heavy request to finish (60 tokens, 20 steps already done).
        CHECK(sim.ttft(light) >= 30);
        CHECK(sim.scheduler->stats().preemptions == 0);
    }
    SUBCASE("the light tenant's higher priority takes a place") {
        Sim sim(4);
        for (int i = 0; i < 8; ++i) {
            sim.submit("heavy", 1, 60, 0, static_cast<TokenId>(40 + i));
        }
        for (int i = 0; i < 20; ++i) {
            sim.step();
        }
        const size_t light = sim.submit("light", 3, 10, 10, 200);
        sim.step_until_first_token(light);
        CHECK(sim.ttft(light) <= 2);
        CHECK(sim.scheduler->stats().fair_preemptions == 1);
        for (int i = 0; i < 1000 && !sim.all_finished("heavy"); ++i) {
            sim.step();
        }
        sim.check_outputs();
    }
    SUBCASE("of two running tenants, the lower priority gives the place") {
        Sim sim(4);
        for (int i = 0; i < 4; ++i) {
            sim.submit("gold", 1, 60, 10, static_cast<TokenId>(40 + i));
            sim.submit("free", 1, 60, 0, static_cast<TokenId>(60 + i));
        }
        for (int i = 0; i < 20; ++i) {
            sim.step();
        }
        const size_t light = sim.submit("light", 1, 10, 10, 200);
        sim.step_until_first_token(light);
        CHECK(sim.ttft(light) <= 2);
        const ServingStats serving = sim.scheduler->serving_stats();
        CHECK(serving.tenants.at("gold").preemptions == 0);
        CHECK(serving.tenants.at("free").preemptions == 1);
    }
}

TEST_CASE("fair batch: a sequence runs fair_preempt_min_steps before it can be preempted") {
    Sim sim(2);
    sim.submit("heavy", 1, 100, 0, 40);
    sim.submit("heavy", 1, 100, 0, 41);
    sim.step();  // Both admitted at step 0.
    const size_t light = sim.submit("light", 1, 5, 0, 200);
    sim.step_until_first_token(light);
    // Its place came free after the default 8 steps of the heavy sequences, not before.
    CHECK(sim.ttft(light) >= 8);
    CHECK(sim.ttft(light) <= 10);
    CHECK(sim.scheduler->stats().fair_preemptions == 1);
}

TEST_CASE("fair batch: no victim for a claimant whose saved KV would not fit back") {
    // 200 positions of cache (blocks of one) and a swap budget. Heavy (weight 2) runs 5 of the
    // 8 places; light (weight 1) then opens two short requests and a long one, A (a prompt of
    // 120). The next step's decode does not fit: light is furthest above its share (3 against
    // 2.5), so A, its most recent, is preempted with its 120 positions saved.
    Sim sim(8, 200, int64_t{1} << 20);
    for (int i = 0; i < 5; ++i) {
        sim.submit("heavy", 2, 30, 0, static_cast<TokenId>(40 + i));
    }
    for (int i = 0; i < 10; ++i) {
        sim.step();
    }
    sim.submit("light", 1, 12, 0, 100);
    sim.submit("light", 1, 12, 0, 101);
    constexpr int32_t kLong = 120;
    const size_t a = sim.submit("light", 1, 10, 0, 120, kLong);
    for (int i = 0; i < 2; ++i) {
        sim.step();
    }
    const SchedulerStats& stats = sim.scheduler->stats();
    REQUIRE(stats.preemptions == 1);
    REQUIRE(stats.swapped_preemptions == 1);
    REQUIRE(sim.scheduler->serving_stats().tenants.at("light").preemptions == 1);
    REQUIRE(sim.tracked[a].sink->ids().size() == 1);
    // The short ones finish while heavy grows: then light runs nothing and is owed a place
    // (1 against (5 - 1) / 2), but A's restore needs more blocks than are free even with any
    // one heavy sequence's. Preempting one would only leave its place empty, step after step.
    bool owed_without_room = false;
    int64_t heavy_done = -1;
    for (int i = 0; i < 200 && sim.tracked[a].sink->ids().size() < 2; ++i) {
        sim.step();
        const ServingStats serving = sim.scheduler->serving_stats();
        const TenantServingStats& light = serving.tenants.at("light");
        if (light.running == 0 && light.queued == 1 && serving.tenants.at("heavy").running == 5 &&
            serving.kv_blocks_total - serving.kv_blocks_used < kLong) {
            owed_without_room = true;
        }
        if (heavy_done < 0 && sim.all_finished("heavy")) {
            heavy_done = sim.step_no;
        }
        CHECK(stats.fair_preemptions == 0);
        CHECK(stats.preemptions == 1);
    }
    CHECK(owed_without_room);
    // Once heavy's sequences finish there is room, and A continues from its saved KV.
    REQUIRE(sim.tracked[a].sink->ids().size() >= 2);
    REQUIRE(heavy_done >= 0);
    MESSAGE("heavy done at step " << heavy_done << ", A's second token at step " << sim.step_no);
    CHECK(sim.step_no - heavy_done <= 1);
    for (int i = 0; i < 1000 && !(sim.all_finished("heavy") && sim.all_finished("light")); ++i) {
        sim.step();
    }
    REQUIRE(sim.all_finished("light"));
    sim.check_outputs();
    CHECK(stats.preemptions == 1);
    CHECK(stats.recompute_tokens == 0);
    CHECK(sim.scheduler->serving_stats().kv_swap_bytes == 0);
}

}  // namespace edge::engine::sched
