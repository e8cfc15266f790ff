#pragma once

// AdminServer is the plain-HTTP admin listener (loopback by default): GET /metrics (Prometheus
// text format), /healthz (the process is alive) and /readyz (models loaded and not draining),
// plus whatever an installed AdminHandler answers under /admin/. /readyz answers 200 "ready" when
// the ready callback returns OK, else 503 "not ready: <its message>" (draining, models loading, a
// failed device).
// Runs on the given io_context; one short request at a time per connection, 5 s read timeout.
// Threading: start() from any thread; stop() closes the acceptor and open connections and may be
// called from any thread. The io_context, metrics and ready callback must outlive it.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace boost::asio {
class io_context;
}

namespace edge::daemon {

class Metrics;

// An answer from an extra admin handler (e.g. the cluster's /admin/* views).
struct AdminReply {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
};
// Called for every request whose path starts with "/admin/", with the method ("GET", "POST",
// ...) and the full target (query included); nullopt means not found. Runs on an I/O thread and
// must not block.
using AdminHandler =
    std::function<std::optional<AdminReply>(std::string_view method, std::string_view target)>;

class AdminServer {
public:
    static Result<std::unique_ptr<AdminServer>> create(boost::asio::io_context& io,
                                                       const std::string& address, uint16_t port,
                                                       Metrics& metrics,
                                                       std::function<Status()> ready);
    ~AdminServer();
    uint16_t port() const;
    // Installs the /admin/* handler; call before start().
    void set_handler(AdminHandler handler);
    void start();
    void stop();

    class Impl;

private:
    explicit AdminServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<Impl> impl_;
};

}  // namespace edge::daemon
