#pragma once

// Internals shared by tls/http_server.cc (accept loop, registry, drain) and tls/http_session.cc
// (one connection). Includes Beast: include it only from those two files.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "tls/http_server.h"

namespace edge::tls {

class HttpSession;

// How long, and for how many of the client's bytes, a closing connection waits for the client
// to read its last answer (HttpSession::close_gracefully), as Apache's lingering close: bounded
// so that a client that keeps sending costs a socket for a second at most. The time is cut to
// header_timeout where that is shorter.
constexpr auto kLingerTime = std::chrono::milliseconds(1000);
constexpr size_t kLingerBytes = 64 * 1024;

class HttpServer::Impl {
public:
    Impl(boost::asio::io_context& io, HttpServerConfig config, TlsContextStore& tls,
         HttpHandler& handler, ServerObserver* observer)
        : io_(io),
          config_(std::move(config)),
          limits_(std::make_shared<const HttpLimits>(config_.limits)),
          tls_(tls),
          handler_(handler),
          observer_(observer ? observer : &null_observer_),
          late_observer_(std::make_shared<ObserverSlot>(observer_)),
          accept_strand_(boost::asio::make_strand(io)),
          acceptor_(accept_strand_),
          accept_pause_(accept_strand_) {}
    // A record still deferred (ObserverSlot), or the close of a session that outlives the server
    // (SessionRegistry::remove), is not reported once the server is gone.
    ~Impl() {
        std::lock_guard lock(late_observer_->mu);
        late_observer_->observer = nullptr;
    }

    Status listen();
    Status adopt_listener();  // listen() for config_.listen_fd.
    void start_accepting();   // accept_strand_ only.
    // After a failed accept (out of descriptors, most often): waits before accepting again, so
    // that a listener whose backlog cannot be drained does not spin, and logs at most once a
    // second. accept_strand_ only.
    void pause_accepting(const boost::system::error_code& ec);
    // accept_strand_ only: once the acceptor is closed and no accept or back-off wait is left
    // to complete, tells stop() that nothing of the accept loop refers to this object any more.
    void note_accept_stopped();
    void stop(std::chrono::milliseconds deadline, std::function<void()> at_deadline);

    // The limits a connection accepted now gets (config_.limits until set_limits()). Any thread.
    std::shared_ptr<const HttpLimits> current_limits() const {
        std::lock_guard lock(limits_mu_);
        return limits_;
    }
    void set_limits(const HttpLimits& limits) {
        auto fresh = std::make_shared<const HttpLimits>(limits);
        std::lock_guard lock(limits_mu_);
        limits_ = std::move(fresh);
    }

    boost::asio::io_context& io_;
    const HttpServerConfig config_;  // Its `limits` are those at create(): see current_limits().
    mutable std::mutex limits_mu_;
    std::shared_ptr<const HttpLimits> limits_;  // Under limits_mu_.
    TlsContextStore& tls_;
    HttpHandler& handler_;
    ServerObserver null_observer_;
    ServerObserver* observer_;
    // The observer as records deferred past their session see it (ChannelImpl's late record):
    // null once the server is destroyed.
    struct ObserverSlot {
        explicit ObserverSlot(ServerObserver* o) : observer(o) {}
        std::mutex mu;
        ServerObserver* observer;
    };
    std::shared_ptr<ObserverSlot> late_observer_;
    // The live sessions, for drain and stop(). Shared with each session (HttpSession::registry_):
    // a session that outlives the server (an I/O thread wedged past stop()'s bound, or its
    // io_context destroyed later with the session's handlers still queued) unregisters into
    // memory that is still there, and reaches the observer only while the server is. Any thread.
    struct SessionRegistry {
        explicit SessionRegistry(std::shared_ptr<ObserverSlot> slot)
            : observer(std::move(slot)) {}
        void add(const std::shared_ptr<HttpSession>& session);
        void remove(HttpSession* session);
        // The session began its close (HttpSession::close_gracefully): no request is left in it,
        // only its bounded linger, which stop()'s deadline does not cut.
        void note_closing(HttpSession* session);

        const std::shared_ptr<ObserverSlot> observer;  // For on_connection_closed.
        std::atomic<bool> draining{false};
        std::atomic<size_t> open{0};
        std::mutex mu;
        std::condition_variable cv;
        struct Entry {
            std::weak_ptr<HttpSession> session;
            bool closing = false;  // note_closing().
        };
        std::unordered_map<HttpSession*, Entry> sessions;  // Under mu.
        size_t closing_sessions = 0;  // Under mu: the entries of sessions that are closing.
    };
    const std::shared_ptr<SessionRegistry> registry_ =
        std::make_shared<SessionRegistry>(late_observer_);
    // The accept loop's state (the acceptor, its back-off timer and the fields below) is used
    // only on this strand: with several I/O threads, an accept's completion, a back-off's and
    // stop()'s close would otherwise run at once on different threads.
    boost::asio::strand<boost::asio::io_context::executor_type> accept_strand_;
    boost::asio::ip::tcp::acceptor acceptor_;  // Completions run on accept_strand_.
    // Accept back-off: the current pause, 0 after a good accept; the failures not yet logged and
    // when the last line was.
    boost::asio::steady_timer accept_pause_;
    // An accept or back-off wait in progress (0 or 1: the loop has one at a time).
    int accept_ops_ = 0;
    std::chrono::milliseconds accept_delay_{0};
    uint64_t accept_failures_ = 0;
    std::chrono::steady_clock::time_point accept_logged_at_{};
    uint16_t port_ = 0;

    std::mutex mu_;
    std::condition_variable cv_;
    bool accept_stopped_ = false;  // Under mu_: see note_accept_stopped().
};

// Starts serving one accepted socket (its executor is the connection's strand).
void start_session(HttpServer::Impl& server, boost::asio::ip::tcp::socket socket);

// Asks a session, from any thread, to close if idle (drain) or at once (force).
void notify_session_drain(const std::shared_ptr<HttpSession>& session, bool force);

}  // namespace edge::tls
