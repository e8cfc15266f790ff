// One public-listener connection: PROXY header, TLS handshake, then HTTP/1.1 requests with
// keep-alive, as one coroutine on the connection's strand. While a response is pending the
// connection is watched for the client going away (a concurrent read), so generation is cancelled
// as soon as the client disconnects.

#include "tls/http_session.h"

#include <openssl/ssl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <optional>
#include <vector>

#include "common/log.h"
#include "tls/http_framing.h"
#include "tls/proxy_protocol.h"
#include "tls/response_channel_impl.h"

namespace edge::tls {

std::shared_ptr<ResponseChannel> HttpSession::handler_channel() {
    return std::shared_ptr<ResponseChannel>(
        channel_.get(), [channel = channel_](ResponseChannel*) { channel->released(); });
}

net::awaitable<bool> HttpSession::accept_proxy_and_handshake() {
    auto& tcp_layer = stream_.socket();
    boost::system::error_code ec;
    if (!stream_.ok()) {
        server_.observer_->on_handshake(false, "other");
        co_return false;
    }
    tcp::endpoint peer = tcp_layer.remote_endpoint(ec);
    if (ec) {
        co_return false;
    }
    net::ip::address peer_address = peer.address();
    if (peer_address.is_v6() && peer_address.to_v6().is_v4_mapped()) {
        peer_address = net::ip::make_address_v4(net::ip::v4_mapped, peer_address.to_v6());
    }
    remote_ = peer_address.to_string();
    bool trusted = false;
    if (!server_.config_.proxy_trusted.empty()) {
        Result<IpAddress> ip = IpAddress::parse(remote_);
        trusted = ip.ok() && server_.config_.proxy_trusted.contains(*ip);
    }
    set_deadline(limits_->handshake_timeout);
    for (;;) {
        auto [read_ec, n] = co_await tcp_layer.async_read_some(buffer_.prepare(512), kTuple);
        if (read_ec) {
            server_.observer_->on_handshake(false, handshake_failure_reason(read_ec, timed_out_));
            co_return false;
        }
        buffer_.commit(n);
        std::string_view bytes(static_cast<const char*>(buffer_.data().data()), buffer_.size());
        Result<ProxyParseOutcome> outcome = parse_proxy_header(bytes);
        if (outcome.ok() && outcome->state == ProxyParseState::kNotProxy) {
            break;
        }
        if (!trusted) {
            server_.observer_->on_connection_rejected("proxy_untrusted");
            log::debug("proxy_header_refused", {{"peer", remote_}});
            co_return false;
        }
        if (!outcome.ok()) {
            server_.observer_->on_connection_rejected("proxy_malformed");
            log::debug("proxy_header_malformed",
                       {{"peer", remote_}, {"error", outcome.status().message()}});
            co_return false;
        }
        if (outcome->state == ProxyParseState::kDone) {
            if (outcome->header.source) {
                remote_ = outcome->header.source->to_string();
            }
            buffer_.consume(outcome->header.consumed);
            break;
        }
    }
    std::string_view hello(static_cast<const char*>(buffer_.data().data()), buffer_.size());
    boost::system::error_code hs_ec = co_await stream_.handshake(hello);
    buffer_.consume(buffer_.size());
    if (hs_ec) {
        server_.observer_->on_handshake(false, handshake_failure_reason(hs_ec, timed_out_));
        co_return false;
    }
    SSL* ssl = stream_.native_handle();
    if (const char* name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name)) {
        server_name_ = name;
    }
    if (X509* cert = SSL_get0_peer_certificate(ssl);
        cert != nullptr && SSL_get_verify_result(ssl) == X509_V_OK) {
        char name[256];
        int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, name,
                                          sizeof(name));
        peer_identity_ = n > 0 ? std::string(name, static_cast<size_t>(n)) : "(no common name)";
        peer_names_ = certificate_dns_names(cert);
    }
    server_.observer_->on_handshake(SSL_session_reused(ssl) == 1, "");
    co_return true;
}

