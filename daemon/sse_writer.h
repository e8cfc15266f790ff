#pragma once

// SseWriter streams server-sent events over a tls::ResponseChannel: the head
// (text/event-stream), `data: {json}\n\n` events and the final `data: [DONE]\n\n`.
// Not synchronized: use it from one thread at a time (the generation sink's callbacks are
// serialized); the channel itself is thread-safe.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tls/http_types.h"

namespace edge::daemon {

class SseWriter {
public:
    explicit SseWriter(std::shared_ptr<tls::ResponseChannel> channel)
        : channel_(std::move(channel)) {}

    // `headers`: added to the head (the first begin() only).
    void begin(std::vector<tls::HttpHeader> headers = {});
    void event(std::string_view json);
    // Several events written as one piece (none, and no head, when `jsons` is empty): a
    // stream's opening (chat role chunks, a backlog that waited for the stream to open) goes
    // out whole, counted once against the connection's stream buffer (a client that has not had
    // a chance to read is not a slow reader; ResponseChannel::write lets one piece larger than
    // the whole buffer through).
    void events(const std::vector<std::string>& jsons);
    // ": <text>\n\n", a comment line that clients ignore.
    void comment(std::string_view text);
    // Writes [DONE] and ends the response.
    void done();

    // "data: <json>\n\n".
    static std::string format_event(std::string_view json);

private:
    std::shared_ptr<tls::ResponseChannel> channel_;
    bool begun_ = false;
    bool finished_ = false;
};

}  // namespace edge::daemon
