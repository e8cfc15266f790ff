// One public-listener connection: PROXY header, TLS handshake, then HTTP/1.1 requests with
// keep-alive, as one coroutine on the connection's strand. While a response is pending the
// connection is watched for the client going away (a concurrent read), so generation is cancelled
// as soon as the client disconnects.

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <deque>
#include <optional>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "common/log.h"
#include "tls/http_server_impl.h"
#include "tls/proxy_protocol.h"
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

namespace {

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

std::string_view handshake_failure_reason(const boost::system::error_code& ec, bool timed_out) {
    if (timed_out) {
        return "timeout";
    }
    if (ec == net::error::eof || ec == net::ssl::error::stream_truncated ||
        ec == net::error::connection_reset) {
        return "eof";
    }
    if (ec.category() == net::error::get_ssl_category()) {
        switch (ERR_GET_REASON(static_cast<unsigned long>(ec.value()))) {
            case SSL_R_HTTP_REQUEST:
            case SSL_R_HTTPS_PROXY_REQUEST:
            case SSL_R_WRONG_VERSION_NUMBER:
            case SSL_R_PACKET_LENGTH_TOO_LONG:
            case SSL_R_RECORD_LENGTH_MISMATCH:
                return "not_tls";
            case SSL_R_UNSUPPORTED_PROTOCOL:
            case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
                return "version";
            case SSL_R_NO_SHARED_CIPHER:
            case SSL_R_NO_SHARED_GROUPS:
                return "no_shared_cipher";
            case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
            case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
            case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
                return "certificate_rejected";
            case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
            case SSL_R_CERTIFICATE_VERIFY_FAILED:
                return "client_certificate";
            default:
                return "other";
        }
    }
    return "other";
}

// Method and target of the request line at the start of `unparsed` when the line is complete
// (both empty otherwise): a line that came in pieces Beast parses only with the whole header, and
// an answer made before that (a 408) is still recorded under the request's route.
std::pair<std::string_view, std::string_view> request_line_parts(std::string_view unparsed) {
    const size_t end = unparsed.find('\n');
    if (end == std::string_view::npos) {
        return {};
    }
    const std::string_view line = unparsed.substr(0, end);
    const size_t first = line.find(' ');
    const size_t second = first == std::string_view::npos ? first : line.find(' ', first + 1);
    if (first == 0 || second == std::string_view::npos || second == first + 1) {
        return {};
    }
    return {line.substr(0, first), line.substr(first + 1, second - first - 1)};
}

struct FramingError {
    int status = 0;  // 0: the framing is fine.
    std::string_view message;
};

// Transfer-Encoding is accepted only as exactly "chunked" on HTTP/1.1 without Content-Length
// (RFC 9112 section 6): any other coding, or one the server cannot frame, closes the connection
// after the answer.
FramingError check_transfer_encoding(const http::request_header<>& head) {
    std::vector<std::string_view> codings;
    bool present = false;
    const auto [first, last] = head.equal_range(http::field::transfer_encoding);
    for (auto field = first; field != last; ++field) {
        present = true;
        std::string_view value = field->value();
        while (!value.empty()) {
            const size_t comma = value.find(',');
            std::string_view coding = value.substr(0, comma);
            value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
            while (!coding.empty() && (coding.front() == ' ' || coding.front() == '\t')) {
                coding.remove_prefix(1);
            }
            while (!coding.empty() && (coding.back() == ' ' || coding.back() == '\t')) {
                coding.remove_suffix(1);
            }
            if (!coding.empty()) {
                codings.push_back(coding);
            }
        }
    }
    if (!present) {
        return {};
    }
    if (head.version() < 11) {
        return {400, "Transfer-Encoding in an HTTP/1.0 request"};
    }
    if (head.find(http::field::content_length) != head.end()) {
        return {400, "both Transfer-Encoding and Content-Length in the request"};
    }
    if (codings.empty() || !beast::iequals(codings.back(), "chunked")) {
        return {400, "Transfer-Encoding whose final coding is not chunked"};
    }
    if (codings.size() > 1) {
        return {501, "Transfer-Encoding other than chunked is not supported"};
    }
    return {};
}

// Empty lines a client may send before a request line, as Apache's limit (10): RFC 9112 section
// 2.2 asks a server to ignore at least one (a client that ends a POST body with an extra CRLF, as
// old browsers do), and a bound keeps a stream of them from holding a connection forever. More
// than that reach the parser, which refuses them (400).
constexpr int kMaxEmptyLines = 10;

std::string error_body(std::string_view message) {
    std::string body = R"({"error":{"message":")";
    body += message;  // Fixed texts only: no escaping needed.
    body += R"(","type":"invalid_request_error","param":null,"code":null}})";
    return body;
}

}  // namespace

