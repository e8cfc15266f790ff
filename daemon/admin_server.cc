#include "daemon/admin_server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include "common/file.h"
#include "common/log.h"
#include "daemon/api/completion.h"
#include "daemon/bearer.h"
#include "daemon/metrics.h"

namespace edge::daemon {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
constexpr auto kTuple = net::as_tuple(net::use_awaitable);

class AdminServer::Impl : public std::enable_shared_from_this<AdminServer::Impl> {
public:
    Impl(net::io_context& io, Metrics& metrics, std::function<Status()> ready,
         size_t max_connections)
        : io_(io),
          strand_(net::make_strand(io)),
          acceptor_(strand_),
          metrics_(metrics),
          ready_(std::move(ready)),
          max_connections_(max_connections) {}

    // Counts a connection in open_ for as long as it lives: serve()'s frame holds it (or, until
    // serve() starts, the function that starts it).
    class OpenSlot {
    public:
        explicit OpenSlot(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {
            impl_->open_.fetch_add(1);
        }
        OpenSlot(OpenSlot&&) noexcept = default;  // Leaves the moved-from one empty.
        OpenSlot& operator=(OpenSlot&&) = delete;
        ~OpenSlot() {
            if (impl_) {
                impl_->open_.fetch_sub(1);
            }
        }

    private:
        std::shared_ptr<Impl> impl_;
    };

    // Runs on strand_, as do the acceptor's close and every handler of the accept: the I/O
    // threads run the io_context together, and an acceptor is not safe to use from two at once.
    net::awaitable<void> accept_loop() {
        // After a failed accept (out of descriptors, most often) the connection stays in the
        // backlog and the listener readable: wait before the next accept instead of spinning,
        // 5 ms doubling to 500 ms, and log at most once a second.
        std::chrono::milliseconds delay{0};
        uint64_t failures = 0;
        std::chrono::steady_clock::time_point logged_at{};
        uint64_t limited = 0;  // Closed at the limit since the last admin_connection_limit.
        std::chrono::steady_clock::time_point limited_logged_at{};
        for (;;) {
            // Each connection on its own strand: the I/O threads run the io_context together,
            // and a tcp_stream's timeout closes the socket from a handler of its own, which must
            // not run beside the read it ends.
            auto [ec, socket] = co_await acceptor_.async_accept(net::make_strand(io_), kTuple);
            if (ec) {
                if (!acceptor_.is_open()) {
                    co_return;
                }
                delay = delay.count() == 0 ? std::chrono::milliseconds(5)
                                           : std::min(delay * 2, std::chrono::milliseconds(500));
                ++failures;
                const auto now = std::chrono::steady_clock::now();
                if (now - logged_at >= std::chrono::seconds(1)) {
                    log::warn("admin_accept_failed",
                              {{"error", ec.message()},
                               {"failures", failures},
                               {"pause_ms", static_cast<int64_t>(delay.count())}});
                    failures = 0;
                    logged_at = now;
                }
                net::steady_timer pause(strand_, delay);
                co_await pause.async_wait(kTuple);
                continue;
            }
            delay = std::chrono::milliseconds(0);
            if (open_.load() >= max_connections_) {
                // Closed at once: a flood costs one accept per connection, and no descriptor
                // stays taken. Counted first, so a client that saw the close finds it counted.
                metrics_.on_admin_connection_rejected("limit");
                boost::system::error_code ignored;
                socket.close(ignored);
                ++limited;
                const auto now = std::chrono::steady_clock::now();
                if (now - limited_logged_at >= std::chrono::seconds(1)) {
                    log::warn("admin_connection_limit",
                              {{"limit", static_cast<uint64_t>(max_connections_)},
                               {"closed", limited}});
                    limited = 0;
                    limited_logged_at = now;
                }
                continue;
            }
            auto executor = socket.get_executor();
            // The connection holds the server: after stop() a connection still answering outlives
            // this loop, and the AdminServer may be gone by then.
            net::co_spawn(
                executor,
                [self = shared_from_this(), s = std::move(socket),
                 slot = OpenSlot(shared_from_this())]() mutable {
                    return self->serve(beast::tcp_stream(std::move(s)), std::move(slot));
                },
                [](std::exception_ptr) {});
        }
    }

