// The scheduler driven by its own thread (start()), not by step(): many tiny requests submitted
// from several threads at once, some cancelled right away, arrive while the scheduler thread is
// busy, idle, or on its way to sleep. Every request must finish (a lost wake-up, or a request
// admitted and never stepped, leaves a sink waiting and its bounded wait fails the test), each
// exactly once, and every model slot is free at the end.

#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

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

TEST_CASE("scheduler thread: tiny requests from four threads, some cancelled, all finish once") {
    FakeOptions options;
    options.slots = 4;
    auto log = std::make_shared<FakeLog>();
    SchedulerConfig config;
    config.max_batch_sequences = 4;
    config.eos_token_ids = options.eos;
    Scheduler scheduler(std::make_unique<FakeCausalLM>(options, log), &micro_tokenizer(), config);
    scheduler.start();

    constexpr int kThreads = 4;
    constexpr int kPerThread = 250;
    std::vector<std::vector<std::shared_ptr<CollectingSink>>> sinks(kThreads);
    std::atomic<int> rejected{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            for (int i = 0; i < kPerThread; ++i) {
                auto sink = std::make_shared<CollectingSink>();
                SamplingParams params;
                params.temperature = 0.0f;
                params.max_tokens = 1 + i % 4;
                SequenceRequest request;
                request.request_id = "r";
                request.prompt = {static_cast<TokenId>(1 + t), 2, 3};
                request.sampling = params;
                request.seed = 1;
                request.sink = sink;
                request.tenant = "t" + std::to_string(t % 2);  // Two tenants share the queue.
                auto handle = scheduler.submit(std::move(request));
                if (!handle.ok()) {
                    ++rejected;
                    continue;
                }
                if (i % 7 == 0) {
                    (*handle)->cancel();
                }
                sinks[t].push_back(std::move(sink));
                if (i % 16 == 0) {
                    // Let the scheduler thread run dry now and then, so that later submits find
                    // it going to sleep or asleep.
                    std::this_thread::yield();
                }
            }
        });
    }
    for (std::thread& t : threads) {
        t.join();
    }
    CHECK(rejected == 0);
    int finished = 0;
    for (const auto& per_thread : sinks) {
        for (const auto& sink : per_thread) {
            std::optional<Finish> finish = sink->wait();
            REQUIRE_MESSAGE(finish, "request " << finished << " never finished");
            CHECK_MESSAGE((finish->reason == FinishReason::kLength ||
                           finish->reason == FinishReason::kStop ||
                           finish->reason == FinishReason::kCancelled),
                          "request " << finished << ": " << finish->error.message());
            CHECK_FALSE(sink->protocol_violated());
            ++finished;
        }
    }
    CHECK(finished == kThreads * kPerThread);
    scheduler.stop();
    std::lock_guard<std::mutex> lock(log->mu);
    CHECK(log->slots_in_use == 0);
}

}  // namespace
}  // namespace edge::engine::sched
