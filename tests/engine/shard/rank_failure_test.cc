// One rank of a sharded MoE block failing alone: a rank backend that throws (std::bad_alloc, as a
// rank growing a buffer would) while the other rank waits in the count exchange. forward()
// returns kInternal naming the rank instead of ending the process (a worker thread's exception)
// or waiting for ever; the block's communicators are aborted, so every later forward fails fast
// with the same status. Runs under a time bound, so a hang fails.

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <future>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "engine/model/moe_block.h"

namespace edge::engine {
namespace {

constexpr int64_t kHidden = 8;
constexpr int64_t kInter = 4;
constexpr int32_t kExperts = 4;
constexpr int64_t kRows = 6;

// A CPU backend whose matmuls throw once `armed` is set (the router's matmul_exact is the
// first call of a forward, and Backend's default sends it here).
class ThrowingBackend final : public Backend {
public:
    explicit ThrowingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

    std::string_view name() const override { return "throwing"; }
    bool supports(Op op, WeightFormat format) const override {
        return inner_->supports(op, format);
    }
    int threads() const override { return inner_->threads(); }
    void matmul(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy) override {
        if (armed) {
            throw std::bad_alloc();
        }
        inner_->matmul(w, x, n, y, ldy);
    }
    void matmul_batch(std::span<const MatmulJob> jobs) override { inner_->matmul_batch(jobs); }

    bool armed = false;

protected:
    void run_tasks(int64_t n, void (*fn)(void*, int64_t, int), void* ctx) override {
        inner_->for_each_task(n, [fn, ctx](int64_t i, int worker) { fn(ctx, i, worker); });
    }

private:
    std::unique_ptr<Backend> inner_;
};

// Two ranks, one MoE layer of 4 F32 experts (2 a rank), every rank backend a ThrowingBackend.
struct Block {
    std::unique_ptr<Backend> driver;
    std::vector<ThrowingBackend*> ranks;  // Owned by the block.
    std::vector<std::vector<float>> store;
    std::unique_ptr<MoeBlock> block;

    Weight matrix(int64_t rows, int64_t cols, int seed) {
        std::vector<float>& v = store.emplace_back(static_cast<size_t>(rows * cols));
        for (size_t i = 0; i < v.size(); ++i) {
            v[i] = 0.1f * static_cast<float>((i * 7 + static_cast<size_t>(seed) * 13) % 17) - 0.8f;
        }
        Weight w;
        w.format = WeightFormat::kF32;
        w.rows = rows;
        w.cols = cols;
        w.data = v.data();
        return w;
    }

    Block() {
        store.reserve(1 + 3 * kExperts);  // Weights point into the vectors: no reallocation.
        auto cpu = create_backend("cpu", BackendOptions{2});
        REQUIRE(cpu.ok());
        driver = std::move(cpu).value();
        shard::ShardingConfig sc;
        sc.ranks = 2;
        auto make_rank = [&](const BackendOptions& bo) -> Result<std::unique_ptr<Backend>> {
            EDGE_ASSIGN_OR_RETURN(auto inner, create_backend("cpu", bo));
            auto rank = std::make_unique<ThrowingBackend>(std::move(inner));
            ranks.push_back(rank.get());
            return std::unique_ptr<Backend>(std::move(rank));
        };
        auto b = MoeBlock::create(MoeShape{kHidden, kInter, kExperts, 2, 1}, sc, driver.get(),
                                  make_rank);
        REQUIRE_MESSAGE(b.ok(), b.status().to_string());
        block = std::move(b).value();
        std::vector<SwiGlu> experts;
        for (int e = 0; e < kExperts; ++e) {
            experts.push_back({matrix(kInter, kHidden, 3 * e), matrix(kInter, kHidden, 3 * e + 1),
                               matrix(kHidden, kInter, 3 * e + 2)});
        }
        block->set_layer(0, matrix(kExperts, kHidden, 99), make_softmax_router(kExperts, 2, true),
                         std::move(experts));
    }
};

// forward() of the one layer on a thread of its own, waited for at most a generous bound; a hung
// forward fails the test (its thread is left behind, owning the block).
Status forward_within_bound(const std::shared_ptr<Block>& b) {
    auto h = std::make_shared<std::vector<float>>(kRows * kHidden, 0.5f);
    auto x = std::make_shared<std::vector<float>>(kRows * kHidden, 0.0f);
    auto task = std::make_shared<std::packaged_task<Status()>>(
        [b, h, x] { return b->block->forward(0, h->data(), kRows, x->data()); });
    std::future<Status> done = task->get_future();
    std::thread t([task] { (*task)(); });
    if (done.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
        t.detach();
        FAIL("forward still running after 30 s: a rank waits for ever");
    }
    t.join();
    return done.get();
}

TEST_CASE("sharding: a rank that throws fails the forward with its name and later ones fast") {
    auto b = std::make_shared<Block>();
    REQUIRE(b->ranks.size() == 2);
    b->block->begin_step();
    REQUIRE(forward_within_bound(b).ok());
    // Rank 1 throws routing its rows; rank 0 waits for it in the count exchange.
    b->ranks[1]->armed = true;
    const Status failed = forward_within_bound(b);
    CHECK(failed.code() == StatusCode::kInternal);
    CHECK(failed.message().find("rank 1 of 2 threw: ") == 0);
    // The communicators stay aborted: the next forward fails at once with the same status, even
    // with the rank healthy again.
    b->ranks[1]->armed = false;
    CHECK(forward_within_bound(b) == failed);
    // Reported as a device fault: the daemon drains and exits for a restart (before, the
    // process ended in std::terminate, which systemd restarted), rather than failing every
    // request from then on while /readyz says ready.
    const Status fault = device_health();
    CHECK(fault.code() == StatusCode::kInternal);
    CHECK(fault.message().find("rank 1 of 2 threw: ") != std::string::npos);
    clear_reported_device_fault_for_testing();
}

}  // namespace
}  // namespace edge::engine
