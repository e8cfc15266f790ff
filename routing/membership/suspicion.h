#pragma once

// Suspicion is the Lifeguard suspicion timer of one suspected member: it starts at `max` and
// shrinks toward `min` as independent members confirm the suspicion (each counted once, the
// originator not at all), so a real failure is declared quickly while a lone slow accuser cannot
// kill a healthy member fast. Sans-IO: it computes deadlines; the owner runs the timer. Not
// synchronized.

#include <string>
#include <unordered_set>

#include "common/clock.h"

namespace edge::routing::membership {

class Suspicion {
public:
    // `k` confirmations are wanted; `from` raised it (not counted as a confirmation).
    Suspicion(std::string from, int k, Duration min, Duration max, TimePoint start);

    // Records a confirmation from `from`; returns true when it is new and counted (then the
    // deadline moved earlier and the confirmation is worth re-gossiping).
    bool confirm(const std::string& from);

    TimePoint deadline() const;
    int confirmations() const { return n_; }
    TimePoint start() const { return start_; }

private:
    int k_;
    int n_ = 0;
    Duration min_;
    Duration max_;
    TimePoint start_;
    std::unordered_set<std::string> confirmers_;
};

}  // namespace edge::routing::membership
