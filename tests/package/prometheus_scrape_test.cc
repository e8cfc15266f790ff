// Debian's Prometheus server, started on loopback with deploy/prometheus/prometheus.yml (ports,
// rule path and a 200 ms scrape interval templated in), scrapes two running daemons that served
// real completions; its HTTP API then answers for request, token, latency and membership series,
// and the alert rules load in the real server.

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <functional>
#include <set>

#include "tests/package/package_testing.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using namespace edge::package_testing;

namespace {

std::string url_encode(const std::string& s) {
    std::string out;
    const char* hex = "0123456789ABCDEF";
    for (unsigned char c : s) {
        if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
            out += static_cast<char>(c);
        } else {
            out += '%';
            out += hex[c >> 4];
            out += hex[c & 15];
        }
    }
    return out;
}

void replace_once(std::string& text, const std::string& from, const std::string& to) {
    size_t pos = text.find(from);
    REQUIRE_MESSAGE(pos != std::string::npos, "deploy/prometheus/prometheus.yml lacks: " << from);
    text.replace(pos, from.size(), to);
}

// One site: a daemon serving the fortunes fixture with a tenant key.
struct Site {
    Site(const testing::TempDir& dir, const std::string& id, double lat, double lon) {
        auto cert = testing::make_certificate(dir.path(), id, {"localhost"});
        // SHA-256 of "sk-prom-test".
        std::string yaml =
            "listeners:\n  public:\n    address: 127.0.0.1\n    port: 0\n    certificates:\n"
            "      - server_names: [localhost]\n        cert: " +
            cert.cert_path + "\n        key: " + cert.key_path +
            "\n  admin:\n    address: 127.0.0.1\n    port: 0\n"
            "site:\n  id: " +
            id + "\n  region: test\n  latitude: " + std::to_string(lat) +
            "\n  longitude: " + std::to_string(lon) +
            "\nmodels:\n  - name: fortunes\n    path: " EDGE_SOURCE_DIR
            "/tests/fixtures/fortunes-qwen3-moe\n"
            "engine:\n  threads: 1\n"
            "tenants:\n  - name: tester\n    api_key_sha256: "
            "[41ec083b12ab1dd65cc6bdff650b4c62c07128aab69785f838eb6c4ac53fae02]\n";
        log = dir.file(id + ".log");
        process = std::make_unique<DaemonProcess>(dir.write(id + ".yaml", yaml), -1, log);
    }
    std::string log;
    std::unique_ptr<DaemonProcess> process;
    uint16_t port = 0, admin = 0;
};

}  // namespace

