#include "tls/http_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>

#include "common/log.h"
#include "tls/http_server_impl.h"

namespace edge::tls {

namespace net = boost::asio;
using tcp = net::ip::tcp;

Status check_listening_socket(int fd) {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    int type = 0;
    socklen_t type_len = sizeof(type);
    int accepting = 0;
    socklen_t accepting_len = sizeof(accepting);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0 ||
        (local.ss_family != AF_INET && local.ss_family != AF_INET6) ||
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 || type != SOCK_STREAM ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &accepting_len) != 0 ||
        accepting == 0) {
        return invalid_argument_error("inherited descriptor " + std::to_string(fd) +
                                      " is not a listening TCP socket");
    }
    return ok_status();
}

Status HttpServer::Impl::adopt_listener() {
    const int fd = config_.listen_fd;
    if (Status s = check_listening_socket(fd); !s.ok()) {
        ::close(fd);
        return s;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
    boost::system::error_code ec;
    acceptor_.assign(local.ss_family == AF_INET ? tcp::v4() : tcp::v6(), fd, ec);
    if (ec) {
        ::close(fd);
        return unavailable_error("cannot take over descriptor " + std::to_string(fd) + ": " +
                                 ec.message());
    }
    port_ = acceptor_.local_endpoint(ec).port();
    return ok_status();
}

Status HttpServer::Impl::listen() {
    if (config_.listen_fd >= 0) {
        return adopt_listener();
    }
    boost::system::error_code ec;
    net::ip::address address = net::ip::make_address(config_.address, ec);
    if (ec) {
        return invalid_argument_error("listen address '" + config_.address +
                                      "' is not an IP address");
    }
    tcp::endpoint endpoint(address, config_.port);
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) {
        acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    }
    if (!ec) {
        acceptor_.bind(endpoint, ec);
    }
    if (!ec) {
        acceptor_.listen(net::socket_base::max_listen_connections, ec);
    }
    if (ec) {
        return unavailable_error("cannot listen on " + config_.address + ":" +
                                 std::to_string(config_.port) + ": " + ec.message());
    }
    port_ = acceptor_.local_endpoint(ec).port();
    return ok_status();
}

void HttpServer::Impl::start_accepting() {
    // Its completion runs on accept_strand_, the acceptor's executor (the handler has none of
    // its own); the socket gets the connection's executor given to async_accept.
    auto on_accept = [this](boost::system::error_code ec, tcp::socket socket) {
        --accept_ops_;
        if (!ec) {
            accept_delay_ = std::chrono::milliseconds(0);
            // A connection accepted while the drain begins is served like one accepted just
            // before: it left the kernel's backlog, so no successor process can take it, and
            // stop() drains it with the others. That holds whether the acceptor's close is still
            // on its way or already ran on this strand (the accept completed before it, and its
            // handler was queued after it): registered here, before note_accept_stopped() lets
            // stop() go on, it gets the first request's grace.
            if (registry_->open.load() >= current_limits()->max_connections) {
                // Closing at once keeps the cost of a connection flood at one accept each.
                observer_->on_connection_rejected("limit");
                boost::system::error_code ignored;
                socket.close(ignored);
            } else {
                boost::system::error_code ignored;
                socket.set_option(tcp::no_delay(true), ignored);
                start_session(*this, std::move(socket));
            }
            if (acceptor_.is_open()) {
                start_accepting();
            } else {
                note_accept_stopped();
            }
            return;
        }
        if (ec == net::error::operation_aborted || !acceptor_.is_open()) {
            note_accept_stopped();
            return;
        }
        pause_accepting(ec);
    };
    ++accept_ops_;
    if (config_.io_threads > 1) {
        acceptor_.async_accept(net::make_strand(io_), std::move(on_accept));
    } else {
        acceptor_.async_accept(io_, std::move(on_accept));
    }
}

void HttpServer::Impl::pause_accepting(const boost::system::error_code& ec) {
    // Out of descriptors (EMFILE, ENFILE), the pending connection stays in the backlog and the
    // listener stays readable: accepting again at once would spin. Go's net/http waits 5 ms,
    // doubling to 1 s; nginx stops accepting for 500 ms.
    constexpr std::chrono::milliseconds kFirst{5};
    constexpr std::chrono::milliseconds kMax{500};
    accept_delay_ = accept_delay_.count() == 0 ? kFirst : std::min(accept_delay_ * 2, kMax);
    ++accept_failures_;
    const auto now = std::chrono::steady_clock::now();
    if (now - accept_logged_at_ >= std::chrono::seconds(1)) {
        log::warn("accept_failed", {{"error", ec.message()},
                                    {"failures", accept_failures_},
                                    {"pause_ms", static_cast<int64_t>(accept_delay_.count())}});
        accept_failures_ = 0;
        accept_logged_at_ = now;
    }
    accept_pause_.expires_after(accept_delay_);
    ++accept_ops_;
    accept_pause_.async_wait([this](boost::system::error_code wec) {
        --accept_ops_;
        if (wec == net::error::operation_aborted || !acceptor_.is_open()) {
            note_accept_stopped();
            return;
        }
        start_accepting();
    });
}

