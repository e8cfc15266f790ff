// How the HTTPS server ends a connection, over real loopback sockets: every close it chooses
// (Connection: close, HTTP/1.0, the drain, an answer it makes itself) lets the client read the
// whole answer and an orderly end (close_notify, then FIN) even with bytes the client pipelined
// behind it that the server never reads (RFC 9112 section 9.6); and the request forms the server
// refuses itself (asterisk-form other than OPTIONS, CONNECT).

#include <doctest/doctest.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "tests/testing/tls_client.h"
#include "tests/tls/https_fixture.h"
#include "tls/http_server.h"

using namespace edge;
using namespace edge::tls;
using namespace edge::tls::test;

namespace {

// Parsed headers at most this large, so the server reads little of what a client pipelines
// behind a request (its watcher stops there): the rest stays unread in the kernel.
constexpr size_t kHeaderLimit = 4096;

HttpLimits small_header_limits() {
    HttpLimits limits;
    limits.max_header_bytes = kHeaderLimit;
    return limits;
}

// A client whose receive buffer holds little, so that the end of a large answer is still queued
// in the server's kernel when the server closes: a close that resets the connection drops it.
Result<std::unique_ptr<TlsClient>> connect_small_window(Fixture& f) {
    TlsClientOptions options;
    options.receive_buffer_bytes = 4096;
    return f.connect(options);
}

// What a client pipelines behind a request that ends the connection: another request with a
// 48 KiB body, far more than the server reads (kHeaderLimit) and less than it discards while it
// lingers (64 KiB).
std::string pipelined_tail() {
    return testing::http_request("POST", "/x", std::string(48 * 1024, 't'));
}

// The answer of "/two-large" (EchoHandler), as the client gets it de-chunked.
std::string two_large_body() {
    return "data: " + std::string(300 * 1024, 'a') + "<first>\n\n" +
           "data: " + std::string(300 * 1024, 'b') + "<second>\n\n" + "data: [DONE]\n\n";
}

// After the answer: close_notify, then the TCP end is a FIN (recv 0), not a reset.
void check_orderly_end(TlsClient& c) {
    CHECK(c.wait_closed());
    CHECK(c.got_close_notify());
    char byte;
    errno = 0;
    const ssize_t n = ::recv(c.fd(), &byte, 1, 0);
    CHECK_MESSAGE(n == 0, "recv: " << n << " errno " << errno);
}

}  // namespace

TEST_CASE(
    "a request that ends the connection, with bytes pipelined behind it: the whole answer, "
    "then close_notify and FIN, no reset") {
    Fixture f(small_header_limits());
    for (const std::string& request :
         {std::string("GET /two-large HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
          std::string("GET /two-large HTTP/1.0\r\nHost: localhost\r\n\r\n")}) {
        CAPTURE(request);
        auto c = connect_small_window(f);
        REQUIRE(c.ok());
        REQUIRE((*c)->send(request + pipelined_tail()).ok());
        auto r = (*c)->read_response();
        CHECK_MESSAGE(r.ok(), (r.ok() ? std::string() : r.status().message()));
        if (r.ok()) {
            CHECK(r->status == 200);
            CHECK(r->body.size() == two_large_body().size());
            CHECK(r->body == two_large_body());
            check_orderly_end(**c);
        }
    }
}

TEST_CASE(
    "drain: the answer in flight reaches a client that pipelined bytes behind it, then an "
    "orderly close") {
    Fixture f(small_header_limits());
    auto c = connect_small_window(f);
    REQUIRE(c.ok());
    REQUIRE((*c)->send(testing::http_request("GET", "/hold") + pipelined_tail()).ok());
    auto channel = f.handler.wait_held();
    REQUIRE(channel != nullptr);
    auto stopper = std::async(std::launch::async, [&] {
        f.server->stop(std::chrono::seconds(10));
        f.stopped = true;
    });
    for (int i = 0; i < 200 && testing::accepts_connections(f.server->port()); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // Waits on the drain.
    }
    REQUIRE_FALSE(testing::accepts_connections(f.server->port()));
    const std::string body(600 * 1024, 'z');
    channel->respond(HttpResponse{200, "text/plain", {}, body});
    channel.reset();
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    CHECK(r->headers["connection"] == "close");
    CHECK(r->body.size() == body.size());
    check_orderly_end(**c);
    CHECK(stopper.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
}

TEST_CASE("drain: an idle keep-alive connection ends with close_notify and FIN") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");
    // Idle in its wait for the next request by then (not on its way there, where it notices the
    // drain itself): the case where drain() ends the wait.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto stopper = std::async(std::launch::async, [&] {
        f.server->stop(std::chrono::seconds(10));
        f.stopped = true;
    });
    check_orderly_end(**c);
    CHECK(stopper.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
}

TEST_CASE(
    "an error answer the server makes itself, with bytes pipelined behind it: an orderly "
    "close") {
    Fixture f(small_header_limits());
    auto c = connect_small_window(f);
    REQUIRE(c.ok());
    REQUIRE((*c)->send("BREW /x HTTP/1.1\r\nHost: localhost\r\n\r\n" + pipelined_tail()).ok());
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 501);
    CHECK(r->headers["connection"] == "close");
    check_orderly_end(**c);
}

TEST_CASE(
    "asterisk-form is refused for methods other than OPTIONS, CONNECT always, then the "
    "close") {
    Fixture f;
    struct Case {
        std::string request;
        int status;
        std::string names;  // In the answer's message.
    };
    for (const Case& k :
         {Case{"GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400, "asterisk-form"},
          Case{"POST * HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", 400,
               "only valid for OPTIONS"},
          Case{"CONNECT edge.example:443 HTTP/1.1\r\nHost: edge.example:443\r\n\r\n", 501,
               "CONNECT"},
          Case{"CONNECT /v1/models HTTP/1.1\r\nHost: a\r\n\r\n", 501, "not supported"}}) {
        CAPTURE(k.request);
        auto c = f.connect();
        REQUIRE(c.ok());
        // What follows a CONNECT is a tunnel's bytes, not HTTP: nothing behind it is served.
        REQUIRE((*c)->send(k.request + testing::http_request("GET", "/x")).ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == k.status);
        CHECK(r->headers["connection"] == "close");
        CHECK(r->body.find(k.names) != std::string::npos);
        CHECK(r->body.find("invalid_request_error") != std::string::npos);
        CHECK((*c)->wait_closed());
    }
    // OPTIONS * is the one asterisk-form request: it reaches the handler.
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n").ok());
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    CHECK(r->body == "remote=127.0.0.1 sni=localhost body=0");
    CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");
}

TEST_CASE("drain: a deadline shorter than the linger does not cut a connection that only lingers") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send("GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok());
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    // close_notify and FIN are here: the server lingers now, for a second at most, since this
    // client keeps its end open. Its request is over; the deadline has nothing to cut.
    REQUIRE((*c)->wait_closed());
    bool cut = false;
    const auto started = std::chrono::steady_clock::now();
    f.server->stop(std::chrono::milliseconds(100), [&cut] { cut = true; });
    f.stopped = true;
    CHECK_FALSE(cut);
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(3));
    CHECK(f.server->open_connections() == 0);
}
