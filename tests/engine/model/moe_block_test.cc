// MoeBlock and its rank backends: when a new plan moves experts off a rank, begin_step() tells that
// rank's backend to release exactly those experts' weights (a GPU rank would otherwise keep every
// expert it ever held), never a router or a buffer the rank still reads; forward still runs. A
// rank backend's call error (take_error: a full device arena) fails that forward and no later one.
// Rank backends here are CPU backends behind a recorder, through MoeBlock::create's factory.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <set>
#include <vector>

#include "engine/model/moe_block.h"

namespace edge::engine {
namespace {

// A CPU backend that records each release_weights() call as the set of host data it named, and
// reports `fail` (once) from take_error(), as a device backend whose arena filled would.
class RecordingBackend final : public Backend {
public:
    RecordingBackend(std::unique_ptr<Backend> inner, std::vector<std::set<const void*>>* releases)
        : inner_(std::move(inner)), releases_(releases) {}

    std::string_view name() const override { return "recording"; }
    bool supports(Op op, WeightFormat format) const override {
        return inner_->supports(op, format);
    }
    int threads() const override { return inner_->threads(); }
    void matmul(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy) override {
        inner_->matmul(w, x, n, y, ldy);
    }
    void matmul_batch(std::span<const MatmulJob> jobs) override { inner_->matmul_batch(jobs); }
    void swiglu_batch(std::span<const SwiGluJob> jobs) override { inner_->swiglu_batch(jobs); }
    void release_weights(std::span<const Weight* const> weights) override {
        std::set<const void*> call;
        for (const Weight* w : weights) {
            call.insert(w->data);
        }
        // A weight named twice in one call would be a MoeBlock bug the set would hide.
        CHECK(call.size() == weights.size());
        releases_->push_back(std::move(call));
    }
    Status take_error() override {
        Status s = std::move(fail);
        fail = ok_status();
        return s;
    }

    Status fail;

protected:
    void run_tasks(int64_t n, void (*fn)(void*, int64_t, int), void* ctx) override {
        inner_->for_each_task(n, [fn, ctx](int64_t i, int worker) { fn(ctx, i, worker); });
    }

private:
    std::unique_ptr<Backend> inner_;
    std::vector<std::set<const void*>>* releases_;
};

// An in-process endpoint whose count exchange fails on every rank while `*fail` is set, as an
// NCCL one that cannot get its staging memory does (kResourceExhausted). The exchange itself
// still runs, so the ranks stay in step and the communicators stay usable.
class FailingCommunicator final : public shard::Communicator {
public:
    FailingCommunicator(std::unique_ptr<shard::Communicator> inner, const std::atomic<bool>* fail)
        : inner_(std::move(inner)), fail_(fail) {}

