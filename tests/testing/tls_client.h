#pragma once

// A blocking TLS client for tests, on raw sockets and OpenSSL (no Asio), so tests can also send
// bytes before the handshake (PROXY headers, garbage), pin TLS versions, offer a session for
// resumption, and read HTTP responses including chunked ones. Every read has a timeout.
// Not thread-safe: one client per thread.

#include <openssl/ssl.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/result.h"

namespace edge::testing {

struct TlsClientOptions {
    std::string server_name = "localhost";  // SNI ("" sends none).
    int min_version = 0;                    // e.g. TLS1_2_VERSION; 0: library default.
    int max_version = 0;
    std::string before_handshake;  // Raw bytes sent first (a PROXY header).
    SSL_SESSION* resume = nullptr;  // Offered for resumption (not owned).
    int timeout_ms = 5000;
    int receive_buffer_bytes = 0;  // SO_RCVBUF before connect; 0: the kernel's default.
    std::string client_cert_path;  // PEM client certificate for mutual TLS ("" sends none).
    std::string client_key_path;   // Its key.
};

struct HttpReply {
    int status = 0;
    std::map<std::string, std::string> headers;  // Lower-case names.
    std::string body;                             // De-chunked.
};

// Connects a plain TCP socket to 127.0.0.1:port; the fd is the caller's.
Result<int> tcp_connect(uint16_t port, int timeout_ms = 5000, int receive_buffer_bytes = 0);
// Whether a TCP connection to 127.0.0.1:port is accepted now; the connection is closed again.
bool accepts_connections(uint16_t port);

// The two halves of tcp_connect, for a test that must hold the socket before it connects (one
// that takes every other descriptor in between): an unconnected TCP socket, and its connect.
// tcp_connect_socket closes `fd` when the connect fails.
Result<int> tcp_socket(int receive_buffer_bytes = 0);
Result<int> tcp_connect_socket(int fd, uint16_t port, int timeout_ms = 5000);

class TlsClient {
public:
    static Result<std::unique_ptr<TlsClient>> connect(uint16_t port, TlsClientOptions options = {});
    ~TlsClient();

    Status send(std::string_view bytes);
    // Reads one HTTP/1.1 response (Content-Length, chunked, or until close).
    Result<HttpReply> read_response();
    // Reads until `needle` appears in what was received since the last call (or timeout/EOF).
    Result<std::string> read_until(std::string_view needle);
    // True when the server closed the connection (read returns EOF or an error within timeout).
    bool wait_closed();
    // The server ended the TLS session with close_notify (seen by a read that returned EOF).
    bool got_close_notify() const;
    // Sends close_notify (this side is done sending) and keeps the connection to read on.
    void send_close_notify();
    void close();

    std::string peer_common_name() const;
    bool session_reused() const;
    std::string protocol_version() const;  // "TLSv1.3", ...
    std::string alpn() const;
    // A new reference the caller frees with SSL_SESSION_free.
    SSL_SESSION* take_session() const;
    int fd() const { return fd_; }

private:
    TlsClient() = default;
    Result<size_t> fill();  // Appends to buffer_; 0 on EOF.

    int fd_ = -1;
    SSL_CTX* ctx_ = nullptr;
    SSL* ssl_ = nullptr;
    std::string buffer_;
};

// Plain-HTTP GET (HTTP/1.0, read to close) against 127.0.0.1:port, for the admin listener.
Result<HttpReply> plain_http_get(uint16_t port, std::string_view path);

// "METHOD PATH HTTP/1.1" with Host, Content-Length (when body), extra header lines.
std::string http_request(std::string_view method, std::string_view path, std::string_view body = {},
                         std::string_view extra_headers = {});

}  // namespace edge::testing
