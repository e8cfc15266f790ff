#include "tests/testing/tls_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/x509.h>

#include <cerrno>
#include <csignal>
#include <cstring>

namespace edge::testing {
namespace {

// SSL_get_error results that a blocking socket gives for a timed-out or interrupted syscall.
bool retryable(int ssl_error) {
    return ssl_error == SSL_ERROR_WANT_READ || ssl_error == SSL_ERROR_WANT_WRITE ||
           ssl_error == SSL_ERROR_SYSCALL;
}

}  // namespace

Result<int> tcp_socket(int receive_buffer_bytes) {
    // Writes to a socket the server closed must fail, not kill the test.
    static const bool ignore_sigpipe = [] {
        signal(SIGPIPE, SIG_IGN);
        return true;
    }();
    (void)ignore_sigpipe;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return unavailable_error(std::string("socket: ") + std::strerror(errno));
    }
    if (receive_buffer_bytes > 0) {
        // Before connect: the window is small from the handshake on (set later, the kernel
        // shrinks a window it already advertised, which a long read may see as a reset).
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer_bytes, sizeof(receive_buffer_bytes));
    }
    return fd;
}

Result<int> tcp_connect_socket(int fd, uint16_t port, int timeout_ms) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        int err = errno;
        ::close(fd);
        return unavailable_error(std::string("connect: ") + std::strerror(err));
    }
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

Result<int> tcp_connect(uint16_t port, int timeout_ms, int receive_buffer_bytes) {
    EDGE_ASSIGN_OR_RETURN(int fd, tcp_socket(receive_buffer_bytes));
    return tcp_connect_socket(fd, port, timeout_ms);
}

bool accepts_connections(uint16_t port) {
    Result<int> fd = tcp_connect(port);
    if (!fd.ok()) {
        return false;
    }
    ::close(*fd);
    return true;
}

Result<std::unique_ptr<TlsClient>> TlsClient::connect(uint16_t port, TlsClientOptions options) {
    EDGE_ASSIGN_OR_RETURN(int fd,
                          tcp_connect(port, options.timeout_ms, options.receive_buffer_bytes));
    std::unique_ptr<TlsClient> c(new TlsClient());
    c->fd_ = fd;
    if (!options.before_handshake.empty()) {
        if (::send(fd, options.before_handshake.data(), options.before_handshake.size(),
                   MSG_NOSIGNAL) < 0) {
            return unavailable_error("send before handshake failed");
        }
    }
    c->ctx_ = SSL_CTX_new(TLS_client_method());
    if (options.min_version) {
        SSL_CTX_set_min_proto_version(c->ctx_, options.min_version);
    }
    if (options.max_version) {
        SSL_CTX_set_max_proto_version(c->ctx_, options.max_version);
    }
    SSL_CTX_set_session_cache_mode(c->ctx_, SSL_SESS_CACHE_CLIENT);
    if (!options.client_cert_path.empty()) {
        if (SSL_CTX_use_certificate_chain_file(c->ctx_, options.client_cert_path.c_str()) != 1 ||
            SSL_CTX_use_PrivateKey_file(c->ctx_, options.client_key_path.c_str(),
                                        SSL_FILETYPE_PEM) != 1) {
            return invalid_argument_error("cannot load client certificate " +
                                          options.client_cert_path);
        }
    }
    static const unsigned char kAlpn[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
    SSL_CTX_set_alpn_protos(c->ctx_, kAlpn, sizeof(kAlpn));
    c->ssl_ = SSL_new(c->ctx_);
    SSL_set_fd(c->ssl_, fd);
    if (!options.server_name.empty()) {
        SSL_set_tlsext_host_name(c->ssl_, options.server_name.c_str());
    }
    if (options.resume) {
        SSL_set_session(c->ssl_, options.resume);
    }
    ERR_clear_error();
    if (SSL_connect(c->ssl_) != 1) {
        char buf[256];
        ERR_error_string_n(ERR_get_error(), buf, sizeof(buf));
        return unavailable_error(std::string("TLS handshake failed: ") + buf);
    }
    return c;
}

TlsClient::~TlsClient() { close(); }

void TlsClient::send_close_notify() {
    if (ssl_) {
        (void)SSL_shutdown(ssl_);  // 0: sent, the peer's not yet seen; either way done here.
    }
}

void TlsClient::close() {
    if (ssl_) {
        SSL_free(ssl_);
        ssl_ = nullptr;
    }
    if (ctx_) {
        SSL_CTX_free(ctx_);
        ctx_ = nullptr;
    }
    if (fd_ >= 0) {
        ::close(fd_);
        fd_ = -1;
    }
}

Status TlsClient::send(std::string_view bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
        ERR_clear_error();
        errno = 0;
        int n = SSL_write(ssl_, bytes.data() + off, static_cast<int>(bytes.size() - off));
        if (n <= 0) {
            const int err = SSL_get_error(ssl_, n);
            const int sys = errno;
            if (retryable(err) && sys == EINTR) {
                continue;  // A signal interrupted the write: nothing was lost.
            }
            if (retryable(err) && (sys == EAGAIN || sys == EWOULDBLOCK)) {
                return deadline_exceeded_error("write timed out");
            }
            return unavailable_error("SSL_write failed");
        }
        off += static_cast<size_t>(n);
    }
    return ok_status();
}