class HttpSession : public std::enable_shared_from_this<HttpSession> {
public:
    HttpSession(HttpServer::Impl& server, tcp::socket socket,
                std::shared_ptr<const TlsGeneration> generation)
        : server_(server),
          generation_(std::move(generation)),
          stream_(std::move(socket), generation_->native_context(0)),
          signal_(stream_.get_executor()),
          watchdog_(stream_.get_executor()) {}

    ~HttpSession() { server_.remove_session(this); }

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
        // An idle keep-alive connection closes now (its client retries elsewhere). One accepted
        // before the listener closed and still on its first request (its handshake, or the
        // request on its way) gets first_request_drain_grace() to send it and is served once:
        // closing it at once would lose a request the client may already have sent to this
        // process, which no other process (a socket-activated successor) can take over.
        if (force || (!busy_ && seq_ != 0)) {
            mark_client_gone();
            close_socket();
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
                   {"limit_bytes", server_.config_.limits.max_stream_buffer_bytes}});
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
    // An answer the server makes itself, then the close. `method` and `target`: the request
    // line's, when it was read (the record's route).
    net::awaitable<void> reject(int status, std::string_view message, int version,
                                std::string_view method = {}, std::string_view target = {});
    net::awaitable<void> wait_signal(Clock::duration timeout);
    // Consumes the empty lines (CRLF, or a bare LF) at the start of buffer_, up to kMaxEmptyLines
    // for one request. Strand only, never while the watcher reads into buffer_.
    void skip_empty_lines();
    // buffer_ holds no byte of a next request yet: nothing, or the CR of an empty line's CRLF
    // whose LF is still to come.
    bool awaiting_request() const {
        return buffer_.size() == 0 ||
               (buffer_.size() == 1 && *static_cast<const char*>(buffer_.data().data()) == '\r' &&
                empty_lines_ < kMaxEmptyLines);
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
        return std::min<Clock::duration>(std::chrono::seconds(2),
                                         server_.config_.limits.header_timeout);
    }
    // The next body read's deadline: body_timeout, cut to what is left of request_read_timeout
    // (from the request's first byte).
    Clock::duration body_deadline() const {
        const HttpLimits& limits = server_.config_.limits;
        Clock::duration d = limits.body_timeout;
        if (limits.request_read_timeout.count() > 0) {
            const Clock::duration left =
                request_start_ + limits.request_read_timeout - Clock::now();
            d = std::clamp<Clock::duration>(left, Clock::duration::zero(), d);
        }
        return d;
    }
    bool request_read_expired() const {
        const auto bound = server_.config_.limits.request_read_timeout;
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
    bool draining() const { return drain_requested_ || server_.draining_.load(); }

    HttpServer::Impl& server_;
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
    bool answer_cut_ = false;  // An answer was cut short (serve_response): no close_notify.
    // Between the first byte of a request and the end of its response; drain closes connections
    // that are not busy (handshaking, or idle between requests) at once.
    bool busy_ = false;
    bool response_done_ = true;
    bool client_gone_ = false;
    bool watcher_running_ = false;
    bool watcher_stopping_ = false;  // The session cancelled the watcher's read (run()).
    bool drain_requested_ = false;
    bool keeps_buffers_ = false;
};

