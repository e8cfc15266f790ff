#pragma once

// One public-listener connection (HttpSession) and the pieces of an answer its ResponseChannel
// hands it (Piece). Internal to tls/http_session.cc and tls/response_channel_impl.h: includes
// Beast. A session's state is used only on its connection's strand, except where a member says
// otherwise; it lives as long as its coroutine (run()) or a channel's call in flight holds it.

#include <openssl/ssl.h>

#include <algorithm>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/log.h"
#include "tls/http_framing.h"
#include "tls/http_server_impl.h"
#include "tls/http_types.h"
#include "tls/tls_context.h"
#include "tls/tls_stream.h"

namespace edge::tls {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
// Our own TLS stream over the socket (tls/tls_stream.h): OpenSSL reads and writes the descriptor
// directly. Deadlines come from the session's one watchdog timer (see set_deadline) instead of a
// timer armed and cancelled around every operation.
using Stream = TlsStream;
using Clock = std::chrono::steady_clock;
constexpr auto kTuple = net::as_tuple(net::use_awaitable);

class ChannelImpl;

struct Piece {
    // kAbandoned: the handler let go of the channel (the last copy it held); whatever of the
    // answer has not ended by then never will.
    enum Kind { kFull, kHead, kChunk, kEnd, kAbandoned } kind = kFull;
    HttpResponse response;
    std::string data;
    // kChunk: which of the channel's accounts holds it until it is written: its backlog
    // (queued_), its oversized places (an oversized chunk let through, ChannelImpl::write), or
    // none (a keepalive comment the session wrote itself).
    enum class Account { kQueued, kOversized, kNone } account = Account::kQueued;
};

class HttpSession : public std::enable_shared_from_this<HttpSession> {
  public:
    HttpSession(HttpServer::Impl& server, tcp::socket socket,
                std::shared_ptr<const TlsGeneration> generation)
        : server_(server),
          registry_(server.registry_),
          limits_(server.current_limits()),
          generation_(std::move(generation)),
          stream_(std::move(socket), generation_->native_context(0)),
          signal_(stream_.get_executor()),
          watchdog_(stream_.get_executor()) {}

    // Through registry_, not server_: the last reference may go after the server (stop() waits
    // for sessions only so long), as when the io_context is destroyed with its handlers later.
    ~HttpSession() { registry_->remove(this); }

    net::awaitable<void> run();

    // Strand only: the channel's pieces for request `seq`.
    void push(uint64_t seq, Piece piece) {
        if (seq != seq_ || response_done_ || client_gone_) {
            return;
        }
        pending_.push_back(std::move(piece));
        signal_.cancel();
    }
    // False when request `seq`'s answer is over (its record was made or handed to its channel).
    bool add_note(uint64_t seq, ResponseNote& note) {
        if (seq == seq_ && !response_done_) {
            notes_.push_back(std::move(note));
            return true;
        }
        return false;
    }
    void set_gone_callback(uint64_t seq, std::function<void()> callback) {
        // Gone already: the callback runs now, even when the answer has ended (the client left
        // before this registration reached the strand, and the session closed the answer on
        // seeing it: ignoring the registration then left the handler generating for no one).
        if (client_gone_) {
            callback();
            return;
        }
        if (seq != seq_ || response_done_) {
            return;
        }
        gone_callback_ = std::move(callback);
    }
    // Strand only.
    void drain(bool force) {
        drain_requested_ = true;
        if (closing_ && !force) {
            return;  // Closing already (close_gracefully): its bounded linger is not cut short.
        }
        // An idle keep-alive connection closes now (its client retries elsewhere). One accepted
        // before the listener closed and still on its first request (its handshake, or the
        // request on its way) gets first_request_drain_grace() to send it and is served once:
        // closing it at once would lose a request the client may already have sent to this
        // process, which no other process (a socket-activated successor) can take over.
        if (force) {
            mark_client_gone();
            close_socket();
        } else if (!busy_ && seq_ != 0) {
            // Its wait for the next request is cancelled: run() then closes it as it closes any
            // other connection (close_gracefully), so a request on its way is not met by a reset.
            cancel_read();
        } else if (!busy_ && deadline_ > Clock::now() + first_request_drain_grace()) {
            // A handshake still running gets the same grace: its client connected before the
            // listener closed and is sending.
            set_read_deadline(first_request_drain_grace());
        }
        signal_.cancel();
    }
    // Strand only: the stream of request `seq` queued more than max_stream_buffer_bytes for a
    // client that does not read; cancel it (generation stops, the connection closes).
    void cancel_slow_stream(uint64_t seq, size_t queued) {
        if (seq != seq_ || response_done_ || client_gone_) {
            return;
        }
        log::warn("stream_cancelled",
                  {{"reason", "slow_reader"},
                   {"peer", remote_},
                   {"queued_bytes", queued},
                   {"limit_bytes", limits_->max_stream_buffer_bytes}});
        server_.observer_->on_stream_cancelled("slow_reader");
        pending_.clear();
        mark_client_gone();
        close_socket();
        signal_.cancel();
    }
    net::any_io_executor executor() { return stream_.get_executor(); }

