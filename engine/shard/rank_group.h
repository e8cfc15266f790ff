#pragma once

// RankGroup runs one function on R in-process ranks at once: rank 0 on the calling thread, ranks
// 1..R-1 on threads the group owns, and returns when all have finished. It is how the sharded
// MoE block drives its ranks SPMD-style (every rank runs the same code with its own rank number
// and talks to the others only through its Communicator). A group of 1 starts no thread.
//
// Failure of one rank: a rank whose body throws, or returns an error, leaves its peers waiting in
// their next collective for a partner that never comes. The group then aborts every rank's
// communicator (Communicator::abort) with that rank's status, so the peers' collectives return it
// at once, waits for every rank to finish (no rank outlives the body's frame), and run() returns
// that first failure as a Status. Exceptions never leave run(): the engine reports errors as
// Status, and a worker thread's exception would otherwise end the process. So a body that wants
// its communicators to stay usable after an error every rank sees alike (a collective's
// kInvalidArgument, a staging buffer it could not get) keeps that error itself (in the rank's
// state, as engine/model/moe_block.cc does) and returns void or OK; an error it returns aborts
// the group's communicators for good.
//
// Threading: run() is called from one thread at a time and must not be re-entered from inside
// the function. The destructor joins the threads. Lifetime: the communicators must outlive the
// group.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/status.h"
#include "engine/shard/communicator.h"

namespace edge::engine::shard {

class RankGroup {
public:
    // One rank per element of `comms` (rank r's endpoint first in rank order, none null, at
    // least one): those the group aborts when a rank fails.
    explicit RankGroup(std::vector<Communicator*> comms);
    ~RankGroup();
    RankGroup(const RankGroup&) = delete;
    RankGroup& operator=(const RankGroup&) = delete;

    int32_t ranks() const { return ranks_; }

    // Calls body(rank) for every rank in [0, ranks()) concurrently; returns when all are done.
    // `body` returns void or Status. OK when every rank finished without error; else the first
    // failure, which the communicators were aborted with: a rank's error with "rank r" put
    // before it, or kInternal "rank r of R threw: <what()>" for an exception.
    template <typename F>
    [[nodiscard]] Status run(F&& body) {
        using Body = std::remove_reference_t<F>;
        return run_impl(
            [](void* ctx, int32_t r) -> Status {
                if constexpr (std::is_void_v<std::invoke_result_t<Body&, int32_t>>) {
                    (*static_cast<Body*>(ctx))(r);
                    return ok_status();
                } else {
                    return (*static_cast<Body*>(ctx))(r);
                }
            },
            &body);
    }

private:
    using Fn = Status (*)(void*, int32_t);
    Status run_impl(Fn fn, void* ctx);
    void worker_loop(int32_t rank);
    // Runs fn_ as `rank`; on an error or exception records it (first wins) and aborts the
    // communicators.
    void run_rank(Fn fn, void* ctx, int32_t rank);

    const int32_t ranks_;
    const std::vector<Communicator*> comms_;
    std::vector<std::thread> threads_;
    Fn fn_ = nullptr;
    void* ctx_ = nullptr;
    std::atomic<uint64_t> gen_{0};     // Bumped to start a job.
    std::atomic<int32_t> pending_{0};  // Ranks 1.. still running the current job.
    std::atomic<bool> stop_{false};
    std::mutex failure_mu_;
    Status failure_;  // The current job's first failure.
};

}  // namespace edge::engine::shard
