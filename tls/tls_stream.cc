#include "tls/tls_stream.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace edge::tls {

namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

constexpr auto kTuple = net::as_tuple(net::use_awaitable);

// OpenSSL's error queue must be empty before a TLS call for SSL_get_error to be right. Clearing it
// unconditionally costs about 800 instructions (every slot is reset); peeking costs a fifth.
void clear_stale_errors() {
    if (ERR_peek_error() != 0) {
        ERR_clear_error();
    }
}

}  // namespace

// The BIO between OpenSSL and the socket. Reads come from the stream's input buffer, refilled
// from the socket when empty (WANT_READ when the socket has nothing either). Reads and writes take
// the socket's descriptor at every call (not a copy taken at the start), so once the session
// closes the socket OpenSSL gets EBADF instead of a descriptor number the kernel may have given
// to another connection.
struct TlsStreamBio {
    static TlsStream* stream(BIO* bio) { return static_cast<TlsStream*>(BIO_get_data(bio)); }

    static int read(BIO* bio, char* out, int size) {
        BIO_clear_retry_flags(bio);
        TlsStream* s = stream(bio);
        if (size <= 0) {
            return 0;
        }
        if (s->in_begin_ == s->in_end_) {
            if (s->filling_) {
                // A socket read into in_ is pending (another operation waits for input): leave
                // the buffer to it.
                BIO_set_retry_read(bio);
                return -1;
            }
            // Try the socket at once: on a busy connection the next request is often there by
            // the time the last response is written, and this read costs no trip through the
            // reactor. Only when it would block does the stream wait (async_read_some).
            s->in_begin_ = 0;
            s->in_end_ = 0;
            const int fd = s->socket_.native_handle();
            if (fd < 0) {
                s->last_errno_ = EBADF;
                return -1;
            }
            ssize_t got;
            do {
                got = ::recv(fd, s->in_.data(), s->in_.size(), 0);
            } while (got < 0 && errno == EINTR);
            if (got == 0) {
                return 0;  // End of stream.
            }
            if (got < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK) {
                    BIO_set_retry_read(bio);
                } else {
                    s->last_errno_ = errno;
                }
                return -1;
            }
            s->in_end_ = static_cast<size_t>(got);
        }
        const size_t n = std::min(static_cast<size_t>(size), s->in_end_ - s->in_begin_);
        std::memcpy(out, s->in_.data() + s->in_begin_, n);
        s->in_begin_ += n;
        return static_cast<int>(n);
    }

    static int write(BIO* bio, const char* data, int size) {
        BIO_clear_retry_flags(bio);
        TlsStream* s = stream(bio);
        const int fd = s->socket_.native_handle();
        if (fd < 0) {
            s->last_errno_ = EBADF;
            return -1;
        }
        for (;;) {
            // MSG_NOSIGNAL: a peer that went away is an EPIPE here, not a SIGPIPE.
            const ssize_t n = ::send(fd, data, static_cast<size_t>(size), MSG_NOSIGNAL);
            if (n >= 0) {
                return static_cast<int>(n);
            }
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                BIO_set_retry_write(bio);
            } else {
                s->last_errno_ = errno;
            }
            return -1;
        }
    }

    static long ctrl(BIO*, int cmd, long, void*) {
        // Writes go straight to the socket: nothing to flush, nothing pending.
        return cmd == BIO_CTRL_FLUSH ? 1 : 0;
    }

    static int create(BIO* bio) {
        BIO_set_init(bio, 1);
        return 1;
    }

    static BIO_METHOD* method() {
        static BIO_METHOD* const kMethod = [] {
            BIO_METHOD* m =
                BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "edge tls socket");
            if (m != nullptr) {
                BIO_meth_set_read(m, &TlsStreamBio::read);
                BIO_meth_set_write(m, &TlsStreamBio::write);
                BIO_meth_set_ctrl(m, &TlsStreamBio::ctrl);
                BIO_meth_set_create(m, &TlsStreamBio::create);
            }
            return m;
        }();
        return kMethod;
    }
};

// Room for one whole TLS record (16 KiB of plaintext plus the largest expansion).
constexpr size_t kInputBytes = 17 * 1024;

TlsStream::TlsStream(tcp::socket socket, SSL_CTX* context)
    : socket_(std::move(socket)), in_(kInputBytes) {
    boost::system::error_code ignored;
    socket_.non_blocking(true, ignored);
    BIO_METHOD* method = TlsStreamBio::method();
    if (method == nullptr) {
        return;
    }
    ssl_ = SSL_new(context);
    if (ssl_ == nullptr) {
        return;
    }
    BIO* bio = BIO_new(method);
    if (bio == nullptr) {
        SSL_free(ssl_);
        ssl_ = nullptr;
        return;
    }
    BIO_set_data(bio, this);
    SSL_set_bio(ssl_, bio, bio);  // The SSL owns the BIO.
    // A write that had to wait may be retried from a buffer at another address (the session's
    // buffer can move between tries), and returns after each record so a long body is not held
    // back until all of it is encrypted.
    SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_set_accept_state(ssl_);
}

TlsStream::~TlsStream() {
    if (ssl_ != nullptr) {
        SSL_free(ssl_);
    }
}

