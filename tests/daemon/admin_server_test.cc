// The admin listener over real loopback sockets: HEAD, bounded request reads, accept back-off.

#include "daemon/admin_server.h"

#include <doctest/doctest.h>

#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "common/log.h"
#include "daemon/metrics.h"
#include "tests/testing/fd_exhaustion.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using namespace edge::daemon;

namespace {

struct AdminFixture {
    explicit AdminFixture(AdminHandler handler = nullptr) {
        auto created = AdminServer::create(io, "127.0.0.1", 0, metrics, [] { return ok_status(); });
        REQUIRE(created.ok());
        server = std::move(created).value();
        if (handler) {
            server->set_handler(std::move(handler));
        }
        server->start();
        thread = std::thread([this] {
            auto guard = boost::asio::make_work_guard(io);
            io.run();
        });
    }
    ~AdminFixture() {
        server->stop();
        io.stop();
        thread.join();
    }
    // Sends `bytes` on a new connection and returns all it answers until it closes.
    std::string exchange(const std::string& bytes) {
        auto fd = testing::tcp_connect(server->port());
        REQUIRE(fd.ok());
        ::send(*fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        std::string all;
        char buf[16384];
        for (ssize_t n; (n = ::recv(*fd, buf, sizeof(buf), 0)) > 0;) {
            all.append(buf, static_cast<size_t>(n));
        }
        ::close(*fd);
        return all;
    }

    boost::asio::io_context io;
    Metrics metrics;
    std::unique_ptr<AdminServer> server;
    std::thread thread;
};

size_t count(std::string_view haystack, std::string_view needle) {
    size_t n = 0;
    for (size_t at = haystack.find(needle); at != std::string_view::npos;
         at = haystack.find(needle, at + 1)) {
        ++n;
    }
    return n;
}

}  // namespace

TEST_CASE("admin: a HEAD response carries the GET's Content-Length and no body") {
    AdminFixture f;
    const std::string all = f.exchange(
        "HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n"
        "GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    CHECK(count(all, "HTTP/1.1 200 OK\r\n") == 2);
    CHECK(count(all, "Content-Length: 3\r\n") == 2);
    CHECK(count(all, "ok\n") == 1);  // The GET's body only.
    const std::string refused = f.exchange("DELETE /healthz HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(refused.find("Allow: GET, HEAD\r\n") != std::string::npos);
}

TEST_CASE("admin: a state-changing request from a browser page is refused, curl's is not") {
    std::atomic<int> calls{0};
    AdminFixture f([&](std::string_view method, std::string_view) -> std::optional<AdminReply> {
        ++calls;
        return AdminReply{200, "text/plain", std::string(method) + " done\n"};
    });
    const std::string post = "POST /admin/rollout?model=m&version=v HTTP/1.1\r\nHost: a\r\n";
    CHECK(f.exchange(post + "Connection: close\r\n\r\n").find("POST done") !=
          std::string::npos);
    const std::string cross =
        f.exchange(post + "Origin: https://evil.example\r\nConnection: close\r\n\r\n");
    CHECK(cross.find("HTTP/1.1 403") == 0);
    CHECK(f.exchange(post + "Sec-Fetch-Site: cross-site\r\nConnection: close\r\n\r\n")
              .find("HTTP/1.1 403") == 0);
    // Reading views from a browser stays possible (no state changes).
    CHECK(f.exchange("GET /admin/members HTTP/1.1\r\nHost: a\r\nOrigin: https://x\r\n"
                     "Connection: close\r\n\r\n")
              .find("GET done") != std::string::npos);
    CHECK(calls == 2);
}

TEST_CASE("admin: oversized headers, bodies and chunk extensions get a status and a close") {
    AdminFixture f;
    auto status_of = [](const std::string& reply) {
        return reply.size() >= 12 ? std::atoi(reply.c_str() + 9) : 0;
    };
    CHECK(status_of(f.exchange("GET /healthz HTTP/1.1\r\nHost: a\r\nX-Big: " +
                               std::string(20000, 'a') + "\r\n\r\n")) == 431);
    CHECK(status_of(f.exchange("POST /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"
                               "hello")) == 413);
    // Without a bound, this was buffered until the read timeout (and a gigabyte of it held).
    const std::string extension =
        f.exchange("GET /healthz HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1;" +
                   std::string(40000, 'a'));
    CHECK(status_of(extension) == 413);
    CHECK(extension.find("Connection: close\r\n") != std::string::npos);
    CHECK(status_of(f.exchange("GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")) ==
          200);
}

TEST_CASE("admin: out of file descriptors, the accept loop backs off, then serves again") {
    AdminFixture f;
    auto failures_logged = std::make_shared<std::atomic<int>>(0);
    log::set_sink([failures_logged](std::string_view line) {
        if (line.find("admin_accept_failed") != std::string_view::npos) {
            ++*failures_logged;
        }
    });
    clockid_t io_clock;
    REQUIRE(pthread_getcpuclockid(f.thread.native_handle(), &io_clock) == 0);
    auto cpu_now = [&] {
        timespec ts{};
        clock_gettime(io_clock, &ts);
        return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
    };
    // The client's socket is made first; then every descriptor is taken, so the server's accept
    // fails.
    auto client_socket = testing::tcp_socket();
    REQUIRE(client_socket.ok());
    testing::FdExhaustion exhausted;
    auto waiting = testing::tcp_connect_socket(*client_socket, f.server->port());
    const auto cpu_before = cpu_now();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const auto cpu_used = cpu_now() - cpu_before;
    const int logged = failures_logged->load();
    exhausted.release();
    log::set_sink(nullptr);
    REQUIRE(exhausted.filled());
    REQUIRE(waiting.ok());
    // The waiting connection is served once descriptors are free again.
    const std::string req = "GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    ::send(*waiting, req.data(), req.size(), MSG_NOSIGNAL);
    char buf[1024];
    const ssize_t n = ::recv(*waiting, buf, sizeof(buf), 0);
    ::close(*waiting);
    CHECK(n > 0);
    CHECK(std::string_view(buf, n > 0 ? static_cast<size_t>(n) : 0).starts_with("HTTP/1.1 200"));
    CHECK(cpu_used < std::chrono::milliseconds(100));  // Spinning used the whole 500 ms.
    CHECK(logged == 1);
}