Result<size_t> TlsClient::fill() {
    char buf[16384];
    for (;;) {
        ERR_clear_error();
        errno = 0;
        int n = SSL_read(ssl_, buf, sizeof(buf));
        if (n > 0) {
            buffer_.append(buf, static_cast<size_t>(n));
            return static_cast<size_t>(n);
        }
        const int err = SSL_get_error(ssl_, n);
        const int sys = errno;
        if (err == SSL_ERROR_ZERO_RETURN) {
            return size_t{0};
        }
        // On this blocking socket OpenSSL reports the SO_RCVTIMEO timeout (EAGAIN) as WANT_READ
        // (or SYSCALL), and a read interrupted by a signal the same way with EINTR: neither is the
        // server closing the connection.
        if (retryable(err) && sys == EINTR) {
            continue;
        }
        if (retryable(err) && (sys == EAGAIN || sys == EWOULDBLOCK)) {
            return deadline_exceeded_error("read timed out");
        }
        return size_t{0};  // EOF, reset or truncation: closed.
    }
}

Result<HttpReply> TlsClient::read_response() {
    size_t head_end;
    while ((head_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
        EDGE_ASSIGN_OR_RETURN(size_t n, fill());
        if (n == 0) {
            return unavailable_error("connection closed before the response head");
        }
    }
    HttpReply reply;
    std::string head = buffer_.substr(0, head_end);
    buffer_.erase(0, head_end + 4);
    size_t line_end = head.find("\r\n");
    std::string status_line = head.substr(0, line_end);
    if (status_line.size() < 12) {
        return invalid_argument_error("bad status line: " + status_line);
    }
    reply.status = std::atoi(status_line.c_str() + 9);
    size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
    while (pos < head.size()) {
        size_t end = head.find("\r\n", pos);
        if (end == std::string::npos) {
            end = head.size();
        }
        std::string line = head.substr(pos, end - pos);
        size_t colon = line.find(':');
        if (colon != std::string::npos) {
            std::string name = line.substr(0, colon);
            for (char& ch : name) {
                ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
            }
            std::string value = line.substr(colon + 1);
            while (!value.empty() && value.front() == ' ') {
                value.erase(0, 1);
            }
            reply.headers[name] = value;
        }
        pos = end + 2;
    }
    if (reply.status == 100) {
        return read_response();
    }
    if (reply.headers.count("content-length")) {
        size_t len = std::stoul(reply.headers["content-length"]);
        while (buffer_.size() < len) {
            EDGE_ASSIGN_OR_RETURN(size_t n, fill());
            if (n == 0) {
                return unavailable_error("connection closed inside the body");
            }
        }
        reply.body = buffer_.substr(0, len);
        buffer_.erase(0, len);
    } else if (reply.headers["transfer-encoding"] == "chunked") {
        for (;;) {
            size_t crlf;
            while ((crlf = buffer_.find("\r\n")) == std::string::npos) {
                EDGE_ASSIGN_OR_RETURN(size_t n, fill());
                if (n == 0) {
                    return unavailable_error("connection closed inside a chunk");
                }
            }
            size_t size = std::stoul(buffer_.substr(0, crlf), nullptr, 16);
            while (buffer_.size() < crlf + 2 + size + 2) {
                EDGE_ASSIGN_OR_RETURN(size_t n, fill());
                if (n == 0) {
                    return unavailable_error("connection closed inside a chunk");
                }
            }
            reply.body += buffer_.substr(crlf + 2, size);
            buffer_.erase(0, crlf + 2 + size + 2);
            if (size == 0) {
                break;
            }
        }
    } else {
        for (;;) {
            EDGE_ASSIGN_OR_RETURN(size_t n, fill());
            if (n == 0) {
                break;
            }
        }
        reply.body = std::move(buffer_);
        buffer_.clear();
    }
    return reply;
}

Result<std::string> TlsClient::read_until(std::string_view needle) {
    while (buffer_.find(needle) == std::string::npos) {
        EDGE_ASSIGN_OR_RETURN(size_t n, fill());
        if (n == 0) {
            return unavailable_error("closed before '" + std::string(needle) + "'");
        }
    }
    size_t end = buffer_.find(needle) + needle.size();
    std::string out = buffer_.substr(0, end);
    buffer_.erase(0, end);
    return out;
}

bool TlsClient::wait_closed() {
    for (int i = 0; i < 100; ++i) {
        Result<size_t> n = fill();
        if (!n.ok()) {
            return false;  // Timed out: still open.
        }
        if (*n == 0) {
            return true;
        }
    }
    return false;
}

bool TlsClient::got_close_notify() const {
    return (SSL_get_shutdown(ssl_) & SSL_RECEIVED_SHUTDOWN) != 0;
}

std::string TlsClient::peer_common_name() const {
    X509* cert = SSL_get1_peer_certificate(ssl_);
    if (!cert) {
        return "";
    }
    char cn[256] = {};
    X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn));
    X509_free(cert);
    return cn;
}