net::awaitable<void> HttpSession::wait_signal(Clock::duration timeout) {
    signal_.expires_after(timeout);
    co_await signal_.async_wait(kTuple);
}

void HttpSession::skip_empty_lines() {
    const std::string_view bytes(static_cast<const char*>(buffer_.data().data()), buffer_.size());
    buffer_.consume(empty_lines_prefix(bytes, empty_lines_));
}

void HttpSession::start_watcher() {
    watcher_running_ = true;
    clear_deadline();
    net::co_spawn(
        stream_.get_executor(),
        [self = shared_from_this()]() -> net::awaitable<void> {
            // It keeps reading while the answer is pending: what the client pipelines behind the
            // request is appended to buffer_ (read_request parses it after this answer), so that
            // a close behind it is still seen. At max_header_bytes buffered it stops, as the
            // bytes a session holds for a request it has not parsed are bounded there; the
            // client is then watched again from the next request on.
            const size_t cap = self->limits_->max_header_bytes;
            while (self->buffer_.size() < cap) {
                auto watch_buffer =
                    self->buffer_.prepare(std::min<size_t>(2048, cap - self->buffer_.size()));
                auto [ec, n] = co_await self->stream_.read_some(watch_buffer);
                if (ec) {
                    if (ec != net::error::operation_aborted || !self->watcher_stopping_) {
                        self->mark_client_gone();
                    }
                    break;
                }
                self->buffer_.commit(n);
                if (self->response_done_ || self->watcher_stopping_) {
                    break;  // The session reads on itself.
                }
            }
            self->watcher_running_ = false;
            self->watcher_stopping_ = false;
            self->signal_.cancel();
        },
        [](std::exception_ptr) {});
}

net::awaitable<void> HttpSession::stop_watcher() {
    if (!watcher_running_) {
        co_return;
    }
    cancel_read();
    // Bounded: should the read not end at the cancel, the watchdog closes the socket.
    set_deadline(std::chrono::seconds(1));
    while (watcher_running_) {
        co_await wait_signal(std::chrono::seconds(1));
    }
}

net::awaitable<void> HttpSession::close_gracefully() {
    closing_ = true;
    registry_->note_closing(this);
    co_await stop_watcher();  // The linger below reads the socket itself.
    // One bound for all of it: the wait for room for close_notify and the linger.
    const Clock::time_point linger_end =
        Clock::now() +
        std::min<Clock::duration>(limits_->header_timeout, kLingerTime);
    auto& tcp_layer = stream_.socket();
    if (!answer_cut_) {
        // Not after a cut answer: an HTTP/1.0 body ends at the close, and close_notify would
        // tell its client that the body it has is whole (tls_stream.h). The wait for room (a
        // client still reading the answer) ends at the deadline by a cancel, not by closing the
        // socket: what the client sent meanwhile is still to be read before the close.
        set_read_deadline(linger_end - Clock::now());
        co_await stream_.close_notify();
    }
    if (!client_gone_ && Clock::now() < linger_end) {
        // Let the client read the answer before the close (RFC 9112 section 9.6): stop sending,
        // discard what it still sends (a request pipelined behind the last one, the rest of a
        // body) for a short bounded while, then close. Closing with unread input makes the
        // kernel reset the connection, and the reset drops whatever of the answer and of
        // close_notify the client has not read yet. The client's own close ends it at once.
        boost::system::error_code ignored;
        tcp_layer.shutdown(tcp::socket::shutdown_send, ignored);
        set_deadline(linger_end - Clock::now());
        size_t discarded = 0;
        while (discarded < kLingerBytes) {
            char sink[4096];
            auto [ec, n] = co_await tcp_layer.async_read_some(net::buffer(sink), kTuple);
            if (ec) {
                break;
            }
            discarded += n;
        }
    }
    // What arrived unread (while the alert waited for room, or with the linger's time spent)
    // would turn the close into a reset: read and dropped first (the socket is non-blocking).
    for (size_t dropped = 0; dropped < kLingerBytes && tcp_layer.is_open();) {
        char sink[4096];
        boost::system::error_code ec;
        const size_t n = tcp_layer.read_some(net::buffer(sink), ec);
        if (ec || n == 0) {
            break;
        }
        dropped += n;
    }
    close_socket();
    stop_watchdog();
}

