// ThreadPool when the process cannot start the threads it asks for: std::thread's constructor
// throws (EAGAIN under RLIMIT_NPROC, systemd's TasksMax, a cgroup's pids.max), stood for here by
// the start hook, which throws before the chosen worker's thread is made.

#include "engine/cpu/thread_pool.h"

#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "common/log.h"

namespace edge::engine::cpu {
namespace {

int g_fail_from = 0;  // The first worker whose thread does not start.

void refuse_eagain(int worker) {
    if (worker >= g_fail_from) {
        throw std::system_error(EAGAIN, std::generic_category(), "pthread_create");
    }
}

void refuse_bad_alloc(int worker) {
    if (worker >= g_fail_from) {
        throw std::bad_alloc();
    }
}

// Installs a start hook and a log sink for one test; both removed on the way out.
struct Refusing {
    Refusing(void (*hook)(int), int fail_from) : level(log::level()) {
        g_fail_from = fail_from;
        set_thread_start_hook_for_testing(hook);
        log::set_level(log::Level::kInfo);  // Whatever EDGE_LOG_LEVEL says.
        log::set_sink([this](std::string_view line) { lines.emplace_back(line); });
    }
    ~Refusing() {
        set_thread_start_hook_for_testing(nullptr);
        log::set_sink(nullptr);
        log::set_level(level);
    }
    log::Level level;
    std::vector<std::string> lines;
};

// Every index covered once, and every worker number below size().
void check_pool_works(ThreadPool& pool) {
    for (int64_t n : {1, 7, 1001}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, 4, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                hits[static_cast<size_t>(i)]++;
            }
        });
        std::vector<std::atomic<int>> tasks(static_cast<size_t>(n));
        std::atomic<bool> worker_in_range{true};
        pool.for_each_task(n, [&](int64_t i, int worker) {
            if (worker < 0 || worker >= pool.size()) {
                worker_in_range = false;
            }
            tasks[static_cast<size_t>(i)]++;
        });
        CHECK(worker_in_range);
        for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
            REQUIRE(hits[i] == 1);
            REQUIRE(tasks[i] == 1);
        }
    }
}

TEST_CASE("thread pool - out of threads: a smaller pool and a warning, not std::terminate") {
    SUBCASE("the fourth of eight threads does not start") {
        Refusing refusing(refuse_eagain, 3);
        ThreadPool pool(8);
        CHECK(pool.size() == 3);  // The caller and workers 1 and 2.
        check_pool_works(pool);
        REQUIRE(refusing.lines.size() == 1);
        const std::string& line = refusing.lines[0];
        INFO(line);
        CHECK(line.find("\"level\":\"warn\"") != std::string::npos);
        CHECK(line.find("\"event\":\"thread_pool_short\"") != std::string::npos);
        CHECK(line.find("\"threads_asked\":8") != std::string::npos);
        CHECK(line.find("\"threads\":3") != std::string::npos);
        CHECK(line.find("could not start thread 4 of 8: Resource temporarily unavailable") !=
              std::string::npos);
    }
    SUBCASE("no thread starts: the caller alone") {
        Refusing refusing(refuse_eagain, 1);
        ThreadPool pool(16);
        CHECK(pool.size() == 1);
        check_pool_works(pool);
        REQUIRE(refusing.lines.size() == 1);
        CHECK(refusing.lines[0].find("could not start thread 2 of 16") != std::string::npos);
    }
    SUBCASE("every thread starts: no warning") {
        Refusing refusing(refuse_eagain, 4);
        ThreadPool pool(4);
        CHECK(pool.size() == 4);
        check_pool_works(pool);
        CHECK(refusing.lines.empty());
    }
}

TEST_CASE("thread pool - another failure to start a worker reaches the caller, workers joined") {
    // Not a shortage of threads: the constructor throws, after joining the workers it started
    // (a joinable std::thread destroyed on the way out would call std::terminate).
    Refusing refusing(refuse_bad_alloc, 3);
    CHECK_THROWS_AS(ThreadPool(8), std::bad_alloc);
    CHECK(refusing.lines.empty());
}

}  // namespace
}  // namespace edge::engine::cpu
