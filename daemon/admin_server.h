#pragma once

// AdminServer is the plain-HTTP admin listener (loopback by default): GET /metrics (Prometheus
// text format), /healthz (the process is alive) and /readyz (models loaded and not draining),
// plus whatever an installed AdminHandler answers under /admin/. /readyz answers 200 "ready" when
// the ready callback returns OK, else 503 "not ready: <its message>" (draining, models loading, a
// failed device).
// Who may use /admin/*: with a token set (listeners.admin.token_file), every /admin/ request
// must carry `Authorization: Bearer <token>` (401 otherwise; /metrics, /healthz and /readyz stay
// open for Prometheus and the other sites' checks). Without one, /admin/ views are open and a
// state-changing request (POST /admin/rollout, which gossip carries to every site) is taken
// only from a loopback client: from another host it is refused with 403.
// Every request, on every path, must name the listener in Host by an IPv4 literal, a bracketed
// IPv6 literal, localhost (any case, any port) or a name given to set_host_names()
// (listeners.admin.host_names): anything else, a missing Host too, gets 403 saying which Host
// was refused. A page whose DNS name was rebound to this address is same-origin with it for the
// browser, and its requests carry nothing else that tells them from Prometheus' or curl's.
// Runs on the given io_context, from any number of threads; one short request at a time per
// connection, 5 s to read a request and write its answer. At most `max_connections` (default
// kAdminMaxConnections) are open at once: the listener is reachable from other sites and
// Prometheus, and a flood of connections must not take every file descriptor of the process
// (the public listener's too). Connections past it are closed at accept, counted in
// edgeserve_admin_connections_rejected_total{reason="limit"} and logged (admin_connection_limit,
// at most once a second).
// Threading: start() once, from any thread; stop() from any thread, once or more, after start()
// or instead of it. stop() does not wait: it hands the closes to the io_context, so they happen
// only while some thread runs it (an io_context stopped at once after stop() closes what is left
// when it is destroyed). It closes the acceptor, and the connections waiting for a request
// (idle keep-alive ones, and one whose request is still arriving, which is not answered). A
// connection answering a request it has read (a deferred answer included, at most
// kAdminDeferredTimeout) finishes that answer, marked `Connection: close`, then closes: an
// operator's POST /admin/rollout is told whether it was made.
// The io_context, metrics, ready callback and handler must outlive every run of the
// io_context: a connection still answering uses them after stop(), even once the AdminServer is
// gone (it holds the server's state itself).

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
    // Set by a handler whose answer depends on work another thread does (a state change made on
    // the gossip strand): the server calls it once, on the I/O thread, with `answer`, and sends
    // what `answer` receives (from any thread; the first call counts) instead of this reply, so
    // a change is not reported made before it is. No answer within kAdminDeferredTimeout: 503.
    std::function<void(std::function<void(AdminReply)> answer)> deferred = nullptr;
};
// Open admin connections at most: far above what Prometheus, the other sites' /readyz checks and
// an operator's commands hold, far below a process's descriptor limit.
inline constexpr size_t kAdminMaxConnections = 256;
// How long the admin listener waits for a deferred answer (below the 5 s the commands wait).
inline constexpr std::chrono::milliseconds kAdminDeferredTimeout{3000};
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
                                                       std::function<Status()> ready,
                                                       size_t max_connections =
                                                           kAdminMaxConnections);
    ~AdminServer();
    uint16_t port() const;
    // Installs the /admin/* handler; call before start().
    void set_handler(AdminHandler handler);
    // The bearer token /admin/ requests must carry ("" for none). Any thread, any time: the
    // next request is checked against it (a reload rotates it).
    void set_token(std::string token);
    // The DNS names a request's Host may carry besides IP literals and localhost, compared
    // without case and without the port; "*" among them accepts any Host (the check is off).
    // Call before start().
    void set_host_names(const std::vector<std::string>& names);
    void start();
    // See the threading contract above.
    void stop();

    class Impl;

private:
    explicit AdminServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<Impl> impl_;
};

// The names to give set_host_names(): `listed` (listeners.admin.host_names) and the host of
// `advertised` (site.admin_address, "" for none). The other sites check /readyz there, with
// that host as Host: a DNS name in it is this site's own, and taken whether listed or not.
std::vector<std::string> admin_host_names(std::vector<std::string> listed,
                                          std::string_view advertised);

// The admin token in `path` (listeners.admin.token_file): the file's text without trailing
// whitespace, 16 to 4096 visible ASCII characters (the characters a bearer token may hold).
// Errors name the file and what is wrong, never the file's text.
Result<std::string> read_admin_token(const std::string& path);

}  // namespace edge::daemon