TlsStream::Step TlsStream::failed(int ret) {
    const int error = SSL_get_error(ssl_, ret);
    Step step;
    switch (error) {
        case SSL_ERROR_WANT_READ:
            step.want = Want::kRead;
            return step;
        case SSL_ERROR_WANT_WRITE:
            step.want = Want::kWrite;
            return step;
        case SSL_ERROR_ZERO_RETURN:
            step.ec = net::error::eof;
            break;
        case SSL_ERROR_SYSCALL:
            fatal_ = true;
            step.ec = last_errno_ != 0
                          ? error_code(last_errno_, net::error::get_system_category())
                          : error_code(net::ssl::error::stream_truncated);
            break;
        case SSL_ERROR_SSL: {
            fatal_ = true;
            const unsigned long e = ERR_get_error();
            if (ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
                step.ec = net::ssl::error::stream_truncated;
            } else {
                step.ec = error_code(static_cast<int>(e), net::error::get_ssl_category());
            }
            break;
        }
        default:
            step.ec = net::error::fault;
            break;
    }
    last_errno_ = 0;
    ERR_clear_error();
    return step;
}

net::awaitable<bool> TlsStream::close_notify() {
    // SSL_shutdown must not follow a fatal error (OpenSSL's SSL_shutdown(3)).
    if (ssl_ == nullptr || sent_close_notify_ || fatal_ || SSL_is_init_finished(ssl_) != 1) {
        co_return false;
    }
    sent_close_notify_ = true;
    for (;;) {
        clear_stale_errors();
        // 0: the alert is sent (the peer's is not awaited). -1 with WANT_WRITE: the socket took
        // none of it; OpenSSL keeps it and the next call sends it (SSL_shutdown(3)).
        const int ret = SSL_shutdown(ssl_);
        if (ret >= 0) {
            co_return true;
        }
        const Step step = failed(ret);
        if (step.want != Want::kWrite) {
            co_return false;
        }
        if (error_code ec = co_await wait(Want::kWrite); ec) {
            co_return false;
        }
    }
}

TlsStream::Step TlsStream::try_handshake() {
    clear_stale_errors();
    const int ret = SSL_do_handshake(ssl_);
    if (ret == 1) {
        return Step{};
    }
    return failed(ret);
}

TlsStream::Step TlsStream::try_read(void* data, size_t size) {
    clear_stale_errors();
    size_t n = 0;
    const int ret = SSL_read_ex(ssl_, data, size, &n);
    if (ret == 1) {
        return Step{n, Want::kNone, {}};
    }
    return failed(ret);
}

TlsStream::Step TlsStream::try_write(const void* data, size_t size) {
    clear_stale_errors();
    size_t n = 0;
    const int ret = SSL_write_ex(ssl_, data, size, &n);
    if (ret == 1) {
        return Step{n, Want::kNone, {}};
    }
    return failed(ret);
}

net::mutable_buffer TlsStream::fill_buffer() {
    if (in_begin_ == in_end_) {
        in_begin_ = 0;
        in_end_ = 0;
    }
    return net::buffer(in_.data() + in_end_, in_.size() - in_end_);
}

TlsStream::error_code TlsStream::filled(error_code ec, size_t n) {
    in_end_ += n;
    if (ec == net::error::eof && SSL_is_init_finished(ssl_) == 1) {
        // The peer closed without close_notify: as asio::ssl::stream reports it.
        return net::ssl::error::stream_truncated;
    }
    return ec;
}

net::awaitable<TlsStream::error_code> TlsStream::handshake(std::string_view already_read) {
    if (already_read.size() > in_.size()) {
        in_.resize(already_read.size());
    }
    if (!already_read.empty()) {
        std::memcpy(in_.data(), already_read.data(), already_read.size());
    }
    in_begin_ = 0;
    in_end_ = already_read.size();
    for (;;) {
        Step step = try_handshake();
        if (step.want == Want::kNone) {
            co_return step.ec;
        }
        if (in_.size() > kInputBytes && in_begin_ == in_end_) {
            in_.resize(kInputBytes);
            in_.shrink_to_fit();
        }
        if (error_code wait_ec = co_await wait(step.want); wait_ec) {
            co_return wait_ec;
        }
    }
}

net::awaitable<TlsStream::error_code> TlsStream::wait(Want want) {
    if (want == Want::kWrite) {
        auto [ec] = co_await socket_.async_wait(tcp::socket::wait_write, kTuple);
        co_return ec;
    }
    if (filling_) {
        // A write that needs input (never on a TLS 1.2 connection without renegotiation, nor on
        // TLS 1.3) while a read waits for it: refuse rather than read into the same buffer twice.
        co_return net::error::in_progress;
    }
    filling_ = true;
    auto space = fill_buffer();  // Named: see the note on temporaries in co_await.
    auto [ec, n] = co_await socket_.async_read_some(space, kTuple);
    filling_ = false;
    co_return filled(ec, n);
}

net::awaitable<std::pair<TlsStream::error_code, size_t>> TlsStream::read_some(
    net::mutable_buffer buffer) {
    if (buffer.size() == 0) {
        co_return std::pair<error_code, size_t>{};
    }
    for (;;) {
        Step step = try_read(buffer.data(), buffer.size());
        if (step.want == Want::kNone) {
            co_return std::pair{step.ec, step.bytes};
        }
        if (error_code wait_ec = co_await wait(step.want); wait_ec) {
            co_return std::pair{wait_ec, size_t{0}};
        }
    }
}

net::awaitable<TlsStream::error_code> TlsStream::write(net::const_buffer buffer) {
    const char* data = static_cast<const char*>(buffer.data());
    size_t left = buffer.size();
    while (left > 0) {
        Step step = try_write(data, left);
        if (step.ec) {
            co_return step.ec;
        }
        if (step.want == Want::kNone) {
            data += step.bytes;
            left -= step.bytes;
            continue;
        }
        if (error_code wait_ec = co_await wait(step.want); wait_ec) {
            co_return wait_ec;
        }
    }
    co_return error_code{};
}

}  // namespace edge::tls