    // Runs on the connection's strand; `slot` counts it open until it ends.
    net::awaitable<void> serve(beast::tcp_stream stream, OpenSlot slot) {
        Connection connection{&stream};
        const ConnectionRegistration registration(*this, connection, stream.get_executor());
        // Bounded: Beast limits the header but not a chunk-size line or trailer, which would be
        // buffered until the read timeout.
        beast::flat_buffer buffer(kMaxRequestBytes);
        for (;;) {
            // Checked after registering and on each turn: a connection that stop()'s close found
            // answering, or that registered after stop() looked, ends here.
            if (stopped_) {
                break;
            }
            http::request_parser<http::empty_body> parser;
            parser.header_limit(kMaxRequestBytes);
            stream.expires_after(std::chrono::seconds(5));
            connection.reading = true;
            auto [ec, n] = co_await http::async_read(stream, buffer, parser, kTuple);
            connection.reading = false;
            if (stopped_) {
                break;  // Closed by stop(), or a request that came too late: not answered.
            }
            if (ec) {
                // A request that cannot be served gets a status; a timeout or a close, nothing.
                int status = 0;
                std::string_view why;
                const bool overflow = ec == http::error::buffer_overflow;
                if (ec == http::error::header_limit || (overflow && !parser.is_header_done())) {
                    status = 431;
                } else if (overflow || ec == http::error::unexpected_body) {
                    status = 413;  // No admin request has a body.
                    why = "admin requests take no body: their parameters go in the query string "
                          "(POST /admin/rollout?model=M&version=V)";
                } else if (ec.category() ==
                               http::make_error_code(http::error::bad_method).category() &&
                           ec != http::error::end_of_stream && ec != http::error::partial_message) {
                    status = 400;
                }
                if (status != 0) {
                    co_await reject(stream, status, why);
                }
                break;
            }
            auto& req = parser.get();
            http::response<http::string_body> res{http::status::ok, req.version()};
            std::string_view target(req.target().data(), req.target().size());
            if (target.find('?') != std::string_view::npos) {
                target = target.substr(0, target.find('?'));
            }
            res.set(http::field::content_type, "text/plain; charset=utf-8");
            std::optional<AdminReply> extra;
            // A browser sends Origin (and Sec-Fetch-Site) with a cross-site request, and may
            // send a bodiless POST without asking first: a page the operator opens could
            // otherwise change state here (POST /admin/rollout). curl and peers send neither.
            const auto fetch_site = req["Sec-Fetch-Site"];
            const bool cross_site = req.count(http::field::origin) > 0 ||
                                    (!fetch_site.empty() && fetch_site != "same-origin" &&
                                     fetch_site != "none");
            const bool changes_state =
                req.method() != http::verb::get && req.method() != http::verb::head;
            const std::string_view host = req[http::field::host];
            if (!host_allowed(host)) {
                extra = refuse_host(host);
            } else if (target.starts_with("/admin/") && cross_site && changes_state) {
                extra = AdminReply{403, "text/plain; charset=utf-8",
                                   "forbidden: a state-changing admin request from a browser "
                                   "page (Origin or Sec-Fetch-Site sent)\n"};
            } else if (target.starts_with("/admin/") &&
                       (extra =
                            authorize(stream, req[http::field::authorization], changes_state))) {
                // Refused: `extra` holds the answer.
            } else if (handler_ && target.starts_with("/admin/")) {
                extra = handler_(std::string_view(req.method_string().data(),
                                                  req.method_string().size()),
                                 std::string_view(req.target().data(), req.target().size()));
                if (!extra) {
                    extra = AdminReply{404, "text/plain; charset=utf-8", "not found\n"};
                }
            }
            if (extra && extra->deferred) {
                extra = co_await await_deferred(stream, std::move(extra->deferred));
            }
            if (extra) {
                if (extra->status == 401) {
                    res.set(http::field::www_authenticate, "Bearer realm=\"edgeserve admin\"");
                }
                res.result(static_cast<http::status>(extra->status));
                res.set(http::field::content_type, extra->content_type);
                res.body() = std::move(extra->body);
            } else if (req.method() != http::verb::get && req.method() != http::verb::head) {
                res.result(http::status::method_not_allowed);
                res.set(http::field::allow, "GET, HEAD");
                res.body() = "method not allowed\n";
            } else if (target == "/metrics") {
                res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
                res.body() = metrics_.serialize();
            } else if (target == "/healthz") {
                res.body() = "ok\n";
            } else if (target == "/readyz") {
                const Status ready = ready_();
                res.result(ready.ok() ? http::status::ok : http::status::service_unavailable);
                res.body() = ready.ok() ? "ready\n" : "not ready: " + ready.message() + "\n";
            } else {
                res.result(http::status::not_found);
                res.body() = "not found\n";
            }
            // Stopping: this answer is the connection's last, and says so.
            res.keep_alive(req.keep_alive() && !stopped_);
            res.prepare_payload();
            if (req.method() == http::verb::head) {
                res.body().clear();  // RFC 9110 section 9.3.2; Content-Length stays the GET's.
            }
            auto [wec, wn] = co_await http::async_write(stream, res, kTuple);
            if (wec || !res.keep_alive()) {
                break;
            }
        }
        beast::error_code ignored;
        stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    }

