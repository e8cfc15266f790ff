#pragma once

// TlsStream is the server side of one TLS connection over a TCP socket, owning its SSL object
// directly (as nginx does) through a small BIO: OpenSSL writes to the socket's descriptor itself
// (non-blocking send) and reads from the stream's input buffer, which the BIO refills with a
// non-blocking recv. Only when the socket has nothing does the stream wait, with one
// socket.async_read_some into that buffer (no epoll_ctl per wait, as a readiness wait would
// cost). Compared with asio::ssl::stream there is no BIO pair, no copy of every record through
// it, and an operation that can complete at once does so without a trip through the io_context's
// queue.
//
// Two interfaces: awaitable members for the HTTP session's hot path (handshake(), read_some(),
// write()), and the Asio AsyncReadStream / AsyncWriteStream members (async_read_some,
// async_write_some) so that Beast's algorithms and net::async_write work on it as well.
//
// Threading: not thread-safe; every call on the connection's executor (strand). At most one read
// and one write may be in progress at once, as for a socket. Closing the socket (socket().close())
// ends a pending operation with an error. Lifetime: the SSL_CTX must outlive the stream (the
// session holds its TlsGeneration); the stream must outlive its pending operations.

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/compose.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/system/error_code.hpp>

struct ssl_st;      // OpenSSL's SSL.
struct ssl_ctx_st;  // OpenSSL's SSL_CTX.

namespace edge::tls {

class TlsStream {
public:
    using executor_type = boost::asio::ip::tcp::socket::executor_type;
    using error_code = boost::system::error_code;

    // What one non-blocking OpenSSL call asks for before it can go on.
    enum class Want { kNone, kRead, kWrite };
    // The outcome of one non-blocking OpenSSL call: `bytes` moved, or `want`, or `ec`.
    struct Step {
        size_t bytes = 0;
        Want want = Want::kNone;
        error_code ec;
    };

    // Takes the connected socket (made non-blocking). `context` is the context the handshake
    // starts with (an SNI callback may switch it). Check ok() before use.
    TlsStream(boost::asio::ip::tcp::socket socket, ssl_ctx_st* context);
    ~TlsStream();
    TlsStream(const TlsStream&) = delete;
    TlsStream& operator=(const TlsStream&) = delete;

    // False when OpenSSL could not make the SSL object (out of memory); nothing else works then.
    bool ok() const { return ssl_ != nullptr; }
    executor_type get_executor() { return socket_.get_executor(); }
    boost::asio::ip::tcp::socket& socket() { return socket_; }
    ssl_st* native_handle() { return ssl_; }

    // The server handshake. `already_read`: bytes the caller read from the socket before (the
    // start of the ClientHello, after any PROXY header); OpenSSL reads them first. Errors as for
    // asio::ssl::stream: net::error::eof, net::ssl::error::stream_truncated, a socket error, or
    // an OpenSSL error in net::error::get_ssl_category().
    boost::asio::awaitable<error_code> handshake(std::string_view already_read);
    // Reads some decrypted bytes into `buffer` (at least one unless buffer is empty). End of
    // stream: net::error::eof after close_notify, net::ssl::error::stream_truncated without.
    boost::asio::awaitable<std::pair<error_code, size_t>> read_some(
        boost::asio::mutable_buffer buffer);
    // Writes all of `buffer`.
    boost::asio::awaitable<error_code> write(boost::asio::const_buffer buffer);

    // Sends close_notify, once, without waiting for the peer's: the client can tell the end of
    // a response read to the close from a cut connection. When the socket's send buffer is full
    // (a client still reading the end of a long answer), waits until it can take the alert; the
    // caller bounds that wait by closing the socket (its deadline), which ends it. Nothing before
    // the handshake finished or after a fatal error. True when the alert went to the socket.
    boost::asio::awaitable<bool> close_notify();

    // One attempt each, never blocking; the building blocks of the members above and below.
    Step try_handshake();
    Step try_read(void* data, size_t size);
    Step try_write(const void* data, size_t size);

