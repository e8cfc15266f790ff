#pragma once

// LoadHeartbeat tells systemd that a slow model load is still moving. Loading a large checkpoint
// (reading a terabyte of weights, quantizing on load) can take longer than the unit's
// TimeoutStartSec; while the engine's load progress (engine/load_progress.h: bytes read, matrices
// taken in) moves, the heartbeat sends EXTEND_TIMEOUT_USEC with a STATUS line every `interval`,
// so systemd waits `extend` past the last sign of progress. A load that stops moving gets no
// more extensions, and systemd's timeout still ends it. Each beat with progress is also logged
// ("loading"), for operators without systemd.
//
// Threading: owns one thread, started by the constructor and joined by the destructor (which
// returns promptly). `progress` is called on that thread. Lifetime: `notifier` must outlive it.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "daemon/systemd_notify.h"
#include "engine/load_progress.h"

namespace edge::daemon {

class LoadHeartbeat {
  public:
    LoadHeartbeat(const SystemdNotifier& notifier, std::function<engine::LoadProgress()> progress,
                  std::chrono::milliseconds interval = std::chrono::seconds(15),
                  std::chrono::milliseconds extend = std::chrono::seconds(90));
    ~LoadHeartbeat();
    LoadHeartbeat(const LoadHeartbeat&) = delete;
    LoadHeartbeat& operator=(const LoadHeartbeat&) = delete;

  private:
    void run();

    const SystemdNotifier& notifier_;
    std::function<engine::LoadProgress()> progress_;
    const std::chrono::milliseconds interval_;
    const std::chrono::milliseconds extend_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace edge::daemon
