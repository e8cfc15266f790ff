#include "routing/membership/awareness.h"

#include <algorithm>

namespace edge::routing::membership {

void Awareness::apply_delta(int delta) {
    score_ = std::clamp(score_ + delta, 0, std::max(0, max_ - 1));
}

}  // namespace edge::routing::membership
