#include "engine/sampling/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace edge::engine::sampling {

std::string StopMatcher::push(std::string_view text, bool armed) {
    if (stopped_) {
        return {};
    }
    const size_t before = held_.size();
    held_.append(text);
    if (stops_.empty()) {
        return std::exchange(held_, std::string());
    }
    size_t first = std::string::npos;
    for (const std::string& stop : stops_) {
        // Only a match that ends in the new text: what was held before holds none (it would
        // have stopped) unless it came unarmed.
        const size_t from = before + 1 > stop.size() ? before + 1 - stop.size() : 0;
        first = armed ? std::min(first, held_.find(stop, from)) : first;
    }
    if (first != std::string::npos) {
        stopped_ = true;
        std::string out = held_.substr(0, first);
        held_.clear();
        return out;
    }
    // Hold the longest tail that is a proper prefix of some stop string; everything before it can
    // never become part of a match.
    size_t keep = 0;
    for (const std::string& stop : stops_) {
        const size_t max_len = std::min(stop.size() - 1, held_.size());
        for (size_t len = max_len; len > keep; --len) {
            if (std::string_view(held_).substr(held_.size() - len) ==
                std::string_view(stop).substr(0, len)) {
                keep = len;
                break;
            }
        }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string StopMatcher::flush() { return std::exchange(held_, std::string()); }

}  // namespace edge::engine::sampling
