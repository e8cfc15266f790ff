#include "routing/membership/suspicion.h"

#include "routing/membership/timing.h"

namespace edge::routing::membership {

Suspicion::Suspicion(std::string from, int k, Duration min, Duration max, TimePoint start)
    : k_(k), min_(min), max_(max), start_(start) {
    // With no confirmations wanted the timer is simply min.
    if (k_ < 1) {
        max_ = min_;
    }
    confirmers_.insert(std::move(from));
}

bool Suspicion::confirm(const std::string& from) {
    if (n_ >= k_) {
        return false;
    }
    if (!confirmers_.insert(from).second) {
        return false;
    }
    ++n_;
    return true;
}

TimePoint Suspicion::deadline() const {
    return start_ + remaining_suspicion_time(n_, k_, Duration::zero(), min_, max_);
}

}  // namespace edge::routing::membership
