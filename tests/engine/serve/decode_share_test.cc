// SchedulerConfig::max_decode_sequences on FakeCausalLM, stepped by the test: with more
// sequences admitted than may decode per step, at most that many decode, tenants' generated
// tokens follow their weights (stride order), sequences of one tenant take turns, and neither a
// tenant that joins late nor one that had too few sequences ready to use its share gets a burst
// of saved-up credit that starves the others.

#include <doctest/doctest.h>

#include <algorithm>
#include <map>

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

struct Stream {
    std::string tenant;
    std::shared_ptr<CollectingSink> sink;
};

struct DecodeSim {
    DecodeSim(int32_t slots, int32_t max_decode) {
        FakeOptions options;
        options.slots = slots;
        options.max_context = 512;
        SchedulerConfig config;
        config.max_batch_sequences = slots;
        config.max_decode_sequences = max_decode;
        config.max_queue = 1000;
        config.fair_quantum_tokens = 16;
        config.eos_token_ids = options.eos;
        scheduler = std::make_unique<Scheduler>(
            std::make_unique<FakeCausalLM>(options, std::make_shared<FakeLog>()),
            &micro_tokenizer(), config);
    }

    void submit(const std::string& tenant, int32_t weight, int count) {
        for (int i = 0; i < count; ++i) {
            SequenceRequest r;
            r.request_id = tenant;
            r.prompt = {40, 41, 42, 43};
            r.sampling.temperature = 0.0f;
            r.sampling.max_tokens = 400;
            r.sampling.ignore_eos = true;
            r.sink = std::make_shared<CollectingSink>();
            r.tenant = tenant;
            r.tenant_weight = weight;
            streams.push_back({tenant, std::static_pointer_cast<CollectingSink>(r.sink)});
            auto handle = scheduler->submit(std::move(r));
            REQUIRE(handle.ok());
            handles.push_back(*handle);
        }
    }

    // Tokens generated so far, per stream.
    std::vector<int64_t> counts() const {
        std::vector<int64_t> c;
        for (const Stream& s : streams) {
            c.push_back(static_cast<int64_t>(s.sink->ids().size()));
        }
        return c;
    }

    std::map<std::string, int64_t> per_tenant(const std::vector<int64_t>& from) const {
        std::map<std::string, int64_t> t;
        const std::vector<int64_t> now = counts();
        for (size_t i = 0; i < streams.size(); ++i) {
            t[streams[i].tenant] += now[i] - (i < from.size() ? from[i] : 0);
        }
        return t;
    }

    std::unique_ptr<Scheduler> scheduler;
    std::vector<std::shared_ptr<GenerationHandle>> handles;
    std::vector<Stream> streams;
};

}  // namespace

TEST_CASE("decode share: at most max_decode_sequences decode, tokens follow the weights") {
    // 24 admitted (8 per tenant), 7 decode per step: weights 1:2:4 give 1, 2 and 4 a step.
    DecodeSim sim(24, 7);
    sim.submit("a", 1, 8);
    sim.submit("b", 2, 8);
    sim.submit("c", 4, 8);
    for (int i = 0; i < 5; ++i) {  // Admission and the prompts' prefill.
        REQUIRE(sim.scheduler->step());
    }
    std::vector<int64_t> before = sim.counts();
    for (int i = 0; i < 140; ++i) {
        const std::vector<int64_t> prev = sim.counts();
        REQUIRE(sim.scheduler->step());
        const std::vector<int64_t> now = sim.counts();
        int64_t decoded = 0;
        for (size_t s = 0; s < now.size(); ++s) {
            decoded += now[s] - prev[s];
        }
        REQUIRE(decoded == 7);
    }
    const auto t = sim.per_tenant(before);
    MESSAGE("a " << t.at("a") << ", b " << t.at("b") << ", c " << t.at("c"));
    CHECK(t.at("a") == 140);
    CHECK(t.at("b") == 280);
    CHECK(t.at("c") == 560);
    // Within a tenant the sequences take turns: counts differ by at most one.
    const std::vector<int64_t> now = sim.counts();
    for (const std::string tenant : {"a", "b", "c"}) {
        int64_t lo = INT64_MAX, hi = 0;
        for (size_t s = 0; s < now.size(); ++s) {
            if (sim.streams[s].tenant == tenant) {
                lo = std::min(lo, now[s] - before[s]);
                hi = std::max(hi, now[s] - before[s]);
            }
        }
        INFO("tenant " << tenant);
        CHECK(hi - lo <= 1);
    }
}