bool TlsClient::session_reused() const { return SSL_session_reused(ssl_) == 1; }

std::string TlsClient::protocol_version() const { return SSL_get_version(ssl_); }

std::string TlsClient::alpn() const {
    const unsigned char* data = nullptr;
    unsigned int len = 0;
    SSL_get0_alpn_selected(ssl_, &data, &len);
    return std::string(reinterpret_cast<const char*>(data), len);
}

SSL_SESSION* TlsClient::take_session() const { return SSL_get1_session(ssl_); }

Result<HttpReply> plain_http_get(uint16_t port, std::string_view path) {
    EDGE_ASSIGN_OR_RETURN(int fd, tcp_connect(port));
    std::string req = "GET " + std::string(path) + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) < 0) {
        ::close(fd);
        return unavailable_error("send failed");
    }
    std::string all;
    char buf[16384];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) {
        all.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    size_t head_end = all.find("\r\n\r\n");
    if (all.size() < 12 || head_end == std::string::npos) {
        return unavailable_error("no HTTP response");
    }
    HttpReply reply;
    reply.status = std::atoi(all.c_str() + 9);
    reply.body = all.substr(head_end + 4);
    return reply;
}

std::string http_request(std::string_view method, std::string_view path, std::string_view body,
                         std::string_view extra_headers) {
    std::string r;
    r += method;
    r += " ";
    r += path;
    r += " HTTP/1.1\r\nHost: localhost\r\n";
    if (!body.empty() || method == "POST") {
        r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\n";
    }
    r += extra_headers;
    r += "\r\n";
    r += body;
    return r;
}

}  // namespace edge::testing