namespace {

// The session whose handler runs on this thread right now (inside HttpHandler::handle, on the
// connection's strand): calls its channel makes there apply at once, not through the executor.
thread_local HttpSession* t_handling = nullptr;

// A request's record whose answer ended incomplete (the client left, a write failed) while its
// handler still held the channel, generation still running: it waits in the channel for the
// handler's last notes (tokens, outcome) and goes to the observer when the channel is destroyed.
struct LateRecord {
    std::string method;
    std::string path;
    std::string client;
    ResponseRecord record;  // Its views point into the strings above and `notes`.
    std::vector<ResponseNote> notes;
    std::shared_ptr<HttpServer::Impl::ObserverSlot> observer;
};

class ChannelImpl final : public ResponseChannel,
                          public std::enable_shared_from_this<ChannelImpl> {
public:
    ChannelImpl(net::any_io_executor executor, std::weak_ptr<HttpSession> session, uint64_t seq,
                size_t max_queued)
        : executor_(std::move(executor)),
          session_(std::move(session)),
          seq_(seq),
          max_queued_(max_queued) {}

    ~ChannelImpl() override {
        if (!late_) {
            return;
        }
        LateRecord& r = *late_;
        r.record.method = r.method;
        r.record.path = r.path;
        r.record.client = r.client;
        r.record.notes = r.notes;
        std::lock_guard lock(r.observer->mu);
        if (r.observer->observer != nullptr) {
            try {
                r.observer->observer->on_response(r.record);
            } catch (...) {
                // A destructor must not throw; the record is lost rather than the process.
            }
        }
    }

    // Session strand: the answer is over; the record waits for this channel's destruction.
    void defer_record(LateRecord record) {
        std::lock_guard lock(late_mu_);
        late_ = std::move(record);
    }

    void respond(HttpResponse response) override {
        deliver(Piece{Piece::kFull, std::move(response), {}});
    }
    void begin_stream(HttpResponse head) override {
        deliver(Piece{Piece::kHead, std::move(head), {}});
    }
    void write(std::string chunk) override {
        // Counted here, before the hand-over to the strand, so that what waits in the
        // io_context's queue is bounded too.
        const size_t n = chunk.size();
        // A chunk larger than the whole limit (a final event carrying many logprobs, a long
        // tool-call argument) is let through uncounted, up to kOversizedQueued of them waiting
        // at once: counted, it would mark a reader slow by its size alone. One at a time was not
        // enough: a second one written before the first reached the socket (the final event
        // and the usage event behind it) cut a reader that kept up. Only a backlog of the others
        // marks a slow reader; memory stays bounded by the limit plus kOversizedQueued chunks,
        // as one more oversized chunk while they all wait is counted (and cuts the stream).
        if (n > max_queued_ && take_oversized_slot()) {
            deliver(Piece{Piece::kChunk, {}, std::move(chunk), Piece::Account::kOversized});
            return;
        }
        const size_t queued = queued_.fetch_add(n, std::memory_order_relaxed) + n;
        if (queued > max_queued_) {
            queued_.fetch_sub(n, std::memory_order_relaxed);
            if (!overflowed_.exchange(true)) {
                on_session([seq = seq_, queued](HttpSession& s) {
                    s.cancel_slow_stream(seq, queued);
                });
            }
            return;
        }
        deliver(Piece{Piece::kChunk, {}, std::move(chunk)});
    }
    void end_stream() override { deliver(Piece{Piece::kEnd, {}, {}}); }
    // The handler's last copy of the channel is gone (handler_channel()'s deleter).
    void released() { deliver(Piece{Piece::kAbandoned, {}, {}}); }
    void on_client_gone(std::function<void()> callback) override {
        if (t_handling != nullptr) {
            if (auto s = session_.lock(); s.get() == t_handling) {
                s->set_gone_callback(seq_, std::move(callback));
                return;
            }
        }
        // A session already destroyed closed its connection before this request's answer (set
        // before answering, this registration is ahead of the answer on the strand): gone.
        net::dispatch(executor_,
                      [session = session_, seq = seq_, callback = std::move(callback)]() mutable {
                          if (auto s = session.lock()) {
                              s->set_gone_callback(seq, std::move(callback));
                          } else {
                              callback();
                          }
                      });
    }
    void note(std::string name, std::variant<std::string, int64_t> value) override {
        ResponseNote note{std::move(name), std::move(value)};
        if (add_late_note(note)) {
            return;
        }
        if (t_handling != nullptr) {
            if (auto s = session_.lock(); s.get() == t_handling && s->add_note(seq_, note)) {
                return;
            }
        }
        // Holds the channel, so a record deferred meanwhile waits for this note.
        net::dispatch(executor_, [session = session_, seq = seq_, note = std::move(note),
                                  self = shared_from_this()]() mutable {
            auto s = session.lock();
            if (!s || !s->add_note(seq, note)) {
                self->add_late_note(note);
            }
        });
    }

private:
    static constexpr int kOversizedQueued = 2;

    // One of the kOversizedQueued places for an uncounted chunk, if one is free.
    bool take_oversized_slot() {
        int queued = oversized_queued_.load();
        while (queued < kOversizedQueued &&
               !oversized_queued_.compare_exchange_weak(queued, queued + 1)) {
        }
        return queued < kOversizedQueued;
    }

    bool add_late_note(ResponseNote& note) {
        std::lock_guard lock(late_mu_);
        if (!late_) {
            return false;
        }
        late_->notes.push_back(std::move(note));
        return true;
    }

    void deliver(Piece piece) {
        on_session([seq = seq_, piece = std::move(piece)](HttpSession& s) mutable {
            s.push(seq, std::move(piece));
        });
    }
    // Runs f(session) on the session's strand: at once when called from its handler, else
    // through the executor (nothing when the session is gone).
    template <typename F>
    void on_session(F&& f) {
        if (t_handling != nullptr) {
            if (auto s = session_.lock(); s.get() == t_handling) {
                f(*s);
                return;
            }
        }
        net::dispatch(executor_, [session = session_, f = std::forward<F>(f)]() mutable {
            if (auto s = session.lock()) {
                f(*s);
            }
        });
    }

    net::any_io_executor executor_;
    std::weak_ptr<HttpSession> session_;
    uint64_t seq_;
    size_t max_queued_;
    std::atomic<bool> overflowed_{false};
    std::mutex late_mu_;
    std::optional<LateRecord> late_;

public:
    // Bytes of chunks written to the channel and not yet to the socket; the session subtracts
    // what it wrote.
    std::atomic<size_t> queued_{0};
    // Uncounted oversized chunks waiting to be written; the session subtracts those it wrote.
    std::atomic<int> oversized_queued_{0};
};

}  // namespace

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
    set_deadline(server_.config_.limits.handshake_timeout);
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
    size_t at = 0;
    while (empty_lines_ < kMaxEmptyLines) {
        if (bytes.substr(at).starts_with("\r\n")) {
            at += 2;
        } else if (bytes.substr(at).starts_with("\n")) {
            at += 1;
        } else {
            break;
        }
        ++empty_lines_;
    }
    buffer_.consume(at);
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
            const size_t cap = self->server_.config_.limits.max_header_bytes;
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