    // Closes the connections waiting for a request (keep-alive ones between requests, new ones
    // before their first); one answering a request is left to finish its answer, and ends at the
    // top of serve()'s loop. Any thread; call after setting stopped_.
    void close_idle_connections() {
        std::lock_guard lock(connections_mu_);
        for (const auto& [id, entry] : connections_) {
            net::post(entry.executor,
                      [self = shared_from_this(), id = id] { self->close_if_reading(id); });
        }
    }

    void set_token(std::string token) {
        std::optional<Sha256Digest> digest;
        if (!token.empty()) {
            digest = sha256(token);
        }
        std::lock_guard lock(token_mu_);
        token_digest_ = digest;
    }

    void set_host_names(const std::vector<std::string>& names) {
        host_names_ = names;
        any_host_ = std::find(names.begin(), names.end(), "*") != names.end();
    }

    // Whether a request with this Host may be answered. DNS rebinding: a page at
    // attacker.example whose name is re-resolved to this listener's address is same-origin with
    // it for the browser, which then lets the page read every view (members' addresses, pools,
    // tenant names in /metrics). A same-origin GET carries neither Origin nor Sec-Fetch-* (those
    // go only to https and localhost origins), so nothing but its Host tells it from Prometheus
    // or curl: the page's own name. An IP literal cannot be rebound, localhost no other site can
    // resolve, and the names the operator lists are the operator's own.
    bool host_allowed(std::string_view host) const {
        if (any_host_) {
            return true;
        }
        boost::system::error_code ec;
        if (host.starts_with('[')) {  // [v6] or [v6]:port.
            const size_t close = host.find(']');
            if (close == std::string_view::npos ||
                (close + 1 < host.size() && host[close + 1] != ':')) {
                return false;
            }
            net::ip::make_address_v6(std::string(host.substr(1, close - 1)), ec);
            return !ec;
        }
        const std::string_view name = host.substr(0, host.find(':'));
        if (beast::iequals(name, "localhost")) {
            return true;
        }
        net::ip::make_address_v4(std::string(name), ec);
        return !ec || std::any_of(host_names_.begin(), host_names_.end(),
                                  [&](const std::string& n) { return beast::iequals(name, n); });
    }

    // The 403 for a Host host_allowed() refused, logged at most once a second: after an
    // upgrade, a Prometheus that scrapes by a name not yet listed shows only "403" itself.
    AdminReply refuse_host(std::string_view host) {
        // As the log line and the body show it: its first 256 bytes, those that are not UTF-8
        // as \xNN (a Host may carry any byte above 0x7f; a strict JSON reader refuses the line).
        const std::string shown = api::logprob_token_text(host.substr(0, 256));
        const std::string named =
            host.empty() ? std::string("a request without Host") : "Host '" + shown + "'";
        const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now().time_since_epoch())
                                .count();
        int64_t last = host_refused_logged_ms_.load();
        if (now - last >= 1000 && host_refused_logged_ms_.compare_exchange_strong(last, now)) {
            log::warn("admin_host_refused",
                      {{"host", shown},
                       {"fix", "name the admin listener by IP address or localhost, or list the "
                               "name in listeners.admin.host_names"}});
        }
        return AdminReply{403, "text/plain; charset=utf-8",
                          "forbidden: " + named +
                              " is not an IP address, localhost or a name listed in "
                              "listeners.admin.host_names (a guard against DNS rebinding); "
                              "list the name there to use it\n"};
    }