  private:
    net::awaitable<bool> accept_proxy_and_handshake();
    net::awaitable<bool> read_request(http::request_parser<http::string_body>& parser);
    // Feeds buffered bytes to `parser`, reading more from the stream while needed, until the
    // header (`header_only`) or the whole message is parsed. Beast's read algorithms do this
    // through the stream's Asio interface; here nothing is read while the buffered bytes suffice.
    net::awaitable<boost::system::error_code> parse_request(
        http::request_parser<http::string_body>& parser, bool header_only);
    net::awaitable<bool> serve_response(int version, bool keep_alive, Clock::time_point start,
                                        std::string_view method, std::string_view path);
    // Coroutine arguments are references and temporaries are named: GCC 12 mis-destroys
    // temporaries inside co_await expressions.
    // `head_only`: the answer to a HEAD request, its head alone (Content-Length included).
    net::awaitable<bool> write_full(HttpResponse& response, int version, bool keep_alive,
                                    bool head_only);
    // An answer the server makes itself, with Connection: close: its caller then ends the
    // connection (run() closes it through close_gracefully). `method` and `target`: the request
    // line's, when it was read (the record's route).
    net::awaitable<void> reject(int status, std::string_view message, int version,
                                std::string_view method = {}, std::string_view target = {});
    net::awaitable<void> wait_signal(Clock::duration timeout);
    // Cancels the read pending on the socket (strand): the watcher's, which then ends without
    // taking the client for gone (watcher_stopping_), or read_request's.
    void cancel_read() {
        if (watcher_running_) {
            watcher_stopping_ = true;
        }
        boost::system::error_code ignored;
        stream_.socket().cancel(ignored);
    }
    // Ends the watcher's read (start_watcher) and waits for it to finish.
    net::awaitable<void> stop_watcher();
    // The one way a connection ends once its handshake is done, whatever ended it (Connection:
    // close, HTTP/1.0, an answer the server made itself, the drain, a timeout): close_notify, then
    // a linger of at most kLingerTime and kLingerBytes, then the close. Closes the socket.
    net::awaitable<void> close_gracefully();
    // Consumes the empty lines (CRLF, or a bare LF) at the start of buffer_, up to kMaxEmptyLines
    // for one request. Strand only, never while the watcher reads into buffer_.
    void skip_empty_lines();
    // buffer_ holds no byte of a next request yet: nothing, or the CR of an empty line's CRLF
    // whose LF is still to come.
    bool awaiting_request() const {
        return tls::awaiting_request(
            std::string_view(static_cast<const char*>(buffer_.data().data()), buffer_.size()),
            empty_lines_);
    }
    void start_watcher();
    // The current request's channel as its handler gets it: the handler's copies share one
    // count, and when the last of them goes the session hears of it (Piece::kAbandoned), so a
    // handler that drops the channel unanswered cannot hold the connection.
    std::shared_ptr<ResponseChannel> handler_channel();
    void mark_client_gone() {
        if (client_gone_) {
            return;
        }
        client_gone_ = true;
        if (!response_done_ && gone_callback_) {
            auto callback = std::move(gone_callback_);
            gone_callback_ = nullptr;
            callback();
        }
    }
    void close_socket() {
        boost::system::error_code ignored;
        stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
        stream_.socket().close(ignored);
    }
    // While draining, how long a connection that has not sent its first request may still send
    // it: long enough for a request already on its way, short enough not to hold the drain.
    Clock::duration first_request_drain_grace() const {
        return std::min<Clock::duration>(std::chrono::seconds(2), limits_->header_timeout);
    }
    // The next body read's deadline: body_timeout, cut to what is left of request_read_timeout
    // (from the request's first byte).
    Clock::duration body_deadline() const {
        const HttpLimits& limits = *limits_;
        Clock::duration d = limits.body_timeout;
        if (limits.request_read_timeout.count() > 0) {
            const Clock::duration left =
                request_start_ + limits.request_read_timeout - Clock::now();
            d = std::clamp<Clock::duration>(left, Clock::duration::zero(), d);
        }
        return d;
    }
    bool request_read_expired() const {
        const auto bound = limits_->request_read_timeout;
        return bound.count() > 0 && Clock::now() >= request_start_ + bound;
    }
    // The next I/O must be done within `timeout` (else the socket is closed, which ends the
    // pending operation with an error and sets timed_out_). Cheap: the watchdog timer is re-armed
    // only when the new deadline is well before the one it waits for; when it wakes early it
    // waits again for the current deadline.
    void set_deadline(Clock::duration timeout) {
        soft_timeout_ = false;
        arm_deadline(timeout);
    }
    // The same for reading a request, where a timeout cancels the read instead of closing: the
    // session then answers 408 to a request that had begun, or closes an idle connection with
    // close_notify, within a last second (nginx and Envoy answer 408 as well; a client that sees
    // a bare TCP close mid-request cannot tell a timeout from a crash).
    void set_read_deadline(Clock::duration timeout) {
        soft_timeout_ = true;
        arm_deadline(timeout);
    }
    void arm_deadline(Clock::duration timeout) {
        deadline_ = Clock::now() + timeout;
        if (!watchdog_armed_ || deadline_ + timeout / 8 < watchdog_at_) {
            arm_watchdog();
        }
    }
    void clear_deadline() { deadline_ = Clock::time_point::max(); }
    void arm_watchdog() {
        watchdog_armed_ = true;
        watchdog_at_ = deadline_;
        const uint64_t generation = ++watchdog_generation_;
        watchdog_.expires_at(deadline_);
        watchdog_.async_wait([self = shared_from_this(), generation](boost::system::error_code) {
            if (generation != self->watchdog_generation_) {
                return;  // Re-armed or stopped since.
            }
            self->watchdog_armed_ = false;
            if (self->deadline_ == Clock::time_point::max()) {
                return;
            }
            if (Clock::now() >= self->deadline_) {
                self->timed_out_ = true;
                if (self->soft_timeout_) {
                    boost::system::error_code ignored;
                    self->stream_.socket().cancel(ignored);
                    self->set_deadline(std::chrono::seconds(1));
                    return;
                }
                self->close_socket();
                return;
            }
            self->arm_watchdog();
        });
    }
    void stop_watchdog() {
        ++watchdog_generation_;
        watchdog_armed_ = false;
        watchdog_.cancel();
    }
    bool draining() const { return drain_requested_ || registry_->draining.load(); }

