#pragma once

// TimerQueue is the sans-IO timer list of Memberlist: callbacks keyed by deadline, run in
// deadline order by run_due(now). The driver (simulator or Asio loop) asks next() when to call
// run_due again. Not synchronized.

#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <utility>

#include "common/clock.h"

namespace edge::routing::membership {

class TimerQueue {
public:
    uint64_t schedule(TimePoint at, std::function<void()> fn) {
        const uint64_t id = ++next_id_;
        queue_.emplace(std::make_pair(at, id), std::move(fn));
        deadlines_.emplace(id, at);
        return id;
    }

    void cancel(uint64_t id) {
        auto it = deadlines_.find(id);
        if (it == deadlines_.end()) {
            return;
        }
        queue_.erase(std::make_pair(it->second, id));
        deadlines_.erase(it);
    }

    TimePoint next() const { return queue_.empty() ? TimePoint::max() : queue_.begin()->first.first; }

    void run_due(TimePoint now) {
        while (!queue_.empty() && queue_.begin()->first.first <= now) {
            auto node = queue_.extract(queue_.begin());
            deadlines_.erase(node.key().second);
            node.mapped()();
        }
    }

    void clear() {
        queue_.clear();
        deadlines_.clear();
    }

private:
    uint64_t next_id_ = 0;
    std::map<std::pair<TimePoint, uint64_t>, std::function<void()>> queue_;
    std::unordered_map<uint64_t, TimePoint> deadlines_;
};

}  // namespace edge::routing::membership
