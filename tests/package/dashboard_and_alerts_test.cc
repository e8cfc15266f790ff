// deploy/grafana/edgeserve.json and deploy/prometheus/alerts.yml only query series the daemon
// exports: every edgeserve_* name in a panel query, a template variable or an alert expression is
// a family of daemon::Metrics (or its _bucket/_sum/_count). The dashboard has the panels the
// operations guide describes (a geomap by latitude/longitude, an expert heat map, ...), and the
// alerts pass `promtool check rules` and their unit tests.

#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

#include <boost/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "tests/package/exported_metrics.h"
#include "tests/package/package_testing.h"
#include "tests/testing/subprocess.h"

using namespace edge;
using namespace edge::package_testing;

namespace {

// Every string under a key named `key`, anywhere in `v`.
void collect(const boost::json::value& v, const std::string& key, std::vector<std::string>& out) {
    if (v.is_object()) {
        for (const auto& [k, child] : v.as_object()) {
            if (k == key && child.is_string()) {
                out.emplace_back(child.as_string());
            }
            collect(child, key, out);
        }
    } else if (v.is_array()) {
        for (const auto& child : v.as_array()) {
            collect(child, key, out);
        }
    }
}

std::set<std::string> edgeserve_names(const std::string& expr) {
    std::set<std::string> names;
    std::regex re("\\bedgeserve_[a-z0-9_]+");
    for (auto it = std::sregex_iterator(expr.begin(), expr.end(), re); it != std::sregex_iterator();
         ++it) {
        names.insert(it->str());
    }
    return names;
}

boost::json::value dashboard() {
    std::string text = read_file(EDGE_SOURCE_DIR "/deploy/grafana/edgeserve.json");
    REQUIRE(!text.empty());
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(text, ec);
    REQUIRE_MESSAGE(!ec, "edgeserve.json is not JSON: " << ec.message());
    return v;
}

}  // namespace

TEST_CASE("every dashboard query names only series the daemon exports") {
    auto exported = queryable_series(populated_metrics_text());
    boost::json::value d = dashboard();
    std::vector<std::string> exprs;
    collect(d, "expr", exprs);
    collect(d, "definition", exprs);  // Template variables' label_values(...).
    CHECK(exprs.size() >= 20);
    std::set<std::string> used;
    for (const std::string& e : exprs) {
        for (const std::string& name : edgeserve_names(e)) {
            CHECK_MESSAGE(exported.count(name) == 1, name << " in " << e);
            used.insert(name);
        }
        // Only the daemon's series and Prometheus' own `up`.
        std::string rest = std::regex_replace(e, std::regex("\\bedgeserve_[a-z0-9_]+"), "");
        std::smatch m;
        CHECK_MESSAGE(
            !std::regex_search(rest, m, std::regex("\\b[a-z_]+_(total|seconds|ratio)\\b")), e);
    }
    // The dashboard covers traffic, tokens, latency, tenants, routing, membership and engine.
    for (const char* name :
         {"edgeserve_site_info", "edgeserve_http_requests_total",
          "edgeserve_http_request_duration_seconds_bucket", "edgeserve_tenant_tokens_total",
          "edgeserve_tenant_requests_total", "edgeserve_tenant_rejections_total",
          "edgeserve_route_decisions_total", "edgeserve_gossip_members",
          "edgeserve_time_to_first_token_seconds_bucket", "edgeserve_kv_cache_usage_ratio",
          "edgeserve_engine_batch_sequences", "edgeserve_expert_tokens_total",
          "edgeserve_tls_certificate_expiry_timestamp_seconds"}) {
        CHECK_MESSAGE(used.count(name) == 1, name);
    }
}

TEST_CASE("the dashboard has a site geomap, an expert heat map and consistent panels") {
    boost::json::value d = dashboard();
    const auto& root = d.as_object();
    CHECK(root.at("uid").as_string() == "edgeserve-fleet");
    const auto& panels = root.at("panels").as_array();
    std::set<int64_t> ids;
    bool geomap = false, heatmap = false;
    for (const auto& p : panels) {
        const auto& panel = p.as_object();
        INFO(boost::json::serialize(panel.at("title")));
        CHECK(ids.insert(panel.at("id").as_int64()).second);
        CHECK(!panel.at("title").as_string().empty());
        const auto& grid = panel.at("gridPos").as_object();
        CHECK(grid.at("x").as_int64() + grid.at("w").as_int64() <= 24);
        std::string type(panel.at("type").as_string());
        if (type == "row") {
            continue;
        }
        CHECK(panel.at("datasource").at("uid").as_string() == "${datasource}");
        CHECK(!panel.at("targets").as_array().empty());
        if (type == "geomap") {
            geomap = true;
            for (const auto& layer : panel.at("options").at("layers").as_array()) {
                const auto& location = layer.at("location").as_object();
                CHECK(location.at("mode").as_string() == "coords");
                CHECK(location.at("latitude").as_string() == "latitude");
                CHECK(location.at("longitude").as_string() == "longitude");
            }
            std::string first(panel.at("targets").as_array()[0].at("expr").as_string());
            CHECK(first.find("edgeserve_site_info") != std::string::npos);
        }
        if (type == "heatmap") {
            heatmap = true;
            std::string expr(panel.at("targets").as_array()[0].at("expr").as_string());
            CHECK(expr.find("edgeserve_expert_tokens_total") != std::string::npos);
        }
    }
    CHECK(geomap);
    CHECK(heatmap);
}

