#pragma once

// UsageScanner reads the token usage out of a peer's OpenAI answer as it passes through the
// forwarder, so the forwarding site can charge the tenant's token limits: from a JSON body's
// "usage", or from the server-sent event that carries "usage" in a stream fed piece by piece
// (events may be split across pieces). It keeps at most one partial event (bounded) and parses only
// events that mention "usage". Not synchronized: one forward at a time.

#include <cstdint>
#include <string>
#include <string_view>

namespace edge::daemon::forward {

class UsageScanner {
public:
    // A whole JSON answer.
    void feed_json(std::string_view body);
    // The next bytes of a text/event-stream body.
    void feed_events(std::string_view bytes);

    int64_t prompt_tokens() const { return prompt_tokens_; }
    int64_t completion_tokens() const { return completion_tokens_; }

private:
    void parse_event(std::string_view event);

    static constexpr size_t kMaxPartialEvent = 1 << 20;  // Longer events are skipped.
    std::string partial_;
    bool skipping_ = false;  // Inside an over-long event: drop until its end.
    int64_t prompt_tokens_ = 0;
    int64_t completion_tokens_ = 0;
};

}  // namespace edge::daemon::forward
