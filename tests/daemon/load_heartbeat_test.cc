// LoadHeartbeat against a real unix datagram socket standing in for systemd's NOTIFY_SOCKET:
// an extension for each beat in which the load moved, none while it stands still.

#include "daemon/load_heartbeat.h"

#include <doctest/doctest.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <string>

#include "tests/testing/test_certs.h"

using namespace edge::daemon;
using namespace std::chrono_literals;

namespace {

// The next datagram on `fd` within `timeout_ms`, or nullopt.
std::optional<std::string> receive(int fd, int timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) {
        return std::nullopt;
    }
    char buf[512];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    REQUIRE(n > 0);
    return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

TEST_CASE("load heartbeat: extends systemd's start timeout while the load moves, only then") {
    edge::testing::TempDir dir;
    const std::string path = dir.file("notify.sock");
    const int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    SystemdNotifier notifier(path, "", "");
    std::atomic<int64_t> matrices{0};
    std::atomic<int64_t> bytes{0};
    {
        LoadHeartbeat beat(
            notifier,
            [&] { return edge::engine::LoadProgress{bytes.load(), matrices.load()}; }, 20ms, 3s);
        // Standing still: nothing, over many beats.
        CHECK_FALSE(receive(fd, 200));
        bytes = int64_t{3} << 20;  // Reading the weights.
        const std::optional<std::string> msg = receive(fd, 5000);
        REQUIRE(msg);
        CHECK(msg->starts_with("EXTEND_TIMEOUT_USEC=3000000\nSTATUS=loading models: 3 MiB read, "
                               "0 weight matrices after "));
        CHECK(msg->ends_with(" s"));
        // One extension per beat that saw progress, not one per beat.
        CHECK_FALSE(receive(fd, 200));
        matrices = 9;  // Preparing the matrices.
        const std::optional<std::string> next = receive(fd, 5000);
        REQUIRE(next);
        CHECK(next->find("3 MiB read, 9 weight matrices") != std::string::npos);
    }
    // Destroyed: no more beats.
    matrices = 20;
    CHECK_FALSE(receive(fd, 200));
    close(fd);
}
