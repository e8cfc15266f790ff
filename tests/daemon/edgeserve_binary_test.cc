// The built `edgeserve` binary: subcommands, check-config, a real run probed with curl and
// openssl s_client, systemd notify (READY/WATCHDOG/RELOADING/STOPPING), SIGHUP, SIGTERM drain, and
// `systemd-analyze verify` of the unit.

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/testing/config_yaml.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

using namespace edge;

namespace {

const std::string kBinary = EDGE_BINARY_DIR "/daemon/edgeserve";

// A unix datagram socket standing in for systemd's notify socket.
class NotifySocket {
public:
    explicit NotifySocket(const std::string& path) : path_(path) {
        fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        REQUIRE(path.size() < sizeof(addr.sun_path));
        std::memcpy(addr.sun_path, path.c_str(), path.size());
        REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
        timeval tv{10, 0};
        setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }
    ~NotifySocket() { close(fd_); }
    // Next datagram ("" on timeout).
    std::string receive() {
        char buf[1024];
        ssize_t n = recv(fd_, buf, sizeof(buf), 0);
        return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    }
    // Receives until a datagram contains `needle`; false on timeout.
    bool expect(const std::string& needle) {
        for (int i = 0; i < 50; ++i) {
            std::string d = receive();
            if (d.empty()) {
                return false;
            }
            if (d.find(needle) != std::string::npos) {
                return true;
            }
        }
        return false;
    }

private:
    std::string path_;
    int fd_ = -1;
};

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

uint16_t port_from_log(const std::string& log, const std::string& key) {
    std::smatch m;
    std::regex re("\"" + key + "\":([0-9]+)");
    REQUIRE_MESSAGE(std::regex_search(log, m, re), log);
    return static_cast<uint16_t>(std::stoi(m[1]));
}

}  // namespace

TEST_CASE("edgeserve --version, --help, unknown and missing subcommands") {
    auto version = testing::run({kBinary, "--version"});
    CHECK(version.exit_code == 0);
    CHECK(version.out.find("edgeserve ") == 0);
    auto help = testing::run({kBinary, "--help"});
    CHECK(help.exit_code == 0);
    CHECK(help.out.find("check-config") != std::string::npos);
    auto unknown = testing::run({kBinary, "frobnicate"});
    CHECK(unknown.exit_code == 2);
    CHECK(unknown.err.find("unknown command 'frobnicate'") != std::string::npos);
    CHECK(testing::run({kBinary}).exit_code == 2);
    CHECK(testing::run({kBinary, "run"}).exit_code == 2);
}

TEST_CASE("edgeserve check-config accepts a good file and names file:line:column of a bad one") {
    testing::TempDir dir;
    std::string good = dir.write("good.yaml", testing::config_yaml("c.pem", "k.pem"));
    auto ok = testing::run({kBinary, "check-config", good});
    CHECK(ok.exit_code == 0);
    CHECK(ok.out.find("ok") != std::string::npos);
    std::string bad = dir.write("bad.yaml", testing::config_yaml("c.pem", "k.pem",
                                                                 "limits:\n  max_body: 5\n"));
    auto fail = testing::run({kBinary, "check-config", bad});
    CHECK(fail.exit_code == 1);
    CHECK(fail.err.find(bad + ":18:3: limits.max_body: unknown key") != std::string::npos);
}

TEST_CASE("the example configs in deploy/config pass check-config") {
    for (const auto& entry :
         std::filesystem::directory_iterator(EDGE_SOURCE_DIR "/deploy/config")) {
        if (entry.path().extension() != ".yaml") {
            continue;
        }
        auto r = testing::run({kBinary, "check-config", entry.path().string()});
        CHECK_MESSAGE(r.exit_code == 0, entry.path().string() << ": " << r.err);
    }
}

TEST_CASE("edgeserve run with models but no engine fails with a clear message") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    std::string config = dir.write(
        "c.yaml", testing::config_yaml(cert.cert_path, cert.key_path,
                                       "models:\n  - {name: m, path: " + dir.file("none") + "}\n"));
    auto r = testing::run({kBinary, "run", "--config", config});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("engine") != std::string::npos);
}