    // The refusal of an /admin/ request its sender may not make, or nullopt when it may.
    std::optional<AdminReply> authorize(beast::tcp_stream& stream, std::string_view authorization,
                                        bool changes_state) {
        std::optional<Sha256Digest> expected;
        {
            std::lock_guard lock(token_mu_);
            expected = token_digest_;
        }
        if (expected) {
            std::optional<std::string_view> presented = bearer_credentials(authorization);
            if (presented && digests_equal(sha256(*presented), *expected)) {
                return std::nullopt;
            }
            return AdminReply{401, "text/plain; charset=utf-8",
                              presented ? "unauthorized: wrong admin token\n"
                                        : "unauthorized: /admin/ needs `Authorization: Bearer "
                                          "<token>` (the file listeners.admin.token_file names; "
                                          "edgeserve --token-file)\n"};
        }
        if (!changes_state) {
            return std::nullopt;
        }
        boost::system::error_code ec;
        net::ip::address from = stream.socket().remote_endpoint(ec).address();
        if (!ec && from.is_v6() && from.to_v6().is_v4_mapped()) {
            from = net::ip::make_address_v4(net::ip::v4_mapped, from.to_v6());
        }
        if (!ec && from.is_loopback()) {
            return std::nullopt;
        }
        return AdminReply{403, "text/plain; charset=utf-8",
                          "forbidden: a state-changing admin request from another host needs an "
                          "admin token (set listeners.admin.token_file)\n"};
    }

    // The answer a deferred reply gives, or 503 when none comes in time. The waiting coroutine
    // and the answer's wake-up both run on the connection's strand, so an answer given before
    // the wait starts is seen instead of waited for.
    static net::awaitable<std::optional<AdminReply>> await_deferred(
        beast::tcp_stream& stream, std::function<void(std::function<void(AdminReply)>)> deferred) {
        struct Wait {
            explicit Wait(const beast::tcp_stream::executor_type& ex) : timer(ex) {}
            std::mutex mu;
            std::optional<AdminReply> reply;  // Under mu.
            net::steady_timer timer;
        };
        auto wait = std::make_shared<Wait>(stream.get_executor());
        wait->timer.expires_after(kAdminDeferredTimeout);
        // The answer holds the wait weakly: the handler may keep it past this connection and
        // past the io_context (a callback queued on another strand at shutdown), and the timer
        // inside must be destroyed while its io_context lives, by this coroutine's frame.
        deferred([weak = std::weak_ptr<Wait>(wait)](AdminReply reply) {
            const std::shared_ptr<Wait> wait = weak.lock();
            if (!wait) {
                return;  // The connection is gone: nobody to tell.
            }
            {
                std::lock_guard lock(wait->mu);
                if (wait->reply) {
                    return;
                }
                reply.deferred = nullptr;
                wait->reply = std::move(reply);
            }
            net::post(wait->timer.get_executor(), [weak] {
                if (const std::shared_ptr<Wait> w = weak.lock()) {
                    w->timer.cancel();
                }
            });
        });
        bool answered = false;
        {
            std::lock_guard lock(wait->mu);
            answered = wait->reply.has_value();
        }
        if (!answered) {
            co_await wait->timer.async_wait(kTuple);  // Woken by the answer, or the timeout.
        }
        std::optional<AdminReply> reply;
        {
            std::lock_guard lock(wait->mu);
            if (wait->reply) {
                reply = std::move(wait->reply);
            } else {
                // An answer after this finds the slot taken and is dropped.
                wait->reply = AdminReply{};
            }
        }
        if (!reply) {
            reply = AdminReply{503, "text/plain; charset=utf-8",
                               "unavailable: the change was not confirmed within " +
                                   std::to_string(kAdminDeferredTimeout.count()) +
                                   " ms; it may still be made (look before repeating it)\n"};
        }
        co_return reply;
    }

