// Metrics::retain_sites: a site gone from membership loses its per-site series; live sites keep
// theirs, counts included; a site seen again starts new series. HELP lines say what is measured.

#include "daemon/metrics.h"

#include <boost/json.hpp>
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/log.h"
#include "daemon/access_log.h"

using edge::daemon::Metrics;

namespace {

bool has(const Metrics& m, const std::string& series) {
    return m.serialize().find(series) != std::string::npos;
}

}  // namespace

TEST_CASE("metrics: retain_sites drops the series of gone sites and keeps the live ones") {
    Metrics m;
    for (const std::string site : {"ams", "sin"}) {
        m.on_route_decision("forwarded", site);
        m.on_route_decision("forwarded", site);
        m.on_route_ejection(site);
        m.set_site_rtt(site, 0.25);
        m.on_forwarded(site, "ok");
        m.on_forward_latency(site, std::chrono::milliseconds(3));
    }
    m.on_route_decision("local", "fra");
    m.on_route_decision("rejected", "");

    m.retain_sites({"fra", "ams"});
    CHECK_MESSAGE(!has(m, "site=\"sin\""), m.serialize());
    CHECK(has(m, "edgeserve_route_decisions_total{outcome=\"forwarded\",site=\"ams\"} 2"));
    CHECK(has(m, "edgeserve_route_ejections_total{site=\"ams\"} 1"));
    CHECK(has(m, "edgeserve_site_rtt_seconds{site=\"ams\"} 0.25"));
    CHECK(has(m, "edgeserve_forwarded_requests_total{outcome=\"ok\",site=\"ams\"} 1"));
    CHECK(has(m, "edgeserve_forward_latency_seconds_count{site=\"ams\"} 1"));
    CHECK(has(m, "edgeserve_route_decisions_total{outcome=\"local\",site=\"fra\"} 1"));
    CHECK(has(m, "edgeserve_route_decisions_total{outcome=\"rejected\",site=\"\"} 1"));

    // sin comes back: new series from 0; retaining again keeps ams' counts as they were.
    m.on_route_decision("forwarded", "sin");
    CHECK(has(m, "edgeserve_route_decisions_total{outcome=\"forwarded\",site=\"sin\"} 1"));
    m.retain_sites({"fra", "ams", "sin"});
    CHECK(has(m, "edgeserve_route_decisions_total{outcome=\"forwarded\",site=\"ams\"} 2"));
    CHECK(has(m, "edgeserve_route_decisions_total{outcome=\"forwarded\",site=\"sin\"} 1"));
    m.retain_sites({});
    CHECK(!has(m, "site=\"ams\""));
    CHECK(!has(m, "site=\"fra\""));
    CHECK(has(m, "site=\"\""));  // Rejected decisions name no site.
}

// A reload removed tenant "old" while nothing of it ran: its series went. A request it had
// authenticated just before the reload, refused after it (it holds no slot), counted again and
// brought them back, partial, until the next reload.
TEST_CASE("metrics: a removed tenant's dropped series are not brought back by a late count") {
    Metrics m;
    m.set_tenants({"old", "kept"}, nullptr);
    m.on_tenant_request("old", "ok");
    m.on_tenant_request("kept", "ok");
    m.set_tenants({"kept"}, [](const std::string&) { return false; });
    CHECK_FALSE(has(m, "tenant=\"old\""));
    m.on_tenant_rejected("old", "rate_limited");
    m.on_tenant_request("old", "rejected");
    m.on_tenant_tokens("old", 3, 4);
    CHECK_MESSAGE(!has(m, "tenant=\"old\""), m.serialize());
    CHECK(has(m, "edgeserve_tenant_requests_total{outcome=\"ok\",tenant=\"kept\"} 1"));

    // Busy at the reload: kept, and counted until it is dropped at a later one.
    m.set_tenants({"kept", "busy"}, nullptr);
    m.on_tenant_request("busy", "ok");
    m.set_tenants({"kept"}, [](const std::string& name) { return name == "busy"; });
    m.on_tenant_request("busy", "ok");
    m.on_tenant_rejected("busy", "rate_limited");
    CHECK(has(m, "edgeserve_tenant_requests_total{outcome=\"ok\",tenant=\"busy\"} 2"));
    CHECK(has(m, "tenant=\"busy\"} 1"));
    m.set_tenants({"kept"}, [](const std::string&) { return false; });
    CHECK_FALSE(has(m, "tenant=\"busy\""));

    // A name added back by a later reload counts again, from 0.
    m.set_tenants({"kept", "old"}, nullptr);
    m.on_tenant_request("old", "ok");
    CHECK(has(m, "edgeserve_tenant_requests_total{outcome=\"ok\",tenant=\"old\"} 1"));
}

