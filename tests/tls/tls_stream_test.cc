// TlsStream (tls/tls_stream.h) on its own, over real loopback sockets: its Asio stream interface
// under Beast's algorithms, long writes that must wait for the reader, and a pending read ended by
// closing the socket (how the session's watchdog cuts a stalled client).

#include "tls/tls_stream.h"

#include <doctest/doctest.h>

#include <openssl/bio.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <thread>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"
#include "tls/tls_context.h"

using namespace edge;
using namespace edge::tls;
namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

namespace {

// One listening socket and the TLS contexts; serve() runs `session` on the first connection on a
// thread of its own io_context and returns what it returned.
struct StreamFixture {
    StreamFixture() {
        cert = testing::make_certificate(dir.path(), "a", {"localhost"});
        auto created = TlsContextStore::create({{{"localhost"}, cert.cert_path, cert.key_path}});
        REQUIRE(created.ok());
        store = std::move(created).value();
        acceptor.open(tcp::v4());
        acceptor.bind(tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
        acceptor.listen();
    }
    uint16_t port() const { return acceptor.local_endpoint().port(); }

    template <typename Session>
    std::future<std::string> serve(Session session) {
        auto done = std::make_shared<std::promise<std::string>>();
        auto result = done->get_future();
        net::co_spawn(
            io,
            [this, session, done]() -> net::awaitable<void> {
                tcp::socket socket = co_await acceptor.async_accept(net::use_awaitable);
                auto generation = store->current();
                TlsStream stream(std::move(socket), generation->native_context(0));
                std::string outcome = co_await session(stream);
                done->set_value(outcome);
            },
            [done](std::exception_ptr e) {
                if (e) {
                    done->set_value("exception");
                }
            });
        thread = std::thread([this] { io.run(); });
        return result;
    }

    ~StreamFixture() {
        if (thread.joinable()) {
            thread.join();
        }
    }

    testing::TempDir dir;
    testing::TestCertificate cert;
    std::unique_ptr<TlsContextStore> store;
    net::io_context io{1};
    tcp::acceptor acceptor{io};
    std::thread thread;
};

// Reads one whole TLS record, undecrypted, from a blocking socket.
std::string read_record(int fd) {
    auto read_exactly = [fd](size_t n) {
        std::string out(n, '\0');
        size_t got = 0;
        while (got < n) {
            const ssize_t r = ::recv(fd, out.data() + got, n - got, 0);
            REQUIRE(r > 0);
            got += static_cast<size_t>(r);
        }
        return out;
    };
    std::string header = read_exactly(5);
    const size_t length = (static_cast<unsigned char>(header[3]) << 8) |
                          static_cast<unsigned char>(header[4]);
    return header + read_exactly(length);
}

}  // namespace

TEST_CASE("TlsStream serves Beast's async_read and async_write (the Asio stream interface)") {
    StreamFixture f;
    const std::string big(300 * 1024, 'x');  // Many TLS records, more than one socket write.
    auto outcome = f.serve([&big](TlsStream& stream) -> net::awaitable<std::string> {
        if (!stream.ok()) {
            co_return "no SSL";
        }
        if (auto ec = co_await stream.handshake({})) {
            co_return "handshake: " + ec.message();
        }
        boost::beast::flat_buffer buffer;
        for (int i = 0; i < 3; ++i) {
            http::request<http::string_body> request;
            auto [rec, rn] = co_await http::async_read(stream, buffer, request,
                                                       net::as_tuple(net::use_awaitable));
            if (rec) {
                co_return "read: " + rec.message();
            }
            http::response<http::string_body> response(http::status::ok, 11);
            response.body() = request.target() == "/big" ? big : request.body();
            response.prepare_payload();
            auto [wec, wn] =
                co_await http::async_write(stream, response, net::as_tuple(net::use_awaitable));
            if (wec) {
                co_return "write: " + wec.message();
            }
        }
        co_return "ok";
    });
    auto client = testing::TlsClient::connect(f.port());
    REQUIRE(client.ok());
    CHECK((*client)->protocol_version() == "TLSv1.3");
    REQUIRE((*client)->send(testing::http_request("POST", "/echo", "hello")).ok());
    auto first = (*client)->read_response();
    REQUIRE(first.ok());
    CHECK(first->status == 200);
    CHECK(first->body == "hello");
    REQUIRE((*client)->send(testing::http_request("GET", "/big")).ok());
    auto second = (*client)->read_response();
    REQUIRE(second.ok());
    CHECK(second->body == big);
    // Head and body in two segments: the read completes only once the body is there.
    std::string request = testing::http_request("POST", "/echo", "split body");
    REQUIRE((*client)->send(request.substr(0, request.size() - 4)).ok());
    REQUIRE((*client)->send(request.substr(request.size() - 4)).ok());
    auto third = (*client)->read_response();
    REQUIRE(third.ok());
    CHECK(third->body == "split body");
    CHECK(outcome.get() == "ok");
}

TEST_CASE("TlsStream writes a body larger than the socket buffers while the client reads") {
    StreamFixture f;
    std::string body(8 * 1024 * 1024, '\0');
    for (size_t i = 0; i < body.size(); ++i) {
        body[i] = static_cast<char>('a' + i % 26);
    }
    auto outcome = f.serve([&body](TlsStream& stream) -> net::awaitable<std::string> {
        if (auto ec = co_await stream.handshake({})) {
            co_return "handshake: " + ec.message();
        }
        char request[4096];
        auto space = net::buffer(request);
        auto [rec, n] = co_await stream.read_some(space);
        if (rec || n == 0) {
            co_return "read: " + rec.message();
        }
        std::string head =
            "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n";
        auto head_buffer = net::buffer(head);
        auto body_buffer = net::buffer(body);
        if (auto ec = co_await stream.write(head_buffer)) {
            co_return "write head: " + ec.message();
        }
        if (auto ec = co_await stream.write(body_buffer)) {
            co_return "write body: " + ec.message();
        }
        co_return "ok";
    });
    auto client = testing::TlsClient::connect(f.port());
    REQUIRE(client.ok());
    REQUIRE((*client)->send(testing::http_request("GET", "/")).ok());
    auto reply = (*client)->read_response();
    REQUIRE(reply.ok());
    CHECK(reply->body.size() == body.size());
    CHECK(reply->body == body);
    CHECK(outcome.get() == "ok");
}

TEST_CASE(
    "closing the socket ends a pending TlsStream read, and later calls fail without touching a "
    "socket") {
    StreamFixture f;
    auto outcome = f.serve([](TlsStream& stream) -> net::awaitable<std::string> {
        if (auto ec = co_await stream.handshake({})) {
            co_return "handshake: " + ec.message();
        }
        // What the session's watchdog does to a stalled client: close the socket under a
        // pending read.
        net::steady_timer closer(stream.get_executor());
        closer.expires_after(std::chrono::milliseconds(0));
        closer.async_wait([&stream](boost::system::error_code) {
            boost::system::error_code ignored;
            stream.socket().close(ignored);
        });
        char data[256];
        auto space = net::buffer(data);
        auto [rec, n] = co_await stream.read_some(space);
        if (!rec) {
            co_return "read succeeded after close";
        }
        // The descriptor number may belong to another connection by now: nothing is sent.
        const char reply[] = "late";
        auto reply_buffer = net::buffer(reply, 4);
        auto wec = co_await stream.write(reply_buffer);
        co_return wec ? "ok" : "write succeeded after close";
    });
    auto client = testing::TlsClient::connect(f.port());
    REQUIRE(client.ok());
    CHECK(outcome.get() == "ok");
    CHECK((*client)->wait_closed());
}

TEST_CASE("TlsStream reports a client that is not TLS as an OpenSSL error") {
    StreamFixture f;
    auto outcome = f.serve([](TlsStream& stream) -> net::awaitable<std::string> {
        auto ec = co_await stream.handshake("GET / HTTP/1.1\r\n\r\n");
        co_return ec.category() == net::error::get_ssl_category() ? "ssl" : ec.message();
    });
    auto fd = testing::tcp_connect(f.port());
    REQUIRE(fd.ok());
    CHECK(outcome.get() == "ssl");
    ::close(*fd);
}

TEST_CASE("TlsStream reports a client that leaves before its ClientHello as end of stream") {
    StreamFixture f;
    auto outcome = f.serve([](TlsStream& stream) -> net::awaitable<std::string> {
        auto ec = co_await stream.handshake({});
        co_return ec == net::error::eof || ec == net::ssl::error::stream_truncated ? "eof"
                                                                                   : ec.message();
    });
    auto fd = testing::tcp_connect(f.port());
    REQUIRE(fd.ok());
    ::close(*fd);
    CHECK(outcome.get() == "eof");
}

TEST_CASE("close_notify waits for room when the send buffer is full rather than dropping it") {
    // A Unix stream socket takes a small send whole or not at all, and counts its buffer per
    // send, so the buffer can be filled exactly: one-byte records until one does not fit, then
    // the client reads one record and the waiting one fits. No record is pending then, and the
    // socket has no room for the alert (a client still reading the end of a long answer).
    StreamFixture f;
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    tcp::socket server_socket(f.io);
    server_socket.assign(tcp::v4(), fds[0]);
    TlsStream stream(std::move(server_socket), f.store->current()->native_context(0));
    REQUIRE(stream.ok());
    SSL_set_num_tickets(stream.native_handle(), 0);  // Only the test's records after the handshake.

    SSL_CTX* client_context = SSL_CTX_new(TLS_client_method());
    REQUIRE(client_context != nullptr);
    SSL* client = SSL_new(client_context);
    REQUIRE(client != nullptr);
    SSL_set_fd(client, fds[1]);
    SSL_set_tlsext_host_name(client, "localhost");
    bool connected = false;
    std::thread handshaker([&] { connected = SSL_connect(client) == 1; });
    bool shook = false;
    net::co_spawn(
        f.io, [&]() -> net::awaitable<void> { shook = !(co_await stream.handshake({})); },
        net::detached);
    f.io.run();
    f.io.restart();
    handshaker.join();
    REQUIRE(shook);
    REQUIRE(connected);

    size_t sent = 0;
    for (;;) {
        auto step = stream.try_write("x", 1);
        REQUIRE_FALSE(step.ec);
        if (step.want == TlsStream::Want::kWrite) {
            break;
        }
        sent += step.bytes;
    }
    REQUIRE(sent > 0);
    std::string raw = read_record(fds[1]);
    auto last = stream.try_write("x", 1);  // The record that waited: it fits now, and fills.
    REQUIRE(last.want == TlsStream::Want::kNone);
    REQUIRE(last.bytes == 1);
    ++sent;

    bool finished = false;
    bool alert_sent = false;
    net::co_spawn(
        f.io,
        [&]() -> net::awaitable<void> {
            alert_sent = co_await stream.close_notify();
            finished = true;
        },
        net::detached);
    f.io.poll();
    CHECK_FALSE(finished);  // No room: it waits instead of dropping the alert.

    // The client reads; once there is room the alert goes out.
    auto read_available = [&] {
        char chunk[65536];
        for (;;) {
            const ssize_t r = ::recv(fds[1], chunk, sizeof chunk, MSG_DONTWAIT);
            if (r <= 0) {
                return;
            }
            raw.append(chunk, static_cast<size_t>(r));
        }
    };
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!finished && std::chrono::steady_clock::now() < give_up) {
        read_available();
        f.io.run_for(std::chrono::milliseconds(10));
    }
    REQUIRE(finished);
    CHECK(alert_sent);
    read_available();

    BIO* received = BIO_new(BIO_s_mem());
    REQUIRE(received != nullptr);
    REQUIRE(BIO_write(received, raw.data(), static_cast<int>(raw.size())) ==
            static_cast<int>(raw.size()));
    SSL_set0_rbio(client, received);
    std::string plain;
    int end = 0;
    for (;;) {
        char chunk[4096];
        const int r = SSL_read(client, chunk, sizeof chunk);
        if (r <= 0) {
            end = SSL_get_error(client, r);
            break;
        }
        plain.append(chunk, static_cast<size_t>(r));
    }
    CHECK(plain == std::string(sent, 'x'));
    CHECK(end == SSL_ERROR_ZERO_RETURN);  // The alert, after every record.
    SSL_free(client);
    SSL_CTX_free(client_context);
    ::close(fds[1]);
}
