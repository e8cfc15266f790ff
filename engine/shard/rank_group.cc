#include "engine/shard/rank_group.h"

#include <exception>
#include <string>

#include "common/check.h"

namespace edge::engine::shard {
namespace {

constexpr int kSpins = 4000;

inline void pause() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

}  // namespace

RankGroup::RankGroup(std::vector<Communicator*> comms)
    : ranks_(static_cast<int32_t>(comms.size())), comms_(std::move(comms)) {
    EDGE_CHECK(ranks_ >= 1, "rank group: no communicator");
    for (Communicator* c : comms_) {
        EDGE_CHECK(c != nullptr, "rank group: null communicator");
    }
    for (int32_t r = 1; r < ranks_; ++r) {
        threads_.emplace_back([this, r] { worker_loop(r); });
    }
}

RankGroup::~RankGroup() {
    stop_.store(true, std::memory_order_release);
    gen_.fetch_add(1, std::memory_order_acq_rel);
    gen_.notify_all();
    for (std::thread& t : threads_) {
        t.join();
    }
}

Status RankGroup::run_impl(Fn fn, void* ctx) {
    failure_ = ok_status();
    if (ranks_ == 1) {
        run_rank(fn, ctx, 0);
        return failure_;
    }
    fn_ = fn;
    ctx_ = ctx;
    pending_.store(ranks_ - 1, std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_acq_rel);
    gen_.notify_all();
    run_rank(fn, ctx, 0);
    // Even when rank 0 failed: the others run on this frame's body until they finish (the abort
    // makes that prompt).
    for (int spin = 0;; ++spin) {
        const int32_t p = pending_.load(std::memory_order_acquire);
        if (p == 0) {
            break;
        }
        if (spin < kSpins) {
            pause();
        } else {
            pending_.wait(p, std::memory_order_acquire);
        }
    }
    std::lock_guard<std::mutex> lock(failure_mu_);
    return failure_;
}

void RankGroup::run_rank(Fn fn, void* ctx, int32_t rank) {
    Status st;
    try {
        st = fn(ctx, rank);
        if (!st.ok()) {
            st = st.with_context("rank " + std::to_string(rank));
        }
    } catch (const std::exception& e) {
        st = internal_error("rank " + std::to_string(rank) + " of " + std::to_string(ranks_) +
                            " threw: " + e.what());
    } catch (...) {
        st = internal_error("rank " + std::to_string(rank) + " of " + std::to_string(ranks_) +
                            " threw an exception that is not a std::exception");
    }
    if (st.ok()) {
        return;
    }
    {
        std::lock_guard<std::mutex> lock(failure_mu_);
        if (failure_.ok()) {
            failure_ = st;
        }
    }
    // Every endpoint, not only this rank's: endpoints made one by one (NcclCommunicator::create)
    // share no abort signal.
    for (Communicator* c : comms_) {
        c->abort(st);
    }
}

void RankGroup::worker_loop(int32_t rank) {
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = gen_.load(std::memory_order_acquire);
        for (int spin = 0; g == seen; ++spin) {
            if (spin < kSpins) {
                pause();
            } else {
                gen_.wait(g, std::memory_order_acquire);
            }
            g = gen_.load(std::memory_order_acquire);
        }
        seen = g;
        if (stop_.load(std::memory_order_acquire)) {
            return;
        }
        run_rank(fn_, ctx_, rank);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            pending_.notify_all();
        }
    }
}

}  // namespace edge::engine::shard
