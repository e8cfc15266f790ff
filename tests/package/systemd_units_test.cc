// The systemd units as installed: `systemd-analyze verify` of the service and its socket says
// nothing, `systemd-analyze security --offline=yes` scores the service at most 2.0, and the unit
// wires check-config, reload, notify and socket activation the way docs/operations.md says.

#include <doctest/doctest.h>

#include <cstdlib>
#include <regex>

#include "tests/package/package_testing.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_certs.h"

using namespace edge;
using namespace edge::package_testing;

namespace {

// The units with the installed binary path replaced by the built binary, in `dir`.
std::string write_units(const testing::TempDir& dir) {
    std::string service = read_file(EDGE_SOURCE_DIR "/systemd/edgeserve.service");
    REQUIRE(!service.empty());
    size_t pos;
    while ((pos = service.find("/usr/local/bin/edgeserve")) != std::string::npos) {
        service.replace(pos, std::strlen("/usr/local/bin/edgeserve"), kBinary);
    }
    dir.write("edgeserve.socket", read_file(EDGE_SOURCE_DIR "/systemd/edgeserve.socket"));
    return dir.write("edgeserve.service", service);
}

bool cannot_run(const testing::CommandResult& r) {
    return r.exit_code != 0 && (r.err.find("Failed to connect") != std::string::npos ||
                                r.err.find("Permission denied") != std::string::npos ||
                                r.err.find("Operation not permitted") != std::string::npos);
}

}  // namespace

TEST_CASE("the service and socket units declare check-config, reload, notify and activation") {
    std::string service = read_file(EDGE_SOURCE_DIR "/systemd/edgeserve.service");
    std::string socket = read_file(EDGE_SOURCE_DIR "/systemd/edgeserve.socket");
    // --socket-activated: the public port is the socket's, as `run` takes it.
    CHECK(service.find("\nExecStartPre=/usr/local/bin/edgeserve check-config --socket-activated "
                       "/etc/edgeserve/edgeserve.yaml\n") != std::string::npos);
    CHECK(service.find("\nExecStart=/usr/local/bin/edgeserve run --config "
                       "/etc/edgeserve/edgeserve.yaml\n") != std::string::npos);
    CHECK(service.find("\nExecReload=/bin/kill -HUP $MAINPID\n") != std::string::npos);
    CHECK(service.find("\nType=notify\n") != std::string::npos);
    // Requires=: a socket that failed (its port taken) stops the service from starting without
    // it, bound to the config's port as an unprivileged user.
    CHECK(service.find("\nWants=network-online.target\n") != std::string::npos);
    CHECK(service.find("\nRequires=edgeserve.socket\n") != std::string::npos);
    CHECK(service.find("\nAfter=network-online.target edgeserve.socket\n") != std::string::npos);
    // No capabilities: the privileged port is bound by systemd.
    CHECK(service.find("\nCapabilityBoundingSet=\n") != std::string::npos);
    CHECK(service.find("AmbientCapabilities") == std::string::npos);
    CHECK(socket.find("\nListenStream=443\n") != std::string::npos);
    CHECK(socket.find("\nService=edgeserve.service\n") != std::string::npos);
    // The drain of the installed config, and the stop path's fixed parts after it (the leave's
    // gossip rounds, the cut grace, the forced close, the forwarder's stop: ~14 s), must end
    // before systemd's stop timeout kills the process (docs/config.md, limits).
    std::smatch m;
    REQUIRE(std::regex_search(service, m, std::regex("\nTimeoutStopSec=([0-9]+)\n")));
    const std::string config = read_file(EDGE_SOURCE_DIR "/deploy/config/edgeserve.yaml");
    std::smatch d;
    REQUIRE(std::regex_search(config, d, std::regex("\n  drain_deadline_ms: ([0-9]+)\n")));
    CHECK(std::stoi(m[1]) * 1000 >= std::stoi(d[1]) + 15000);
}

TEST_CASE("systemd-analyze verify is silent on the service and the socket") {
    if (!testing::have_program("systemd-analyze")) {
        MESSAGE("systemd-analyze not installed; skipping");
        return;
    }
    testing::TempDir dir;
    std::string service = write_units(dir);
    auto r =
        testing::run({"systemd-analyze", "verify", service, dir.file("edgeserve.socket")}, 60000);
    if (cannot_run(r)) {
        MESSAGE("systemd-analyze cannot run here (" << r.err << "); skipping");
        return;
    }
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK_MESSAGE(r.out.empty(), r.out);
    CHECK_MESSAGE(r.err.empty(), r.err);
}

TEST_CASE("systemd-analyze security --offline=yes scores the service at most 2.0") {
    if (!testing::have_program("systemd-analyze")) {
        MESSAGE("systemd-analyze not installed; skipping");
        return;
    }
    auto help = testing::run({"systemd-analyze", "security", "--help"});
    if (help.out.find("--offline") == std::string::npos) {
        MESSAGE("this systemd-analyze has no --offline (systemd < 250); skipping");
        return;
    }
    testing::TempDir dir;
    std::string service = write_units(dir);
    auto r = testing::run({"systemd-analyze", "security", "--offline=yes", "--no-pager", service},
                          60000);
    if (cannot_run(r)) {
        MESSAGE("systemd-analyze cannot run here (" << r.err << "); skipping");
        return;
    }
    std::smatch m;
    std::string all = r.out + r.err;
    REQUIRE_MESSAGE(std::regex_search(all, m,
                                      std::regex("Overall exposure level for "
                                                 "edgeserve\\.service: ([0-9.]+)")),
                    all);
    double score = std::stod(m[1]);
    MESSAGE("systemd-analyze security exposure: " << score);
    CHECK(score <= 2.0);
}
