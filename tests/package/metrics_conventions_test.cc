// Metric naming follows Prometheus conventions (edgeserve_ prefix, base units, _total counters,
// bounded labels), `promtool check metrics` accepts both every family Metrics can export and a
// live daemon's /metrics, and the daemon exports its site, certificate expiry and membership.

#include <doctest/doctest.h>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "daemon/certificate_expiry.h"
#include "tests/package/exported_metrics.h"
#include "tests/package/package_testing.h"
#include "tests/testing/config_yaml.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using namespace edge::package_testing;

namespace {

// promtool's lint over the exposition text: "" when clean, else what it said.
std::string promtool_lint(const std::string& text) {
    auto r = testing::run({"promtool", "check", "metrics"}, 30000, text);
    if (r.exit_code == 0 && r.out.empty() && r.err.empty()) {
        return "";
    }
    return "exit " + std::to_string(r.exit_code) + ": " + r.out + r.err;
}

}  // namespace

TEST_CASE("every metric family is edgeserve_-prefixed, in base units, with bounded labels") {
    std::string text = populated_metrics_text();
    auto types = metric_types(text);
    CHECK(types.size() >= 19);
    for (const auto& [name, type] : types) {
        INFO(name);
        CHECK(name.rfind("edgeserve_", 0) == 0);
        bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
        CHECK((type == "counter") == total);
        // No milliseconds, kilobytes or percentages: seconds, bytes and ratios only.
        for (const char* unit : {"_ms", "_milliseconds", "_kb", "_mb", "_percent"}) {
            CHECK(name.find(unit) == std::string::npos);
        }
    }
    // Labels: never an identifier that grows with traffic or carries a secret.
    std::regex label_re("([a-z_]+)=\"");
    std::set<std::string> labels;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), label_re);
         it != std::sregex_iterator(); ++it) {
        labels.insert((*it)[1]);
    }
    for (const char* forbidden :
         {"request_id", "id", "prompt", "key", "api_key", "user", "path", "client", "address"}) {
        CHECK_MESSAGE(labels.count(forbidden) == 0, forbidden);
    }
    for (const char* name :
         {"edgeserve_tls_certificate_expiry_timestamp_seconds", "edgeserve_gossip_members",
          "edgeserve_site_info", "edgeserve_time_to_first_token_seconds",
          "edgeserve_kv_cache_usage_ratio", "edgeserve_route_decisions_total",
          "edgeserve_engine_batch_sequences", "edgeserve_expert_tokens_total",
          "edgeserve_kv_swap_bytes", "edgeserve_preempted_tokens_recomputed_total"}) {
        CHECK_MESSAGE(types.count(name) == 1, name);
    }
    CHECK(text.find("edgeserve_kv_swap_bytes{model=\"qwen3-moe\"} 4096\n") != std::string::npos);
    CHECK(text.find("edgeserve_preempted_tokens_recomputed_total{model=\"qwen3-moe\"} 37\n") !=
          std::string::npos);
}

TEST_CASE("unknown gossip states and route outcomes are dropped, not turned into labels") {
    daemon::Metrics m;
    m.set_gossip_members("bogus", 5);
    m.on_route_decision("sideways", "x");
    std::string text = m.serialize();
    CHECK(text.find("bogus") == std::string::npos);
    CHECK(text.find("sideways") == std::string::npos);
    CHECK(text.find("edgeserve_gossip_members{state=\"dead\"} 0") != std::string::npos);
}

TEST_CASE("promtool check metrics accepts every family Metrics exports") {
    if (!testing::have_program("promtool")) {
        MESSAGE("promtool not installed (Debian package prometheus); skipping");
        return;
    }
    std::string lint = promtool_lint(populated_metrics_text());
    CHECK_MESSAGE(lint.empty(), lint);
}

TEST_CASE("a live daemon's /metrics: promtool-clean, with site, certificate expiry, members") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    std::string config = dir.write("c.yaml", testing::config_yaml(cert.cert_path, cert.key_path));
    std::string log = dir.file("log");
    DaemonProcess d(config, -1, log);
    REQUIRE(wait_for_text(log, "\"event\":\"listening\""));
    uint16_t port = port_from_log(read_file(log), "public_port");
    uint16_t admin = port_from_log(read_file(log), "admin_port");
    auto client = testing::TlsClient::connect(port);
    REQUIRE(client.ok());
    REQUIRE((*client)->send(testing::http_request("GET", "/v1/models")).ok());
    REQUIRE((*client)->read_response().ok());

    auto metrics = testing::plain_http_get(admin, "/metrics");
    REQUIRE(metrics.ok());
    REQUIRE(metrics->status == 200);
    const std::string& text = metrics->body;
    CHECK(text.find("edgeserve_http_requests_total{route=\"/v1/models\",status=\"200\"} 1") !=
          std::string::npos);
    CHECK(
        text.find("edgeserve_site_info{latitude=\"50.1000\",longitude=\"8.7000\",region=\"local\","
                  "site=\"test-site\"} 1") != std::string::npos);
    CHECK(text.find("edgeserve_gossip_members{state=\"alive\"} 1") != std::string::npos);
    auto not_after = daemon::certificate_not_after(cert.cert_path);
    REQUIRE(not_after.ok());
    std::smatch m;
    REQUIRE(std::regex_search(
        text, m,
        std::regex("edgeserve_tls_certificate_expiry_timestamp_seconds\\{certificate=\"localhost\""
                   "\\} ([0-9.e+]+)")));
    CHECK(static_cast<int64_t>(std::stod(m[1])) == *not_after);
    // The test certificate is valid for about two days.
    CHECK(*not_after - time(nullptr) > 40 * 3600);
    CHECK(*not_after - time(nullptr) <= 49 * 3600);

    if (testing::have_program("promtool")) {
        std::string lint = promtool_lint(text);
        CHECK_MESSAGE(lint.empty(), lint);
    } else {
        MESSAGE("promtool not installed (Debian package prometheus); skipping the lint");
    }
    d.signal(SIGTERM);
    CHECK(d.wait(15000) == 0);
}

TEST_CASE("certificate expiry labels are one per chain, even where names or file names repeat") {
    const std::vector<tls::CertificateConfig> certs = {
        {{"a.example", "b.example"}, "/etc/le/live/a/fullchain.pem", "k"},
        {{}, "/etc/le/live/b/fullchain.pem", "k"},
        {{}, "/etc/le/live/c/fullchain.pem", "k"},
        {{"a.example"}, "/etc/tls/a2.pem", "k"},
        {{"c.example"}, "/etc/tls/c.pem", "k"},
        {{}, "/etc/tls/only.pem", "k"},
    };
    // Shared labels hid one chain's expiry behind another's (the last written won).
    CHECK(daemon::certificate_labels(certs) ==
          std::vector<std::string>{"/etc/le/live/a/fullchain.pem", "/etc/le/live/b/fullchain.pem",
                                   "/etc/le/live/c/fullchain.pem", "/etc/tls/a2.pem", "c.example",
                                   "only.pem"});
}

TEST_CASE("certificate_not_after names the file it cannot read") {
    auto missing = daemon::certificate_not_after("/nonexistent/cert.pem");
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.status().message().find("/nonexistent/cert.pem") != std::string::npos);
    testing::TempDir dir;
    auto garbage = daemon::certificate_not_after(dir.write("x.pem", "not a certificate\n"));
    REQUIRE_FALSE(garbage.ok());
    CHECK(garbage.status().message().find("no PEM certificate") != std::string::npos);
}