    // Answers a request that cannot be served (its reason phrase, or `why` when given), then
    // closes: what follows it on the connection cannot be framed.
    static net::awaitable<void> reject(beast::tcp_stream& stream, int status,
                                       std::string_view why = {}) {
        http::response<http::string_body> res{static_cast<http::status>(status), 11};
        res.set(http::field::content_type, "text/plain; charset=utf-8");
        res.body() = std::string(why.empty() ? std::string_view(http::obsolete_reason(res.result()))
                                             : why) +
                     "\n";
        res.keep_alive(false);
        res.prepare_payload();
        stream.expires_after(std::chrono::seconds(5));
        auto [wec, wn] = co_await http::async_write(stream, res, kTuple);
        beast::error_code ignored;
        stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
        // Discard what the client still sends for a short bounded while: closing with unread
        // input would reset the connection before the answer is read.
        stream.expires_after(std::chrono::seconds(1));
        size_t discarded = 0;
        while (!wec && discarded < 64 * 1024) {
            char sink[4096];
            auto [rec, rn] = co_await stream.async_read_some(net::buffer(sink), kTuple);
            if (rec) {
                break;
            }
            discarded += rn;
        }
    }

    // Request line and header fields, or a chunk-size line or trailer section, at most.
    static constexpr size_t kMaxRequestBytes = 8192;

    // A connection's state, in its serve() frame; touched only on the connection's strand.
    struct Connection {
        beast::tcp_stream* stream = nullptr;
        bool reading = false;  // Waiting for (the rest of) a request, not answering one.
    };
    struct RegisteredConnection {
        Connection* connection = nullptr;
        beast::tcp_stream::executor_type executor;  // The connection's strand.
    };
    // Lists a connection in connections_ for as long as its serve() frame lives.
    class ConnectionRegistration {
    public:
        ConnectionRegistration(Impl& impl, Connection& connection,
                               beast::tcp_stream::executor_type executor)
            : impl_(impl) {
            std::lock_guard lock(impl_.connections_mu_);
            id_ = impl_.next_connection_id_++;
            impl_.connections_.emplace(id_, RegisteredConnection{&connection, std::move(executor)});
        }
        ~ConnectionRegistration() {
            std::lock_guard lock(impl_.connections_mu_);
            impl_.connections_.erase(id_);
        }
        ConnectionRegistration(const ConnectionRegistration&) = delete;
        ConnectionRegistration& operator=(const ConnectionRegistration&) = delete;

    private:
        Impl& impl_;
        uint64_t id_ = 0;
    };

    // On connection `id`'s strand. Still listed, its frame is alive: the frame leaves the list
    // on this strand too (or when the io_context is destroyed, when no handler runs).
    void close_if_reading(uint64_t id) {
        Connection* connection = nullptr;
        {
            std::lock_guard lock(connections_mu_);
            auto it = connections_.find(id);
            if (it == connections_.end()) {
                return;
            }
            connection = it->second.connection;
        }
        if (connection->reading) {
            connection->stream->close();  // The read ends with operation_aborted.
        }
    }