void format_head(std::string& out, const HttpResponse& response, int version, bool keep_alive,
                 std::optional<size_t> content_length) {
    out += version >= 11 ? "HTTP/1.1 " : "HTTP/1.0 ";
    char number[24];
    auto [end, ec] = std::to_chars(number, number + sizeof(number), response.status);
    out.append(number, end);
    out += ' ';
    out += reason_phrase(response.status);
    out += "\r\nContent-Type: ";
    out += response.content_type;
    out += "\r\n";
    for (const HttpHeader& h : response.headers) {
        out += h.name;
        out += ": ";
        out += h.value;
        out += "\r\n";
    }
    if (content_length) {
        out += "Content-Length: ";
        end = std::to_chars(number, number + sizeof(number), *content_length).ptr;
        out.append(number, end);
        out += "\r\n";
    } else if (version >= 11) {
        out += "Transfer-Encoding: chunked\r\n";
    }
    if (!keep_alive) {
        out += "Connection: close\r\n";
    } else if (version < 11) {
        out += "Connection: keep-alive\r\n";
    }
    out += "\r\n";
}

net::awaitable<bool> HttpSession::write_full(HttpResponse& response, int version, bool keep_alive,
                                             bool head_only) {
    // Formatted by hand into a buffer the session reuses: one TLS write, no allocation per
    // request once the buffer has grown.
    std::string& out = write_buffer_;
    out.clear();
    format_head(out, response, version, keep_alive, response.body.size());
    set_deadline(server_.config_.limits.write_timeout);
    boost::system::error_code wec;
    if (head_only) {
        auto head = net::buffer(out);
        wec = co_await stream_.write(head);
    } else if (response.body.size() <= 16 * 1024) {
        // Head and body in one buffer: one TLS record.
        out += response.body;
        auto single = net::buffer(out);
        wec = co_await stream_.write(single);
    } else {
        auto head = net::buffer(out);
        wec = co_await stream_.write(head);
        // write_timeout per slice, not for the whole body: a slow client that keeps reading a
        // large answer (a forwarded one may be 64 MiB) is not cut; one that stops is.
        constexpr size_t kSlice = 256 * 1024;
        for (size_t at = 0; !wec && at < response.body.size(); at += kSlice) {
            set_deadline(server_.config_.limits.write_timeout);
            auto slice = net::buffer(response.body.data() + at,
                                     std::min(kSlice, response.body.size() - at));
            wec = co_await stream_.write(slice);
        }
    }
    if (out.capacity() > 64 * 1024) {
        std::string().swap(out);
    }
    co_return !wec;
}

