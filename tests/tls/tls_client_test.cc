// The test TLS client (tests/testing/tls_client.h) against the real HTTPS server: its read
// timeout (SO_RCVTIMEO) surfaces from OpenSSL as SSL_ERROR_WANT_READ with EAGAIN and must read as
// a timeout with the connection still open, never as the server closing it. Misread as a close, a
// slow answer in the binary cluster test looked like fra dropping its client, and wait_closed()
// was true for a connection that was still open.

#include <doctest/doctest.h>

#include <future>
#include <mutex>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"
#include "tls/http_server.h"
#include "tls/tls_context.h"

using namespace edge;
using namespace edge::tls;

namespace {

// Parks every request's channel for the test to answer.
class HoldHandler final : public HttpHandler {
public:
    void handle(HttpRequest, std::shared_ptr<ResponseChannel> channel) override {
        std::lock_guard lock(mu_);
        held_ = channel;
        promise_.set_value();
    }
    std::shared_ptr<ResponseChannel> wait_held() {
        future_.wait_for(std::chrono::seconds(5));
        std::lock_guard lock(mu_);
        return held_;
    }

private:
    std::mutex mu_;
    std::shared_ptr<ResponseChannel> held_;
    std::promise<void> promise_;
    std::future<void> future_ = promise_.get_future();
};

}  // namespace

TEST_CASE("the test client reports a silent server as a read timeout, not as a close") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "a", {"localhost"});
    auto store = TlsContextStore::create({{{"localhost"}, cert.cert_path, cert.key_path}});
    REQUIRE(store.ok());
    boost::asio::io_context io;
    HoldHandler handler;
    HttpServerConfig config;
    config.address = "127.0.0.1";
    config.port = 0;
    auto server = HttpServer::create(io, config, **store, handler, nullptr);
    REQUIRE(server.ok());
    (*server)->start();
    std::thread thread([&] {
        auto guard = boost::asio::make_work_guard(io);
        io.run();
    });

    testing::TlsClientOptions o;
    o.timeout_ms = 200;
    auto c = testing::TlsClient::connect((*server)->port(), o);
    REQUIRE(c.ok());
    REQUIRE((*c)->send(testing::http_request("GET", "/hold")).ok());
    std::shared_ptr<ResponseChannel> held = handler.wait_held();
    REQUIRE(held != nullptr);
    auto reply = (*c)->read_response();
    REQUIRE_FALSE(reply.ok());
    CHECK_MESSAGE(reply.status().code() == StatusCode::kDeadlineExceeded,
                  reply.status().to_string());
    CHECK_FALSE((*c)->wait_closed());
    // Still open: the late answer arrives on the same connection.
    held->respond(HttpResponse{200, "text/plain", {}, "late"});
    auto late = (*c)->read_response();
    CHECK_MESSAGE(late.ok(), late.status().to_string());
    if (late.ok()) {
        CHECK(late->body == "late");
    }

    (*server)->stop(std::chrono::milliseconds(0));
    io.stop();
    thread.join();
}