void HttpServer::Impl::note_accept_stopped() {
    if (accept_ops_ != 0 || acceptor_.is_open()) {
        return;
    }
    // Notified under the lock: stop() may return and destroy this object as soon as it can take
    // the lock again, so nothing here touches it after the unlock.
    std::lock_guard lock(mu_);
    accept_stopped_ = true;
    cv_.notify_all();
}

void HttpServer::Impl::SessionRegistry::add(const std::shared_ptr<HttpSession>& session) {
    std::lock_guard lock(mu);
    sessions.emplace(session.get(), Entry{session});
    open.fetch_add(1);
}

void HttpServer::Impl::SessionRegistry::note_closing(HttpSession* session) {
    std::lock_guard lock(mu);
    auto it = sessions.find(session);
    if (it != sessions.end() && !it->second.closing) {
        it->second.closing = true;
        ++closing_sessions;
        cv.notify_all();
    }
}

void HttpServer::Impl::SessionRegistry::remove(HttpSession* session) {
    // The observer through its slot, before the erase: once the last session is erased, stop()
    // may return and the server, and then the observer, be destroyed (the slot is emptied first).
    {
        std::lock_guard lock(observer->mu);
        if (observer->observer != nullptr) {
            observer->observer->on_connection_closed();
        }
    }
    std::lock_guard lock(mu);
    auto it = sessions.find(session);
    if (it != sessions.end()) {
        closing_sessions -= it->second.closing ? 1 : 0;
        sessions.erase(it);
    }
    open.fetch_sub(1);
    cv.notify_all();
}

void HttpServer::Impl::stop(std::chrono::milliseconds deadline,
                            std::function<void()> at_deadline) {
    SessionRegistry& registry = *registry_;
    auto notify_all_sessions = [&registry](bool force) {
        std::vector<std::shared_ptr<HttpSession>> live;
        {
            std::lock_guard lock(registry.mu);
            for (auto& [raw, entry] : registry.sessions) {
                if (auto s = entry.session.lock()) {
                    live.push_back(std::move(s));
                }
            }
        }
        for (auto& s : live) {
            notify_session_drain(s, force);
        }
    };
    registry.draining.store(true);
    // On the accept strand, as every other use of the acceptor. The close ends the accept in
    // progress (or the back-off wait); stop() goes on once its completion has run, so that no
    // handler of the accept loop runs after the server is destroyed, and every connection
    // accepted before the close is in the registry below.
    net::post(accept_strand_, [this] {
        boost::system::error_code ignored;
        acceptor_.close(ignored);
        accept_pause_.cancel();
        note_accept_stopped();
    });
    {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return accept_stopped_; });
    }
    notify_all_sessions(false);
    // Until `bound`, for every connection to end (or, `closing_suffices`, to be at most closing).
    auto wait_sessions = [&registry](std::chrono::milliseconds bound, bool closing_suffices) {
        std::unique_lock lock(registry.mu);
        return registry.cv.wait_for(lock, bound, [&registry, closing_suffices] {
            return registry.sessions.size() ==
                   (closing_suffices ? registry.closing_sessions : 0);
        });
    };
    // The deadline is for requests: a connection that has only its linger left (a second at
    // most) ends by itself after it, rather than counting as a request to cut.
    if (wait_sessions(deadline, true)) {
        wait_sessions(kLingerTime, false);
    } else if (at_deadline) {
        // The owner ends the requests still running; their answers get a moment to go out.
        log::warn("drain_deadline_cut",
                  {{"connections", static_cast<uint64_t>(registry.open.load())}});
        at_deadline();
        wait_sessions(HttpServer::kCutGrace, false);
    }
    if (registry.open.load() != 0) {
        log::warn("drain_deadline",
                  {{"connections_closed", static_cast<uint64_t>(registry.open.load())}});
    }
    notify_all_sessions(true);
    std::unique_lock lock(registry.mu);
    // Forced closes complete within one pass of the I/O loop; the bound only guards a wedged loop
    // (a session left then unregisters later, into the registry it shares).
    registry.cv.wait_for(lock, std::chrono::seconds(10),
                         [&registry] { return registry.sessions.empty(); });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() = default;

Result<std::unique_ptr<HttpServer>> HttpServer::create(net::io_context& io,
                                                       HttpServerConfig config,
                                                       TlsContextStore& tls, HttpHandler& handler,
                                                       ServerObserver* observer) {
    auto impl = std::make_unique<Impl>(io, std::move(config), tls, handler, observer);
    EDGE_RETURN_IF_ERROR(impl->listen());
    return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

uint16_t HttpServer::port() const { return impl_->port_; }

void HttpServer::start() {
    net::post(impl_->accept_strand_, [impl = impl_.get()] { impl->start_accepting(); });
}

void HttpServer::stop(std::chrono::milliseconds deadline, std::function<void()> at_deadline) {
    impl_->stop(deadline, std::move(at_deadline));
}

size_t HttpServer::open_connections() const { return impl_->registry_->open.load(); }

void HttpServer::set_limits(const HttpLimits& limits) { impl_->set_limits(limits); }

}  // namespace edge::tls
