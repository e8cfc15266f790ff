// Socket activation: parsing $LISTEN_PID/$LISTEN_FDS, and the zero-downtime handover with real
// processes: the old daemon drains a request in flight while a new daemon, started on the same
// inherited listening socket, serves the connections that arrive meanwhile; no connection is ever
// refused and no request goes unanswered.

#include "daemon/socket_activation.h"

#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "tests/package/package_testing.h"
#include "tests/testing/config_yaml.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using namespace edge::package_testing;

TEST_CASE("parse_listen_fds follows the sd_listen_fds protocol") {
    auto none = daemon::parse_listen_fds("", "", 42);
    REQUIRE(none.ok());
    CHECK(none->empty());
    auto other = daemon::parse_listen_fds("41", "2", 42);  // Meant for our parent.
    REQUIRE(other.ok());
    CHECK(other->empty());
    auto two = daemon::parse_listen_fds("42", "2", 42);
    REQUIRE(two.ok());
    CHECK(*two == std::vector<int>{3, 4});
    auto zero = daemon::parse_listen_fds("42", "0", 42);
    REQUIRE(zero.ok());
    CHECK(zero->empty());
    auto bad_pid = daemon::parse_listen_fds("4x2", "1", 42);
    REQUIRE_FALSE(bad_pid.ok());
    CHECK(bad_pid.status().message().find("LISTEN_PID") != std::string::npos);
    auto bad_count = daemon::parse_listen_fds("42", "-1", 42);
    REQUIRE_FALSE(bad_count.ok());
    CHECK(bad_count.status().message().find("LISTEN_FDS") != std::string::npos);
    CHECK_FALSE(daemon::parse_listen_fds("42", "99999", 42).ok());
}

TEST_CASE("a daemon given a descriptor that is not a listening socket exits with a clear error") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    std::string config = dir.write("c.yaml", testing::config_yaml(cert.cert_path, cert.key_path));
    int not_listening = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(not_listening >= 0);
    std::string log = dir.file("log");
    DaemonProcess d(config, not_listening, log);
    CHECK(d.wait(20000) == 1);
    const std::string text = read_file(log);
    CHECK(text.find("is not a listening TCP socket") != std::string::npos);
    // Refused as the descriptor is taken, before the config and the models load (minutes, for
    // a large checkpoint, each time Restart=on-failure tries again).
    CHECK(text.find("socket_activation_invalid") != std::string::npos);
    CHECK(text.find("\"backend\"") == std::string::npos);
    close(not_listening);
}