    std::string_view kind() const override { return "failing"; }
    int32_t rank() const override { return inner_->rank(); }
    int32_t size() const override { return inner_->size(); }
    Status all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                        std::span<const int64_t> recv_counts) override {
        return inner_->all_to_all_v(send, send_counts, recv, recv_counts);
    }
    Status all_gather(const void* send, int64_t bytes, void* recv) override {
        return inner_->all_gather(send, bytes, recv);
    }
    Status all_reduce_sum(std::span<float> data) override { return inner_->all_reduce_sum(data); }
    Status all_reduce_sum(std::span<int64_t> data) override { return inner_->all_reduce_sum(data); }
    Status exchange_counts(std::span<const int64_t> send_counts,
                           std::span<int64_t> recv_counts) override {
        Status s = inner_->exchange_counts(send_counts, recv_counts);
        if (s.ok() && fail_->load()) {
            return resource_exhausted_error("no memory for the count staging buffer");
        }
        return s;
    }
    Status barrier() override { return inner_->barrier(); }
    void abort(Status why) override { inner_->abort(std::move(why)); }

private:
    std::unique_ptr<shard::Communicator> inner_;
    const std::atomic<bool>* fail_;
};

constexpr int64_t kHidden = 16;
constexpr int64_t kInter = 8;
constexpr int32_t kExperts = 4;
constexpr int32_t kLayers = 2;

// F32 weights filled with a fixed pattern; the deque keeps every buffer where it was.
struct Weights {
    std::deque<std::vector<float>> store;
    Weight matrix(int64_t rows, int64_t cols, int seed) {
        std::vector<float>& v = store.emplace_back(static_cast<size_t>(rows * cols));
        for (size_t i = 0; i < v.size(); ++i) {
            v[i] = 0.3f * static_cast<float>((i * 2654435761u + seed * 97) % 2001) / 1000.0f - 0.3f;
        }
        Weight w;
        w.format = WeightFormat::kF32;
        w.rows = rows;
        w.cols = cols;
        w.data = v.data();
        return w;
    }
    std::vector<SwiGlu> experts(int seed) {
        std::vector<SwiGlu> out;
        for (int e = 0; e < kExperts; ++e) {
            out.push_back({matrix(kInter, kHidden, seed + 3 * e),
                           matrix(kInter, kHidden, seed + 3 * e + 1),
                           matrix(kHidden, kInter, seed + 3 * e + 2)});
        }
        return out;
    }
};

struct Fixture {
    std::unique_ptr<Backend> driver;
    std::vector<std::vector<std::set<const void*>>> releases;  // [rank][call].
    std::vector<RecordingBackend*> ranks;                       // Owned by the block.
    std::unique_ptr<MoeBlock> block;
    Weights weights;
    std::vector<Weight> routers;
    std::vector<std::vector<SwiGlu>> experts;  // [layer][expert].

    // Two ranks, 3 slots each; `shared`: layer 1 reuses layer 0's expert buffers (tied tensors).
    // The block's communicators come from `comms` (default: in-process ones).
    Fixture(int32_t rebalance, bool shared, CommunicatorFactory comms = {}) : releases(2) {
        auto cpu = create_backend("cpu", BackendOptions{2});
        REQUIRE(cpu.ok());
        driver = std::move(cpu).value();
        shard::ShardingConfig sc;
        sc.ranks = 2;
        sc.slots_per_rank = 3;
        sc.rebalance_interval_steps = rebalance;
        sc.load_window_steps = 4;
        int32_t next_rank = 0;
        auto make_rank = [&](const BackendOptions& bo) -> Result<std::unique_ptr<Backend>> {
            EDGE_ASSIGN_OR_RETURN(auto inner, create_backend("cpu", bo));
            auto rank = std::make_unique<RecordingBackend>(
                std::move(inner), &releases[static_cast<size_t>(next_rank++)]);
            ranks.push_back(rank.get());
            return std::unique_ptr<Backend>(std::move(rank));
        };
        MoeShape shape{kHidden, kInter, kExperts, 2, kLayers};
        auto b = MoeBlock::create(shape, sc, driver.get(), make_rank, std::move(comms));
        REQUIRE_MESSAGE(b.ok(), b.status().to_string());
        block = std::move(b).value();
        for (int32_t l = 0; l < kLayers; ++l) {
            routers.push_back(weights.matrix(kExperts, kHidden, 1000 + l));
            experts.push_back(shared && l > 0 ? experts[0] : weights.experts(100 * (l + 1)));
            block->set_layer(l, routers.back(), make_softmax_router(kExperts, 2, true),
                             experts.back());
        }
        // Skew the routers towards expert 0 so the planner has a reason to replicate it.
        for (int32_t l = 0; l < kLayers; ++l) {
            auto* r = const_cast<float*>(static_cast<const float*>(routers[l].data));
            std::fill(r, r + kHidden, 0.4f);
        }
    }

    static constexpr int64_t kRows = 5;
    static std::vector<float> rows(int s) {
        std::vector<float> h(kRows * kHidden);
        for (size_t i = 0; i < h.size(); ++i) {
            h[i] = 1.0f + 0.5f * std::sin(0.37f * static_cast<float>(i + s * 11));
        }
        return h;
    }

