// The daemon's signal helpers, with real signals: each case runs in a forked child, whose only
// threads are its own, so a process-directed kill() reaches the watcher and nothing else.

#include "daemon/signals.h"

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace edge::daemon {
namespace {

// Runs `body` in a forked child and returns its exit code (-1 when it died of a signal, as it
// does at the alarm if it hangs).
template <typename Body>
int in_child(Body body) {
    const pid_t pid = fork();
    if (pid == 0) {
        alarm(30);
        _exit(body());
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Waits up to 5 s for `flag` to reach `want`.
bool wait_for(const std::atomic<int>& flag, int want) {
    for (int i = 0; i < 500 && flag.load() != want; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return flag.load() == want;
}

TEST_CASE("signal_name names the daemon's signals") {
    CHECK(signal_name(SIGTERM) == "SIGTERM");
    CHECK(signal_name(SIGINT) == "SIGINT");
    CHECK(signal_name(SIGHUP) == "SIGHUP");
    CHECK(signal_name(SIGUSR1) == "signal");
}

TEST_CASE("SignalWatcher calls back for each watched signal, on its own thread, until destroyed") {
    const int code = in_child([] {
        const sigset_t set = signal_set({SIGUSR1, SIGUSR2});
        pthread_sigmask(SIG_BLOCK, &set, nullptr);
        std::atomic<int> seen{0};
        std::atomic<int> last{0};
        const std::thread::id main_thread = std::this_thread::get_id();
        std::atomic<bool> other_thread{true};
        {
            SignalWatcher watcher({SIGUSR1, SIGUSR2}, [&](int sig) {
                other_thread = other_thread && std::this_thread::get_id() != main_thread;
                last = sig;
                seen.fetch_add(1);
            });
            kill(getpid(), SIGUSR1);
            if (!wait_for(seen, 1) || last != SIGUSR1) {
                return 10;
            }
            kill(getpid(), SIGUSR2);
            if (!wait_for(seen, 2) || last != SIGUSR2) {
                return 11;
            }
        }
        // Destroyed: a later signal stays pending, no callback.
        kill(getpid(), SIGUSR1);
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        if (seen != 2) {
            return 12;
        }
        sigset_t pending;
        sigpending(&pending);
        if (!sigismember(&pending, SIGUSR1)) {
            return 13;
        }
        return other_thread ? 0 : 14;
    });
    CHECK(code == 0);
}

TEST_CASE("SignalWatcher's destructor returns promptly when no signal comes") {
    const int code = in_child([] {
        const sigset_t set = signal_set({SIGUSR1});
        pthread_sigmask(SIG_BLOCK, &set, nullptr);
        const auto start = std::chrono::steady_clock::now();
        { SignalWatcher watcher({SIGUSR1}, [](int) {}); }
        const auto took = std::chrono::steady_clock::now() - start;
        // One poll period, with room for a loaded machine.
        return took < std::chrono::seconds(5) ? 0 : 1;
    });
    CHECK(code == 0);
}

TEST_CASE("take_pending_stop takes a pending SIGTERM or SIGINT once, and leaves SIGHUP") {
    const int code = in_child([] {
        const sigset_t set = signal_set({SIGTERM, SIGINT, SIGHUP});
        pthread_sigmask(SIG_BLOCK, &set, nullptr);
        if (take_pending_stop()) {
            return 10;
        }
        kill(getpid(), SIGHUP);
        if (take_pending_stop()) {
            return 11;
        }
        kill(getpid(), SIGTERM);
        std::optional<int> sig = take_pending_stop();
        if (!sig || *sig != SIGTERM) {
            return 12;
        }
        if (take_pending_stop()) {
            return 13;
        }
        kill(getpid(), SIGINT);
        sig = take_pending_stop();
        if (!sig || *sig != SIGINT) {
            return 14;
        }
        sigset_t pending;
        sigpending(&pending);
        return sigismember(&pending, SIGHUP) ? 0 : 15;
    });
    CHECK(code == 0);
}

}  // namespace
}  // namespace edge::daemon
