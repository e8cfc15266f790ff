// Daemon::stop, what SIGTERM runs: with a cluster, the draining state is gossiped before the
// listener stops, and that time counts against the drain deadline. The certificate reload
// rebuilds (and counts) only the set whose files changed. A 408 is counted by status but kept
// out of the request-duration histogram.

#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "common/log.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/metrics.h"
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

namespace {

// Writes the file at `path` again with the same bytes: a new change time, as a renewal tool's
// write of the same certificate.
void touch(const std::string& path) {
    const std::string pem = testing::read_file(path);
    std::ofstream(path, std::ios::trunc) << pem;
}

bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}


// A daemon serving `cert`/`key` publicly and the peer set (the peer listener and the forwarding
// client) from `ca` and `peer_cert`/`peer_key`, started.
struct PeerSetDaemon {
    testing::ScriptedGenerator generator{{"test-model"}};
    std::unique_ptr<edge::daemon::Daemon> daemon;

    PeerSetDaemon(const testing::TempDir& dir, const std::string& cert, const std::string& key,
                  const std::string& ca, const std::string& peer_cert,
                  const std::string& peer_key) {
        testing::DaemonYaml y;
        y.cert_path = cert;
        y.key_path = key;
        y.peer.emplace();
        y.peer->ca_path = ca;
        y.peer->cert_path = peer_cert;
        y.peer->key_path = peer_key;
        daemon = testing::make_daemon(testing::daemon_yaml(y), dir.file("c.yaml"), generator,
                                      SystemClock::instance());
        daemon->start();
    }

    // Checks the certificate reload counters: each of `series` is a listener and result with
    // its count (R"("peer",result="ok"} 1)"), and no series begins as `absent` does.
    void check_reloads(std::initializer_list<const char*> series, const char* absent = nullptr) {
        const std::string reloads = "edgeserve_certificate_reloads_total{listener=";
        const std::string text = daemon->metrics().serialize();
        for (const char* one : series) {
            CHECK_MESSAGE(has(text, reloads + one), text);
        }
        if (absent != nullptr) {
            CHECK_MESSAGE(!has(text, reloads + absent), text);
        }
    }
};
}  // namespace

TEST_CASE("certificates: a change to one set's files rebuilds and counts that set alone") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    auto ca = testing::make_ca(dir.path(), "ca", "test cluster CA");
    auto peer = testing::make_signed_certificate(ca, dir.path(), "peer", {"fra.cluster.test"});
    PeerSetDaemon site(dir, cert.cert_path, cert.key_path, ca.cert_path, peer.cert_path,
                       peer.key_path);
    auto& daemon = site.daemon;

    // The cluster files renewed: the peer listener and the forwarding client reload; the
    // public listener keeps its generation (its session caches) and counts nothing.
    touch(peer.cert_path);
    REQUIRE(daemon->reload_certificates().ok());
    site.check_reloads({R"("peer",result="ok"} 1)",
                       R"("forwarding_client",result="ok"} 1)",
                       R"("public",result="error"} 0)"},
                       R"("public",result="ok")");

    // The public files renewed: the public listener alone.
    touch(cert.key_path);
    REQUIRE(daemon->reload_certificates().ok());
    site.check_reloads({R"("public",result="ok"} 1)",
                       R"("peer",result="ok"} 1)",
                       R"("forwarding_client",result="ok"} 1)"});
    daemon->stop(std::chrono::milliseconds(0));
}

TEST_CASE("certificates: a SIGHUP's peer section on a site without one is not read or watched") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    auto ca = testing::make_ca(dir.path(), "ca", "test cluster CA");
    auto peer = testing::make_signed_certificate(ca, dir.path(), "peer", {"fra.cluster.test"});
    // The file watch polls every 100 ms (its shortest).
    auto watched = [](std::string yaml) {
        const std::string at = "    certificates:\n";
        REQUIRE(yaml.find(at) != std::string::npos);
        return yaml.insert(yaml.find(at), "    certificate_watch_ms: 100\n");
    };
    testing::DaemonYaml y;
    y.cert_path = cert.cert_path;
    y.key_path = cert.key_path;
    testing::ScriptedGenerator generator({"test-model"});
    auto daemon = testing::make_daemon(watched(testing::daemon_yaml(y)), dir.file("c.yaml"),
                                       generator, SystemClock::instance());
    std::mutex mu;
    std::vector<std::string> lines;  // Guarded by mu: the watcher's thread logs too.
    log::set_sink([&](std::string_view line) {
        std::lock_guard lock(mu);
        lines.emplace_back(line);
    });
    daemon->start();

    // A SIGHUP's config with a `peer` section (it needs a restart): nothing runs on its files.
    y.peer.emplace();
    y.peer->ca_path = ca.cert_path;
    y.peer->cert_path = peer.cert_path;
    y.peer->key_path = peer.key_path;
    auto with_peer =
        edge::daemon::parse_config(watched(testing::daemon_yaml(y)), dir.file("c.yaml"));
    REQUIRE_MESSAGE(with_peer.ok(), with_peer.status().to_string());
    REQUIRE(daemon->reload_certificates(*with_peer).ok());
    // The public files did not change: nothing rebuilt, nothing counted.
    CHECK_MESSAGE(!has(daemon->metrics().serialize(), R"(result="ok"})"),
                  daemon->metrics().serialize());
    CHECK_MESSAGE(!has(daemon->metrics().serialize(), R"(listener="peer")"),
                  daemon->metrics().serialize());

    // The peer files change, then the public ones: the watch reports the public ones only.
    touch(peer.cert_path);
    touch(ca.cert_path);
    touch(cert.cert_path);
    auto logged = [&](const std::string& part) {
        std::lock_guard lock(mu);
        for (const std::string& line : lines) {
            if (has(line, "certificate_files_changed") && has(line, part)) {
                return true;
            }
        }
        return false;
    };
    CHECK(testing::wait_for([&] { return logged(cert.cert_path); }, std::chrono::seconds(10)));
    daemon->stop(std::chrono::milliseconds(0));
    log::set_sink(nullptr);
    CHECK_FALSE(logged(peer.cert_path));
    CHECK_FALSE(logged(ca.cert_path));
    CHECK_MESSAGE(has(daemon->metrics().serialize(),
                      R"(edgeserve_certificate_reloads_total{listener="public",result="ok"} 1)"),
                  daemon->metrics().serialize());
}