    // AsyncReadStream: reads into the first non-empty buffer of `buffers`.
    template <typename MutableBufferSequence, typename Token>
    auto async_read_some(const MutableBufferSequence& buffers, Token&& token) {
        return boost::asio::async_compose<Token, void(error_code, size_t)>(
            IoOp<MutableBufferSequence, true>{*this, buffers, false, false, false, Step{}}, token,
            socket_);
    }
    // AsyncWriteStream: writes from the first non-empty buffer of `buffers`.
    template <typename ConstBufferSequence, typename Token>
    auto async_write_some(const ConstBufferSequence& buffers, Token&& token) {
        return boost::asio::async_compose<Token, void(error_code, size_t)>(
            IoOp<ConstBufferSequence, false>{*this, buffers, false, false, false, Step{}}, token,
            socket_);
    }

private:
    friend struct TlsStreamBio;

    // Waits for what `want` (kRead or kWrite) names: readable bytes go straight into the input
    // buffer; a write waits for the socket to be writable. The awaitable members' one wait.
    boost::asio::awaitable<error_code> wait(Want want);

    // One async_read_some / async_write_some: try, wait for readiness while OpenSSL asks, and
    // complete through the executor when no wait was needed (never inside the initiating call).
    template <typename Buffers, bool kRead>
    struct IoOp {
        TlsStream& stream;
        Buffers buffers;
        bool waited = false;
        bool done = false;
        bool filling = false;
        Step result;

        template <typename Self>
        void operator()(Self& self, error_code ec = {}, size_t filled = 0) {
            if (done) {
                self.complete(result.ec, result.bytes);
                return;
            }
            if (filling) {
                filling = false;
                stream.filling_ = false;
                ec = stream.filled(ec, filled);
            }
            if (ec) {
                self.complete(ec, 0);
                return;
            }
            auto first = first_buffer();
            if (first.size() == 0) {
                result = Step{};
            } else if constexpr (kRead) {
                result = stream.try_read(first.data(), first.size());
            } else {
                result = stream.try_write(first.data(), first.size());
            }
            if (result.want == Want::kRead && stream.filling_) {
                result = Step{0, Want::kNone, boost::asio::error::in_progress};
            } else if (result.want == Want::kRead) {
                waited = true;
                filling = true;
                stream.filling_ = true;
                stream.socket_.async_read_some(stream.fill_buffer(), std::move(self));
                return;
            }
            if (result.want == Want::kWrite) {
                waited = true;
                stream.socket_.async_wait(boost::asio::ip::tcp::socket::wait_write,
                                          std::move(self));
                return;
            }
            if (waited) {
                self.complete(result.ec, result.bytes);
                return;
            }
            done = true;
            boost::asio::post(std::move(self));
        }

        auto first_buffer() const {
            using Buffer = std::conditional_t<kRead, boost::asio::mutable_buffer,
                                              boost::asio::const_buffer>;
            for (auto it = boost::asio::buffer_sequence_begin(buffers);
                 it != boost::asio::buffer_sequence_end(buffers); ++it) {
                Buffer b(*it);
                if (b.size() != 0) {
                    return b;
                }
            }
            return Buffer();
        }
    };

    // Turns a non-positive OpenSSL return into a Step (and empties the error queue).
    Step failed(int ret);
    // The free space of the input buffer, for one socket read (the buffer is empty when OpenSSL
    // asks for more bytes).
    boost::asio::mutable_buffer fill_buffer();
    // Records a socket read into fill_buffer(); the error to report (end of stream mid-TLS is a
    // truncation) or none.
    error_code filled(error_code ec, size_t n);

    boost::asio::ip::tcp::socket socket_;
    ssl_st* ssl_ = nullptr;
    // Socket bytes not yet given to OpenSSL: in_[in_begin_, in_end_).
    std::vector<char> in_;
    size_t in_begin_ = 0;
    size_t in_end_ = 0;
    bool filling_ = false;  // A socket read into in_ is in progress.
    // errno of the BIO's last failed recv or send.
    int last_errno_ = 0;
    bool fatal_ = false;          // OpenSSL reported SSL_ERROR_SSL or SSL_ERROR_SYSCALL.
    bool sent_close_notify_ = false;
};

}  // namespace edge::tls
