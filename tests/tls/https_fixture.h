#pragma once

// The HTTPS server fixture of the tls tests: a server on a loopback port with certificates
// generated at test time, a handler that echoes what it saw (or holds the channel for the test to
// answer), and an observer that records what the server reports. One fixture per test case; the
// handler and observer are called from the server's I/O threads.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "tests/testing/daemon_yaml.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"
#include "tls/http_server.h"
#include "tls/tls_context.h"

namespace edge::tls::test {

using edge::testing::TlsClient;
using edge::testing::TlsClientOptions;


// Answers with what it saw ("/headers": every header field and the body); "/hold" parks the
// channel for the test to answer later;
// "/two-large" streams two 300 KiB events and a last small one from inside handle(), where
// nothing can be written to the socket between them; "/throw" throws (a handler bug).
class EchoHandler final : public HttpHandler {
  public:
    void handle(HttpRequest request, std::shared_ptr<ResponseChannel> channel) override {
        if (request.path() == "/two-large") {
            channel->begin_stream(HttpResponse{200, "text/event-stream", {}, ""});
            channel->write("data: " + std::string(300 * 1024, 'a') + "<first>\n\n");
            channel->write("data: " + std::string(300 * 1024, 'b') + "<second>\n\n");
            channel->write("data: [DONE]\n\n");
            channel->end_stream();
            return;
        }
        if (request.path() == "/throw") {
            throw std::runtime_error("handler bug");
        }
        if (request.path() == "/drop") {
            // A handler bug: the channel dropped (from another thread) without an answer.
            std::thread([channel = std::move(channel)]() mutable { channel.reset(); }).detach();
            return;
        }
        if (request.path() == "/drop-stream") {
            channel->begin_stream(HttpResponse{200, "text/event-stream", {}, ""});
            channel->write("data: 1\n\n");
            return;  // The stream is never ended.
        }
        if (request.path() == "/headers") {
            HttpResponse r;
            for (const HttpHeader& h : request.headers) {
                r.body += h.name + ": " + h.value + "\n";
            }
            r.body += "body=" + request.body;
            channel->respond(std::move(r));
            return;
        }
        if (request.path() == "/hold") {
            std::lock_guard lock(mu_);
            held_ = channel;
            held_promise_.set_value();
            return;
        }
        HttpResponse r;
        r.body = "remote=" + request.remote_address + " sni=" + request.server_name +
                 " body=" + std::to_string(request.body.size());
        channel->respond(std::move(r));
    }
    std::shared_ptr<ResponseChannel> wait_held() {
        held_future_.wait_for(std::chrono::seconds(5));
        std::lock_guard lock(mu_);
        return held_;
    }
    // Ready for another "/hold".
    void reset_held() {
        std::lock_guard lock(mu_);
        held_.reset();
        held_promise_ = {};
        held_future_ = held_promise_.get_future();
    }

  private:
    std::mutex mu_;
    std::shared_ptr<ResponseChannel> held_;
    std::promise<void> held_promise_;
    std::future<void> held_future_ = held_promise_.get_future();
};

// A ResponseRecord with its views copied.
struct Answered {
    std::string method, path, client;
    int status = 0;
    bool complete = false;
    uint64_t body_bytes = 0;
    std::vector<std::string> notes;  // "name=value".
    std::chrono::nanoseconds duration{};
};

// Counts what the server reports (any thread).
class CountingObserver final : public ServerObserver {
  public:
    void on_stream_cancelled(std::string_view reason) override {
        std::lock_guard lock(mu_);
        cancelled_.emplace_back(reason);
    }
    void on_response(const ResponseRecord& r) override {
        Answered a{std::string(r.method), std::string(r.path), std::string(r.client),
                   r.status, r.complete, r.body_bytes, {}};
        a.duration = r.duration;
        for (const ResponseNote& n : r.notes) {
            std::visit([&](const auto& v) { a.notes.push_back(n.name + "=" + as_text(v)); },
                       n.value);
        }
        std::lock_guard lock(mu_);
        answered_.push_back(std::move(a));
    }
    std::vector<std::string> cancelled() {
        std::lock_guard lock(mu_);
        return cancelled_;
    }
    // The answers reported so far, once there are at least `n` (5 s at most).
    std::vector<Answered> answered(size_t n) {
        testing::wait_for(
            [&] {
                std::lock_guard lock(mu_);
                return answered_.size() >= n;
            },
            std::chrono::seconds(5));
        std::lock_guard lock(mu_);
        return answered_;
    }

  private:
    static std::string as_text(const std::string& v) { return v; }
    static std::string as_text(int64_t v) { return std::to_string(v); }

    std::mutex mu_;
    std::vector<std::string> cancelled_;
    std::vector<Answered> answered_;
};

struct Fixture {
    explicit Fixture(HttpLimits limits = {}, std::vector<std::string> trusted = {"127.0.0.0/8"},
                     int io_threads = 1, SessionTicketOptions tickets = {}) {
        a = testing::make_certificate(dir.path(), "a", {"localhost"});
        b = testing::make_certificate(dir.path(), "b", {"other.test", "*.wild.test"});
        auto store =
            TlsContextStore::create({{{"localhost"}, a.cert_path, a.key_path},
                                     {{"other.test", "*.wild.test"}, b.cert_path, b.key_path}},
                                    {}, std::move(tickets));
        REQUIRE(store.ok());
        tls = std::move(store).value();
        HttpServerConfig config;
        config.address = "127.0.0.1";
        config.port = 0;
        config.limits = limits;
        config.proxy_trusted = *CidrSet::parse(trusted);
        config.io_threads = io_threads;
        auto created = HttpServer::create(io, config, *tls, handler, &observer);
        REQUIRE(created.ok());
        server = std::move(created).value();
        server->start();
        for (int i = 0; i < io_threads; ++i) {
            threads.emplace_back([this] {
                auto guard = boost::asio::make_work_guard(io);
                io.run();
            });
        }
    }
    ~Fixture() {
        if (!stopped) {
            server->stop(std::chrono::milliseconds(0));
        }
        io.stop();
        for (auto& t : threads) {
            t.join();
        }
        server.reset();
    }
    Result<std::unique_ptr<TlsClient>> connect(TlsClientOptions o = {}) {
        return TlsClient::connect(server->port(), std::move(o));
    }

    testing::TempDir dir;
    testing::TestCertificate a, b;
    boost::asio::io_context io;
    EchoHandler handler;
    CountingObserver observer;
    std::unique_ptr<TlsContextStore> tls;
    std::unique_ptr<HttpServer> server;
    std::vector<std::thread> threads;
    bool stopped = false;
};

inline std::string get_body(TlsClient& c, const std::string& path = "/x") {
    REQUIRE(c.send(testing::http_request("GET", path)).ok());
    auto reply = c.read_response();
    REQUIRE(reply.ok());
    CHECK(reply->status == 200);
    return reply->body;
}

}  // namespace edge::tls::test