net::awaitable<void> HttpSession::reject(int status, std::string_view message, int version,
                                         std::string_view method, std::string_view target) {
    HttpResponse response{status, "application/json", {}, error_body(message)};
    HttpRequest line;  // For its path(): the route the record is counted under.
    line.target = std::string(target);
    ResponseRecord record;
    record.method = method;
    record.path = target.empty() ? std::string_view() : line.path();
    record.client = remote_;
    record.status = status;
    const bool head_only = method == "HEAD";  // Its answer has no content (RFC 9110 9.3.2).
    record.complete = co_await write_full(response, version, false, head_only);
    record.body_bytes = record.complete && !head_only ? response.body.size() : 0;
    // From the start of the request's read, not of this answer: a 408 held the connection for
    // the whole timeout.
    record.duration = Clock::now() - request_start_;
    server_.observer_->on_response(record);
    // Let the client read the answer before the close: stop sending, discard what it still sends
    // for a short bounded while, then close (closing with unread input would reset the answer).
    stream_.send_close_notify();
    auto& tcp_layer = stream_.socket();
    boost::system::error_code ignored;
    tcp_layer.shutdown(tcp::socket::shutdown_send, ignored);
    set_deadline(std::min<Clock::duration>(server_.config_.limits.header_timeout,
                                           std::chrono::seconds(1)));
    size_t discarded = 0;
    while (discarded < 64 * 1024) {
        char sink[4096];
        auto [ec, n] = co_await tcp_layer.async_read_some(net::buffer(sink), kTuple);
        if (ec) {
            break;
        }
        discarded += n;
    }
}

