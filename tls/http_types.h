#pragma once

// The HTTP request/response vocabulary shared by the TLS server (tls/http_server.h) and the
// handlers that the daemon plugs into it, free of Beast types so that handlers compile quickly.
// ResponseChannel is how a handler answers: one full response, or a streamed one (head, chunks,
// end). Plain values; ResponseChannel's contract is on the class.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace edge::tls {

struct HttpHeader {
    std::string name;  // As received (compare case-insensitively).
    std::string value;
};

// A field a handler adds to the record of its request (ResponseChannel::note).
struct ResponseNote {
    std::string name;
    std::variant<std::string, int64_t> value;
};

struct HttpRequest {
    std::string method;  // "GET", "POST", ...
    std::string target;  // Path and query as received.
    int version = 11;    // 10 or 11.
    std::vector<HttpHeader> headers;
    std::string body;
    std::string remote_address;  // The client: from the PROXY header when one was accepted.
    std::string server_name;     // SNI name the client asked for ("" when none).
    // Common name of the client certificate verified by mutual TLS ("" when the listener asks
    // for none).
    std::string peer_identity;
    // The DNS subjectAltNames of that certificate (empty when there is none).
    std::vector<std::string> peer_names;

    // The first header named `name` (ASCII case-insensitive), or "" when absent.
    std::string_view header(std::string_view name) const;
    // How many headers are named `name` (ASCII case-insensitive).
    size_t header_count(std::string_view name) const;
    // The target without its query string.
    std::string_view path() const;
};

struct HttpResponse {
    int status = 200;
    std::string content_type = "application/json";
    std::vector<HttpHeader> headers;  // Extra headers (Retry-After, Allow, ...).
    std::string body;
};

// A handler's way to answer one request. Thread-safe: every call may come from any thread (an
// engine thread, typically); calls are applied in order on the connection's strand. Exactly one
// of respond() or begin_stream() ... end_stream() must happen; later calls are ignored. Calls after
// the client went away are ignored (cheaply).
class ResponseChannel {
public:
    virtual ~ResponseChannel() = default;
    virtual void respond(HttpResponse response) = 0;
    // Starts a chunked (or, for HTTP/1.0, close-delimited) response: `response.body` is ignored.
    virtual void begin_stream(HttpResponse head) = 0;
    virtual void write(std::string chunk) = 0;
    virtual void end_stream() = 0;
    // `callback` runs once, on the connection's strand, if the client disconnects or the
    // connection is closed before the response was fully written. Set it before answering.
    virtual void on_client_gone(std::function<void()> callback) = 0;
    // Adds `name`=`value` to this request's record (ResponseRecord::notes, the access log): the
    // tenant, the model, where it was served. Notes made before the answer's last piece are in
    // the record; later ones may be missing, except when the answer ended incomplete (the client
    // left) while the handler held the channel: that record waits for every note made until the
    // channel is released.
    virtual void note(std::string name, std::variant<std::string, int64_t> value) = 0;
};

class HttpHandler {
public:
    virtual ~HttpHandler() = default;
    // Called on the connection's strand; must not block. May answer inline or later.
    virtual void handle(HttpRequest request, std::shared_ptr<ResponseChannel> channel) = 0;
};

// One request's answer, as the connection saw it: for metrics and the access log.
struct ResponseRecord {
    // For an answer the server makes itself (400 malformed, 408, 413, 414, 431, 501, 505): the
    // request line's when it was read, else "".
    std::string_view method;
    std::string_view path;
    std::string_view client;  // HttpRequest::remote_address.
    // The status sent; kClientClosedRequest when the client left before any answer began.
    int status = 0;
    // Every byte of the answer was written (false: the client left, a write failed or timed out,
    // or a stream was cut).
    bool complete = false;
    uint64_t body_bytes = 0;               // Body bytes written (chunk framing not counted).
    // To the answer's end: from the request's last byte read, or, for an answer the server makes
    // itself, from the start of the request's read (its first byte; a new connection's first
    // wait), so a 408 shows how long it held the connection.
    std::chrono::nanoseconds duration{};
    std::span<const ResponseNote> notes;  // The handler's ResponseChannel::note calls, in order.
};

// The status recorded (never sent) for a request whose client went away before an answer began,
// as nginx logs it.
inline constexpr int kClientClosedRequest = 499;

// Hooks for metrics. Called on connection strands (any I/O thread), except a deferred
// on_response (below), which runs on the thread that releases the channel; implementations are
// thread-safe.
class ServerObserver {
public:
    virtual ~ServerObserver() = default;
    virtual void on_connection_opened() {}
    virtual void on_connection_closed() {}
    // reason: "limit" (max_connections), "proxy_untrusted", "proxy_malformed", "draining".
    virtual void on_connection_rejected(std::string_view reason) {}
    // failure_reason: "" on success, else "timeout", "eof", "not_tls", "version",
    // "no_shared_cipher", "certificate_rejected" (the client refused the server's),
    // "client_certificate" (a listener that asks for one got none, or one it does not trust:
    // from another CA, expired), "other".
    virtual void on_handshake(bool resumed, std::string_view failure_reason) {}
    // After the answer's last byte was written, or writing it failed, or the client left; an
    // incomplete answer whose channel the handler still holds (a generation being cancelled) is
    // reported when the handler releases it, from the thread that does.
    virtual void on_response(const ResponseRecord& record) {}
    // A streamed response the server cut before its end. reason: "slow_reader" (more than
    // HttpLimits::max_stream_buffer_bytes queued for a client that does not read).
    virtual void on_stream_cancelled(std::string_view reason) {}
};

// Standard reason phrase, for the status line of streamed heads and logs.
std::string_view reason_phrase(int status);

// `s` with each %XX escape (RFC 3986) replaced by its byte; a '%' not followed by two hex digits
// stays as it is. `plus_is_space`: a '+' is a space too (form-encoded query strings).
std::string percent_decode(std::string_view s, bool plus_is_space = false);

}  // namespace edge::tls
