#pragma once

// AbortSignal is the shared "this group is aborted, and why" of one communicator group: the first
// Status raised wins and stays for good; later raises are ignored. The communicators check
// raised() on every wait (one atomic load) and return status() once it is set. Both
// implementations keep one per group (engine/shard/in_process_communicator.cc,
// engine/cuda/nccl_communicator.cc).
//
// Threading: every member may be called from any thread at any time.

#include <atomic>
#include <mutex>
#include <utility>

#include "common/status.h"

namespace edge::engine::shard {

class AbortSignal {
public:
    // Records `why` unless a status was recorded already; true when this call did. An OK `why`
    // is recorded as kAborted (an aborted call must not look like one that succeeded).
    bool raise(Status why) {
        std::lock_guard<std::mutex> lock(mu_);
        if (raised_.load(std::memory_order_relaxed)) {
            return false;
        }
        why_ = why.ok() ? aborted_error("communicator group aborted without a reason")
                        : std::move(why);
        raised_.store(true, std::memory_order_release);
        return true;
    }

    bool raised() const { return raised_.load(std::memory_order_acquire); }

    // The recorded status; OK until raise() was called.
    Status status() const {
        std::lock_guard<std::mutex> lock(mu_);
        return why_;
    }

private:
    mutable std::mutex mu_;
    Status why_;
    std::atomic<bool> raised_{false};
};

}  // namespace edge::engine::shard