TEST_CASE("edgeserve run: systemd notify, curl, openssl s_client, SIGHUP, SIGTERM drain") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    std::string config = dir.write("c.yaml", testing::config_yaml(cert.cert_path, cert.key_path));
    NotifySocket notify(dir.file("notify.sock"));
    std::string log_path = dir.file("stderr.log");
    testing::Child child({kBinary, "run", "--config", config},
                         {"NOTIFY_SOCKET=" + dir.file("notify.sock"), "WATCHDOG_USEC=400000"},
                         log_path);
    REQUIRE(notify.expect("READY=1"));
    CHECK(notify.expect("WATCHDOG=1"));
    std::string log = read_file(log_path);
    uint16_t port = port_from_log(log, "public_port");
    uint16_t admin = port_from_log(log, "admin_port");
    CHECK(log.find("auth_disabled") != std::string::npos);
    std::string url = "https://localhost:" + std::to_string(port);

    if (testing::have_program("curl")) {
        auto models = testing::run({"curl", "-sS", "--cacert", cert.cert_path,
                                    "--resolve", "localhost:" + std::to_string(port) + ":127.0.0.1",
                                    url + "/v1/models"});
        CHECK(models.exit_code == 0);
        CHECK(models.out == R"({"object":"list","data":[]})");
        auto completion = testing::run(
            {"curl", "-sS", "--cacert", cert.cert_path, "--resolve",
             "localhost:" + std::to_string(port) + ":127.0.0.1", "-w", "%{http_code}", "-H",
             "Content-Type: application/json", "-d",
             R"({"model":"fortunes","messages":[{"role":"user","content":"hi"}]})",
             url + "/v1/chat/completions"});
        CHECK(completion.out.find("model_not_found") != std::string::npos);
        CHECK(completion.out.substr(completion.out.size() - 3) == "404");
    } else {
        MESSAGE("curl not installed; skipping the curl probes");
    }
    if (testing::have_program("openssl")) {
        for (std::string version : {"-tls1_3", "-tls1_2"}) {
            auto s = testing::run({"openssl", "s_client", "-connect",
                                   "127.0.0.1:" + std::to_string(port), "-servername", "localhost",
                                   version, "-alpn", "http/1.1", "-brief"},
                                  20000, "");
            CHECK(s.exit_code == 0);
            std::string all = s.out + s.err;
            CHECK(all.find(version == "-tls1_3" ? "TLSv1.3" : "TLSv1.2") != std::string::npos);
            CHECK(all.find("CN = localhost") != std::string::npos);
        }
    } else {
        MESSAGE("openssl not installed; skipping the s_client probes");
    }
    CHECK(testing::plain_http_get(admin, "/readyz")->status == 200);

    child.signal(SIGHUP);
    CHECK(notify.expect("RELOADING=1"));
    CHECK(notify.expect("READY=1"));

    // A request in flight at SIGTERM (its body still arriving) is served before the exit. The
    // interim 100 Continue proves the daemon has read the head, so the connection is past its
    // handshake (a drain closes connections still handshaking) before the signal is sent.
    auto in_flight = testing::TlsClient::connect(port);
    REQUIRE(in_flight.ok());
    std::string body = R"({"model":"fortunes","messages":[{"role":"user","content":"hi"}]})";
    REQUIRE((*in_flight)
                ->send("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                       "Content-Type: application/json\r\nExpect: 100-continue\r\n"
                       "Content-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n")
                .ok());
    auto interim = (*in_flight)->read_until("\r\n\r\n");
    REQUIRE(interim.ok());
    CHECK(interim->find("100 Continue") != std::string::npos);
    REQUIRE((*in_flight)->send(body.substr(0, 10)).ok());
    child.signal(SIGTERM);
    CHECK(notify.expect("STOPPING=1"));
    bool refused = false;
    for (int i = 0; i < 400 && !refused; ++i) {
        refused = !testing::tcp_connect(port).ok();
        if (!refused) {
            usleep(5000);  // Waits on the daemon closing its acceptor.
        }
    }
    CHECK(refused);
    REQUIRE((*in_flight)->send(body.substr(10)).ok());
    auto reply = (*in_flight)->read_response();
    REQUIRE(reply.ok());
    CHECK(reply->status == 404);
    CHECK(reply->headers["connection"] == "close");
    CHECK(child.wait(15000) == 0);
    CHECK_FALSE(testing::tcp_connect(port).ok());
    std::string final_log = read_file(log_path);
    CHECK(final_log.find("certificates_reloaded") != std::string::npos);
    CHECK(final_log.find("\"event\":\"stopped\"") != std::string::npos);
}

TEST_CASE("systemd-analyze verify accepts the unit") {
    if (!testing::have_program("systemd-analyze")) {
        MESSAGE("systemd-analyze not installed; skipping the unit check");
        return;
    }
    // The unit names the installed path; verify the same unit pointing at the built binary.
    std::string unit = read_file(EDGE_SOURCE_DIR "/systemd/edgeserve.service");
    REQUIRE(!unit.empty());
    size_t pos;
    while ((pos = unit.find("/usr/local/bin/edgeserve")) != std::string::npos) {
        unit.replace(pos, std::strlen("/usr/local/bin/edgeserve"), kBinary);
    }
    testing::TempDir dir;
    std::string path = dir.write("edgeserve.service", unit);
    auto r = testing::run({"systemd-analyze", "verify", path}, 60000);
    if (r.exit_code != 0 && (r.err.find("Failed to connect") != std::string::npos ||
                             r.err.find("No such file or directory") != std::string::npos ||
                             r.err.find("Permission denied") != std::string::npos)) {
        MESSAGE("systemd-analyze cannot run here (" << r.err << "); skipping");
        return;
    }
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(unit.find("Type=notify") != std::string::npos);
    CHECK(unit.find("ProtectSystem=strict") != std::string::npos);
    CHECK(unit.find("NoNewPrivileges=yes") != std::string::npos);
}
