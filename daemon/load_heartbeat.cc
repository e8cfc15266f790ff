#include "daemon/load_heartbeat.h"

#include <string>

#include "common/log.h"

namespace edge::daemon {

LoadHeartbeat::LoadHeartbeat(const SystemdNotifier& notifier,
                             std::function<engine::LoadProgress()> progress,
                             std::chrono::milliseconds interval, std::chrono::milliseconds extend)
    : notifier_(notifier),
      progress_(std::move(progress)),
      interval_(interval),
      extend_(extend),
      thread_([this] { run(); }) {}

LoadHeartbeat::~LoadHeartbeat() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void LoadHeartbeat::run() {
    const auto start = std::chrono::steady_clock::now();
    engine::LoadProgress last = progress_();
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, interval_, [this] { return stop_; })) {
        const engine::LoadProgress now = progress_();
        if (now == last) {
            continue;  // No sign of progress: no extension.
        }
        last = now;
        const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                                 std::chrono::steady_clock::now() - start)
                                 .count();
        const int64_t mib = now.bytes_read >> 20;
        const std::string status = "loading models: " + std::to_string(mib) + " MiB read, " +
                                   std::to_string(now.matrices) + " weight matrices after " +
                                   std::to_string(seconds) + " s";
        log::info("loading", {{"mib_read", mib},
                              {"matrices", now.matrices},
                              {"seconds", static_cast<int64_t>(seconds)}});
        const auto usec = std::chrono::duration_cast<std::chrono::microseconds>(extend_).count();
        if (Status s = notifier_.notify("EXTEND_TIMEOUT_USEC=" + std::to_string(usec) +
                                        "\nSTATUS=" + status);
            !s.ok()) {
            log::warn("sd_notify_failed", {{"error", s.message()}});
        }
    }
}

}  // namespace edge::daemon