net::awaitable<bool> HttpSession::read_request(http::request_parser<http::string_body>& parser) {
    const HttpLimits& limits = server_.config_.limits;
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
    parser.header_limit(static_cast<uint32_t>(limits.max_header_bytes));
    parser.body_limit(limits.max_body_bytes);
    // Usually the whole header is already in the buffer (a keep-alive client sends a request in
    // one segment): it is parsed without any further read.
    if (!first_request_waited) {
        set_read_deadline(limits.header_timeout);
    }
    boost::system::error_code ec = co_await parse_request(parser, true);
    // What the parser has not consumed: the start of a head it refused.
    const std::string_view unparsed(static_cast<const char*>(buffer_.data().data()),
                                    buffer_.size());
    if (ec == http::error::header_limit) {
        // The request line alone passed the limit: a target too long (RFC 9112 section 3). Beast
        // may not have parsed a line that came in pieces (it then waits for the whole header),
        // so the line's end is looked for in what is unparsed.
        const size_t line_end = unparsed.find('\n');
        if (parser.get().target().empty() &&
            (line_end == std::string_view::npos || line_end >= limits.max_header_bytes)) {
            co_await reject(414, "request target too long", 11);
        } else {
            co_await reject(431, "request header fields too large", 11);
        }
        co_return false;
    }
    if (ec == http::error::body_limit) {
        co_await reject(413, "request body too large", 11);
        co_return false;
    }
    if (ec == http::error::bad_version) {
        // "HTTP/1.1" ended by a bare LF is a malformed line, not another version (RFC 9112
        // section 2.2 lets a server refuse the LF alone).
        const std::string_view line = unparsed.substr(0, unparsed.find('\n'));
        if (line.size() < unparsed.size() &&
            (line.ends_with(" HTTP/1.1") || line.ends_with(" HTTP/1.0"))) {
            co_await reject(400, "malformed request line: lines end with CRLF", 11);
            co_return false;
        }
        co_await reject(505, "HTTP version not supported: this server speaks HTTP/1.0 and 1.1", 11);
        co_return false;
    }
    if (ec && ec != http::error::partial_message &&
        ec.category() == http::make_error_code(http::error::bad_method).category()) {
        co_await reject(400, "malformed HTTP request", 11);
        co_return false;
    }
    if (ec && timed_out_) {
        // Beast parses a request line that came whole before the rest of the header, one that
        // came in pieces only with the whole header.
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
    // Named, not temporaries in the co_await expressions below (GCC 12).
    const std::string_view method = head.method_string();
    const std::string_view target = head.target();
    if (head.version() != 10 && head.version() != 11) {
        co_await reject(505, "HTTP version not supported: this server speaks HTTP/1.0 and 1.1", 11,
                        method, target);
        co_return false;
    }
    if (head.version() == 11 && head.count(http::field::host) != 1) {
        // RFC 9112 section 3.2: an HTTP/1.1 request has exactly one Host.
        co_await reject(400, "an HTTP/1.1 request needs exactly one Host header", 11, method,
                        target);
        co_return false;
    }
    if (head.method() == http::verb::unknown) {
        // A method Beast does not know at all (GET, POST, PUT, PROPFIND, ... it does: those get
        // the handler's 404 or 405).
        co_await reject(501, "method not implemented", head.version(), method, target);
        co_return false;
    }
    if (auto framing = check_transfer_encoding(head); framing.status != 0) {
        // The body's length is unknown or not ours to trust: answer and close, so that no byte
        // of it is read as the next request (RFC 9112 section 6.1 and 6.3).
        co_await reject(framing.status, framing.message, head.version(), method, target);
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
        if (bec == http::error::header_limit) {
            co_await reject(400, "chunk size line or trailer section too long", head.version(),
                            method, target);
            co_return false;
        }
        if (bec == http::error::body_limit) {
            co_await reject(413, "request body too large", head.version(), method, target);
            co_return false;
        }
        if (bec && bec != http::error::partial_message &&
            bec.category() == http::make_error_code(http::error::bad_method).category()) {
            co_await reject(400, "malformed HTTP request body", head.version(), method, target);
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
    auto finished = [&] { return header_only ? parser.is_header_done() : parser.is_done(); };
    const size_t limit = server_.config_.limits.max_header_bytes;
    size_t header_bytes = 0;  // Of the header, consumed by the parser (header_only).
    boost::system::error_code ec;
    for (;;) {
        while (buffer_.size() > 0 && !finished()) {
            // After the header, the parser gets at most max_header_bytes at a time: a chunk-size
            // line or trailer it cannot finish within that many bytes is too long.
            const size_t offered = header_only ? buffer_.size() : std::min(buffer_.size(), limit);
            const size_t used = parser.put(net::buffer(buffer_.data().data(), offered), ec);
            buffer_.consume(used);
            if (header_only) {
                header_bytes += used;
            }
            if (ec == http::error::need_more) {
                ec = {};
                if (used > 0) {
                    continue;  // What it left may go further (a slice ended mid-line).
                }
                if (!header_only && offered == limit) {
                    co_return http::make_error_code(http::error::header_limit);
                }
                break;
            }
            if (ec) {
                co_return ec;
            }
            if (used == 0) {
                break;
            }
        }
        if (finished()) {
            if (header_only && header_bytes > limit) {
                co_return http::make_error_code(http::error::header_limit);
            }
            co_return ec;
        }
        // Beast bounds the fields of a header (not with its request line) and the payload, not a
        // chunk-size line with its extensions or the trailer section: what the parser left
        // unconsumed is one of those, or the header's unfinished part. Each is held to
        // max_header_bytes exactly (the request line and fields together).
        const size_t held = buffer_.size() + header_bytes;
        if (held > limit) {
            co_return http::make_error_code(http::error::header_limit);
        }
        // In the header, reads stop one byte past the bound; after it, the slices above bound a
        // chunk line exactly and body bytes are read in full 16 KiB steps.
        auto more = buffer_.prepare(header_only ? std::min<size_t>(4096, limit + 1 - held)
                                                : size_t{16} * 1024);
        auto [read_ec, n] = co_await stream_.read_some(more);
        if (read_ec == net::error::eof || read_ec == net::ssl::error::stream_truncated) {
            // The client closed mid-message: a partial message, as Beast's readers report it.
            parser.put_eof(ec);
            co_return ec ? ec : http::make_error_code(http::error::partial_message);
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

net::awaitable<bool> HttpSession::serve_response(int version, bool keep_alive,
                                                 Clock::time_point start, std::string_view method,
                                                 std::string_view path) {
    int status = kClientClosedRequest;
    uint64_t body_bytes = 0;
    bool streaming = false;
    bool event_stream = false;       // A text/event-stream head went out.
    Clock::time_point last_write{};  // Of the stream's head or last chunk.
    bool ok = true;
    const auto write_timeout = server_.config_.limits.write_timeout;
    // RFC 9110 section 9.3.2: no content in an answer to HEAD, whatever the handler produced.
    const bool head_only = method == "HEAD";
    for (;;) {
        if (pending_.empty()) {
            if (client_gone_) {
                ok = false;
                break;
            }
            // A write deadline bounds one write, not the wait for the next piece: generation
            // may pause (a preempted request) while the client keeps reading.
            clear_deadline();
            // The watcher reads behind any bytes already buffered (a pipelined request), up to
            // max_header_bytes of them; past that the client is not watched until the next
            // request is parsed.
            if (!watcher_running_ && buffer_.size() < server_.config_.limits.max_header_bytes) {
                start_watcher();
                // The watcher may have finished at once (a client already gone, its EOF already
                // read), and its wake-up then found no wait to cancel: look again before waiting.
                continue;
            }
            const auto keepalive = server_.config_.limits.stream_keepalive;
            if (event_stream && !head_only && keepalive.count() > 0) {
                // A silent event stream gets a comment (HttpLimits::stream_keepalive).
                const Clock::time_point due = last_write + keepalive;
                if (Clock::now() >= due) {
                    pending_.push_back(
                        Piece{Piece::kChunk, {}, ": keepalive\n\n", Piece::Account::kNone});
                    continue;
                }
                co_await wait_signal(due - Clock::now());
                continue;
            }
            co_await wait_signal(std::chrono::hours(24 * 365));
            continue;
        }
        Piece piece = std::move(pending_.front());
        pending_.pop_front();
        keep_alive = keep_alive && !draining();
        if (piece.kind == Piece::kFull && !streaming) {
            status = piece.response.status;
            ok = co_await write_full(piece.response, version, keep_alive, head_only);
            if (ok && !head_only) {
                body_bytes = piece.response.body.size();
            }
            break;
        }
        if (piece.kind == Piece::kHead && !streaming) {
            streaming = true;
            event_stream = piece.response.content_type.starts_with("text/event-stream");
            status = piece.response.status;
            if (version < 11) {
                keep_alive = false;  // The end of the body is the end of the connection.
            }
            write_buffer_.clear();
            format_head(write_buffer_, piece.response, version, keep_alive, std::nullopt);
            set_deadline(write_timeout);
            auto head = net::buffer(write_buffer_);
            boost::system::error_code ec = co_await stream_.write(head);
            if (ec) {
                ok = false;
                break;
            }
            last_write = Clock::now();
            continue;
        }
        if (piece.kind == Piece::kChunk && streaming) {
            // Coalesce whatever else is already queued into one write.
            size_t counted = 0;
            int oversized = 0;
            auto take = [&](const Piece& p) {
                counted += p.account == Piece::Account::kQueued ? p.data.size() : 0;
                oversized += p.account == Piece::Account::kOversized ? 1 : 0;
            };
            take(piece);
            while (!pending_.empty() && pending_.front().kind == Piece::kChunk) {
                take(pending_.front());
                piece.data += pending_.front().data;
                pending_.pop_front();
            }
            // What the channel counted for these chunks is off its backlog once they are
            // written (or dropped).
            auto written = [&] {
                channel_->queued_.fetch_sub(counted, std::memory_order_relaxed);
                if (oversized > 0) {
                    channel_->oversized_queued_.fetch_sub(oversized);
                }
            };
            if (piece.data.empty() || head_only) {
                written();
                continue;
            }
            set_deadline(write_timeout);
            boost::system::error_code ec;
            if (version >= 11) {
                // Size line, data and CRLF in one buffer: one TLS record per write.
                std::string& out = write_buffer_;
                out.clear();
                char size[24];
                auto end = std::to_chars(size, size + sizeof(size), piece.data.size(), 16).ptr;
                out.append(size, end);
                out += "\r\n";
                out += piece.data;
                out += "\r\n";
                auto chunk = net::buffer(out);
                ec = co_await stream_.write(chunk);
                if (out.capacity() > 64 * 1024) {
                    std::string().swap(out);
                }
            } else {
                auto raw = net::buffer(piece.data);
                ec = co_await stream_.write(raw);
            }
            written();
            if (ec) {
                ok = false;
                break;
            }
            last_write = Clock::now();
            body_bytes += piece.data.size();
            continue;
        }
        if (piece.kind == Piece::kEnd && streaming) {
            if (version >= 11 && !head_only) {
                set_deadline(write_timeout);
                static constexpr std::string_view kLast = "0\r\n\r\n";
                auto last = net::buffer(kLast.data(), kLast.size());
                boost::system::error_code ec = co_await stream_.write(last);
                ok = !ec;
            }
            if (version < 11) {
                keep_alive = false;
            }
            break;
        }
        if (piece.kind == Piece::kAbandoned) {
            // The handler let go of the channel with its answer unfinished (a handler bug): a
            // 500 when nothing went out yet; a stream begun is cut (the connection closes, so
            // the client sees it incomplete rather than waiting for the rest forever).
            log::error("handler_abandoned_response",
                       {{"path", path}, {"streaming", streaming}, {"peer", remote_}});
            if (streaming) {
                ok = false;
                break;
            }
            HttpResponse error{500, "text/plain; charset=utf-8", {}, "internal error\n"};
            status = error.status;
            ok = co_await write_full(error, version, keep_alive, head_only);
            if (ok && !head_only) {
                body_bytes = error.body.size();
            }
            break;
        }
        // Out-of-order calls (a chunk before the head, a second respond) are ignored.
    }
    clear_deadline();  // The last write is done; what comes next sets its own.
    if (!ok) {
        // Before the answer counts as done, so the handler hears of it (a failed or timed-out
        // write cancels the generation, as a client that left does).
        mark_client_gone();
        answer_cut_ = true;
    }
    response_done_ = true;
    gone_callback_ = nullptr;
    ResponseRecord record;
    record.method = method;
    record.path = path;
    record.client = remote_;
    record.status = status;
    record.complete = ok;
    record.body_bytes = body_bytes;
    record.duration = Clock::now() - start;
    if (!ok && channel_.use_count() > 1) {
        // The handler still holds the channel (a generation being cancelled): its last notes
        // (tokens, outcome) come after this, so the record goes out when it lets go.
        channel_->defer_record(LateRecord{std::string(method), std::string(path), remote_, record,
                                          std::move(notes_), server_.late_observer_});
        co_return false;
    }
    record.notes = notes_;
    server_.observer_->on_response(record);
    co_return ok && keep_alive;
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
        bool keep_alive = beast_request.keep_alive() && !draining();
        int version = request.version;
        std::string method = request.method;
        std::string path(request.path());

        ++seq_;
        response_done_ = false;
        gone_callback_ = nullptr;
        pending_.clear();
        notes_.clear();
        channel_ = std::make_shared<ChannelImpl>(stream_.get_executor(), weak_from_this(), seq_,
                                                 server_.config_.limits.max_stream_buffer_bytes);
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
                watcher_stopping_ = true;
                boost::system::error_code ignored;
                stream_.socket().cancel(ignored);
            }
            // The watcher read owns the stream; wait for it (next request bytes) or time out.
            co_await wait_signal(server_.config_.limits.idle_timeout);
            if (watcher_running_ || client_gone_ || draining()) {
                break;
            }
        }
    }
    if (!answer_cut_) {
        // Not after a cut answer: an HTTP/1.0 body ends at the close, and close_notify would
        // tell its client that the body it has is whole (tls_stream.h).
        stream_.send_close_notify();
    }
    close_socket();
    stop_watchdog();
}

void start_session(HttpServer::Impl& server, tcp::socket socket) {
    auto session = std::make_shared<HttpSession>(server, std::move(socket), server.tls_.current());
    server.add_session(session);
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