    void step(int s) {
        const int64_t n = kRows;
        const std::vector<float> h = rows(s);
        std::vector<float> x(h.size(), 0.25f);
        block->begin_step();
        for (int32_t l = 0; l < kLayers; ++l) {
            REQUIRE(block->forward(l, h.data(), n, x.data()).ok());
        }
        REQUIRE(block->end_step().ok());
        for (float v : x) {
            REQUIRE(std::isfinite(v));
        }
    }

    std::set<const void*> data_of(int32_t layer, std::initializer_list<int32_t> ids) const {
        std::set<const void*> out;
        for (int32_t e : ids) {
            const SwiGlu& s = experts[layer][e];
            out.insert({s.gate.data, s.up.data, s.down.data});
        }
        return out;
    }
};

std::set<const void*> merged(std::set<const void*> a, const std::set<const void*>& b) {
    a.insert(b.begin(), b.end());
    return a;
}

TEST_CASE("moe block: a new plan releases on each rank exactly the experts it moved away") {
    Fixture f(0, false);
    f.step(0);  // Contiguous: rank 0 holds experts 0-1, rank 1 experts 2-3, in both layers.
    CHECK(f.releases[0].empty());
    CHECK(f.releases[1].empty());

    // Only additions (expert 2 replicated onto rank 0): nothing to release anywhere.
    auto grow = ExpertPlacement::parse("0-2;2-3", kLayers, kExperts, 2, 3);
    REQUIRE(grow.ok());
    REQUIRE(f.block->set_plan(*grow).ok());
    CHECK(f.releases[0].empty());  // Nothing happens before the plan is applied.
    f.step(1);
    CHECK(f.releases[0].empty());
    CHECK(f.releases[1].empty());

    // Expert 1 moves to rank 1 and expert 3 to rank 0; expert 2 stays on both.
    auto swap = ExpertPlacement::parse("0,2,3;1,2", kLayers, kExperts, 2, 3);
    REQUIRE(swap.ok());
    REQUIRE(f.block->set_plan(*swap).ok());
    f.step(2);
    REQUIRE(f.releases[0].size() == 1);
    REQUIRE(f.releases[1].size() == 1);
    CHECK(f.releases[0][0] == merged(f.data_of(0, {1}), f.data_of(1, {1})));
    CHECK(f.releases[1][0] == merged(f.data_of(0, {3}), f.data_of(1, {3})));
    for (const auto& calls : f.releases) {
        CHECK(calls[0].count(f.routers[0].data) == 0);
        CHECK(calls[0].count(f.routers[1].data) == 0);
    }

    // The same plan again changes nothing: no further release.
    REQUIRE(f.block->set_plan(*swap).ok());
    f.step(3);
    CHECK(f.releases[0].size() == 1);
    CHECK(f.releases[1].size() == 1);
}

TEST_CASE("moe block: a buffer the rank still reads in another layer is not released") {
    Fixture f(0, true);  // Layer 1's experts are layer 0's buffers.
    f.step(0);
    // Layer 0 swaps experts 1 and 2 between the ranks; layer 1 keeps the contiguous plan, so both
    // ranks still read the moved buffers there.
    auto plan = ExpertPlacement::from_slots(kLayers, kExperts, 2, 3,
                                            {{{0, 2}, {1, 3}}, {{0, 1}, {2, 3}}});
    REQUIRE_MESSAGE(plan.ok(), plan.status().to_string());
    REQUIRE(f.block->set_plan(*plan).ok());
    f.step(1);
    CHECK(f.releases[0].empty());
    CHECK(f.releases[1].empty());
    // Layer 0 back to contiguous, layer 1 moves expert 1 off rank 0: rank 0 drops expert 2 (layer
    // 0) and expert 1 (layer 1) but reads expert 1 again in layer 0, so only expert 2 goes; rank 1
    // drops expert 1 in layer 0 but now holds it in layer 1.
    auto next = ExpertPlacement::from_slots(kLayers, kExperts, 2, 3,
                                            {{{0, 1}, {2, 3}}, {{0}, {1, 2, 3}}});
    REQUIRE_MESSAGE(next.ok(), next.status().to_string());
    REQUIRE(f.block->set_plan(*next).ok());
    f.step(2);
    REQUIRE(f.releases[0].size() == 1);
    CHECK(f.releases[0][0] == f.data_of(0, {2}));
    CHECK(f.releases[1].empty());
    // Rank 1 drops expert 2 in both layers: its buffers are named once (RecordingBackend checks).
    auto last = ExpertPlacement::from_slots(kLayers, kExperts, 2, 3,
                                            {{{0, 2}, {1, 3}}, {{0, 2}, {1, 3}}});
    REQUIRE_MESSAGE(last.ok(), last.status().to_string());
    REQUIRE(f.block->set_plan(*last).ok());
    f.step(3);
    REQUIRE(f.releases[0].size() == 2);
    CHECK(f.releases[0][1] == f.data_of(0, {1}));
    REQUIRE(f.releases[1].size() == 1);
    CHECK(f.releases[1][0] == f.data_of(0, {2}));
}

TEST_CASE("moe block: planner rebalances release what each new plan took off each rank") {
    Fixture f(2, false);  // A plan every 2 steps from the measured (skewed) load.
    for (int s = 0; s < 24; ++s) {
        const ExpertPlacement before = f.block->placement();
        std::vector<size_t> calls = {f.releases[0].size(), f.releases[1].size()};
        f.step(s);
        const ExpertPlacement& after = f.block->placement();
        for (int32_t r = 0; r < 2; ++r) {
            std::set<const void*> want;
            for (int32_t l = 0; l < kLayers; ++l) {
                for (int32_t e : before.experts_on(l, r)) {
                    if (!after.holds(l, e, r)) {
                        want = merged(want, f.data_of(l, {e}));
                    }
                }
            }
            INFO("step " << s << ", rank " << r);
            if (want.empty()) {
                CHECK(f.releases[r].size() == calls[r]);
            } else {
                REQUIRE(f.releases[r].size() == calls[r] + 1);
                CHECK(f.releases[r].back() == want);
            }
        }
    }
    // The skewed load did move experts, so the checks above saw releases.
    CHECK(f.block->stats().plans_applied >= 1);
    CHECK(f.releases[0].size() + f.releases[1].size() >= 1);
}

TEST_CASE("moe block: a rank backend's call error fails that forward only") {
    Fixture f(0, false);
    f.step(0);
    // Both ranks report, as if both arenas filled: the first rank's error is returned and the
    // second's taken too, so the next forward is clean.
    f.ranks[0]->fail = resource_exhausted_error("arena full on rank 0");
    f.ranks[1]->fail = resource_exhausted_error("arena full on rank 1");
    std::vector<float> h = Fixture::rows(1);
    std::vector<float> x(h.size(), 0.25f);
    f.block->begin_step();
    const Status s = f.block->forward(0, h.data(), Fixture::kRows, x.data());
    CHECK(s.code() == StatusCode::kResourceExhausted);
    CHECK(s.message() == "arena full on rank 0");
    CHECK(f.block->forward(1, h.data(), Fixture::kRows, x.data()).ok());
    CHECK(f.block->end_step().ok());
    f.step(2);
}

TEST_CASE("moe block: a rank backend's call error is taken when a collective fails the step") {
    std::atomic<bool> fail_exchange{false};
    Fixture f(0, false, [&](int32_t ranks) {
        auto inner = shard::create_communicators("in_process", ranks);
        REQUIRE(inner.ok());
        std::vector<std::unique_ptr<shard::Communicator>> out;
        for (auto& c : *inner) {
            out.push_back(std::make_unique<FailingCommunicator>(std::move(c), &fail_exchange));
        }
        return Result<std::vector<std::unique_ptr<shard::Communicator>>>(std::move(out));
    });
    f.step(0);
    // Rank 1's backend fails a call (its router matmul) in a step whose count exchange then
    // fails on every rank: the step reports the collective's error.
    f.ranks[1]->fail = resource_exhausted_error("arena full on rank 1");
    fail_exchange = true;
    std::vector<float> h = Fixture::rows(1);
    std::vector<float> x(h.size(), 0.25f);
    f.block->begin_step();
    const Status s = f.block->forward(0, h.data(), Fixture::kRows, x.data());
    CHECK(s.code() == StatusCode::kUnavailable);
    CHECK(s.message().find("communicator out of memory") == 0);
    // The backend's error went with that step: the next one, its communicators fine again, runs
    // clean (before, rank 1's stale error failed it).
    fail_exchange = false;
    const Status next = f.block->forward(1, h.data(), Fixture::kRows, x.data());
    CHECK_MESSAGE(next.ok(), next.to_string());
    CHECK(f.block->end_step().ok());
    f.step(2);
}

TEST_CASE("moe block: slots_per_rank 0 gets no replicas from the rebalancer") {
    // 3 experts on 2 ranks: ceil(3 / 2) = 2 slots a rank, one left free by the contiguous plan.
    // Top-1 routing over equal logits sends every token to expert 0: the planner's best plan
    // with a spare slot replicates it.
    constexpr int32_t kThree = 3;
    auto run = [](int32_t slots_per_rank, const std::string& static_plan = "") {
        auto cpu = create_backend("cpu", BackendOptions{2});
        REQUIRE(cpu.ok());
        shard::ShardingConfig sc;
        sc.ranks = 2;
        sc.slots_per_rank = slots_per_rank;
        sc.static_plan = static_plan;
        sc.rebalance_interval_steps = 1;
        sc.load_window_steps = 4;
        auto b = MoeBlock::create(MoeShape{kHidden, kInter, kThree, 1, 1}, sc, cpu->get());
        REQUIRE_MESSAGE(b.ok(), b.status().to_string());
        MoeBlock& block = **b;
        Weights weights;
        std::vector<SwiGlu> experts = weights.experts(7);
        experts.resize(kThree);
        Weight router = weights.matrix(kThree, kHidden, 1);
        auto* r = const_cast<float*>(static_cast<const float*>(router.data));
        std::fill(r, r + kThree * kHidden, 0.4f);
        block.set_layer(0, router, make_softmax_router(kThree, 1, true), std::move(experts));
        const std::vector<float> h = Fixture::rows(0);
        for (int s = 0; s < 4; ++s) {
            std::vector<float> x(h.size(), 0.0f);
            block.begin_step();
            REQUIRE(block.forward(0, h.data(), Fixture::kRows, x.data()).ok());
            REQUIRE(block.end_step().ok());
        }
        const shard::ShardStats st = block.stats();
        CHECK(st.rebalances == 4);
        return st.extra_replicas;
    };
    // Asked for: 2 slots a rank, the spare one holds a replica of the hot expert.
    CHECK(run(2) == 1);
    // 0: the same 2 slots, and no replicas, as configured.
    CHECK(run(0) == 0);
    // 0 beside a static plan that lists a replica: its spare slot keeps holding one.
    CHECK(run(0, "0-1;2,0") == 1);
}

TEST_CASE("moe block: layers x experts beyond any real model is refused before allocating") {
    // 4096 layers x 65536 experts passes each field's own range; the block's per-pair load
    // windows and placement would take tens of gigabytes.
    auto cpu = create_backend("cpu", BackendOptions{1});
    REQUIRE(cpu.ok());
    shard::ShardingConfig sc;
    auto huge = MoeBlock::create(MoeShape{8, 8, 65536, 8, 4096}, sc, cpu->get());
    REQUIRE_FALSE(huge.ok());
    CHECK(huge.status().message().find("4096 layers x 65536 routed experts") != std::string::npos);
    // Kimi K2's 61 x 384 is far inside.
    CHECK(MoeBlock::create(MoeShape{8, 8, 384, 8, 61}, sc, cpu->get()).ok());
}

}  // namespace
}  // namespace edge::engine
