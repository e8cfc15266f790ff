#pragma once

// StopMatcher finds stop strings in generated text across token boundaries. Text is fed as it is
// decoded; push() returns what can safely be shown: everything except a tail that might be the
// start of a stop string, which is held until the next text resolves it. When a stop string
// appears, the text before it is returned, the stop string and anything after it are dropped,
// and stopped() turns true. Text pushed unarmed (before min_tokens, as vLLM checks stop strings
// only after it) is never cut, but the tail that might begin a stop is held as usual, so a stop
// string that begins in it and ends in armed text is found; one wholly in unarmed text is not.
//
// Threading: one per sequence, used by one thread at a time. Input must be valid UTF-8, as must
// the stop strings; the output then never splits a character.

#include <string>
#include <string_view>
#include <vector>

namespace edge::engine::sampling {

class StopMatcher {
public:
    explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

    std::string push(std::string_view text, bool armed = true);

    // The held-back tail, when generation ends for another reason.
    std::string flush();

    bool stopped() const { return stopped_; }
    size_t held_bytes() const { return held_.size(); }

private:
    std::vector<std::string> stops_;
    std::string held_;
    bool stopped_ = false;
};

}  // namespace edge::engine::sampling
