#pragma once

// AdminServer is the plain-HTTP admin listener (loopback by default): GET /metrics (Prometheus
// text format), /healthz (the process is alive) and /readyz (models loaded and not draining).
// Runs on the given io_context; one short request at a time per connection, 5 s read timeout.
// Threading: start() from any thread; stop() closes the acceptor and open connections and may be
// called from any thread. The io_context, metrics and ready callback must outlive it.

#include <functional>
#include <memory>
#include <string>

#include "common/result.h"

namespace boost::asio {
class io_context;
}

namespace edge::daemon {

class Metrics;

class AdminServer {
public:
    static Result<std::unique_ptr<AdminServer>> create(boost::asio::io_context& io,
                                                       const std::string& address, uint16_t port,
                                                       Metrics& metrics,
                                                       std::function<bool()> ready);
    ~AdminServer();
    uint16_t port() const;
    void start();
    void stop();

    class Impl;

private:
    explicit AdminServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<Impl> impl_;
};

}  // namespace edge::daemon
