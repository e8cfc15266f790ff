#pragma once

// UsageScanner reads the token usage out of a peer's OpenAI answer as it passes through the
// forwarder, so the forwarding site can charge the tenant's token limits: from a JSON body's
// "usage", or, in a stream fed piece by piece (events may be split across pieces), from the
// peer's usage report comment (api::kUsageReportComment), which it removes from what is relayed,
// else from the server-sent event that carries "usage". Events end at a blank line, with lines
// ended by LF, CRLF or CR as the SSE spec allows; the bytes relayed are the peer's, unchanged. It
// holds back at most one partial event (bounded: a longer one is relayed as it comes and not
// parsed) and parses only events that mention "usage". Not synchronized: one forward at a time.

#include <cstdint>
#include <string>
#include <string_view>

namespace edge::daemon::forward {

class UsageScanner {
public:
    // A whole JSON answer: its usage, or an error answer's code (error_code()).
    void feed_json(std::string_view body);
    // The next bytes of a text/event-stream body. Returns the bytes to relay to the client: the
    // whole events seen so far, less the usage report; an event's start stays held until its end.
    std::string feed_events(std::string_view bytes);
    // At the end of the stream: the bytes still held (an event without its final blank line),
    // less a usage report without its blank line, which is read as a whole one is.
    std::string flush();
    // At a cut (the stream broke before its end): a usage report held without its blank line is
    // read, as flush() reads it; the other bytes held (an event's start) are dropped, as a client
    // drops an event its stream ends inside, so that what is written after the cut (an error
    // event) does not join them into one malformed event. Returns what ends the event a client
    // is inside after part of an over-long one was relayed (a blank line), else "".
    std::string cut();

    int64_t prompt_tokens() const { return prompt_tokens_; }
    int64_t completion_tokens() const { return completion_tokens_; }
    // The peer's usage report comment was seen and read (its figures win over a "usage"
    // event's); a malformed one is withheld from the client but does not count.
    bool reported() const { return reported_; }
    // The stream's end event (`data: [DONE]`) was relayed: the client has the whole answer.
    bool ended() const { return ended_; }
    // An error event (`data: {"error":...}`) was relayed: the peer's stream failed in-band
    // (one longer than the partial-event bound counts from its start).
    bool failed() const { return failed_; }
    // That event's error.code ("" when it has none): service_unavailable for a generation the
    // peer stopped for its load or a shutdown (a drain's deadline, no room once queued). Also a
    // whole JSON error answer's (feed_json()), which does not set failed().
    const std::string& error_code() const { return error_code_; }
    // Part of an over-long event was relayed without its end: a stream cut now leaves that
    // event open on the client's side (cut() closes it).
    bool inside_event() const { return passing_; }

  private:
    // What an LF right after a CR is: the second half of that CRLF line end, not a line end of
    // its own. When the CR ended an event, the LF goes where that event went.
    enum class AfterCr : uint8_t { kNone, kInEvent, kRelayed, kWithheld };

    // Reads `body`'s "usage" object; true when it holds both counts as integers.
    bool read_usage(std::string_view body);
    void parse_event(std::string_view event);
    // True when `event` is the usage report comment (read, not to be relayed).
    bool take_report(std::string_view event);
    // Reads the code of the error event whose JSON is `json`.
    void read_error(std::string_view json);

    static constexpr size_t kMaxPartialEvent = 1 << 20;  // Longer events are not held back.
    std::string partial_;        // The current event's bytes not yet relayed.
    bool at_line_start_ = true;  // No byte of the current line seen yet: a line end is blank.
    AfterCr after_cr_ = AfterCr::kNone;
    bool passing_ = false;  // Inside an over-long event: relay until its end, parse nothing.
    bool reported_ = false;
    bool ended_ = false;
    bool failed_ = false;
    std::string error_code_;
    int64_t prompt_tokens_ = 0;
    int64_t completion_tokens_ = 0;
};

}  // namespace edge::daemon::forward