net::awaitable<bool> HttpSession::read_request(http::request_parser<http::string_body>& parser) {
    const HttpLimits& limits = *limits_;
    // A fresh connection's header_timeout runs from its first wait, not again from its first
    // byte (as nginx's client_header_timeout).
    bool first_request_waited = false;
    bool waited = false;
    request_start_ = Clock::now();
    // Empty lines before the request line are skipped (they may come in a read of their own, or
    // behind the previous request); until a byte of the request itself is here, the connection
    // is idle.
    for (skip_empty_lines(); awaiting_request(); skip_empty_lines()) {
        // Keep-alive wait for the next request's first byte; a fresh connection's first request
        // is still taken while draining, within a short grace (drain()).
        if (draining() && seq_ != 0) {
            co_return false;
        }
        // A fresh connection's first request is due within header_timeout, as nginx's
        // client_header_timeout: a client that handshakes and sends nothing holds a connection
        // (and its TLS state) that long, not a keep-alive idle period.
        // Set once per wait: empty lines sent a byte at a time must not restart it.
        if (!waited) {
            Clock::duration first_due =
                std::min<Clock::duration>(limits.header_timeout, limits.idle_timeout);
            if (draining()) {
                first_due = std::min<Clock::duration>(first_due, first_request_drain_grace());
            }
            set_read_deadline(seq_ == 0 ? first_due : limits.idle_timeout);
        }
        first_request_waited = seq_ == 0;
        if (seq_ != 0 && !waited) {
            // Right after a response the client has rarely sent its next request yet: let the
            // other connections' ready work run first, then read (a read at once would mostly
            // find nothing and cost two recv calls and a wait in the reactor).
            auto executor = stream_.get_executor();  // Named: GCC 12 and co_await temporaries.
            co_await net::post(executor, net::use_awaitable);
            if (draining()) {
                co_return false;  // drain() found no read to cancel while this waited.
            }
        }
        waited = true;
        auto first = buffer_.prepare(4096);
        auto [ec, n] = co_await stream_.read_some(first);
        if (ec) {
            co_return false;  // Idle past the timeout (run() sends close_notify), or gone.
        }
        buffer_.commit(n);
    }
    if (waited && !first_request_waited) {
        request_start_ = Clock::now();  // A keep-alive wait is not part of the request.
    }
    empty_lines_ = 0;  // The next request may have its own.
    busy_ = true;
    if (!keeps_buffers_) {
        // A connection that sends requests keeps OpenSSL's record buffers (about 34 KiB) instead
        // of freeing and allocating both around every record (7% of the instructions of a small
        // keep-alive request); one that only handshakes and idles holds none.
        SSL_clear_mode(stream_.native_handle(), SSL_MODE_RELEASE_BUFFERS);
        keeps_buffers_ = true;
    }
    set_request_limits(parser, limits.max_header_bytes, limits.max_body_bytes);
    // Usually the whole header is already in the buffer (a keep-alive client sends a request in
    // one segment): it is parsed without any further read.
    if (!first_request_waited) {
        set_read_deadline(limits.header_timeout);
    }
    boost::system::error_code ec = co_await parse_request(parser, true);
    // What the parser has not consumed: the start of a head it refused.
    const std::string_view unparsed(static_cast<const char*>(buffer_.data().data()),
                                    buffer_.size());
    if (const FramingError answer =
            header_phase_error(ec, parser, unparsed, limits.max_header_bytes);
        answer.status != 0) {
        co_await reject(answer.status, answer.message, 11);
        co_return false;
    }
    if (ec && timed_out_) {
        // The parser gets the request line once it is whole (RequestReadPhase); one it has not
        // got yet is looked for in what is unparsed.
        std::pair<std::string_view, std::string_view> line{parser.get().method_string(),
                                                           parser.get().target()};
        if (line.second.empty()) {
            line = request_line_parts(unparsed);
        }
        co_await reject(408,
                        "request timeout: the request header was not complete within "
                        "header_timeout",
                        11, line.first, line.second);
        co_return false;
    }
    if (ec) {
        co_return false;  // Reset or end of stream: nothing to answer.
    }
    auto& head = parser.get();
    // The header's fields, as the handler gets them: the parser adds a chunked body's trailer
    // fields to the same list, each beside the header's field of its name (RFC 9110 section
    // 6.5.1: a trailer is not merged into the header; a second Host or an Authorization there
    // was never checked).
    header_fields_.clear();
    header_fields_.reserve(8);
    for (const auto& field : head) {
        header_fields_.push_back(
            HttpHeader{std::string(field.name_string()), std::string(field.value())});
    }
    // Keep-alive is the header's too: taken from the message after its body, a trailer's
    // Connection: close ended the connection (RFC 9110 section 6.5.1: a trailer must not change
    // the connection's handling), and requests pipelined behind it went unanswered.
    request_keep_alive_ = head.keep_alive();
    // Named, not temporaries in the co_await expressions below (GCC 12).
    const std::string_view method = head.method_string();
    const std::string_view target = head.target();
    if (const FramingError framing = check_request_head(head); framing.status != 0) {
        // Answered in the request's version, or in 1.1 to one the server does not speak.
        const int version = head.version() == 10 || head.version() == 11 ? head.version() : 11;
        co_await reject(framing.status, framing.message, version, method, target);
        co_return false;
    }
    if (!parser.is_done()) {
        auto expect = head[http::field::expect];
        if (head.version() >= 11 && beast::iequals(expect, "100-continue")) {
            static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
            set_deadline(limits.write_timeout);
            auto continue_buffer = net::buffer(kContinue.data(), kContinue.size());
            boost::system::error_code wec = co_await stream_.write(continue_buffer);
            if (wec) {
                co_return false;
            }
        }
        // body_timeout bounds each silence, not the whole body (parse_request re-arms it as
        // bytes arrive); request_read_timeout, the whole request.
        set_read_deadline(body_deadline());
        boost::system::error_code bec = co_await parse_request(parser, false);
        if (const FramingError answer = body_phase_error(bec, head); answer.status != 0) {
            co_await reject(answer.status, answer.message, head.version(), method, target);
            co_return false;
        }
        if (bec && timed_out_) {
            co_await reject(408,
                            request_read_expired()
                                ? "request timeout: the request was not read within "
                                  "request_read_timeout"
                                : "request timeout: no request body bytes arrived within "
                                  "body_timeout",
                            head.version(), method, target);
            co_return false;
        }
        if (bec) {
            co_return false;
        }
    }
    soft_timeout_ = false;  // What follows (the answer) is cut at its deadline.
    co_return true;
}

