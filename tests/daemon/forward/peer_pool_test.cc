// The forwarding client's pool of idle connections (daemon/forward/peer_pool.cc) against a real
// peer socket: a keep-alive TLS peer that answers one request and then waits, reporting when its
// end of the connection sees EOF. PeerClient is driven directly on its own io_context.

#include <doctest/doctest.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>

#include "daemon/forward/peer_client.h"
#include "tests/testing/daemon_yaml.h"
#include "tests/testing/loopback_socket.h"
#include "tests/testing/test_certs.h"
#include "tls/http_types.h"

namespace edge::daemon::forward {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

// A peer that takes one TLS connection (certificate of the cluster CA naming site "raw"),
// answers its one request with a keep-alive 200 and then reads on until the forwarder closes
// its end: eof() tells when.
class KeepAlivePeer {
  public:
    KeepAlivePeer(const testing::TestCa& ca, const std::string& dir) {
        const auto cert = testing::make_signed_certificate(ca, dir, "raw", {"raw", "localhost"});
        listen_fd_ = testing::bind_loopback(SOCK_STREAM, port_);
        ctx_ = testing::make_server_context(cert);
        thread_ = std::thread([this] { serve(); });
    }
    ~KeepAlivePeer() {
        shutdown(listen_fd_, SHUT_RDWR);
        if (const int fd = conn_fd_.load(); fd >= 0) {
            shutdown(fd, SHUT_RDWR);  // Frees serve() from its read if the test failed.
        }
        thread_.join();
        close(listen_fd_);
        SSL_CTX_free(ctx_);
    }
    cluster::RouteTarget target() const {
        return cluster::RouteTarget{false, "raw", "127.0.0.1:" + std::to_string(port_), 0.0, "m"};
    }
    // When the connection's other end closed; nullopt while it is open.
    std::optional<SteadyClock::time_point> eof() const {
        if (!closed_.load()) {
            return std::nullopt;
        }
        return closed_at_;
    }

  private:
    void serve() {
        const int fd = accept(listen_fd_, nullptr, nullptr);
        if (fd < 0) {
            return;
        }
        conn_fd_.store(fd);
        SSL* ssl = SSL_new(ctx_);
        SSL_set_fd(ssl, fd);
        if (SSL_accept(ssl) == 1) {
            std::string request;
            char buf[4096];
            int n = 0;
            // The head and its body (the test's request has one of a few bytes), then the answer.
            while (request.find("\r\n\r\n") == std::string::npos ||
                   request.find("{}") == std::string::npos) {
                if ((n = SSL_read(ssl, buf, sizeof(buf))) <= 0) {
                    break;
                }
                request.append(buf, static_cast<size_t>(n));
            }
            if (n > 0) {
                const std::string answer =
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    "Content-Length: 2\r\n\r\n{}";
                SSL_write(ssl, answer.data(), static_cast<int>(answer.size()));
                // Nothing more is sent on it: the next read ends when the forwarder closes it.
                while (SSL_read(ssl, buf, sizeof(buf)) > 0) {
                }
                closed_at_ = SteadyClock::now();
                closed_.store(true);
            }
        }
        SSL_free(ssl);
        close(fd);
    }

    int listen_fd_ = -1;
    std::atomic<int> conn_fd_{-1};
    uint16_t port_ = 0;
    SSL_CTX* ctx_ = nullptr;
    SteadyClock::time_point closed_at_{};  // Written before closed_ is set.
    std::atomic<bool> closed_{false};
    std::thread thread_;
};

// Keeps the status of the answer it was given.
class StatusChannel final : public tls::ResponseChannel {
  public:
    void respond(tls::HttpResponse response) override { status.store(response.status); }
    void begin_stream(tls::HttpResponse head) override { status.store(head.status); }
    void write(std::string) override {}
    void end_stream() override {}
    void on_client_gone(std::function<void()>) override {}
    void note(std::string, std::variant<std::string, int64_t>) override {}

    std::atomic<int> status{0};
};

// A PeerClient ("fra") on an io_context run by its own thread, and a keep-alive peer.
struct Fixture {
    explicit Fixture(std::chrono::milliseconds pool_idle_timeout) {
        ca = testing::make_ca(dir.path(), "cluster-ca", "edgeserve test cluster CA");
        const auto cert = testing::make_signed_certificate(ca, dir.path(), "fra", {"fra"});
        peer = std::make_unique<KeepAlivePeer>(ca, dir.path());
        PeerClientConfig config;
        config.site_id = "fra";
        config.ca_path = ca.cert_path;
        config.cert_path = cert.cert_path;
        config.key_path = cert.key_path;
        config.pool_idle_timeout = pool_idle_timeout;
        auto made = PeerClient::create(io, config, nullptr);
        REQUIRE(made.ok());
        client = std::move(made).value();
        runner = std::thread([this] {
            io.run();
            ran_out.store(true);
        });
    }
    ~Fixture() {
        client.reset();
        work.reset();
        if (!testing::wait_for([&] { return ran_out.load(); }, 5s)) {
            io.stop();
        }
        runner.join();
    }

    // One forward to the peer, answered; returns once the client has the answer.
    void forward_once() {
        tls::HttpRequest request;
        request.method = "POST";
        request.target = "/v1/chat/completions";
        request.headers.push_back({"Content-Type", "application/json"});
        request.body = "{}";
        auto channel = std::make_shared<StatusChannel>();
        client->forward(std::move(request), "acme", {peer->target()}, channel,
                        [](const cluster::ForwardResult&) {});
        REQUIRE(testing::wait_for([&] { return channel->status.load() != 0; }, 5s));
        REQUIRE(channel->status.load() == 200);
    }

    testing::TempDir dir;
    testing::TestCa ca;
    std::unique_ptr<KeepAlivePeer> peer;
    boost::asio::io_context io;
    boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work =
        boost::asio::make_work_guard(io);
    std::unique_ptr<PeerClient> client;
    std::thread runner;
    std::atomic<bool> ran_out{false};  // io.run() returned: nothing left pending on it.
};

// The pool was swept only when a connection came back to it: with no more traffic, up to
// max_idle_connections per peer stayed open forever, past pool_idle_timeout.
TEST_CASE("peer pool: a connection idle past pool_idle_timeout is closed with no further request") {
    constexpr auto kTimeout = 200ms;
    Fixture f(kTimeout);
    const auto sent = SteadyClock::now();
    f.forward_once();
    CHECK(f.client->connections_opened() == 1);
    REQUIRE(testing::wait_for([&] { return f.peer->eof().has_value(); }, 5s));
    // Closed by the sweep, not before: it was pooled after `sent`.
    CHECK(*f.peer->eof() - sent >= kTimeout);
    CHECK(testing::wait_for([&] { return f.client->idle_connections() == 0; }, 5s));
}

// The sweep's timer is disarmed when the client stops: a wait left pending would hold the
// io_context, whose run() the daemon's shutdown joins, for the rest of the timeout.
TEST_CASE("peer pool: stopping closes the idle connections and leaves no sweep pending") {
    Fixture f(60s);
    f.forward_once();
    CHECK(f.client->idle_connections() == 1);
    CHECK_FALSE(f.peer->eof().has_value());
    f.client->stop(1s);
    CHECK(testing::wait_for([&] { return f.peer->eof().has_value(); }, 5s));
    CHECK(f.client->idle_connections() == 0);
    // Only the work guard keeps the io_context running now (the client still exists).
    f.work.reset();
    CHECK(testing::wait_for([&] { return f.ran_out.load(); }, 5s));
}

}  // namespace
}  // namespace edge::daemon::forward
