#pragma once

// HttpServer is the public HTTPS listener: TCP accept, optional PROXY protocol header from trusted
// load balancers, TLS handshake (tls/tls_context.h picks the chain by SNI), then HTTP/1.1 with
// keep-alive, each request handed to an HttpHandler. Every step has a timeout; header and body
// sizes and the connection count are bounded, so a slow or hostile client costs one socket.
//
// Threading: runs on the io_context it is given (any number of threads; each connection lives on
// its own strand). start() and port() from any thread; stop() blocks and must be called from a
// thread that is not running the io_context. Lifetime: the io_context, the TlsContextStore, the
// handler and the observer must outlive the server; the io_context must keep running until stop()
// returns.

#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"
#include "tls/cidr.h"
#include "tls/http_types.h"
#include "tls/tls_context.h"

namespace boost::asio {
class io_context;
}

namespace edge::tls {

struct HttpLimits {
    std::chrono::milliseconds handshake_timeout{10'000};  // PROXY header + TLS handshake.
    std::chrono::milliseconds header_timeout{10'000};     // From first byte to end of headers.
    std::chrono::milliseconds body_timeout{30'000};       // Longest silence in a request body.
    // The whole request, first byte to the body's end: an upload that keeps sending a byte at a
    // time, never silent for body_timeout, is still cut here (408). 0: no bound.
    std::chrono::milliseconds request_read_timeout{300'000};
    std::chrono::milliseconds idle_timeout{60'000};       // Keep-alive wait for the next request.
    std::chrono::milliseconds write_timeout{30'000};      // One write to a stalled reader.
    size_t max_header_bytes = 16 * 1024;                  // Request line + headers, bytes.
    size_t max_body_bytes = 4 * 1024 * 1024;              // Request body, bytes.
    size_t max_connections = 10'000;                      // Open connections at most.
    // Bytes of a streamed response queued for a client and not yet written (the socket's own
    // buffers aside); a stream that would queue more is cancelled: its reader is too slow.
    size_t max_stream_buffer_bytes = 1024 * 1024;
    // An event stream (text/event-stream) silent this long gets an SSE comment (": keepalive"),
    // which clients ignore: a request waiting in the engine's queue or in a long prefill is not
    // cut by an idle timeout between here and the client (a load balancer's, or a forwarding
    // site's peer.stream_idle_timeout). 0: none.
    std::chrono::milliseconds stream_keepalive{15'000};
};

struct HttpServerConfig {
    std::string address = "0.0.0.0";  // Listen address (IPv4 or IPv6 literal).
    uint16_t port = 8443;              // 0 picks a free port (see port()).
    HttpLimits limits;
    CidrSet proxy_trusted;  // Peers allowed to send a PROXY header; anyone else sending one is cut.
    // Threads that run the io_context. With 1, connections run on the io_context's executor
    // directly (no strand overhead); with more, each connection gets its own strand.
    int io_threads = 1;
    // An already bound and listening TCP socket to take over (systemd socket activation); -1:
    // bind `address`:`port` instead. The server owns the descriptor from create() on (closes it
    // on stop); other processes may hold copies, so the socket keeps listening across restarts.
    int listen_fd = -1;
};

// Whether `fd` is a TCP socket (IPv4 or IPv6) that listens: what HttpServerConfig::listen_fd must
// be. The error names the descriptor.
Status check_listening_socket(int fd);

class HttpServer {
public:
    static Result<std::unique_ptr<HttpServer>> create(boost::asio::io_context& io,
                                                      HttpServerConfig config,
                                                      TlsContextStore& tls, HttpHandler& handler,
                                                      ServerObserver* observer);
    ~HttpServer();

    // The bound port (the real one when configured as 0).
    uint16_t port() const;
    void start();
    // Stops accepting (new connections are refused), closes idle keep-alive connections (as
    // every connection the server ends: close_notify, then a linger of a second at most), lets
    // requests in flight finish (their responses carry Connection: close) until `deadline`
    // elapses, then closes what is left. With `at_deadline`, what is left is first given the
    // chance to end its answers: it is called (the owner ends the requests, e.g. with an error
    // event), and the connections get kCutGrace to write that before they are closed. A
    // connection whose request has ended and that only lingers is no request to cut: when only
    // such are left at the deadline, they get the rest of their linger (a second at most) and
    // `at_deadline` is not called. Returns when every connection is gone.
    void stop(std::chrono::milliseconds deadline, std::function<void()> at_deadline = {});
    static constexpr std::chrono::milliseconds kCutGrace{1000};
    size_t open_connections() const;
    // Replaces the limits (config reload), from any thread. A connection keeps the limits it was
    // accepted with for its whole life; those accepted from now on get `limits`, and the
    // connection count is checked against the new max_connections at once.
    void set_limits(const HttpLimits& limits);

    class Impl;

private:
    explicit HttpServer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace edge::tls
