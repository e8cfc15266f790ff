// Daemon::stop, what SIGTERM runs: with a cluster, the draining state is gossiped before the
// listener stops, and that time counts against the drain deadline.

#include <doctest/doctest.h>

#include <chrono>

#include "daemon/config.h"
#include "daemon/daemon.h"
#include "tests/testing/config_yaml.h"
#include "tests/testing/daemon_yaml.h"
#include "tests/testing/scripted_generator.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/test_daemon.h"
#include "tests/testing/tls_client.h"

using namespace edge;

TEST_CASE("drain: advertising draining by gossip is part of the drain deadline, not added to it") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    testing::DaemonYaml y;
    y.cert_path = cert.cert_path;
    y.key_path = cert.key_path;
    y.gossip.emplace();
    y.gossip->gossip_interval_ms = 1000;  // Draining is advertised for three rounds: 3 s.
    y.gossip->health_check_interval_ms = 0;
    y.gossip->health_check_timeout_ms = 0;
    testing::ScriptedGenerator generator({"test-model"});
    auto daemon = testing::make_daemon(testing::daemon_yaml(y), dir.file("c.yaml"), generator,
                                       SystemClock::instance());
    daemon->start();
    // A stream the engine never finishes: only the deadline ends it.
    auto c = testing::TlsClient::connect(daemon->public_port());
    REQUIRE(c.ok());
    REQUIRE((*c)->send(testing::http_request(
                          "POST", "/v1/chat/completions",
                          R"({"model":"test-model","stream":true,)"
                          R"("messages":[{"role":"user","content":"hi"}]})"))
                .ok());
    REQUIRE(generator.wait_for_request(0));
    generator.emit(0, "before");
    REQUIRE((*c)->read_until("before").ok());

    const auto t0 = std::chrono::steady_clock::now();
    daemon->stop(std::chrono::milliseconds(2000));
    const auto took = std::chrono::steady_clock::now() - t0;
    // The deadline, then HttpServer::kCutGrace (1 s) for the cut stream's last words: 3 s. It
    // was 2 s of gossip, then 2 s more for the stream, then the grace: 5 s, past the deadline
    // by the whole gossip time (and past systemd's TimeoutStopSec when drain_deadline_ms is set
    // just below it).
    CHECK_MESSAGE(took < std::chrono::milliseconds(4000),
                  std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
    CHECK(took >= std::chrono::milliseconds(2000));  // The stream had its whole deadline.
}

TEST_CASE("drain: draining is advertised for three rounds of the gossip preset or the key") {
    auto window = [](const std::string& gossip) {
        Result<daemon::Config> c =
            daemon::parse_config(testing::config_yaml("/c", "/k", gossip), "x.yaml");
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        return daemon::drain_advertise_window(*c);
    };
    // The wan preset gossips every 500 ms: a window of 200 ms rounds was barely more than one.
    CHECK(window("gossip:\n  preset: wan\n").count() == 1500);
    CHECK(window("gossip:\n  preset: wan\n  gossip_interval_ms: 0\n").count() == 1500);
    CHECK(window("gossip:\n").count() == 600);  // lan: 200 ms.
    CHECK(window("gossip:\n  preset: wan\n  gossip_interval_ms: 40\n").count() == 120);
}
