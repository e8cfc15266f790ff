#pragma once

// ThreadPool is a fixed set of compute threads that run one parallel_for at a time. The calling
// thread takes part as worker 0, so a pool of size 1 starts no thread at all. A parallel_for splits
// [0, n) into size() contiguous parts (boundaries rounded to `grain`) and runs part i on worker i;
// nothing is allocated per call: the body is passed as a pointer to the caller's lambda.
//
// Threading: parallel_for may be called from one thread at a time (the model's forward); the body
// runs concurrently on disjoint ranges and must not call parallel_for again. The destructor joins
// the workers.

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace edge::engine::cpu {

class ThreadPool {
public:
    // `threads` workers in all (including the caller); values < 1 mean one per hardware thread.
    explicit ThreadPool(int threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return size_; }

    // Calls body(begin, end) on disjoint ranges covering [0, n), one per worker, in parallel.
    // Ranges start at multiples of `grain`. Returns when all are done.
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
    // Static jobs get (ctx, begin, end); dynamic jobs get (ctx, task, worker).
    using Fn = void (*)(void*, int64_t, int64_t);
    void run(int64_t n, int64_t grain, Fn fn, void* ctx);
    void run_dynamic(int64_t tasks, Fn fn, void* ctx);
    void dispatch(Fn fn, void* ctx, int64_t n, int64_t grain, bool dynamic);
    void work_on(int worker);
    void worker_loop(int worker);

    int size_ = 1;
    std::vector<std::thread> threads_;
    // The current job, published before `generation_` is bumped.
    Fn fn_ = nullptr;
    void* ctx_ = nullptr;
    int64_t n_ = 0;
    int64_t grain_ = 1;
    bool dynamic_ = false;
    std::atomic<int64_t> next_task_{0};
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> remaining_{0};
    std::atomic<bool> stop_{false};
};

}  // namespace edge::engine::cpu