TEST_CASE("a daemon given two listening sockets refuses to start rather than leave one unserved") {
    // The kernel queues connections on both while systemd holds them; one the daemon does not
    // accept from would hang its clients, and a running service is never activated again.
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    std::string config = dir.write("c.yaml", testing::config_yaml(cert.cert_path, cert.key_path));
    auto listening = [] {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        REQUIRE(fd >= 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
        REQUIRE(listen(fd, 16) == 0);
        const int high = fcntl(fd, F_DUPFD_CLOEXEC, 100);  // Clear of descriptors 3 and 4.
        close(fd);
        return high;
    };
    const int first = listening();
    const int second = listening();
    std::string log = dir.file("log");
    DaemonProcess d(config, first, log, {}, second);
    CHECK(d.wait(20000) == 1);
    const std::string text = read_file(log);
    CAPTURE(text);
    CHECK(text.find("2 sockets") != std::string::npos);
    CHECK(text.find("one ListenStream=") != std::string::npos);
    close(first);
    close(second);
}

TEST_CASE("restart on an inherited socket: old drains, new serves, nothing is refused") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    // The config names port 0: the daemon must serve on the inherited socket, not bind its own.
    std::string config = dir.write("c.yaml", testing::config_yaml(cert.cert_path, cert.key_path,
                                                                  "log:\n  access_log: true\n"));
    uint16_t port = 0;
    int listener = listen_loopback(port);

    std::string log_a = dir.file("a.log");
    DaemonProcess a(config, listener, log_a);
    REQUIRE(wait_for_text(log_a, "\"event\":\"listening\""));
    CHECK(read_file(log_a).find("\"event\":\"socket_activation\"") != std::string::npos);
    CHECK(port_from_log(read_file(log_a), "public_port") == port);

    // Requests all along, each on a new connection: a refusal, or a connection closed without
    // its answer (one the old process accepted as it began to drain), is the failure this
    // design exists to prevent.
    std::atomic<bool> hammering{true};
    std::atomic<int> attempts{0}, refused{0}, unanswered{0};
    std::thread hammer([&] {
        testing::TlsClientOptions options;
        options.timeout_ms = 30000;  // Waiting in the backlog while no process accepts.
        while (hammering.load()) {
            auto c = testing::TlsClient::connect(port, options);
            ++attempts;
            if (!c.ok()) {
                MESSAGE("connect failed: " << c.status().message());
                ++refused;
                continue;
            }
            auto r = (*c)->send(testing::http_request("GET", "/v1/models")).ok()
                         ? (*c)->read_response()
                         : Result<testing::HttpReply>(unavailable_error("send failed"));
            if (!r.ok() || r->status != 200) {
                ++unanswered;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
    });

    // An idle keep-alive connection (A closes it when it starts draining, after its acceptor).
    auto idle = testing::TlsClient::connect(port);
    REQUIRE(idle.ok());
    REQUIRE((*idle)->send(testing::http_request("GET", "/v1/models")).ok());
    auto first = (*idle)->read_response();
    REQUIRE(first.ok());
    CHECK(first->status == 200);

    // A request in flight on A: headers read (100 Continue), body still arriving.
    std::string body = R"({"model":"none","messages":[{"role":"user","content":"hi"}]})";
    auto in_flight = testing::TlsClient::connect(port);
    REQUIRE(in_flight.ok());
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

    a.signal(SIGTERM);
    CHECK((*idle)->wait_closed());  // A has stopped accepting.
    CHECK(a.running());             // ... and is still draining the request in flight.

    // A client arriving now waits in the socket's backlog until the new process accepts it.
    std::atomic<int> late_status{0};
    std::thread late([&] {
        testing::TlsClientOptions options;
        options.timeout_ms = 30000;
        auto c = testing::TlsClient::connect(port, options);
        if (!c.ok() || !(*c)->send(testing::http_request("GET", "/v1/models")).ok()) {
            return;
        }
        auto r = (*c)->read_response();
        late_status = r.ok() ? r->status : -1;
    });
    std::string log_b = dir.file("b.log");
    DaemonProcess b(config, listener, log_b);
    late.join();
    CHECK(late_status.load() == 200);
    CHECK(a.running());  // The old process overlapped with the new one.

    // The old process finishes its request and exits cleanly.
    REQUIRE((*in_flight)->send(body.substr(10)).ok());
    auto reply = (*in_flight)->read_response();
    REQUIRE(reply.ok());
    CHECK(reply->status == 404);
    CHECK(reply->headers["connection"] == "close");
    CHECK(a.wait(15000) == 0);

    // The new one keeps serving on the same port.
    auto after = testing::TlsClient::connect(port);
    REQUIRE(after.ok());
    REQUIRE((*after)->send(testing::http_request("GET", "/v1/models")).ok());
    auto after_reply = (*after)->read_response();
    REQUIRE(after_reply.ok());
    CHECK(after_reply->status == 200);
    CHECK(read_file(log_b).find("\"path\":\"/v1/models\"") != std::string::npos);

    hammering = false;
    hammer.join();
    CHECK(attempts.load() > 0);
    CHECK(refused.load() == 0);
    CHECK(unanswered.load() == 0);
    b.signal(SIGTERM);
    CHECK(b.wait(15000) == 0);
    close(listener);
}