TEST_CASE("Prometheus scrapes two daemons with deploy/prometheus/prometheus.yml") {
    if (!testing::have_program("prometheus")) {
        MESSAGE("prometheus not installed (Debian package prometheus); skipping");
        return;
    }
    testing::TempDir dir;
    auto key_hash = testing::run({"sh", "-c", "printf '%s' sk-prom-test | sha256sum"});
    REQUIRE(key_hash.out.substr(0, 64) ==
            "41ec083b12ab1dd65cc6bdff650b4c62c07128aab69785f838eb6c4ac53fae02");
    Site fra(dir, "fra1", 50.11, 8.68);
    Site ams(dir, "ams1", 52.37, 4.90);
    for (Site* s : {&fra, &ams}) {
        REQUIRE_MESSAGE(wait_for_text(s->log, "\"event\":\"listening\"", 60000), read_file(s->log));
        s->port = port_from_log(read_file(s->log), "public_port");
        s->admin = port_from_log(read_file(s->log), "admin_port");
        auto c = testing::TlsClient::connect(s->port);
        REQUIRE(c.ok());
        std::string body =
            R"({"model":"fortunes","max_tokens":4,"messages":[{"role":"user","content":"hi"}]})";
        REQUIRE((*c)->send(testing::http_request("POST", "/v1/chat/completions", body,
                                                 "Content-Type: application/json\r\n"
                                                 "Authorization: Bearer sk-prom-test\r\n"))
                    .ok());
        auto reply = (*c)->read_response();
        REQUIRE(reply.ok());
        CHECK_MESSAGE(reply->status == 200, reply->body);
    }

    std::string config = read_file(EDGE_SOURCE_DIR "/deploy/prometheus/prometheus.yml");
    replace_once(config, "scrape_interval: 15s", "scrape_interval: 200ms");
    replace_once(config, "evaluation_interval: 15s", "evaluation_interval: 200ms");
    replace_once(config, "scrape_timeout: 10s", "scrape_timeout: 200ms");
    replace_once(config, "/usr/share/edgeserve/prometheus/alerts.yml",
                 EDGE_SOURCE_DIR "/deploy/prometheus/alerts.yml");
    replace_once(config, "      - targets: [\"127.0.0.1:9443\"]\n",
                 "      - targets: [\"127.0.0.1:" + std::to_string(fra.admin) +
                     "\", \"127.0.0.1:" + std::to_string(ams.admin) + "\"]\n");
    uint16_t prom_port = 0;
    close(listen_loopback(prom_port));  // A free port for Prometheus' web listener.
    std::string prom_log = dir.file("prometheus.log");
    auto which = testing::run({"sh", "-c", "command -v prometheus"});
    std::string prometheus_path = which.out.substr(0, which.out.find('\n'));
    REQUIRE(!prometheus_path.empty());
    testing::Child prometheus(
        {prometheus_path, "--config.file=" + dir.write("prometheus.yml", config),
         "--storage.tsdb.path=" + dir.file("data"),
         "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
        {}, prom_log);

    // Polls an instant query until `accept` likes its result vector (Prometheus is another
    // process scraping on its own clock: there is no timer to drive).
    auto query = [&](const std::string& promql,
                     const std::function<bool(const boost::json::array&)>& accept) {
        std::string last;
        for (int i = 0; i < 300; ++i) {
            auto r =
                testing::plain_http_get(prom_port, "/api/v1/query?query=" + url_encode(promql));
            if (r.ok() && r->status == 200) {
                last = r->body;
                boost::system::error_code ec;
                auto v = boost::json::parse(r->body, ec);
                if (!ec && v.is_object() && v.as_object().contains("data")) {
                    const auto& result = v.at("data").at("result").as_array();
                    if (accept(result)) {
                        return true;
                    }
                }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        FAIL_CHECK("query " << promql << " never matched; last answer: " << last
                            << "\nprometheus log:\n"
                            << read_file(prom_log));
        return false;
    };
    // Accepts a result with exactly one series per daemon, each at least `min_value`; `label`
    // names the label that tells the daemons apart.
    const std::set<std::string> instances = {"127.0.0.1:" + std::to_string(fra.admin),
                                             "127.0.0.1:" + std::to_string(ams.admin)};
    const std::set<std::string> sites = {"fra1", "ams1"};
    auto per_daemon = [](const std::set<std::string>& expected, const std::string& label,
                         double min_value) {
        return [=](const boost::json::array& result) {
            std::set<std::string> seen;
            for (const auto& s : result) {
                double value = std::stod(std::string(s.at("value").as_array()[1].as_string()));
                const auto& metric = s.at("metric").as_object();
                if (value >= min_value && metric.contains(label)) {
                    seen.insert(std::string(metric.at(label).as_string()));
                }
            }
            return seen == expected && result.size() == expected.size();
        };
    };
    auto per_site = [&](double min_value) { return per_daemon(instances, "instance", min_value); };

    CHECK(query("up{job=\"edgeserve\"}", per_site(1)));
    CHECK(
        query("sum by (instance) (edgeserve_http_requests_total{route=\"/v1/chat/completions\","
              "status=\"200\"})",
              per_site(1)));
    CHECK(
        query("sum by (instance) (edgeserve_tenant_tokens_total{tenant=\"tester\","
              "kind=\"completion\"})",
              per_site(1)));
    CHECK(
        query("histogram_quantile(0.99, sum by (instance, le) "
              "(edgeserve_http_request_duration_seconds_bucket))",
              per_site(0)));
    CHECK(query("edgeserve_gossip_members{state=\"alive\"}", per_site(1)));
    // The dashboard's join: each instance's site name and position from edgeserve_site_info.
    CHECK(query("edgeserve_site_info * on (instance) group_left up", per_daemon(sites, "site", 1)));

    // Every dashboard query is valid PromQL for this server (variables filled in as Grafana does).
    boost::json::value dashboard =
        boost::json::parse(read_file(EDGE_SOURCE_DIR "/deploy/grafana/edgeserve.json"));
    std::vector<std::string> exprs;
    std::function<void(const boost::json::value&)> walk = [&](const boost::json::value& v) {
        if (v.is_object()) {
            for (const auto& [k, child] : v.as_object()) {
                if (k == "expr" && child.is_string()) {
                    exprs.emplace_back(child.as_string());
                }
                walk(child);
            }
        } else if (v.is_array()) {
            for (const auto& child : v.as_array()) {
                walk(child);
            }
        }
    };
    walk(dashboard);
    REQUIRE(!exprs.empty());
    for (std::string e : exprs) {
        for (auto [from, to] : {std::pair<std::string, std::string>{"$__rate_interval", "1m"},
                                {"$site", ".*"},
                                {"$model", ".*"}}) {
            for (size_t pos; (pos = e.find(from)) != std::string::npos;) {
                e.replace(pos, from.size(), to);
            }
        }
        auto r = testing::plain_http_get(prom_port, "/api/v1/query?query=" + url_encode(e));
        REQUIRE(r.ok());
        CHECK_MESSAGE(r->status == 200, e << ": " << r->body);
        CHECK_MESSAGE(r->body.find("\"status\":\"success\"") != std::string::npos, e);
        if (e.find("last_over_time(edgeserve_site_info") != std::string::npos) {
            // A fleet map: one row per site, with the coordinates the map places it at.
            auto result = boost::json::parse(r->body).at("data").at("result").as_array();
            CHECK_MESSAGE(result.size() == 2, e << ": " << r->body);
            for (const auto& row : result) {
                const auto& metric = row.at("metric").as_object();
                std::string site(metric.at("site").as_string());
                CHECK(metric.at("latitude").as_string() ==
                      (site == "fra1" ? "50.1100" : "52.3700"));
                CHECK(metric.at("longitude").as_string() == (site == "fra1" ? "8.6800" : "4.9000"));
            }
        }
    }

    auto rules = testing::plain_http_get(prom_port, "/api/v1/rules");
    REQUIRE(rules.ok());
    for (const char* alert :
         {"EdgeserveSiteDown", "EdgeserveHighErrorRatio", "EdgeserveTimeToFirstTokenHigh",
          "EdgeserveKvCacheNearFull", "EdgeserveGossipMembersMissing",
          "EdgeserveCertificateExpiringSoon", "EdgeserveTenantRejectionsSpiking"}) {
        CHECK_MESSAGE(rules->body.find(alert) != std::string::npos, alert);
    }
    // Health: no rule failed to evaluate against the live series.
    CHECK(rules->body.find("\"health\":\"err\"") == std::string::npos);

    prometheus.signal(SIGTERM);
    CHECK(prometheus.wait(20000) == 0);
    for (Site* s : {&fra, &ams}) {
        s->process->signal(SIGTERM);
        CHECK(s->process->wait(15000) == 0);
    }
}
