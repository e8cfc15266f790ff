#pragma once

// ThreadPool is a fixed set of compute threads that run one parallel_for at a time. The calling
// thread takes part as worker 0, so a pool of size 1 starts no thread at all. A parallel_for hands
// out [0, n) in contiguous chunks (boundaries at multiples of `grain`) that the workers claim from
// a shared counter, each claim a share of what is left (guided: large first, small last, so the
// workers reach the end together): on a busy machine, a worker the OS has not scheduled yet costs
// nothing, because the others take its chunks and the caller never waits for a worker that has
// not started. Nothing is allocated per call: the body is passed as a pointer to the caller's
// lambda. Idle workers spin for a short while (kSpinTime in thread_pool.cc) before they sleep, so
// the many short jobs of a forward pass start without a wake-up system call; the claim counter, the
// job generation and the active count live on separate cache lines.
//
// Threading: parallel_for may be called from one thread at a time (the model's forward); the body
// runs concurrently on disjoint ranges and must not call parallel_for again. The destructor joins
// the workers.
//
// A pool may start fewer threads than asked: when the process is out of threads (std::thread
// throws std::system_error, EAGAIN under RLIMIT_NPROC, systemd's TasksMax or a cgroup's pids.max)
// it keeps the workers it has, logs a warning (event "thread_pool_short") and size() says how
// many there are. The pool still works with the caller alone; its users size their per-worker
// scratch by size(). No exception leaves the constructor for that.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace edge::engine::cpu {

// The most threads a pool is asked for: engine.threads and the tools' --threads are bounded by it.
inline constexpr int kMaxPoolThreads = 4096;

class ThreadPool {
public:
    // `threads` workers in all (including the caller); values < 1 mean one per hardware thread.
    // Fewer when the process cannot start that many threads (above).
    explicit ThreadPool(int threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    // The workers running, the caller included: at most the number asked for.
    int size() const { return size_; }

    // Calls body(begin, end) on disjoint ranges covering [0, n), in parallel. Ranges start at
    // multiples of `grain`. Returns when all are done.
    template <typename F>
    void parallel_for(int64_t n, int64_t grain, F&& body) {
        auto call = [](void* ctx, int64_t b, int64_t e) {
            (*static_cast<std::remove_reference_t<F>*>(ctx))(b, e);
        };
        run(n, grain, call, &body);
    }

    // Calls body(task, worker) for task in [0, tasks), tasks claimed dynamically by the workers;
    // `worker` < size() identifies the running worker (for per-worker scratch).
    template <typename F>
    void for_each_task(int64_t tasks, F&& body) {
        auto call = [](void* ctx, int64_t b, int64_t worker) {
            (*static_cast<std::remove_reference_t<F>*>(ctx))(b, static_cast<int>(worker));
        };
        run_dynamic(tasks, call, &body);
    }

private:
    // Range jobs get (ctx, begin, end); task jobs get (ctx, task, worker).
    using Fn = void (*)(void*, int64_t, int64_t);
    void run(int64_t n, int64_t grain, Fn fn, void* ctx);
    void run_dynamic(int64_t tasks, Fn fn, void* ctx);
    void dispatch(Fn fn, void* ctx, int64_t n, int64_t grain, int64_t chunks, bool tasks);
    void work_on(int worker);
    void worker_loop(int worker);
    void stop_workers();

    int size_ = 1;
    std::vector<std::thread> threads_;
    // The current job. Written by the caller only while the job is closed (gen_ odd) and no
    // worker is active; read by workers only while they are counted in active_ and saw it open.
    // One cache line, read-only while the job runs.
    alignas(64) Fn fn_ = nullptr;
    void* ctx_ = nullptr;
    int64_t n_ = 0;
    int64_t grain_ = 1;
    int64_t grains_ = 0;
    int64_t chunks_ = 0;      // Task jobs: the number of tasks.
    int64_t min_claim_ = 1;   // Range jobs: the fewest grains one claim takes.
    bool tasks_ = false;
    // Each counter on its own line: claims do not disturb the workers polling gen_.
    alignas(64) std::atomic<int64_t> next_{0};  // Next grain (range jobs) or task to claim.
    alignas(64) std::atomic<uint64_t> gen_{0};  // Even: job open; odd: closed. Bumped per open/close.
    std::atomic<bool> stop_{false};
    alignas(64) std::atomic<int> active_{0};  // Workers inside the current job.
};

// For tests: `hook` runs before each worker thread is started, with the worker's number (1 for
// the first thread started), and may throw what std::thread's constructor throws, to stand for a
// process out of threads. nullptr removes it. Set it while no pool is being constructed.
void set_thread_start_hook_for_testing(void (*hook)(int worker));

}  // namespace edge::engine::cpu