TEST_CASE("the generated tokens panel counts tokens where the engine generated them") {
    // edgeserve_tenant_tokens_total counts at the site the client connected to, so a site that
    // forwards everything would show all the tokens and the site that served them none.
    boost::json::value d = dashboard();
    std::vector<std::string> exprs;
    for (const auto& p : d.as_object().at("panels").as_array()) {
        if (p.as_object().at("title").as_string() == "Generated tokens/s by site") {
            collect(p, "expr", exprs);
        }
    }
    REQUIRE(exprs.size() == 1);
    std::set<std::string> names = edgeserve_names(exprs[0]);
    CHECK_MESSAGE(names.count("edgeserve_generated_tokens_total") == 1, exprs[0]);
    CHECK_MESSAGE(names.count("edgeserve_tenant_tokens_total") == 0, exprs[0]);
}

TEST_CASE("alert expressions name only exported series and every required alert exists") {
    auto exported = queryable_series(populated_metrics_text());
    YAML::Node rules = YAML::LoadFile(EDGE_SOURCE_DIR "/deploy/prometheus/alerts.yml");
    std::set<std::string> alerts;
    for (const auto& group : rules["groups"]) {
        for (const auto& rule : group["rules"]) {
            std::string expr = rule["expr"].as<std::string>();
            alerts.insert(rule["alert"].as<std::string>());
            for (const std::string& name : edgeserve_names(expr)) {
                CHECK_MESSAGE(exported.count(name) == 1, name << " in " << expr);
            }
            CHECK(rule["annotations"]["summary"].IsDefined());
            CHECK(rule["labels"]["severity"].IsDefined());
        }
    }
    CHECK(alerts ==
          std::set<std::string>{"EdgeserveSiteDown", "EdgeserveHighErrorRatio",
                                "EdgeserveTimeToFirstTokenHigh", "EdgeserveKvCacheNearFull",
                                "EdgeserveGossipMembersMissing", "EdgeserveCertificateExpiringSoon",
                                "EdgeserveTenantRejectionsSpiking", "EdgeserveConfigReloadFailed",
                                "EdgeserveCertificateReloadFailed"});
    // docs/operations.md explains each one.
    std::string ops = read_file(EDGE_SOURCE_DIR "/docs/operations.md");
    for (const std::string& alert : alerts) {
        CHECK_MESSAGE(ops.find("### " + alert) != std::string::npos, alert);
    }
}

TEST_CASE("promtool check rules and promtool test rules pass on the alerts") {
    if (!testing::have_program("promtool")) {
        MESSAGE("promtool not installed (Debian package prometheus); skipping");
        return;
    }
    auto check = testing::run(
        {"promtool", "check", "rules", EDGE_SOURCE_DIR "/deploy/prometheus/alerts.yml"});
    CHECK_MESSAGE(check.exit_code == 0, check.out << check.err);
    CHECK(check.out.find("SUCCESS: 9 rules found") != std::string::npos);
    auto test = testing::run(
        {"promtool", "test", "rules", EDGE_SOURCE_DIR "/deploy/prometheus/alerts_test.yml"}, 60000);
    CHECK_MESSAGE(test.exit_code == 0, test.out << test.err);
    CHECK(test.out.find("SUCCESS") != std::string::npos);
}

TEST_CASE("the operations guide's metrics table lists exactly the families the daemon exports") {
    std::set<std::string> exported;
    for (const auto& [name, type] : metric_types(populated_metrics_text())) {
        exported.insert(name);
    }
    std::set<std::string> documented;
    std::istringstream doc(read_file(EDGE_SOURCE_DIR "/docs/operations.md"));
    std::string line;
    std::regex row("^\\| `(edgeserve_[a-z0-9_]+)` \\|");
    while (std::getline(doc, line)) {
        std::smatch m;
        if (std::regex_search(line, m, row)) {
            documented.insert(m[1].str());
        }
    }
    for (const std::string& name : exported) {
        CHECK_MESSAGE(documented.count(name) == 1, name << " is exported but not documented");
    }
    for (const std::string& name : documented) {
        CHECK_MESSAGE(exported.count(name) == 1, name << " is documented but not exported");
    }
}
