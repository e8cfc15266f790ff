#pragma once

// A loopback socket on a free port, for tests (doctest's REQUIRE on failure; the benches that
// share tls_client.cc link no doctest, so it lives here).

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>

namespace edge::testing {

// A socket bound to 127.0.0.1 on a free port, close-on-exec, the caller's to close: SOCK_STREAM
// listening (backlog 128, SO_REUSEADDR) or SOCK_DGRAM. `port` receives the port.
inline int bind_loopback(int type, uint16_t& port) {
    const int fd = socket(AF_INET, type | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    if (type == SOCK_STREAM) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    if (type == SOCK_STREAM) {
        REQUIRE(listen(fd, 128) == 0);
    }
    socklen_t len = sizeof(addr);
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port = ntohs(addr.sin_port);
    return fd;
}

}  // namespace edge::testing