    HttpServer::Impl& server_;
    const std::shared_ptr<HttpServer::Impl::SessionRegistry> registry_;  // Outlives server_.
    // The limits when the connection was accepted, for its whole life: a reload
    // (HttpServer::set_limits) applies to the connections accepted after it.
    const std::shared_ptr<const HttpLimits> limits_;
    std::shared_ptr<const TlsGeneration> generation_;
    Stream stream_;
    beast::flat_buffer buffer_;
    net::steady_timer signal_;
    net::steady_timer watchdog_;
    Clock::time_point deadline_ = Clock::time_point::max();
    Clock::time_point watchdog_at_;
    uint64_t watchdog_generation_ = 0;
    bool watchdog_armed_ = false;
    bool timed_out_ = false;
    bool soft_timeout_ = false;  // The deadline is a request read's (set_read_deadline).
    // When the current request's read began: its first byte, or a new connection's first wait
    // (its header_timeout runs from there). The duration of an answer the server makes itself.
    Clock::time_point request_start_{};
    std::deque<Piece> pending_;
    std::vector<ResponseNote> notes_;       // The current request's (ResponseRecord::notes).
    std::shared_ptr<ChannelImpl> channel_;  // The current request's.
    std::function<void()> gone_callback_;
    std::string remote_;
    std::string server_name_;
    std::string peer_identity_;
    std::vector<std::string> peer_names_;
    std::string write_buffer_;
    uint64_t seq_ = 0;
    int empty_lines_ = 0;  // Skipped before the next request line (skip_empty_lines).
    std::vector<HttpHeader> header_fields_;  // The request header's (read_request).
    bool request_keep_alive_ = false;        // The request header's (read_request).
    bool answer_cut_ = false;  // An answer was cut short (serve_response): no close_notify.
    // Between the first byte of a request and the end of its response; drain closes connections
    // that are not busy (handshaking, or idle between requests) at once.
    bool busy_ = false;
    bool response_done_ = true;
    bool client_gone_ = false;
    bool watcher_running_ = false;
    bool watcher_stopping_ = false;  // The session cancelled the watcher's read (run()).
    bool drain_requested_ = false;
    bool closing_ = false;  // close_gracefully() has begun.
    bool keeps_buffers_ = false;
};

}  // namespace edge::tls
