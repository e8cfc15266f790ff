#pragma once

// RankGroup runs one function on R in-process ranks at once: rank 0 on the calling thread, ranks
// 1..R-1 on threads the group owns, and returns when all have finished. It is how the sharded
// MoE block drives its ranks SPMD-style (every rank runs the same code with its own rank number
// and talks to the others only through its Communicator). A group of 1 starts no thread.
//
// Threading: run() is called from one thread at a time and must not be re-entered from inside
// the function. The destructor joins the threads.

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace edge::engine::shard {

class RankGroup {
public:
    explicit RankGroup(int32_t ranks);
    ~RankGroup();
    RankGroup(const RankGroup&) = delete;
    RankGroup& operator=(const RankGroup&) = delete;

    int32_t ranks() const { return ranks_; }

    // Calls body(rank) for every rank in [0, ranks()) concurrently; returns when all are done.
    template <typename F>
    void run(F&& body) {
        run_impl([](void* ctx, int32_t r) { (*static_cast<std::remove_reference_t<F>*>(ctx))(r); },
                 &body);
    }

private:
    using Fn = void (*)(void*, int32_t);
    void run_impl(Fn fn, void* ctx);
    void worker_loop(int32_t rank);

    const int32_t ranks_;
    std::vector<std::thread> threads_;
    Fn fn_ = nullptr;
    void* ctx_ = nullptr;
    std::atomic<uint64_t> gen_{0};      // Bumped to start a job.
    std::atomic<int32_t> pending_{0};   // Ranks 1.. still running the current job.
    std::atomic<bool> stop_{false};
};

}  // namespace edge::engine::shard
