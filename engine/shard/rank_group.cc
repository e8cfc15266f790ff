#include "engine/shard/rank_group.h"

namespace edge::engine::shard {
namespace {

constexpr int kSpins = 4000;

inline void pause() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

}  // namespace

RankGroup::RankGroup(int32_t ranks) : ranks_(ranks < 1 ? 1 : ranks) {
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

void RankGroup::run_impl(Fn fn, void* ctx) {
    if (ranks_ == 1) {
        fn(ctx, 0);
        return;
    }
    fn_ = fn;
    ctx_ = ctx;
    pending_.store(ranks_ - 1, std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_acq_rel);
    gen_.notify_all();
    fn(ctx, 0);
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
        fn_(ctx_, rank);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            pending_.notify_all();
        }
    }
}

}  // namespace edge::engine::shard