TEST_CASE("decode share: a tenant that joins late gets its share, not a burst") {
    DecodeSim sim(24, 6);
    sim.submit("a", 1, 8);
    sim.submit("b", 2, 8);
    for (int i = 0; i < 60; ++i) {
        REQUIRE(sim.scheduler->step());
    }
    // 2 of 6 a step went to "a" and 4 to "b" while they were alone.
    sim.submit("late", 3, 8);
    for (int i = 0; i < 3; ++i) {
        REQUIRE(sim.scheduler->step());
    }
    const std::vector<int64_t> before = sim.counts();
    for (int i = 0; i < 60; ++i) {
        REQUIRE(sim.scheduler->step());
    }
    const auto t = sim.per_tenant(before);
    MESSAGE("a " << t.at("a") << ", b " << t.at("b") << ", late " << t.at("late"));
    // Weights 1:2:3 of 6 a step: 60, 120, 180 over 60 steps (a few tokens of slack for the
    // steps right after the join).
    CHECK(t.at("late") <= 180 + 6);
    CHECK(t.at("late") >= 180 - 6);
    CHECK(t.at("a") >= 60 - 6);
    CHECK(t.at("b") >= 120 - 6);
}

TEST_CASE("decode share: a tenant short of ready sequences saves no credit to starve others") {
    // "b" (weight 2) has only 2 sequences while "a" (weight 1) has 8: b takes its 2 a step and
    // a the other 4. Then b gets 8 more: from then on 2 of 6 a step go to a and 4 to b, and a
    // decodes in every step (with saved-up credit b would take all 6 for ~25 steps).
    DecodeSim sim(24, 6);
    sim.submit("a", 1, 8);
    sim.submit("b", 2, 2);
    for (int i = 0; i < 3; ++i) {
        REQUIRE(sim.scheduler->step());
    }
    std::vector<int64_t> before = sim.counts();
    for (int i = 0; i < 50; ++i) {
        REQUIRE(sim.scheduler->step());
    }
    auto t = sim.per_tenant(before);
    CHECK(t.at("a") == 200);
    CHECK(t.at("b") == 100);
    sim.submit("b", 2, 8);
    for (int i = 0; i < 2; ++i) {
        REQUIRE(sim.scheduler->step());
    }
    before = sim.counts();
    int starved = 0;
    for (int i = 0; i < 30; ++i) {
        const int64_t a0 = sim.per_tenant({}).at("a");
        REQUIRE(sim.scheduler->step());
        starved += sim.per_tenant({}).at("a") == a0 ? 1 : 0;
    }
    t = sim.per_tenant(before);
    MESSAGE("a " << t.at("a") << ", b " << t.at("b") << ", steps a got none " << starved);
    CHECK(starved == 0);
    CHECK(t.at("a") >= 60 - 2);
    CHECK(t.at("a") <= 60 + 2);
}

TEST_CASE("decode share: fewer ready than the limit all decode") {
    DecodeSim sim(8, 16);
    sim.submit("a", 1, 4);
    sim.submit("b", 5, 4);
    for (int i = 0; i < 3; ++i) {
        REQUIRE(sim.scheduler->step());
    }
    const std::vector<int64_t> before = sim.counts();
    for (int i = 0; i < 10; ++i) {
        REQUIRE(sim.scheduler->step());
    }
    const auto t = sim.per_tenant(before);
    CHECK(t.at("a") == 40);
    CHECK(t.at("b") == 40);
}

}  // namespace edge::engine::sched
