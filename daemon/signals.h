#pragma once

// The daemon's process signals. `run` blocks SIGTERM, SIGINT and SIGHUP in every thread before
// it starts any, and takes them synchronously: in its main loop while serving, and through a
// SignalWatcher while its main thread is busy with a step that cannot wait for them (the models'
// load, the drain).

#include <signal.h>

#include <atomic>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <thread>

namespace edge::daemon {

// "SIGTERM", "SIGINT", "SIGHUP", or "signal" for any other.
std::string_view signal_name(int sig);

// A set of signals, from a list.
sigset_t signal_set(std::initializer_list<int> signals);

// The first of SIGTERM or SIGINT already pending on the process (taken off, so it is not acted
// on twice), or nullopt when neither is. For checking after a step that ran with them blocked.
std::optional<int> take_pending_stop();

// Calls on_signal(sig) on a thread of its own for each of `signals` that arrives, until
// destroyed. The signals must be blocked in every thread (sigtimedwait takes only blocked ones).
// The destructor returns within kPollNs.
class SignalWatcher {
public:
    static constexpr long kPollNs = 100'000'000;

    SignalWatcher(std::initializer_list<int> signals, std::function<void(int)> on_signal);
    ~SignalWatcher();
    SignalWatcher(const SignalWatcher&) = delete;
    SignalWatcher& operator=(const SignalWatcher&) = delete;

private:
    std::atomic<bool> done_{false};
    std::thread thread_;
};

}  // namespace edge::daemon
