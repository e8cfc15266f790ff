#include "engine/cpu/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <system_error>

#include "common/log.h"

namespace edge::engine::cpu {
namespace {

using SpinClock = std::chrono::steady_clock;

// An idle worker spins this long for the next job before it sleeps: a forward issues many short
// parallel_fors back to back (and the next token follows within microseconds), and waking a
// sleeping thread costs more than the work of many.
constexpr auto kSpinTime = std::chrono::microseconds(300);
// The caller, waiting for workers to finish their chunks, spins this long, then yields the CPU
// (a worker preempted mid-chunk may be waiting for this very core), then sleeps.
constexpr auto kCallerSpinTime = std::chrono::microseconds(50);
constexpr auto kCallerYieldTime = std::chrono::milliseconds(2);
// Range jobs: a claim takes 1 / (kClaimDivisor * workers) of the grains left, but at least
// 1 / kMaxClaims of all (bounding the claims per job, each a contended atomic and a kernel call
// whose first rows are not yet prefetched). 1 (at two workers: 1/2, 1/4, 1/8, ... of the job)
// against 2 (1/4, 3/16, ...): one-token decode steps faster by 3.8% / 3.2% (int4-g128), 3.5%
// (fp8), 2.0% (int8), 1.7% / 0.9% (BF16) in in-process A/B runs of 16-20 alternating rounds on
// the bench preset (the one-token q/k/v and o matmuls of INT4 attention, each under 1 MiB, took
// ~20% less time); about half as many cold kernel starts per matmul.
constexpr int64_t kClaimDivisor = 1;
constexpr int64_t kMaxClaims = 64;
// Pause instructions between clock reads while spinning.
constexpr int kPausesPerCheck = 32;

std::atomic<void (*)(int)> g_thread_start_hook{nullptr};

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
    gen_.store(1);  // Closed until the first job.
    // Reserved first: keeping a thread that started cannot fail.
    threads_.reserve(static_cast<size_t>(threads - 1));
    try {
        for (int i = 1; i < threads; ++i) {
            if (void (*hook)(int) = g_thread_start_hook.load()) {
                hook(i);
            }
            threads_.emplace_back([this, i] { worker_loop(i); });
        }
    } catch (const std::system_error& e) {
        // Out of threads (EAGAIN: RLIMIT_NPROC, systemd's TasksMax, a cgroup's pids.max). The
        // pool works with the workers it has (the callers construct it where nothing can fail,
        // and a smaller pool is slower, not wrong), so it keeps them rather than take the
        // process down: a thread left joinable here would call std::terminate.
        const int started = static_cast<int>(threads_.size()) + 1;
        log::warn("thread_pool_short",
                  {{"threads_asked", threads},
                   {"threads", started},
                   {"error", "could not start thread " + std::to_string(started + 1) + " of " +
                                 std::to_string(threads) + ": " + e.code().message()},
                   {"detail",
                    "running with fewer threads; raise the process's thread limit "
                    "(systemd TasksMax, ulimit -u, the cgroup's pids.max) or lower "
                    "engine.threads"}});
    } catch (...) {
        // Anything else (std::bad_alloc) goes to the caller, with no thread left running.
        stop_workers();
        throw;
    }
    // Workers read size_ only inside a job, which the caller opens after this.
    size_ = static_cast<int>(threads_.size()) + 1;
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
    stop_.store(true);
    gen_.fetch_add(1);
    gen_.notify_all();
    for (std::thread& t : threads_) {
        t.join();
    }
    threads_.clear();
}

void ThreadPool::run(int64_t n, int64_t grain, Fn fn, void* ctx) {
    if (n <= 0) {
        return;
    }
    grain = std::max<int64_t>(1, grain);
    if (size_ == 1 || n <= grain) {
        fn(ctx, 0, n);
        return;
    }
    dispatch(fn, ctx, n, grain, 0, false);
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
    dispatch(fn, ctx, tasks, 1, tasks, true);
}

void ThreadPool::dispatch(Fn fn, void* ctx, int64_t n, int64_t grain, int64_t chunks,
                          bool tasks) {
    // The job is closed and no worker is active (the previous dispatch ended that way).
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    grain_ = grain;
    grains_ = (n + grain - 1) / grain;
    chunks_ = chunks;
    min_claim_ = std::max<int64_t>(1, grains_ / kMaxClaims);
    tasks_ = tasks;
    next_.store(0, std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_seq_cst);  // Open.
    gen_.notify_all();
    work_on(0);
    // Close, then wait only for workers that got in: one that has not started never will.
    gen_.fetch_add(1, std::memory_order_seq_cst);
    if (active_.load(std::memory_order_seq_cst) == 0) {
        return;
    }
    const SpinClock::time_point start = SpinClock::now();
    for (;;) {
        for (int i = 0; i < kPausesPerCheck; ++i) {
            if (active_.load(std::memory_order_seq_cst) == 0) {
                return;
            }
            cpu_relax();
        }
        const auto waited = SpinClock::now() - start;
        if (waited < kCallerSpinTime) {
            continue;
        }
        if (waited < kCallerYieldTime) {
            sched_yield();
            continue;
        }
        const int a = active_.load(std::memory_order_seq_cst);
        if (a == 0) {
            return;
        }
        active_.wait(a, std::memory_order_seq_cst);
    }
}

void ThreadPool::work_on(int worker) {
    if (tasks_) {
        for (;;) {
            const int64_t c = next_.fetch_add(1, std::memory_order_relaxed);
            if (c >= chunks_) {
                return;
            }
            fn_(ctx_, c, worker);
        }
    }
    // Range jobs: guided claims over grains. Each claim takes a share of what is left (so the
    // first are large and the last small): the workers finish within a small chunk of each
    // other, where equal chunks leave one waiting for up to a whole chunk at every barrier.
    int64_t g = next_.load(std::memory_order_relaxed);
    for (;;) {
        if (g >= grains_) {
            return;
        }
        const int64_t take = std::max(min_claim_, (grains_ - g) / (kClaimDivisor * size_));
        if (!next_.compare_exchange_weak(g, g + take, std::memory_order_relaxed)) {
            continue;
        }
        fn_(ctx_, g * grain_, std::min(n_, (g + take) * grain_));
        g = next_.load(std::memory_order_relaxed);
    }
}

void ThreadPool::worker_loop(int worker) {
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = gen_.load(std::memory_order_seq_cst);
        if (g == seen || (g & 1) != 0) {
            // Spin for the next job, then sleep until gen_ moves.
            const SpinClock::time_point start = SpinClock::now();
            bool spinning = true;
            while (g == seen || (g & 1) != 0) {
                if (stop_.load(std::memory_order_relaxed)) {
                    return;
                }
                if (spinning) {
                    for (int i = 0; i < kPausesPerCheck && (g == seen || (g & 1) != 0); ++i) {
                        cpu_relax();
                        g = gen_.load(std::memory_order_seq_cst);
                    }
                    spinning = SpinClock::now() - start < kSpinTime;
                } else {
                    gen_.wait(g, std::memory_order_seq_cst);
                    g = gen_.load(std::memory_order_seq_cst);
                }
            }
        }
        if (stop_.load()) {
            return;
        }
        // Announce, then check the job is still open: either the caller sees us in active_ and
        // waits, or we see it closed and stay out (both sides use seq_cst).
        active_.fetch_add(1, std::memory_order_seq_cst);
        if (gen_.load(std::memory_order_seq_cst) == g) {
            work_on(worker);
        }
        seen = g;
        if (active_.fetch_sub(1, std::memory_order_seq_cst) == 1) {
            active_.notify_one();
        }
    }
}

void set_thread_start_hook_for_testing(void (*hook)(int worker)) {
    g_thread_start_hook.store(hook);
}

}  // namespace edge::engine::cpu
