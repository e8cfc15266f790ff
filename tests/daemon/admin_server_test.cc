// The admin listener over real loopback sockets: bounded request reads.

#include "daemon/admin_server.h"

#include <doctest/doctest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "daemon/metrics.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using namespace edge::daemon;

namespace {

struct AdminFixture {
    AdminFixture() {
        auto created = AdminServer::create(io, "127.0.0.1", 0, metrics, [] { return ok_status(); });
        REQUIRE(created.ok());
        server = std::move(created).value();
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

}  // namespace

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