net::awaitable<boost::system::error_code> HttpSession::parse_request(
    http::request_parser<http::string_body>& parser, bool header_only) {
    RequestReadPhase phase(limits_->max_header_bytes, header_only);
    for (;;) {
        const RequestReadPhase::Step step = phase.advance(parser, buffer_);
        if (step.ec || step.finished) {
            co_return step.ec;
        }
        auto more = buffer_.prepare(step.read_size);
        auto [read_ec, n] = co_await stream_.read_some(more);
        if (read_ec == net::error::eof || read_ec == net::ssl::error::stream_truncated) {
            co_return RequestReadPhase::at_eof(parser);  // The client closed mid-message.
        }
        if (read_ec) {
            co_return read_ec;  // Timeout or reset.
        }
        buffer_.commit(n);
        if (!header_only) {
            // body_timeout is the longest silence while a body is read, as nginx's
            // client_body_timeout (the time between two successive reads), within the
            // request's own bound (request_read_timeout): a byte every few seconds does not hold
            // the connection for days.
            set_read_deadline(body_deadline());
        }
    }
}

net::awaitable<void> HttpSession::run() {
    if (!co_await accept_proxy_and_handshake()) {
        close_socket();
        stop_watchdog();
        co_return;
    }
    for (;;) {
        if (buffer_.size() == 0 && buffer_.capacity() > 16 * 1024) {
            // An idle connection keeps no large buffer from an earlier big request.
            buffer_.shrink_to_fit();
        }
        http::request_parser<http::string_body> parser;
        if (!co_await read_request(parser)) {
            break;
        }
        auto start = Clock::now();
        http::request<http::string_body> beast_request = parser.release();
        HttpRequest request;
        request.method = std::string(beast_request.method_string());
        request.target = std::string(beast_request.target());
        request.version = beast_request.version();
        request.headers = std::move(header_fields_);  // Not a trailer's (read and dropped).
        header_fields_ = {};
        request.body = std::move(beast_request.body());
        request.remote_address = remote_;
        request.server_name = server_name_;
        request.peer_identity = peer_identity_;
        request.peer_names = peer_names_;
        bool keep_alive = request_keep_alive_ && !draining();  // The header's (read_request).
        int version = request.version;
        std::string method = request.method;
        std::string path(request.path());

        ++seq_;
        response_done_ = false;
        gone_callback_ = nullptr;
        pending_.clear();
        notes_.clear();
        channel_ = std::make_shared<ChannelImpl>(stream_.get_executor(), weak_from_this(), seq_,
                                                 limits_->max_stream_buffer_bytes);
        t_handling = this;
        try {
            server_.handler_.handle(std::move(request), handler_channel());
        } catch (const std::exception& e) {
            // A handler bug must not leave t_handling naming this session once it is gone, nor
            // the client without an answer (a no-op if the handler had answered).
            t_handling = nullptr;
            log::error("handler_exception", {{"error", e.what()}, {"path", path}});
            channel_->respond(
                HttpResponse{500, "text/plain; charset=utf-8", {}, "internal error\n"});
        }
        t_handling = nullptr;
        bool again = co_await serve_response(version, keep_alive && !draining(), start, method,
                                             path);
        channel_.reset();
        busy_ = false;
        if (!again || draining()) {
            break;
        }
        if (watcher_running_) {
            if (buffer_.size() > 0) {
                // The next request (or its start) is here already: the watcher's read waits for
                // bytes the client may send only once it has its answers. Cancel it; what the
                // read had not taken stays in the TLS stream for read_request.
                cancel_read();
            }
            // The watcher read owns the stream; wait for it (next request bytes) or time out.
            co_await wait_signal(limits_->idle_timeout);
            if (watcher_running_ || client_gone_ || draining()) {
                break;
            }
        }
    }
    co_await close_gracefully();
}

void start_session(HttpServer::Impl& server, tcp::socket socket) {
    auto session = std::make_shared<HttpSession>(server, std::move(socket), server.tls_.current());
    server.registry_->add(session);
    server.observer_->on_connection_opened();
    net::co_spawn(session->executor(), [session]() { return session->run(); },
                  [](std::exception_ptr e) {
                      if (e) {
                          try {
                              std::rethrow_exception(e);
                          } catch (const std::exception& ex) {
                              log::error("session_exception", {{"what", ex.what()}});
                          } catch (...) {
                              log::error("session_exception", {{"what", "unknown"}});
                          }
                      }
                  });
}

void notify_session_drain(const std::shared_ptr<HttpSession>& session, bool force) {
    net::dispatch(session->executor(), [session, force] { session->drain(force); });
}

}  // namespace edge::tls