TEST_CASE("certificates: a file both sets share, the public set failing, reloads the peer once") {
    testing::TempDir dir;
    auto ca = testing::make_ca(dir.path(), "ca", "test cluster CA");
    auto shared =
        testing::make_signed_certificate(ca, dir.path(), "shared", {"localhost", "fra.test"});
    // The public listener serves the same certificate file with its own copy of the key (mode
    // 0600 kept).
    const std::string public_key = dir.file("public.key");
    std::filesystem::copy_file(shared.key_path, public_key);
    const std::string key_pem = testing::read_file(public_key);
    PeerSetDaemon site(dir, shared.cert_path, public_key, ca.cert_path, shared.cert_path,
                       shared.key_path);
    auto& daemon = site.daemon;

    // The shared certificate renewed, the public key broken: the public set fails at every
    // check (it tries its files again), the peer set loads the renewal once. It rebuilt at every
    // check, its new session caches and the forwarding client's dropped connections included,
    // while the public set's failure had its stamps forgotten for both sets.
    touch(shared.cert_path);
    std::ofstream(public_key, std::ios::trunc) << "not a key\n";
    for (int check = 0; check < 3; ++check) {
        CHECK_FALSE(daemon->reload_certificates().ok());
    }
    site.check_reloads({R"("public",result="error"} 3)",
                       R"("peer",result="ok"} 1)",
                       R"("forwarding_client",result="ok"} 1)"});

    // The public key fixed: the public set loads; the peer set's files have not changed since.
    std::ofstream(public_key, std::ios::trunc) << key_pem;
    REQUIRE(daemon->reload_certificates().ok());
    REQUIRE(daemon->reload_certificates().ok());
    site.check_reloads({R"("public",result="ok"} 1)",
                       R"("public",result="error"} 3)",
                       R"("peer",result="ok"} 1)",
                       R"("forwarding_client",result="ok"} 1)"});
    daemon->stop(std::chrono::milliseconds(0));
}

TEST_CASE("metrics: a 408 is counted by status, not observed as a request's duration") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    testing::DaemonYaml y;
    y.cert_path = cert.cert_path;
    y.key_path = cert.key_path;
    y.drain_deadline_ms = 0;  // The limits section is the one below.
    y.extra = "limits:\n  header_timeout_ms: 300\n  body_timeout_ms: 300\n";
    testing::ScriptedGenerator generator({"test-model"});
    auto daemon = testing::make_daemon(testing::daemon_yaml(y), dir.file("c.yaml"), generator,
                                       SystemClock::instance());
    daemon->start();
    {
        // One request answered, for the route's histogram to have something.
        auto c = testing::TlsClient::connect(daemon->public_port());
        REQUIRE(c.ok());
        REQUIRE((*c)->send(testing::http_request("GET", "/v1/models")).ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
    }
    {
        // The header stops after its request line: 408 at header_timeout.
        auto c = testing::TlsClient::connect(daemon->public_port());
        REQUIRE(c.ok());
        REQUIRE((*c)->send("GET /v1/models HTTP/1.1\r\nHost: lo").ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 408);
    }
    {
        // Half a body, then nothing: 408 at body_timeout.
        auto c = testing::TlsClient::connect(daemon->public_port());
        REQUIRE(c.ok());
        REQUIRE((*c)->send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                           "Content-Length: 10\r\n\r\nab")
                    .ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 408);
    }
    const std::string requests = "edgeserve_http_requests_total{route=";
    const std::string durations = "edgeserve_http_request_duration_seconds_count{route=";
    // The observer runs once the answer is written, which the client may read first.
    CHECK(testing::wait_for(
        [&] {
            const std::string text = daemon->metrics().serialize();
            return has(text, requests + R"("/v1/models",status="408"} 1)") &&
                   has(text, requests + R"("/v1/chat/completions",status="408"} 1)");
        },
        std::chrono::seconds(5)));
    const std::string text = daemon->metrics().serialize();
    CHECK_MESSAGE(has(text, requests + R"("/v1/models",status="200"} 1)"), text);
    CHECK_MESSAGE(has(text, durations + R"("/v1/models",status="200"} 1)"), text);
    // The waits for the stalled clients (300 ms each) are in no duration series.
    std::string timed_out;  // The duration series' lines for a 408.
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
        if (line.starts_with("edgeserve_http_request_duration_seconds") &&
            has(line, R"(status="408")")) {
            timed_out += line + "\n";
        }
    }
    CHECK(timed_out == "");
    daemon->stop(std::chrono::milliseconds(0));
}
