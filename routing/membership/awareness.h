#pragma once

// Awareness is Lifeguard's local-health score: it rises when this member misses acks it should
// have seen (a sign that it, not its peers, is slow) and falls on every successful probe. Timeouts
// are multiplied by (score + 1), so a starved member probes more patiently instead of accusing
// healthy peers. Not synchronized: owned by the membership strand.

#include "common/clock.h"

namespace edge::routing::membership {

class Awareness {
public:
    // Score is clamped to [0, max_multiplier - 1].
    explicit Awareness(int max_multiplier) : max_(max_multiplier) {}

    void apply_delta(int delta);
    int score() const { return score_; }
    Duration scale_timeout(Duration timeout) const { return timeout * (score_ + 1); }

private:
    int max_;
    int score_ = 0;
};

}  // namespace edge::routing::membership
