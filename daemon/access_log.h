#pragma once

// AccessLog: a listener's server observer that writes one `request` log line per answered
// request (when log.access_log is on) and passes every event on to the next observer (the
// public listener's metrics). The line is written when the answer ends, so it carries what only
// the end knows: status, duration, body bytes, whether the client got it all, and the handler's
// notes (tenant, model, request id, the site that served it, token counts).

#include <string>

#include "tls/http_types.h"

namespace edge::daemon {

class AccessLog final : public tls::ServerObserver {
public:
    // `next` may be null. `listener` names the listener in each line ("public", "peer").
    AccessLog(tls::ServerObserver* next, std::string listener, bool enabled)
        : next_(next), listener_(std::move(listener)), enabled_(enabled) {}

    void on_connection_opened() override;
    void on_connection_closed() override;
    void on_connection_rejected(std::string_view reason) override;
    void on_handshake(bool resumed, std::string_view failure_reason) override;
    void on_response(const tls::ResponseRecord& record) override;
    void on_stream_cancelled(std::string_view reason) override;

private:
    tls::ServerObserver* const next_;
    const std::string listener_;
    const bool enabled_;
};

}  // namespace edge::daemon