TEST_CASE("metrics: a tenant removed while its first request runs counts that request") {
    // Busy at the reload but with no series yet: the late count made none, as for a tenant
    // whose series were dropped, and the request was never counted.
    Metrics m;
    m.set_tenants({"first", "kept"}, nullptr);
    m.set_tenants({"kept"}, [](const std::string& name) { return name == "first"; });
    m.on_tenant_tokens("first", 3, 4);
    m.on_tenant_request("first", "ok");
    CHECK_MESSAGE(has(m, "edgeserve_tenant_requests_total{outcome=\"ok\",tenant=\"first\"} 1"),
                  m.serialize());
    CHECK(has(m, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"first\"} 4"));
    m.set_tenants({"kept"}, [](const std::string&) { return false; });
    CHECK_FALSE(has(m, "tenant=\"first\""));
    // Idle at a reload with no series: none made by a late count.
    m.set_tenants({"kept", "idle"}, nullptr);
    m.set_tenants({"kept"}, [](const std::string&) { return false; });
    m.on_tenant_request("idle", "rejected");
    CHECK_FALSE(has(m, "tenant=\"idle\""));
}

TEST_CASE("metrics: the certificate expiry HELP says it is the chain's earliest notAfter") {
    // The gauge is the earliest date of any certificate a chain sends (certificate_expiry.h): a
    // HELP naming the leaf sent an on-call engineer to a leaf that was fine while an intermediate
    // lapsed.
    Metrics m;
    m.set_certificate_expiry("localhost", 1800000000);
    const std::string text = m.serialize();
    const std::string help = "# HELP edgeserve_tls_certificate_expiry_timestamp_seconds ";
    const size_t at = text.find(help);
    REQUIRE(at != std::string::npos);
    const std::string line = text.substr(at, text.find('\n', at) - at);
    CHECK_MESSAGE(line.find("Earliest notAfter among the certificates each served chain sends") !=
                      std::string::npos,
                  line);
    CHECK_MESSAGE(line.find("chain's leaf") == std::string::npos, line);
}

TEST_CASE("metrics: engine latency histograms reach minutes") {
    // A reply of thousands of tokens takes minutes end to end: with 30 s as the last bound its
    // p99 read as +Inf.
    Metrics m;
    m.set_serving_source([] {
        edge::engine::ServingStats s;
        s.model = "m";
        edge::engine::LatencyHistogram& h = s.tenants["acme"].end_to_end;
        h.observe(100.0);
        h.observe(400.0);
        return std::vector<edge::engine::ServingStats>{s};
    });
    const std::string bucket =
        "edgeserve_end_to_end_latency_seconds_bucket{model=\"m\",tenant=\"acme\",le=";
    CHECK(has(m, bucket + "\"30\"} 0"));
    CHECK(has(m, bucket + "\"120\"} 1"));
    CHECK(has(m, bucket + "\"600\"} 2"));
    CHECK(has(m, bucket + "\"+Inf\"} 2"));
}

TEST_CASE("access log: note text that is not UTF-8 is escaped, so the line stays JSON") {
    edge::daemon::AccessLog access_log(nullptr, "public", true);
    std::vector<std::string> lines;
    edge::log::set_sink([&](std::string_view line) { lines.emplace_back(line); });
    edge::tls::ResponseRecord record;
    record.method = "POST";
    record.path = "/v1/completions";
    record.status = 200;
    // A forwarding site's name as a peer sent it (with verify_site_identity off), and a number.
    const std::vector<edge::tls::ResponseNote> notes{{"from_site", std::string("a\xff\xfe" "b")},
                                                     {"prompt_tokens", int64_t{7}}};
    record.notes = notes;
    access_log.on_response(record);
    edge::log::set_sink(nullptr);
    REQUIRE(lines.size() == 1);
    INFO(lines[0]);
    CHECK(lines[0].find(R"("from_site":"a\\xff\\xfeb")") != std::string::npos);
    CHECK(lines[0].find(R"("prompt_tokens":7)") != std::string::npos);
    CHECK(lines[0].find('\xff') == std::string::npos);
    boost::system::error_code ec;
    boost::json::parse(lines[0], ec);
    CHECK_FALSE(ec);
}

TEST_CASE("access log: a method that is not an HTTP token is logged as (unparsed), not as sent") {
    edge::daemon::AccessLog access_log(nullptr, "public", true);
    std::vector<std::string> lines;
    edge::log::set_sink([&](std::string_view line) { lines.emplace_back(line); });
    // What a 408's record carries: the request line's first word as the client sent it.
    const std::string long_method(16 * 1024, 'G');
    for (const std::string& method :
         {std::string("POST"), std::string("M-SEARCH"), std::string(), std::string("GE\xff\xfeT"),
          std::string("G\"E\\T"), std::string("GET\x01"), long_method}) {
        edge::tls::ResponseRecord record;
        record.method = method;
        record.path = "/v1/models";
        record.status = 408;
        access_log.on_response(record);
    }
    edge::log::set_sink(nullptr);
    REQUIRE(lines.size() == 7);
    CHECK(lines[0].find(R"("method":"POST")") != std::string::npos);
    CHECK(lines[1].find(R"("method":"M-SEARCH")") != std::string::npos);
    CHECK(lines[2].find(R"("method":"")") != std::string::npos);  // The server's own answers.
    for (size_t i = 3; i < lines.size(); ++i) {
        INFO(lines[i].substr(0, 200));
        CHECK(lines[i].find("\"method\":\"(unparsed)\"") != std::string::npos);
        CHECK(lines[i].size() < 512);
    }
}
