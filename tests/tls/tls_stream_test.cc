// TlsStream (tls/tls_stream.h) on its own, over real loopback sockets: its Asio stream interface
// under Beast's algorithms, long writes that must wait for the reader, and a pending read ended by
// closing the socket (how the session's watchdog cuts a stalled client).

#include "tls/tls_stream.h"

#include <doctest/doctest.h>

#include <unistd.h>

#include <future>
#include <thread>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
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