    net::io_context& io_;
    net::strand<net::io_context::executor_type> strand_;
    tcp::acceptor acceptor_;  // On strand_.
    Metrics& metrics_;
    std::function<Status()> ready_;
    const size_t max_connections_;
    std::atomic<size_t> open_{0};         // Connections accepted and not yet ended.
    AdminHandler handler_;
    std::mutex token_mu_;
    std::optional<Sha256Digest> token_digest_;  // Under token_mu_; nullopt: no token.
    // Set before start(): listeners.admin.host_names; a "*" among them sets any_host_.
    std::vector<std::string> host_names_;
    bool any_host_ = false;
    // When admin_host_refused was last logged, in steady-clock milliseconds.
    std::atomic<int64_t> host_refused_logged_ms_{std::numeric_limits<int64_t>::min() / 2};
    std::atomic<bool> stopped_{false};
    std::mutex connections_mu_;
    uint64_t next_connection_id_ = 0;                                 // Under connections_mu_.
    std::unordered_map<uint64_t, RegisteredConnection> connections_;  // Under connections_mu_.
    uint16_t port_ = 0;
};

Result<std::unique_ptr<AdminServer>> AdminServer::create(net::io_context& io,
                                                         const std::string& address,
                                                         uint16_t port, Metrics& metrics,
                                                         std::function<Status()> ready,
                                                         size_t max_connections) {
    auto impl = std::make_shared<Impl>(io, metrics, std::move(ready), max_connections);
    boost::system::error_code ec;
    net::ip::address addr = net::ip::make_address(address, ec);
    if (ec) {
        return invalid_argument_error("admin listen address '" + address +
                                      "' is not an IP address");
    }
    tcp::endpoint endpoint(addr, port);
    impl->acceptor_.open(endpoint.protocol(), ec);
    if (!ec) {
        impl->acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    }
    if (!ec) {
        impl->acceptor_.bind(endpoint, ec);
    }
    if (!ec) {
        impl->acceptor_.listen(net::socket_base::max_listen_connections, ec);
    }
    if (ec) {
        return unavailable_error("cannot listen on admin " + address + ":" +
                                 std::to_string(port) + ": " + ec.message());
    }
    impl->port_ = impl->acceptor_.local_endpoint(ec).port();
    return std::unique_ptr<AdminServer>(new AdminServer(std::move(impl)));
}

AdminServer::~AdminServer() = default;

uint16_t AdminServer::port() const { return impl_->port_; }

void AdminServer::set_handler(AdminHandler handler) { impl_->handler_ = std::move(handler); }

void AdminServer::set_token(std::string token) { impl_->set_token(std::move(token)); }

void AdminServer::set_host_names(const std::vector<std::string>& names) {
    impl_->set_host_names(names);
}

void AdminServer::start() {
    net::co_spawn(
        impl_->strand_, [impl = impl_]() { return impl->accept_loop(); },
        [](std::exception_ptr) {});
}

void AdminServer::stop() {
    // Set first: whatever the closes below miss (a connection registering now, one answering)
    // sees it at the top of its loop.
    impl_->stopped_ = true;
    net::post(impl_->strand_, [impl = impl_] {
        boost::system::error_code ignored;
        impl->acceptor_.close(ignored);
    });
    impl_->close_idle_connections();
}

std::vector<std::string> admin_host_names(std::vector<std::string> listed,
                                          std::string_view advertised) {
    // host:port or [v6]:port, as the config checked it (host_port: a DNS name or an IP, never
    // the "*" that turns the check off); a bracketed host is taken as an IP literal anyway.
    const std::string_view host = advertised.substr(0, advertised.rfind(':'));
    if (!host.empty()) {
        listed.emplace_back(host);
    }
    return listed;
}

Result<std::string> read_admin_token(const std::string& path) {
    constexpr size_t kMinBytes = 16;
    constexpr size_t kMaxBytes = 4096;
    Result<std::string> text = read_small_file(path, kMaxBytes + 2);
    if (!text.ok()) {
        return text.status();
    }
    std::string token = std::move(text).value();
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ' ||
                              token.back() == '\t')) {
        token.pop_back();
    }
    for (size_t i = 0; i < token.size(); ++i) {
        const auto c = static_cast<unsigned char>(token[i]);
        if (c < 0x21 || c > 0x7e) {
            return invalid_argument_error(path + ": byte " + std::to_string(i + 1) +
                                          " of the admin token is not a visible ASCII character "
                                          "(one line, no spaces)");
        }
    }
    if (token.size() < kMinBytes || token.size() > kMaxBytes) {
        return invalid_argument_error(
            path + ": the admin token has " + std::to_string(token.size()) +
            " characters; it needs " + std::to_string(kMinBytes) + " to " +
            std::to_string(kMaxBytes) + " (e.g. `openssl rand -hex 32 > FILE`)");
    }
    return token;
}

}  // namespace edge::daemon
