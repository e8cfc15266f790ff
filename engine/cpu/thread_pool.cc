#include "engine/cpu/thread_pool.h"

#include <algorithm>

namespace edge::engine::cpu {
namespace {

// Spins this many times before sleeping on the atomic: a forward issues hundreds of short
// parallel_fors back to back, and waking a sleeping thread costs more than the work of many.
constexpr int kSpins = 4000;

inline void cpu_relax() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
    if (threads < 1) {
        threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    }
    size_ = threads;
    for (int i = 1; i < size_; ++i) {
        threads_.emplace_back([this, i] { worker_loop(i); });
    }
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (std::thread& t : threads_) {
        t.join();
    }
}

void ThreadPool::run(int64_t n, int64_t grain, Fn fn, void* ctx) {
    if (n <= 0) {
        return;
    }
    if (size_ == 1 || n <= grain) {
        fn(ctx, 0, n);
        return;
    }
    dispatch(fn, ctx, n, std::max<int64_t>(1, grain), false);
}

void ThreadPool::run_dynamic(int64_t tasks, Fn fn, void* ctx) {
    if (tasks <= 0) {
        return;
    }
    if (size_ == 1 || tasks == 1) {
        for (int64_t t = 0; t < tasks; ++t) {
            fn(ctx, t, 0);
        }
        return;
    }
    next_task_.store(0, std::memory_order_relaxed);
    dispatch(fn, ctx, tasks, 1, true);
}

void ThreadPool::dispatch(Fn fn, void* ctx, int64_t n, int64_t grain, bool dynamic) {
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    grain_ = grain;
    dynamic_ = dynamic;
    remaining_.store(size_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    work_on(0);
    for (int spin = 0; remaining_.load(std::memory_order_acquire) != 0; ++spin) {
        if (spin < kSpins) {
            cpu_relax();
        } else {
            int r = remaining_.load(std::memory_order_acquire);
            if (r != 0) {
                remaining_.wait(r, std::memory_order_acquire);
            }
        }
    }
}

void ThreadPool::work_on(int worker) {
    if (dynamic_) {
        for (;;) {
            int64_t t = next_task_.fetch_add(1, std::memory_order_relaxed);
            if (t >= n_) {
                break;
            }
            fn_(ctx_, t, worker);
        }
        return;
    }
    // Contiguous parts of whole grains, as even as possible.
    int64_t grains = (n_ + grain_ - 1) / grain_;
    int64_t g0 = grains * worker / size_;
    int64_t g1 = grains * (worker + 1) / size_;
    int64_t b = std::min(n_, g0 * grain_);
    int64_t e = std::min(n_, g1 * grain_);
    if (b < e) {
        fn_(ctx_, b, e);
    }
}

void ThreadPool::worker_loop(int worker) {
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = generation_.load(std::memory_order_acquire);
        for (int spin = 0; g == seen; ++spin) {
            if (spin < kSpins) {
                cpu_relax();
            } else {
                generation_.wait(seen, std::memory_order_acquire);
            }
            g = generation_.load(std::memory_order_acquire);
        }
        seen = g;
        if (stop_.load()) {
            return;
        }
        work_on(worker);
        if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            remaining_.notify_one();
        }
    }
}

}  // namespace edge::engine::cpu
