#pragma once

// Liveness: what a systemd watchdog ping vouches for. The main thread's signal loop sends
// WATCHDOG=1, and on its own it would keep sending while every I/O thread is stuck (a deadlock
// on the request path) or the engine has stopped stepping with sequences in its batch; systemd
// would never restart such a daemon. check() asks both: it posts a no-op probe to the I/O
// threads (one at a time) and reads the engine's step and layer counters (a single long step
// moves layer by layer), and names what has made no
// progress for longer than `stall`. Thread-safe; the probe may run on any I/O thread.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/serving_stats.h"

namespace edge::daemon {

class Liveness {
public:
    using TimePoint = std::chrono::steady_clock::time_point;
    // `post_to_io(fn)` runs fn on an I/O thread later; `stats()` is the engine's per-model stats.
    Liveness(std::function<void(std::function<void()>)> post_to_io,
             std::function<std::vector<engine::ServingStats>()> stats);

    // At `now`: "" when alive; else "io" (the probe posted earlier has waited longer than
    // `stall`) or "engine" (a model with sequences in its batch finished no step and no layer
    // for longer than `stall`).
    std::string check(TimePoint now, std::chrono::milliseconds stall);

private:
    struct Probe {
        std::atomic<bool> done{false};
    };
    std::function<void(std::function<void()>)> post_to_io_;
    std::function<std::vector<engine::ServingStats>()> stats_;
    std::mutex mu_;
    std::shared_ptr<Probe> probe_;  // Outstanding, or done; under mu_.
    TimePoint probe_posted_;
    // Per model (stats order): the step and layer counts last seen and when either last moved
    // (or the batch was empty, or first seen holding sequences).
    std::vector<int64_t> steps_;
    std::vector<int64_t> layers_;
    std::vector<TimePoint> progress_at_;
    std::vector<bool> busy_;  // Its batch held sequences at the last check.
};

}  // namespace edge::daemon
