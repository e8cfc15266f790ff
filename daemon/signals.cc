#include "daemon/signals.h"

#include <utility>

namespace edge::daemon {

std::string_view signal_name(int sig) {
    switch (sig) {
        case SIGTERM: return "SIGTERM";
        case SIGINT: return "SIGINT";
        case SIGHUP: return "SIGHUP";
        default: return "signal";
    }
}

sigset_t signal_set(std::initializer_list<int> signals) {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : signals) {
        sigaddset(&set, sig);
    }
    return set;
}

std::optional<int> take_pending_stop() {
    sigset_t pending;
    sigemptyset(&pending);
    if (sigpending(&pending) != 0 ||
        (!sigismember(&pending, SIGTERM) && !sigismember(&pending, SIGINT))) {
        return std::nullopt;
    }
    const sigset_t stop = signal_set({SIGTERM, SIGINT});
    int sig = 0;
    if (sigwait(&stop, &sig) != 0) {
        return std::nullopt;
    }
    return sig;
}

SignalWatcher::SignalWatcher(std::initializer_list<int> signals,
                             std::function<void(int)> on_signal)
    : thread_([this, set = signal_set(signals), on_signal = std::move(on_signal)] {
          const timespec poll{0, kPollNs};
          while (!done_.load()) {
              const int sig = sigtimedwait(&set, nullptr, &poll);
              if (sig > 0) {
                  on_signal(sig);
              }
          }
      }) {}

SignalWatcher::~SignalWatcher() {
    done_.store(true);
    thread_.join();
}

}  // namespace edge::daemon
