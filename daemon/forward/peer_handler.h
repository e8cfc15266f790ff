#pragma once

// PeerHandler is the peer (mutual TLS) listener's HttpHandler: every request on it is one another
// site forwarded here, served by ApiRouter::handle_forwarded (runs here, never forwarded again).
// Thread-safe like the router; the router must outlive it.

#include <memory>

#include "daemon/api/api_router.h"
#include "tls/http_types.h"

namespace edge::daemon::forward {

class PeerHandler final : public tls::HttpHandler {
public:
    explicit PeerHandler(api::ApiRouter& router) : router_(router) {}

    void handle(tls::HttpRequest request, std::shared_ptr<tls::ResponseChannel> channel) override {
        router_.handle_forwarded(std::move(request), std::move(channel));
    }

private:
    api::ApiRouter& router_;
};

}  // namespace edge::daemon::forward
