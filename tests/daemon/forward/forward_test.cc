// Forwarding between sites end to end (the fixture: forward_fixture.h). Cuts and timeouts of an
// answer a peer accepted: forward_cut_test.cc.

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "daemon/cluster/route_planner.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/forward/peer_client.h"
#include "daemon/metrics.h"
#include "daemon/tenants.h"
#include "tests/daemon/forward/forward_fixture.h"
#include "tests/testing/daemon_yaml.h"
#include "tests/testing/loopback_socket.h"
#include "tests/testing/scripted_generator.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/test_daemon.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using daemon::cluster::RoutePlan;
using daemon::cluster::RouteRejection;
using daemon::cluster::RouteTarget;
using edge::testing::TlsClient;

using namespace edge::testing::forward;

TEST_CASE("the cluster certificate's and the cluster CA's expiry are on /metrics") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"});
    const std::string metrics = a.daemon->metrics().serialize();
    for (const std::string label : {"peer:fra.crt", "peer-ca:cluster-ca.crt", "localhost"}) {
        INFO(label);
        CHECK(metrics.find("edgeserve_tls_certificate_expiry_timestamp_seconds{certificate=\"" +
                           label + "\"}") != std::string::npos);
    }
}

TEST_CASE("/v1/models lists the models other sites serve beside this site's own") {
    Cluster cluster;
    Site a(cluster, "a", {"m"}, tenants_section());
    a.planner.set_cluster_models({"far-model", "m"});
    auto c = a.client();
    REQUIRE(c->send(testing::http_request("GET", "/v1/models", "", auth())).ok());
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    std::vector<std::string> ids;
    const boost::json::object list = json_of(r->body);
    for (const auto& m : list.at("data").as_array()) {
        ids.emplace_back(m.as_object().at("id").as_string());
    }
    CHECK(ids == std::vector<std::string>{"m", "far-model"});
    REQUIRE(c->send(testing::http_request("GET", "/v1/models/far-model", "", auth())).ok());
    auto one = c->read_response();
    REQUIRE(one.ok());
    CHECK(one->status == 200);
    CHECK(json_of(one->body)["id"] == "far-model");
}

TEST_CASE("forwarded non-streamed completion arrives intact, over one pooled mTLS connection") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"m"});
    a.planner.route_to({b.target()});

    for (size_t i = 0; i < 2; ++i) {
        auto c = a.client();
        REQUIRE(c->send(chat_request(false, "m", "X-Model-Version: v1\r\n")).ok());
        if (!b.generator.wait_for_request(i)) {
            auto r = c->read_response();
            std::string what = r.ok() ? std::to_string(r->status) + r->body
                                      : r.status().to_string();
            FAIL(what);
        }
        auto req = b.generator.request(i);
        // B has no tenants of its own: the engine knows every forwarded tenant by one name,
        // but its prefix-cache entries are its own, not the anonymous tenant's every forwarded
        // tenant (and B's own clients) would share.
        CHECK(req.tenant == daemon::kForwardedTenant);
        CHECK(req.cache_scope == "forwarded:acme");
        CHECK(req.model == "m");
        b.generator.emit(i, "Hello");
        b.generator.emit(i, " world");
        b.generator.finish(i, engine::FinishReason::kStop, engine::Usage{5, 2, 0});
        auto r = c->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        CHECK(r->headers["x-edgeserve-site"] == "sin");
        auto body = json_of(r->body);
        CHECK(body["choices"].as_array()[0].as_object()["message"].as_object()["content"] ==
              "Hello world");
        CHECK(body["usage"].as_object()["total_tokens"] == 7);
    }
    CHECK_FALSE(a.generator.wait_for_request(0, 0));  // Nothing ran at the forwarding site.
    CHECK(a.planner.last_pin() == "v1");
    CHECK(a.daemon->forwarder()->connections_opened() == 1);  // Keep-alive pool reused.
    auto reports = a.planner.reports();
    REQUIRE(reports.size() == 2);
    CHECK(reports[0].site == "sin");
    CHECK(reports[0].ok);
    CHECK(metrics_contain(a, "edgeserve_forwarded_requests_total{outcome=\"ok\",site=\"sin\"} 2"));
    // The forwarding site charged the tenant the peer's usage.
    CHECK(metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 10"));
    CHECK(metrics_contain(a, "edgeserve_forward_latency_seconds_count{site=\"sin\"} 2"));
}

// Collects the access log's lines ("event":"request") while it lives.
class AccessLines {
public:
    AccessLines() {
        log::set_sink([this](std::string_view line) {
            boost::json::object v = json_of(std::string(line));
            if (v["event"] == "request") {
                std::lock_guard lock(mu_);
                lines_.push_back(std::move(v));
            }
        });
    }
    ~AccessLines() { log::set_sink(nullptr); }
    size_t count() {
        std::lock_guard lock(mu_);
        return lines_.size();
    }
    // The lines so far, once there are `n` (5 s at most).
    std::vector<boost::json::object> wait(size_t n) {
        testing::wait_for([&] { return count() >= n; }, std::chrono::seconds(5));
        std::lock_guard lock(mu_);
        return lines_;
    }

private:
    std::mutex mu_;
    std::vector<boost::json::object> lines_;
};

TEST_CASE("pooled connections idle past pool_idle_timeout are closed, a departed peer's too") {
    Cluster cluster;
    // Long enough for a forward on a busy sanitizer build to come back within it.
    Site a(cluster, "fra", {"m"}, tenants_section(), true, "  pool_idle_timeout_ms: 1500\n");
    Site b(cluster, "sin", {"m"});
    Site c(cluster, "syd", {"m"});
    auto forward_once = [&](Site& to, size_t index) {
        a.planner.route_to({to.target()});
        auto client = a.client();
        REQUIRE(client->send(chat_request(false)).ok());
        REQUIRE(to.generator.wait_for_request(index));
        to.generator.emit(index, "ok");
        to.generator.finish(index, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
        auto r = client->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
    };
    auto* forwarder = a.daemon->forwarder();
    auto idle_is = [&](int64_t n) {
        return testing::wait_for([&] { return forwarder->idle_connections() == n; },
                                 std::chrono::seconds(5));
    };
    forward_once(b, 0);
    CHECK(idle_is(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(1600));
    // Nothing goes to sin any more (it left the cluster, say): its stale connection is closed
    // when the next connection, syd's, comes back to the pool.
    forward_once(c, 0);
    CHECK(idle_is(1));
    CHECK(forwarder->connections_opened() == 2);
    // Within the timeout syd's connection is reused; past it, a new one is opened.
    forward_once(c, 1);
    CHECK(forwarder->connections_opened() == 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(1600));
    forward_once(c, 2);
    CHECK(forwarder->connections_opened() == 3);
    CHECK(idle_is(1));
}

TEST_CASE("the access log has one line per answer, written at its end, on both sites of a forward") {
    AccessLines log;
    Cluster cluster;
    const std::string logged = "log:\n  access_log: true\n";
    Site a(cluster, "fra", {"m"}, tenants_section() + logged);
    Site b(cluster, "sin", {"m"}, logged);
    a.planner.route_to({b.target()});

    auto c = a.client();
    REQUIRE(c->send(chat_request(false)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(log.count() == 0);  // Nothing before the answer ends.
    b.generator.emit(0, "Hello");
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{5, 2, 0});
    auto r = c->read_response();
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
    // A key no tenant holds: refused before any tenant is known.
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false),
                                          "Authorization: Bearer sk-wrong\r\n"))
                .ok());
    auto refused = c->read_response();
    REQUIRE(refused.ok());
    CHECK(refused->status == 401);

    std::vector<boost::json::object> lines = log.wait(3);
    REQUIRE(lines.size() == 3);
    const boost::json::object* public_line = nullptr;
    const boost::json::object* peer_line = nullptr;
    const boost::json::object* denied_line = nullptr;
    for (const auto& l : lines) {
        if (l.at("status") == 401) {
            denied_line = &l;
        } else if (l.at("status") == 200) {
            (l.at("listener") == "peer" ? peer_line : public_line) = &l;
        }
    }
    REQUIRE(public_line != nullptr);
    REQUIRE(peer_line != nullptr);
    REQUIRE(denied_line != nullptr);
    const boost::json::object& fra = *public_line;
    const boost::json::object& sin = *peer_line;
    CHECK(fra.at("method") == "POST");
    CHECK(fra.at("path") == "/v1/chat/completions");
    CHECK(fra.at("client") == "127.0.0.1");
    CHECK(fra.at("complete") == true);
    CHECK(fra.at("body_bytes").to_number<uint64_t>() == r->body.size());
    CHECK(fra.at("duration_ms").to_number<double>() >= 0.0);
    CHECK(fra.at("tenant") == "acme");
    CHECK(fra.at("model") == "m");
    CHECK(fra.at("served_by") == "sin");
    CHECK(fra.at("attempts") == 1);
    CHECK(fra.at("prompt_tokens") == 5);
    CHECK(fra.at("completion_tokens") == 2);
    // Both sites name the request by the response's id.
    CHECK("chatcmpl-" + std::string(fra.at("request_id").as_string()) ==
          json_of(r->body).at("id").as_string());
    CHECK(sin.at("request_id") == fra.at("request_id"));
    CHECK(sin.at("from_site") == "fra");
    CHECK(sin.at("tenant") == "acme");
    CHECK(sin.at("served_by") == "sin");
    CHECK(sin.at("outcome") == "ok");
    CHECK(sin.at("completion_tokens") == 2);
    const boost::json::object& denied = *denied_line;
    CHECK(denied.at("status") == 401);
    CHECK(denied.at("listener") == "public");
    CHECK_FALSE(denied.contains("tenant"));
    // No key reaches the log.
    for (const auto& l : lines) {
        CHECK(boost::json::serialize(l).find("sk-") == std::string::npos);
    }
}

TEST_CASE("forwarded SSE stream passes chunks through as they are produced") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"m"});
    a.planner.route_to({b.target()});

    auto c = a.client();
    REQUIRE(c->send(chat_request(true)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    b.generator.emit(0, "Hel");
    // The first token reaches the client while the generation is still running.
    auto first = c->read_until("Hel");
    REQUIRE(first.ok());
    CHECK(first->find("200 OK") != std::string::npos);
    CHECK(first->find("text/event-stream") != std::string::npos);
    CHECK(first->find("X-Edgeserve-Site: sin") != std::string::npos);
    b.generator.emit(0, "lo");
    auto second = c->read_until("lo\"");
    REQUIRE(second.ok());
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{4, 2, 0});
    auto rest = c->read_until("data: [DONE]\n\n");
    REQUIRE(rest.ok());
    REQUIRE(c->read_until("0\r\n\r\n").ok());  // The stream's end.
    CHECK(rest->find("\"finish_reason\":\"stop\"") != std::string::npos);
    CHECK(rest->find("\"prompt_tokens\":4") != std::string::npos);
    // Usage read from the stream reached the tenant's accounting at the forwarding site.
    CHECK(metrics_contain(
        a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 2"));
}

TEST_CASE("a forwarded stream without include_usage charges the tenant the peer's real usage") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section() + "    output_tokens_per_minute: 5\n");
    Site b(cluster, "sin", {"m"});
    a.planner.route_to({b.target()});
    const std::string plain_stream = testing::http_request(
        "POST", "/v1/chat/completions",
        R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true})", auth());

    auto c = a.client();
    // A client's own cap header is not the forwarding site's: replaced.
    const std::string stream_body =
        R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true})";
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", stream_body,
                                          auth() + "X-Edgeserve-Max-Tokens: 100000\r\n"))
                .ok());
    REQUIRE(b.generator.wait_for_request(0));
    // The default max_tokens, lowered to the tenant's minute budget at fra, holds at sin too.
    CHECK(b.generator.request(0).sampling.max_tokens == 5);
    b.generator.emit(0, "Hello");
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{3, 20, 0});
    auto all = c->read_until("0\r\n\r\n");
    REQUIRE(all.ok());
    CHECK(all->find("data: [DONE]\n\n") != std::string::npos);
    // The peer's report is for the forwarding site only: the client sees what it asked for.
    CHECK(all->find("edgeserve-usage") == std::string::npos);
    CHECK(all->find("\"usage\"") == std::string::npos);
    CHECK(metrics_contain(
        a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 20"));
    CHECK(metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 3"));

    // 20 tokens against 5 per minute: the tenant is in debt, as if the request had run here.
    check_in_debt(a, b, plain_stream, 1);
}

TEST_CASE("a client leaving a forwarded stream is charged its max_tokens, not nothing") {
    // The peer's usage report comes at the end: a client that left before it was charged 0
    // tokens, so a tenant could stream for free by leaving early. It now pays the most the
    // request could generate (its max_tokens, here the default lowered to the 5 of its minute
    // budget), as a request that ran.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section() + "    output_tokens_per_minute: 5\n");
    Site b(cluster, "sin", {"m"});
    a.planner.route_to({b.target()});
    auto c = a.client();
    REQUIRE(c->send(chat_request(true)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    b.generator.emit(0, "tok");
    REQUIRE(c->read_until("tok").ok());
    c->close();
    REQUIRE(b.generator.wait_cancelled(0));
    b.generator.finish(0, engine::FinishReason::kCancelled, engine::Usage{3, 1, 0});
    check_in_debt(a, b, chat_request(true), 1);
}

TEST_CASE("a client leaving a forwarded stream pays its prompt, told on the stream's head") {
    // The prompt was charged only from the usage report at the end: leaving early read any
    // prompt for free, where the same request run here is charged it on acceptance.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section() + "    input_tokens_per_minute: 100\n");
    Site b(cluster, "sin", {"m"});
    b.generator.set_prompt_tokens(1000);
    a.planner.route_to({b.target()});
    auto c = a.client();
    REQUIRE(c->send(chat_request(true)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    b.generator.emit(0, "tok");
    Result<std::string> head = c->read_until("tok");
    REQUIRE(head.ok());
    // The count is for the forwarding site only.
    CHECK(head->find("X-Edgeserve-Prompt-Tokens") == std::string::npos);
    CHECK(head->find("x-edgeserve-prompt-tokens") == std::string::npos);
    c->close();
    REQUIRE(b.generator.wait_cancelled(0));
    b.generator.finish(0, engine::FinishReason::kCancelled, engine::Usage{1000, 1, 0});
    check_in_debt(a, b, chat_request(true), 1);
    CHECK(
        metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 1000"));
    // Tokens served count what is known: not the max_tokens charged for the unknown rest.
    CHECK(
        metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 0"));
}

TEST_CASE("a forwarded stream's prompt is charged when the peer accepts it, not at its end") {
    // A forwarded request was charged its prompt only when it ended, a local
    // run on its acceptance: a tenant's long streams elsewhere were all admitted, far beyond
    // input_tokens_per_minute, before the first one's end put the bucket in debt.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section() + "    input_tokens_per_minute: 100\n");
    Site b(cluster, "sin", {"m"});
    b.generator.set_prompt_tokens(1000);
    a.planner.route_to({b.target()});
    auto c = a.client();
    REQUIRE(c->send(chat_request(true)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    b.generator.emit(0, "tok");
    REQUIRE(c->read_until("tok").ok());  // Its head, which told fra the prompt, came first.
    // Still streaming: the tenant's input tokens are in debt already.
    auto second = a.ask(chat_request(true));
    CHECK(second->status == 429);
    CHECK(error_code_of(*second) == "input_tokens_per_minute");
    CHECK_FALSE(b.generator.wait_for_request(1, 0));
    // Its end charges what the peer reports beyond that, not the prompt once more.
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1000, 1, 0});
    REQUIRE(c->read_until("data: [DONE]").ok());
    CHECK(request_counted(a, "ok"));
    // 1000 tokens at 100 a minute: back out of debt after 9 minutes and a bit, not 19.
    a.clock.advance(std::chrono::seconds(9 * 60 + 1));
    auto third = a.client();
    REQUIRE(third->send(chat_request(false)).ok());
    REQUIRE(b.generator.wait_for_request(1));
    b.generator.finish(1, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    auto served = third->read_response();
    REQUIRE(served.ok());
    CHECK(served->status == 200);
}

TEST_CASE("a deferred answer cut after the peer accepted: tried once more, never refunded") {
    // The peer accepted (its deferred head, with the prompt's length), then died.
    const std::string accepted_then_died = kAcceptedDeferredHead;
    SUBCASE("another site answers: the client gets its answer, charged once") {
        Cluster cluster;
        Site a(cluster, "fra", {"m"}, tenants_section());
        Site b(cluster, "sin", {"m"});
        RawPeer raw(cluster, accepted_then_died);
        a.planner.route_to({raw.target(), b.target()});
        auto client = a.client();
        REQUIRE(client->send(chat_request(false)).ok());
        REQUIRE(b.generator.wait_for_request(0));
        b.generator.emit(0, "second run");
        b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{3, 2, 0});
        auto r = client->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        CHECK(r->headers["x-edgeserve-site"] == "sin");
        CHECK(
            metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 3"));
    }
    SUBCASE("no other site can: a 503, charged as a request that ran (its told prompt)") {
        // It was refunded in full as one every site refused (peer_refused), rate token too.
        Cluster cluster;
        Site a(cluster, "fra", {"m"}, tenants_section());
        RawPeer raw(cluster, accepted_then_died);
        RouteTarget dead{false, "ams", "127.0.0.1:" + std::to_string(refused_port()), 0.0, "m"};
        a.planner.route_to({raw.target(), dead});
        auto r = a.ask(chat_request(false));
        CHECK(r->status == 503);
        CHECK(request_counted(a, "error"));
        CHECK_FALSE(metrics_contain(a, "reason=\"peer_refused\""));
        CHECK(metrics_contain(a,
                              "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 40"));
    }
    SUBCASE("the next site refuses it: its 503 relayed, charged as a request that ran") {
        // The refusal, relayed with no usage, settled the charge at nothing: the prompt the
        // first peer told was refunded, and no output charged for what it may have generated.
        Cluster cluster;
        Site a(cluster, "fra", {"m"}, tenants_section());
        Site c(cluster, "gru", {"m"});
        c.generator.fail_next_submit(unavailable_error("engine queue full"));
        RawPeer raw(cluster, accepted_then_died);
        a.planner.route_to({raw.target(), c.target()});
        auto r = a.ask(chat_request(false));
        CHECK(r->status == 503);
        CHECK(r->headers["x-edgeserve-site"] == "gru");
        CHECK(request_counted(a, "error"));
        CHECK_FALSE(metrics_contain(a, "reason=\"peer_refused\""));
        CHECK(metrics_contain(a,
                              "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 40"));
    }
}

// `site`'s engine takes 800 ms to accept its first request, past the peer.response_timeout_ms
// (300) of the forwarding site in these tests: the forward was sent and got no head in time, so
// that site may have run it.
static void never_answers_in_time(Site& site) {
    site.generator.on_submit_at(
        0, [] { std::this_thread::sleep_for(std::chrono::milliseconds(800)); });
}

// A non-streamed request sent to `a`, whose plan has `peer` last: its engine accepts it (its
// first request), then finds no room for it before any token, having read `prompt` tokens. The
// answer the client gets.
static testing::HttpReply no_room_after_acceptance(Site& a, Site& peer, int64_t prompt) {
    auto client = a.client();
    REQUIRE(client->send(chat_request(false)).ok());
    REQUIRE(peer.generator.wait_for_request(0));
    REQUIRE(peer_head_arrived(a, peer.id));
    peer.generator.finish(0, engine::FinishReason::kError, engine::Usage{prompt, 0, 0},
                          unavailable_error("no KV room"));
    auto r = client->read_response();
    REQUIRE(r.ok());
    return std::move(r).value();
}

TEST_CASE("a deferred answer cut after the peer accepted, then refused here: never refunded") {
    // The fallback to this site forgot the acceptance: this site's refusal for its load (and a
    // later peer's) gave back the prompt the first peer told, counted rejected. Charged as an
    // answer cut after acceptance: the prompt told and max_tokens (the default, lowered to the
    // 5 of the tenant's minute budget), whichever target ends it, and however.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section() + "    output_tokens_per_minute: 5\n", true,
           "  response_timeout_ms: 300\n");
    Site c(cluster, "gru", {"m"});
    RawPeer raw(cluster, kAcceptedDeferredHead);
    a.generator.fail_next_submit(unavailable_error("engine queue full"));
    const RouteTarget here{true, "fra", "", 0.0, "m"};
    size_t gru_seen = 0;  // Requests gru's engine took.
    SUBCASE("this site is the last target") {
        a.planner.route_to({raw.target(), here});
        CHECK(a.ask(chat_request(false))->status == 503);
    }
    SUBCASE("then the last target refuses it too") {
        c.generator.fail_next_submit(unavailable_error("engine queue full"));
        a.planner.route_to({raw.target(), here, c.target()});
        auto r = a.ask(chat_request(false));
        CHECK(r->status == 503);
        CHECK(r->headers["x-edgeserve-site"] == "gru");
    }
    // gru's end was settled as one never placed there: the prompt told, no output charged,
    // where this site's own refusal charged max_tokens.
    SUBCASE("then the last target accepts it and has no room before any token") {
        a.planner.route_to({raw.target(), here, c.target()});
        CHECK(no_room_after_acceptance(a, c, 40).status == 503);
        gru_seen = 1;
    }
    SUBCASE("the next target accepts it and has no room before any token") {
        a.planner.route_to({raw.target(), c.target()});
        CHECK(no_room_after_acceptance(a, c, 40).status == 503);
        gru_seen = 1;
    }
    SUBCASE("then a site that gives no head in time, this site, and no room at the last") {
        // sin may have run it too: the last target's end was settled as after sin alone (an
        // error, its prompt as gru told it, no output charged), the acceptance before forgotten.
        Site b(cluster, "sin", {"m"});
        never_answers_in_time(b);
        a.planner.route_to({raw.target(), b.target(), here, c.target()});
        CHECK(no_room_after_acceptance(a, c, 40).status == 503);
        gru_seen = 1;
    }
    // No later target could be reached: answered as the cut alone is (503 upstream_cut), never
    // the upstream_unavailable that tells the client the request ran nowhere, while the tenant
    // was charged as for one that may have run.
    SUBCASE("the next target cannot be reached") {
        a.planner.route_to({raw.target(), refusing_site()});
        auto r = a.ask(chat_request(false));
        CHECK(r->status == 503);
        CHECK(error_code_of(*r) == "upstream_cut");
    }
    SUBCASE("then this site refuses it and the last target cannot be reached") {
        a.planner.route_to({raw.target(), here, refusing_site()});
        auto r = a.ask(chat_request(false));
        CHECK(r->status == 503);
        CHECK(error_code_of(*r) == "upstream_cut");
    }
    CHECK(request_counted(a, "error"));
    CHECK_FALSE(metrics_contain(a, "edgeserve_tenant_rejections_total{"));
    CHECK(metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 40"));
    // max_tokens charged against 5 a minute: the next request waits, never routed (the plan's
    // one site refusing connections, a request admitted gets a 503 at once).
    a.planner.route_to({refusing_site()});
    check_in_debt(a, c, chat_request(false), gru_seen);
}

// Site "ams", which takes TCP connections and never accepts them: a forward to it waits for its
// TLS handshake until connect_timeout (or the client leaves).
struct SilentSite {
    SilentSite() : fd(testing::bind_loopback(SOCK_STREAM, port)) {}
    ~SilentSite() { close(fd); }
    RouteTarget target() const {
        return RouteTarget{false, "ams", "127.0.0.1:" + std::to_string(port), 0.0, "m"};
    }
    // Whether the forwarder's connection waits there within 5 s (the listening socket readable:
    // a connection is queued to be accepted): the target before it is done with.
    bool connected() const {
        pollfd p{fd, POLLIN, 0};
        return poll(&p, 1, 5000) == 1;
    }
    uint16_t port = 0;
    int fd;
};

TEST_CASE("a client leaving while the next target is tried after a peer's cut pays for that cut") {
    // The client left while the next target was tried: the forward ended cancelled with no
    // usage, and was charged no output for what the first peer may have generated, its told
    // prompt counted as 0, where a client leaving that peer's stream pays both. Charged as an
    // answer cut after acceptance, the prompt told and max_tokens (the default, lowered to the 5
    // of the tenant's minute budget); counted cancelled, as a client that left.
    Cluster cluster;
    // A minute to connect to ams: the client leaves while that wait runs, however slow the
    // machine (the default 2 s could end it first, answered as upstream_cut, not cancelled).
    Site a(cluster, "fra", {"m"}, tenants_section() + "    output_tokens_per_minute: 5\n", true,
           "  connect_timeout_ms: 60000\n");
    Site c(cluster, "gru", {"m"});  // Never in the plan.
    RawPeer raw(cluster, kAcceptedDeferredHead);
    SilentSite ams;
    SUBCASE("the next target of the forward") {
        a.planner.route_to({raw.target(), ams.target()});
    }
    SUBCASE("the target after this site, which refused it for its load") {
        a.generator.fail_next_submit(unavailable_error("engine queue full"));
        a.planner.route_to({raw.target(), RouteTarget{true, "fra", "", 0.0, "m"}, ams.target()});
    }
    auto client = a.client();
    REQUIRE(client->send(chat_request(false)).ok());
    REQUIRE(ams.connected());  // raw accepted it and was cut before.
    client->close();
    CHECK(request_counted(a, "cancelled"));
    CHECK_FALSE(metrics_contain(a, "edgeserve_tenant_rejections_total{"));
    CHECK(metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 40"));
    a.planner.route_to({refusing_site()});
    check_in_debt(a, c, chat_request(false), 0);
}

TEST_CASE("a peer that gave no head in time, then the client leaves: the request token stays") {
    // sin may have run it: as its 504 alone, or a later target's refusal, the request is not
    // refunded (the request token stays spent); nothing told what it used, so no output is
    // charged, as for that 504.
    Cluster cluster;
    Site a(cluster, "fra", {"m"},
           tenants_section() + "    requests_per_second: 1\n    burst: 1\n", true,
           "  response_timeout_ms: 300\n  connect_timeout_ms: 60000\n");  // As above.
    Site b(cluster, "sin", {"m"});
    never_answers_in_time(b);
    SilentSite ams;
    a.planner.route_to({b.target(), ams.target()});
    auto client = a.client();
    REQUIRE(client->send(chat_request(false)).ok());
    REQUIRE(ams.connected());
    client->close();
    CHECK(request_counted(a, "cancelled"));
    CHECK_FALSE(metrics_contain(a, "edgeserve_tenant_rejections_total{"));
    a.planner.route_to({refusing_site()});
    auto limited = a.ask(chat_request(false));
    CHECK(limited->status == 429);
    CHECK(error_code_of(*limited) == "requests_per_second");
}

TEST_CASE("a peer that generated, then answered a deferred 503: relayed and charged, not rerun") {
    // The peer's engine accepted the request and generated 1500 tokens; then its drain's
    // deadline cancelled it, or the lone sequence outgrew its KV cache: a 503 after the work.
    // Taken for a refusal before any token, it was run again at the next target (done twice,
    // the peer's tokens never charged) and, that one refusing too, refunded in full as a
    // request no site ran; relayed from the plan's last target, charged the prompt alone.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "ams", {"m"});
    Site c(cluster, "gru", {"m"});
    c.generator.fail_next_submit(unavailable_error("engine queue full"));
    engine::FinishReason reason = engine::FinishReason::kCancelled;
    Status error;
    SUBCASE("a drain's deadline cancelled it, another target next") {
        a.planner.route_to({b.target(), c.target()});
    }
    SUBCASE("it outgrew the KV cache, at the plan's last target") {
        reason = engine::FinishReason::kError;
        error = unavailable_error("the KV cache cannot hold the sequence");
        a.planner.route_to({b.target()});
    }
    auto client = a.client();
    REQUIRE(client->send(chat_request(false)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    b.generator.emit(0, "a long reply, cut");
    // Once the deferred head went out (submit() returned): an error after acceptance.
    REQUIRE(peer_head_arrived(a, "ams"));
    b.generator.finish(0, reason, engine::Usage{3, 1500, 0}, error);
    auto r = client->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 503);
    CHECK(r->headers["x-edgeserve-site"] == "ams");
    // The peer's usage is for this site only.
    CHECK(r->headers.count("x-edgeserve-completion-tokens") == 0);
    CHECK(r->headers.count("x-edgeserve-prompt-tokens") == 0);
    CHECK_FALSE(c.generator.wait_for_request(0, 0));
    // Charged what ran at ams, as the same request cut here is: never refunded as refused.
    CHECK(request_counted(a, "error"));
    CHECK_FALSE(metrics_contain(a, "reason=\"peer_refused\""));
    CHECK(metrics_contain(
        a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 1500"));
    CHECK(metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 3"));
}

TEST_CASE("a peer that accepted then had no room before any token at the last target: refused") {
    // Run here, that end (accepted, then a capacity error with no token) is a refusal for
    // capacity: rejected, everything admission took given back. Forwarded with no target left,
    // it was settled as an error after acceptance, its rate token and prompt kept.
    Cluster cluster;
    Site a(cluster, "fra", {"m"},
           tenants_section() + "    requests_per_second: 1\n    burst: 1\n");
    Site b(cluster, "sin", {"m"});
    a.planner.route_to({b.target()});
    auto client = a.client();
    REQUIRE(client->send(chat_request(false)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    REQUIRE(peer_head_arrived(a, "sin"));
    b.generator.finish(0, engine::FinishReason::kError, engine::Usage{3, 0, 0},
                       unavailable_error("no KV room"));
    auto r = client->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 503);
    CHECK(request_counted(a, "rejected"));
    CHECK(metrics_contain(
        a, "edgeserve_tenant_rejections_total{reason=\"overloaded\",tenant=\"acme\"} 1"));
    CHECK_FALSE(metrics_contain(a, "kind=\"prompt\",tenant=\"acme\"} 3"));
    // fra's clock stands still: the rate token went back, so the next request reaches sin.
    REQUIRE(client->send(chat_request(false)).ok());
    REQUIRE(b.generator.wait_for_request(1));
    b.generator.finish(1, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    auto served = client->read_response();
    REQUIRE(served.ok());
    CHECK(served->status == 200);
}

TEST_CASE("a peer's plain error answer telling what ran there is read as a deferred one's") {
    // A peer whose engine ended the request before its deferred head went out answers plain,
    // with what ran until then: any 5xx head was run again at the next target (done twice)
    // and the usage it told ignored (the request refunded as refused where none other took it).
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"m"});
    const std::string body =
        R"({"error":{"message":"the KV cache cannot hold the sequence","type":"server_error",)"
        R"("param":null,"code":null}})";
    auto answer = [&](int completion, const char* status = "503 Service Unavailable") {
        return std::string("HTTP/1.1 ") + status + "\r\nContent-Type: application/json\r\n"
               "X-Edgeserve-Prompt-Tokens: 7\r\nX-Edgeserve-Completion-Tokens: " +
               std::to_string(completion) + "\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body;
    };
    SUBCASE("it generated: relayed and charged, not run again") {
        // Run again, sin refuses too, so the test ends either way.
        b.generator.fail_next_submit(unavailable_error("engine queue full"));
        RawPeer raw(cluster, answer(1500));
        a.planner.route_to({raw.target(), b.target()});
        auto r = a.ask(chat_request(false));
        CHECK(r->status == 503);
        CHECK(r->headers["x-edgeserve-site"] == "raw");
        CHECK(r->body.find("KV cache cannot hold") != std::string::npos);
        CHECK(r->headers.count("x-edgeserve-completion-tokens") == 0);
        CHECK(r->headers.count("x-edgeserve-prompt-tokens") == 0);
        CHECK(request_counted(a, "error"));
        CHECK_FALSE(metrics_contain(a, "reason=\"peer_refused\""));
        CHECK(metrics_contain(
            a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 1500"));
        CHECK(metrics_contain(a,
                              "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 7"));
    }
    // Refused there for capacity before any token, as a deferred answer's 503 or 429 is.
    auto run_at_sin = [&](RawPeer& raw) {
        a.planner.route_to({raw.target(), b.target()});
        auto client = a.client();
        REQUIRE(client->send(chat_request(false)).ok());
        REQUIRE(b.generator.wait_for_request(0));
        b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{3, 2, 0});
        auto r = client->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        CHECK(r->headers["x-edgeserve-site"] == "sin");
        CHECK(request_counted(a, "ok"));
        CHECK(metrics_contain(a,
                              "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 3"));
    };
    SUBCASE("it says none was generated: the next target runs it, charged once") {
        RawPeer raw(cluster, answer(0));
        run_at_sin(raw);
    }
    SUBCASE("a 429 saying none was generated: the next target runs it too") {
        RawPeer raw(cluster, answer(0, "429 Too Many Requests"));
        run_at_sin(raw);
    }
}

TEST_CASE("a peer that accepts a request and then breaks it is reported once, as failed") {
    // The accepting head was reported as a success and the cut after it as a failure (or not
    // at all): each success reset the outlier detector's consecutive failures, so a peer that
    // accepted every request and then died was never ejected.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    SUBCASE("a deferred answer, rerun elsewhere") {
        Site b(cluster, "sin", {"m"});
        RawPeer raw(cluster,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                    "X-Edgeserve-Deferred-Head: 1\r\nTransfer-Encoding: chunked\r\n\r\n");
        a.planner.route_to({raw.target(), b.target()});
        auto client = a.client();
        REQUIRE(client->send(chat_request(false)).ok());
        REQUIRE(b.generator.wait_for_request(0));
        b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{3, 2, 0});
        auto r = client->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        auto reports = a.planner.reports();
        REQUIRE(reports.size() == 2);
        CHECK(reports[0].site == "raw");
        CHECK_FALSE(reports[0].ok);
        CHECK(reports[1].site == "sin");
        CHECK(reports[1].ok);
    }
    SUBCASE("a stream cut before its end") {
        RawPeer raw(cluster,
                    chunked_events("data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\","
                                   "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half\"},"
                                   "\"finish_reason\":null}]}\n\n",
                                   /*last_chunk=*/false));
        a.planner.route_to({raw.target()});
        auto client = a.client();
        REQUIRE(client->send(chat_request(true)).ok());
        auto all = client->read_until("0\r\n\r\n");
        REQUIRE(all.ok());
        CHECK(all->find("upstream_cut") != std::string::npos);
        auto reports = a.planner.reports();
        REQUIRE(reports.size() == 1);
        CHECK(reports[0].site == "raw");
        CHECK_FALSE(reports[0].ok);
    }
}

TEST_CASE("a forwarded stream silent longer than stream_idle_timeout is kept by keepalives") {
    // A request waiting for its first token (a queue, a long prefill) sent nothing after the
    // stream's head, and the forwarding site cut it at peer.stream_idle_timeout_ms; the serving
    // site's keepalive comments (limits.stream_keepalive_ms) keep it.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section(), true, "  stream_idle_timeout_ms: 300\n");
    Site b(cluster, "sin", {"m"}, "limits:\n  stream_keepalive_ms: 100\n");
    a.planner.route_to({b.target()});
    auto c = a.client();
    REQUIRE(c->send(chat_request(true)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    b.generator.emit(0, "late");
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{3, 1, 0});
    auto all = c->read_until("0\r\n\r\n");
    REQUIRE(all.ok());
    CHECK(all->find("upstream_cut") == std::string::npos);
    CHECK(all->find("late") != std::string::npos);
    CHECK(all->find(": keepalive\n\n") != std::string::npos);
    CHECK(all->find("data: [DONE]\n\n") != std::string::npos);
}

TEST_CASE("a forwarded stream longer than 8 MiB is relayed whole") {
    // Beast's response parser stops a body at 8 MiB by default: a healthy stream past it (a
    // long reasoning reply, logprobs) was cut with upstream_cut.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"m"});
    a.planner.route_to({b.target()});
    auto c = a.client();
    REQUIRE(c->send(chat_request(true)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    const std::string piece(10 * 1024, 'x');
    for (int i = 0; i < 900; ++i) {  // About 9 MiB of events, each read as it comes.
        const std::string tag = "<" + std::to_string(i) + ">";
        b.generator.emit(0, tag + piece);
        auto got = c->read_until(tag);
        REQUIRE(got.ok());
        REQUIRE(got->find("upstream_cut") == std::string::npos);
    }
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{3, 900, 0});
    auto rest = c->read_until("0\r\n\r\n");
    REQUIRE(rest.ok());
    CHECK(rest->find("upstream_cut") == std::string::npos);
    CHECK(rest->find("data: [DONE]\n\n") != std::string::npos);
}

TEST_CASE("a non-streamed answer slower than response_timeout is not rerun elsewhere") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section(), true, "  response_timeout_ms: 200\n");
    Site b(cluster, "sin", {"m"});
    Site c(cluster, "syd", {"m"});
    a.planner.route_to({b.target(), c.target()});

    auto client = a.client();
    REQUIRE(client->send(chat_request(false)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    b.generator.emit(0, "slow");
    // The generation outlasts response_timeout: the peer's head came when it accepted.
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{2, 1, 0});
    auto r = client->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    CHECK(r->headers["content-type"] == "application/json");
    CHECK(r->headers.count("x-edgeserve-deferred-head") == 0);
    CHECK(r->headers["x-edgeserve-site"] == "sin");
    auto body = json_of(r->body);
    CHECK(body["choices"].as_array()[0].as_object()["message"].as_object()["content"] == "slow");
    CHECK_FALSE(c.generator.wait_for_request(0, 0));  // Run once, at b only.
    CHECK(metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 2"));

    // An error after the peer accepted keeps its own status, not the deferred head's 200.
    auto client2 = a.client();
    REQUIRE(client2->send(chat_request(false)).ok());
    REQUIRE(b.generator.wait_for_request(1));
    b.generator.finish(1, engine::FinishReason::kError, engine::Usage{},
                       invalid_argument_error("prompt too long"));
    auto r2 = client2->read_response();
    REQUIRE(r2.ok());
    CHECK(r2->status == 400);
    CHECK(r2->body.find("prompt too long") != std::string::npos);
    CHECK_FALSE(c.generator.wait_for_request(0, 0));
    // Failed after the peer's engine accepted it: an error, as the same end here, not ok.
    CHECK(request_counted(a, "error"));
    CHECK(metrics_contain(a,
                          "edgeserve_tenant_requests_total{outcome=\"ok\",tenant=\"acme\"} 1\n"));
}

TEST_CASE("a client that goes away cancels the request on the remote engine") {
    AccessLines log;
    Cluster cluster;
    const std::string logged = "log:\n  access_log: true\n";
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"m"}, logged);
    a.planner.route_to({b.target()});

    SUBCASE("mid-stream") {
        auto c = a.client();
        REQUIRE(c->send(chat_request(true)).ok());
        REQUIRE(b.generator.wait_for_request(0));
        b.generator.emit(0, "tok");
        REQUIRE(c->read_until("tok").ok());
        c->close();
        CHECK(b.generator.wait_cancelled(0));
        // The serving site's line waits for how generation ended, after the answer was cut.
        std::vector<boost::json::object> lines = log.wait(1);
        REQUIRE(lines.size() == 1);
        CHECK(lines[0].at("listener") == "peer");
        CHECK(lines[0].at("complete") == false);
        CHECK(lines[0].at("outcome") == "cancelled");
        CHECK(lines[0].contains("completion_tokens"));
        // Counted as a client leaving a request run here is, and as the forward is.
        CHECK(request_counted(a, "cancelled"));
    }
    SUBCASE("before the answer's head") {
        auto c = a.client();
        REQUIRE(c->send(chat_request(false)).ok());
        REQUIRE(b.generator.wait_for_request(0));
        c->close();
        CHECK(b.generator.wait_cancelled(0));
        CHECK(request_counted(a, "cancelled"));
    }
}

TEST_CASE("connect refused and 5xx before any byte retry on the next target") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"m"});
    Site c(cluster, "gru", {"m"});

    SUBCASE("connection refused") {
        RouteTarget dead{false, "dead", "127.0.0.1:" + std::to_string(refused_port()), 0.0,
                         "m"};
        a.planner.route_to({dead, b.target()});
        auto client = a.client();
        REQUIRE(client->send(chat_request(false)).ok());
        REQUIRE(b.generator.wait_for_request(0));
        b.generator.emit(0, "ok");
        b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
        auto r = client->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        CHECK(r->headers["x-edgeserve-site"] == "sin");
        auto reports = a.planner.reports();
        REQUIRE(reports.size() == 2);
        CHECK(reports[0].site == "dead");
        CHECK_FALSE(reports[0].ok);
        CHECK(reports[1].site == "sin");
        CHECK(reports[1].ok);
        CHECK(metrics_contain(a, "edgeserve_forward_retries_total{reason=\"connect\"} 1"));
    }
    SUBCASE("the peer answers 503") {
        c.generator.fail_next_submit(unavailable_error("engine queue full"));
        a.planner.route_to({c.target(), b.target()});
        auto client = a.client();
        REQUIRE(client->send(chat_request(false)).ok());
        REQUIRE(b.generator.wait_for_request(0));
        b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
        auto r = client->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        CHECK(r->headers["x-edgeserve-site"] == "sin");
        // Retried, but not a failure for outlier detection: a refusal is load, not ill health.
        auto reports = a.planner.reports();
        REQUIRE(reports.size() == 1);
        CHECK(reports[0].site == "sin");
        CHECK(reports[0].ok);
        CHECK(metrics_contain(a, "edgeserve_forward_retries_total{reason=\"status_5xx\"} 1"));
    }
    SUBCASE("every target fails: the last 5xx reaches the client") {
        c.generator.fail_next_submit(unavailable_error("engine queue full"));
        RouteTarget dead{false, "dead", "127.0.0.1:" + std::to_string(refused_port()), 0.0,
                         "m"};
        a.planner.route_to({dead, c.target()});
        auto client = a.client();
        REQUIRE(client->send(chat_request(false)).ok());
        auto r = client->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 503);
        CHECK(r->headers["x-edgeserve-site"] == "gru");
        CHECK(json_of(r->body)["error"].as_object()["message"] == "engine queue full");
    }
    SUBCASE("every target unreachable: 503 naming the last failure") {
        RouteTarget dead{false, "dead", "127.0.0.1:" + std::to_string(refused_port()), 0.0,
                         "m"};
        a.planner.route_to({dead});
        auto r = a.ask(chat_request(false));
        CHECK(r->status == 503);
        CHECK(error_code_of(*r) == "upstream_unavailable");
        std::string message(json_of(r->body)["error"].as_object()["message"].as_string());
        CHECK(message.find("site 'dead'") != std::string::npos);
        CHECK(r->headers["retry-after"] == "1");
    }
}

TEST_CASE("a forward every site refused gives back what admission took, as a local refusal") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"},
           tenants_section() + "    requests_per_second: 1\n    burst: 1\n");
    Site b(cluster, "sin", {"m"});
    Site c(cluster, "gru", {"m"});
    auto client = a.client();
    // gru's engine refuses it (503 before generating): it never ran, so the tenant's one
    // request of this second is still there. fra's clock stands still: no token refills.
    c.generator.fail_next_submit(unavailable_error("engine queue full"));
    a.planner.route_to({c.target()});
    REQUIRE(client->send(chat_request(false)).ok());
    auto refused = client->read_response();
    REQUIRE(refused.ok());
    CHECK(refused->status == 503);
    CHECK(metrics_contain(
        a, "edgeserve_tenant_rejections_total{reason=\"peer_refused\",tenant=\"acme\"} 1"));
    // So the next one is admitted, and sin serves it.
    a.planner.route_to({b.target()});
    REQUIRE(client->send(chat_request(false)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    auto served = client->read_response();
    REQUIRE(served.ok());
    CHECK(served->status == 200);
    // A request that ran took the token for good: the third waits for the next second.
    REQUIRE(client->send(chat_request(false)).ok());
    auto limited = client->read_response();
    REQUIRE(limited.ok());
    CHECK(limited->status == 429);
    CHECK(error_code_of(*limited) == "requests_per_second");
}

TEST_CASE("a peer refusing for the tenant's own full queue there keeps the request token spent") {
    // A peer's 429 (the tenant's queue there full: a peer applies no rate to a forwarded request,
    // and its shared queue full is a 503) was refunded as a refusal for load: a tenant whose
    // queue at the peer was full had it tokenize prompts at any rate.
    Cluster cluster;
    Site a(cluster, "fra", {"m"},
           tenants_section() + "    requests_per_second: 1\n    burst: 1\n");
    Site b(cluster, "sin", {"m"}, tenants_section());
    auto client = a.client();
    b.generator.fail_next_submit(resource_exhausted_error("tenant 'acme': queue full"));
    a.planner.route_to({b.target()});
    REQUIRE(client->send(chat_request(false)).ok());
    auto refused = client->read_response();
    REQUIRE(refused.ok());
    CHECK(refused->status == 429);
    // fra's clock stands still: the next request waits for the next second, never reaching sin.
    REQUIRE(client->send(chat_request(false)).ok());
    auto limited = client->read_response();
    REQUIRE(limited.ok());
    CHECK(limited->status == 429);
    CHECK(error_code_of(*limited) == "requests_per_second");
    CHECK_FALSE(b.generator.wait_for_request(0, 0));
}

TEST_CASE("a peer's 429 after its engine read the prompt does not tell the prompt's length") {
    // A forwarding site of an earlier version takes any usage count on an error answer for one
    // after acceptance: told on a 429, it counted the refusal ok, and no longer refunded nor
    // retried it. So the prompt sin read goes untold, and this site charges none of it.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section() + "    input_tokens_per_minute: 100\n");
    Site b(cluster, "sin", {"m"}, tenants_section());
    a.planner.route_to({b.target()});
    b.generator.set_prompt_tokens(1000);
    b.generator.fail_next_submit(resource_exhausted_error("tenant 'acme': queue full"));
    auto client = a.client();
    REQUIRE(client->send(chat_request(false)).ok());
    auto refused = client->read_response();
    REQUIRE(refused.ok());
    CHECK(refused->status == 429);
    CHECK(request_counted(a, "rejected"));
    CHECK(metrics_contain(
        a, "edgeserve_forwarded_requests_total{outcome=\"rejected\",site=\"sin\"} 1"));
    // Not in debt for the 1000 tokens: the next request reaches sin.
    REQUIRE(client->send(chat_request(false)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    auto served = client->read_response();
    REQUIRE(served.ok());
    CHECK(served->status == 200);
}

TEST_CASE("a forward that timed out connecting ran nowhere: a 503, refunded as refused") {
    // A peer that takes the TCP connection and never speaks TLS (or a blackholed address, a
    // name lookup that hangs) was never sent the request: answered 504 and counted an error, it
    // kept the tenant's request token spent, unlike a refused connection.
    Cluster cluster;
    Site a(cluster, "fra", {"m"},
           tenants_section() + "    requests_per_second: 1\n    burst: 1\n", true,
           "  connect_timeout_ms: 200\n  response_timeout_ms: 300\n");
    auto client = a.client();
    auto ask = [&] {
        REQUIRE(client->send(chat_request(false)).ok());
        auto r = client->read_response();
        REQUIRE(r.ok());
        return std::move(r).value();
    };
    SUBCASE("no handshake within connect_timeout") {
        uint16_t port = 0;
        const int mute = testing::bind_loopback(SOCK_STREAM, port);  // Listens, never accepts.
        a.planner.route_to({RouteTarget{false, "mute", "127.0.0.1:" + std::to_string(port), 0.0,
                                        "m"}});
        auto r = ask();
        CHECK(r.status == 503);
        CHECK(error_code_of(r) == "upstream_unavailable");
        CHECK(request_counted(a, "rejected"));
        CHECK(metrics_contain(
            a, "edgeserve_tenant_rejections_total{reason=\"peer_refused\",tenant=\"acme\"} 1"));
        // The request token went back (fra's clock stands still): the next one is admitted.
        auto again = ask();
        CHECK(again.status == 503);
        CHECK(error_code_of(again) == "upstream_unavailable");
        close(mute);
    }
    SUBCASE("sent, and no head within response_timeout: a 504, charged as one that may have run") {
        Site b(cluster, "sin", {"m"});
        never_answers_in_time(b);
        a.planner.route_to({b.target()});
        auto r = ask();
        CHECK(r.status == 504);
        CHECK(error_code_of(r) == "upstream_timeout");
        CHECK(request_counted(a, "error"));
        CHECK_FALSE(metrics_contain(a, "reason=\"peer_refused\""));
        auto limited = ask();
        CHECK(limited.status == 429);
        CHECK(error_code_of(limited) == "requests_per_second");
    }
    SUBCASE("sent to one that never answered, then refused by the last target: not refunded") {
        // sin may have run it; gru's 503 says only that gru did not. Refunded as peer_refused,
        // the tenant had sin run requests past its rate.
        Site b(cluster, "sin", {"m"});
        Site c(cluster, "gru", {"m"});
        never_answers_in_time(b);
        c.generator.fail_next_submit(unavailable_error("engine queue full"));
        a.planner.route_to({b.target(), c.target()});
        auto r = ask();
        CHECK(r.status == 503);
        CHECK(r.headers["x-edgeserve-site"] == "gru");
        CHECK(request_counted(a, "error"));
        CHECK_FALSE(metrics_contain(a, "reason=\"peer_refused\""));
        auto limited = ask();
        CHECK(limited.status == 429);
        CHECK(error_code_of(limited) == "requests_per_second");
    }
    SUBCASE("sent to one that never answered, then this site refused it for its load") {
        // sin may have run it; this site's engine refusing it says only that it did not run
        // here. Refunded as overloaded, the tenant had sin run requests past its rate.
        Site b(cluster, "sin", {"m"});
        never_answers_in_time(b);
        a.generator.fail_next_submit(unavailable_error("engine queue full"));
        const RouteTarget here{true, "fra", "", 0.0, "m"};
        SUBCASE("the last target") {
            a.planner.route_to({b.target(), here});
            CHECK(ask().status == 503);
        }
        SUBCASE("then refused by the last target") {
            Site c(cluster, "gru", {"m"});
            c.generator.fail_next_submit(unavailable_error("engine queue full"));
            a.planner.route_to({b.target(), here, c.target()});
            auto r = ask();
            CHECK(r.status == 503);
            CHECK(r.headers["x-edgeserve-site"] == "gru");
        }
        SUBCASE("then no room at the last target after it accepted") {
            // An error after acceptance, not one never placed (overloaded): its prompt as told.
            Site c(cluster, "gru", {"m"});
            a.planner.route_to({b.target(), here, c.target()});
            CHECK(no_room_after_acceptance(a, c, 3).status == 503);
            CHECK(metrics_contain(
                a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 3"));
        }
        SUBCASE("then the last target unreachable") {
            // sin may have run it: a 504, as for [sin, ams]. It got the 503 (upstream_unavailable)
            // that tells the client the request ran nowhere.
            a.planner.route_to({b.target(), here, refusing_site()});
            auto r = ask();
            CHECK(r.status == 504);
            CHECK(error_code_of(r) == "upstream_timeout");
        }
        CHECK(request_counted(a, "error"));
        CHECK_FALSE(metrics_contain(a, "edgeserve_tenant_rejections_total{"));
        // The request token stays spent (fra's clock stands still): refused before routing.
        a.planner.route_to({refusing_site()});
        auto limited = ask();
        CHECK(limited.status == 429);
        CHECK(error_code_of(limited) == "requests_per_second");
    }
    SUBCASE("sent to one that never answered, then no room at the last after it accepted") {
        // Settled as an error after acceptance (sin may have run it), so the prompt gru's
        // acceptance charged is also the prompt counted: it was charged and shown as 0.
        Site b(cluster, "sin", {"m"});
        Site c(cluster, "gru", {"m"});
        never_answers_in_time(b);
        a.planner.route_to({b.target(), c.target()});
        CHECK(no_room_after_acceptance(a, c, 3).status == 503);
        CHECK(request_counted(a, "error"));
        CHECK_FALSE(metrics_contain(a, "reason=\"overloaded\""));
        CHECK(metrics_contain(
            a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 3"));
    }
}

TEST_CASE("a prompt a peer's engine refused for itself is charged and counted as one here") {
    // Run here, the engine's refusal of a prompt beyond the context counts rejected with its
    // reason and charges the prompt it tokenized to input_tokens_per_minute. Forwarded, it
    // counted ok and charged nothing: a tenant could have peers tokenize prompts without end.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section() + "    input_tokens_per_minute: 100\n");
    Site b(cluster, "sin", {"m"});
    a.planner.route_to({b.target()});
    b.generator.set_prompt_tokens(1000);
    b.generator.fail_next_submit(out_of_range_error("prompt: 1000 tokens exceed the context"));
    auto r = a.ask(chat_request(false));
    CHECK(r->status == 400);
    CHECK(error_code_of(*r) == "context_length_exceeded");
    CHECK(r->headers.count("x-edgeserve-prompt-tokens") == 0);
    CHECK(request_counted(a, "rejected"));
    CHECK(metrics_contain(a, "edgeserve_tenant_rejections_total{reason=\"context_length_exceeded\","
                             "tenant=\"acme\"} 1"));
    // In debt for the 1000 tokens sin read: the next request waits, never reaching sin.
    check_in_debt(a, b, chat_request(false), 0);
    CHECK(metrics_contain(a, "edgeserve_tenant_rejections_total{reason=\"input_tokens_per_minute\","
                             "tenant=\"acme\"} 1"));
}

TEST_CASE("every remote target refused and this site next in the plan: it runs here") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    RouteTarget dead{false, "ams", "127.0.0.1:" + std::to_string(refused_port()), 0.0, "m"};
    RouteTarget here{true, "fra", "", 0.0, "m"};
    a.planner.route_to({dead, here});
    auto client = a.client();
    a.answered_here(*client, chat_request(false));
    auto reports = a.planner.reports();
    REQUIRE(reports.size() == 1);  // The remote's failure still reaches the detector.
    CHECK(reports[0].site == "ams");
    CHECK(
        metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 2"));
    // Streamed the same way.
    REQUIRE(client->send(chat_request(true)).ok());
    REQUIRE(a.generator.wait_for_request(1));
    a.generator.emit(1, "streamed here");
    a.generator.finish(1, engine::FinishReason::kStop, engine::Usage{3, 2, 0});
    auto rest = client->read_until("data: [DONE]");
    REQUIRE(rest.ok());
    CHECK(rest->find("streamed here") != std::string::npos);
}

TEST_CASE("a retry budget of zero forbids the retry") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section(), true,
           "  retry_budget: 0\n  min_retry_concurrency: 0\n");
    Site b(cluster, "sin", {"m"});
    RouteTarget dead{false, "dead", "127.0.0.1:" + std::to_string(refused_port()), 0.0,
                     "m"};
    a.planner.route_to({dead, b.target()});
    auto r = a.ask(chat_request(false));
    CHECK(r->status == 503);
    CHECK(error_code_of(*r) == "upstream_unavailable");
    CHECK_FALSE(b.generator.wait_for_request(0, 0));
    CHECK(a.planner.reports().size() == 1);
}

TEST_CASE("an answer held back for a retry holds its retry slot: relayed when none is free") {
    // The retry was allowed when the attempt began, its slot taken only at the next target:
    // another forward's retry took the last slot meanwhile, and the peer's answer held back
    // was lost for a made-up 503 (upstream_unavailable).
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section(), true,
           "  retry_budget: 0\n  min_retry_concurrency: 1\n");
    Site b(cluster, "ams", {"m"});
    Site c(cluster, "gru", {"m"});
    // The first forward: accepted at ams, gru next.
    a.planner.route_to({b.target(), c.target()});
    auto first = a.client();
    REQUIRE(first->send(chat_request(false)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    REQUIRE(peer_head_arrived(a, "ams"));
    // The second one's retry takes the budget's one slot (its first target refuses the
    // connection), and gru holds it.
    RouteTarget dead{false, "dead", "127.0.0.1:" + std::to_string(refused_port()), 0.0, "m"};
    a.planner.route_to({dead, c.target()});
    auto second = a.client();
    REQUIRE(second->send(chat_request(false)).ok());
    REQUIRE(c.generator.wait_for_request(0));
    // ams ends the first for capacity before any token: gru would run it, but no retry may.
    b.generator.finish(0, engine::FinishReason::kError, engine::Usage{3, 0, 0},
                       unavailable_error("the model has no free sequence slot"));
    auto r = first->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 503);
    CHECK(r->headers["x-edgeserve-site"] == "ams");
    CHECK_MESSAGE(r->body.find("no free sequence slot") != std::string::npos, r->body);
    CHECK_FALSE(c.generator.wait_for_request(1, 0));
    c.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    auto served = second->read_response();
    REQUIRE(served.ok());
    CHECK(served->status == 200);
}

TEST_CASE("a peer that closes after its stream's end event: the stream ends once, not cut") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    const std::string events =
        "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
        "\"delta\":{\"content\":\"whole\"},\"finish_reason\":\"stop\"}]}\n\n"
        ": edgeserve-usage {\"prompt_tokens\":3,\"completion_tokens\":1}\n\n"
        "data: [DONE]\n\n";
    RawPeer raw(cluster, chunked_events(events, /*last_chunk=*/false));  // Closed before it.
    a.planner.route_to({raw.target()});
    auto client = a.client();
    REQUIRE(client->send(chat_request(true)).ok());
    auto all = client->read_until("0\r\n\r\n");
    REQUIRE(all.ok());
    CHECK(all->find("whole") != std::string::npos);
    CHECK(all->find("upstream_cut") == std::string::npos);
    const size_t done = all->find("data: [DONE]");
    REQUIRE(done != std::string::npos);
    CHECK(all->find("data: [DONE]", done + 1) == std::string::npos);  // Once.
    CHECK(all->find("edgeserve-usage") == std::string::npos);         // Read, not relayed.
    CHECK(
        metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 1"));
}

TEST_CASE("a stream that ends without the peer's usage report is charged as one cut, not free") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section() + "    output_tokens_per_minute: 5\n");
    const std::string events =
        "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
        "\"delta\":{\"content\":\"whole\"},\"finish_reason\":\"stop\"}]}\n\n"
        "data: [DONE]\n\n";
    RawPeer raw(cluster, chunked_events(events, /*last_chunk=*/true));
    a.planner.route_to({raw.target()});
    auto client = a.client();
    REQUIRE(client->send(chat_request(true)).ok());
    auto all = client->read_until("0\r\n\r\n");
    REQUIRE(all.ok());
    CHECK(all->find("whole") != std::string::npos);
    REQUIRE(request_counted(a, "ok"));
    // Its max_tokens (5, the minute's budget) was charged: the next request waits.
    auto next = a.client();
    REQUIRE(next->send(chat_request(true)).ok());
    auto r = next->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 429);
}

TEST_CASE("a connection whose peer sent more than its answer is not pooled for the next one") {
    // A peer sent bytes past its answer's end (a second answer, garbage). Pooled, the next
    // forward on that connection read those bytes as its own answer: a client, perhaps of
    // another tenant, got an answer the peer never made for it.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section(), true, "  connect_timeout_ms: 300\n");
    const std::string first =
        R"({"id":"1","object":"chat.completion","choices":[{"index":0,"message":)"
        R"({"role":"assistant","content":"first answer"},"finish_reason":"stop"}],)"
        R"("usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})";
    const std::string stray =
        R"({"id":"2","object":"chat.completion","choices":[{"index":0,"message":)"
        R"({"role":"assistant","content":"stray answer"},"finish_reason":"stop"}],)"
        R"("usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})";
    auto answer = [](const std::string& body) {
        return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body;
    };
    RawPeer raw(cluster, answer(first) + answer(stray));
    a.planner.route_to({raw.target()});
    auto client = a.client();
    REQUIRE(client->send(chat_request(false)).ok());
    auto r = client->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    CHECK(r->body.find("first answer") != std::string::npos);
    CHECK(a.daemon->forwarder()->idle_connections() == 0);

    // The peer takes no second request: the next forward must not be answered at all.
    auto next = a.client();
    REQUIRE(next->send(chat_request(false)).ok());
    auto r2 = next->read_response();
    REQUIRE(r2.ok());
    CHECK(r2->body.find("stray answer") == std::string::npos);
    CHECK(r2->status >= 500);
}

TEST_CASE("a peer's interim 1xx head is skipped: the client gets the final answer") {
    // HTTP/1.1 lets a server send interim heads (100 Continue, 103 Early Hints) before the
    // answer; one was taken for the answer itself, and the client got a bare 1xx.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    const std::string body =
        R"({"id":"1","object":"chat.completion","choices":[{"index":0,"message":)"
        R"({"role":"assistant","content":"final answer"},"finish_reason":"stop"}],)"
        R"("usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})";
    RawPeer raw(cluster,
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body);
    a.planner.route_to({raw.target()});
    auto r = a.ask(chat_request(false));
    CHECK(r->status == 200);
    CHECK(r->body.find("final answer") != std::string::npos);
}

TEST_CASE("no retry once bytes reached the client") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"m"});
    auto c = std::make_unique<Site>(cluster, "gru", std::vector<std::string>{"m"});
    a.planner.route_to({c->target(), b.target()});

    auto client = a.client();
    REQUIRE(client->send(chat_request(true)).ok());
    REQUIRE(c->generator.wait_for_request(0));
    c->generator.emit(0, "partial");
    REQUIRE(client->read_until("partial").ok());
    // The serving site dies mid-stream: the client gets the cut reported in-band, no replay.
    c->daemon->stop(std::chrono::milliseconds(0));
    auto rest = client->read_until("upstream_cut");
    REQUIRE(rest.ok());
    auto end = client->read_until("0\r\n\r\n");  // The stream's end...
    REQUIRE(end.ok());
    CHECK(end->find("data: [DONE]") != std::string::npos);  // ...as a local cut ends it.
    CHECK_FALSE(b.generator.wait_for_request(0, 0));
    auto reports = a.planner.reports();
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].site == "gru");
    CHECK(metrics_contain(
        a, "edgeserve_forwarded_requests_total{outcome=\"error\",site=\"gru\"} 1"));
    CHECK_FALSE(metrics_contain(a, "edgeserve_forward_retries_total{"));
}

TEST_CASE("a site declared dead mid-stream: its forwards end now, not at the idle timeout") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"m"});
    Site c(cluster, "gru", {"m"});
    a.planner.route_to({c.target(), b.target()});
    auto client = a.client();
    REQUIRE(client->send(chat_request(true)).ok());
    REQUIRE(c.generator.wait_for_request(0));
    c.generator.emit(0, "partial");
    REQUIRE(client->read_until("partial").ok());
    // gru goes silent (paused, partitioned) with its connection open; gossip finds it dead.
    std::function<void(const std::string&)> lost = a.daemon->forwarder()->site_lost_handler();
    lost("sin");  // Another site: nothing happens to this forward.
    lost("gru");
    auto rest = client->read_until("0\r\n\r\n");
    REQUIRE(rest.ok());
    CHECK(rest->find("upstream_cut") != std::string::npos);
    CHECK(rest->find("was declared dead (gossip) while streaming") != std::string::npos);
    CHECK(rest->find("data: [DONE]") != std::string::npos);
    CHECK_FALSE(b.generator.wait_for_request(0, 0));  // Bytes were out: not rerun.
    c.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 1, 0});

    // Non-streamed, on the pooled connection: nothing reached the client, so the next target
    // runs it (not a fresh connection to the dead site).
    auto again = a.client();
    REQUIRE(again->send(chat_request(false)).ok());
    REQUIRE(c.generator.wait_for_request(1));
    lost("gru");
    REQUIRE(b.generator.wait_for_request(0));
    CHECK_FALSE(c.generator.wait_for_request(2, 200));
    b.generator.emit(0, "from sin");
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 2, 0});
    auto reply = again->read_response();
    REQUIRE(reply.ok());
    CHECK(reply->status == 200);
    CHECK(reply->body.find("from sin") != std::string::npos);
}

TEST_CASE("a reload of unchanged certificate files keeps the pooled peer connections") {
    // A SIGHUP re-reads the certificates with the rest of the config; files that did not change
    // are not rebuilt, so the forwarding client keeps its pool (and the listeners their session
    // caches). A file that changed is loaded again, and the pool starts afresh.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"m"});
    a.planner.route_to({b.target()});
    auto forward = [&](size_t i) {
        auto c = a.client();
        REQUIRE(c->send(chat_request(false)).ok());
        REQUIRE(b.generator.wait_for_request(i));
        b.generator.finish(i, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
        auto r = c->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
    };
    forward(0);
    // Unchanged since the start, the first reload included: nothing to do.
    REQUIRE(a.daemon->reload_certificates().ok());
    forward(1);
    CHECK(a.daemon->forwarder()->connections_opened() == 1);
    REQUIRE(a.daemon->reload_certificates().ok());
    REQUIRE(b.daemon->reload_certificates().ok());
    REQUIRE(b.daemon->reload_certificates().ok());
    forward(2);
    CHECK(a.daemon->forwarder()->connections_opened() == 1);
    // Written again (the same bytes, a new change time): loaded, the pool dropped.
    const std::string pem = testing::read_file(a.cert.cert_path);
    std::ofstream(a.cert.cert_path, std::ios::trunc) << pem;
    REQUIRE(a.daemon->reload_certificates().ok());
    forward(3);
    CHECK(a.daemon->forwarder()->connections_opened() == 2);
}

TEST_CASE("the peer listener refuses clients without a cluster certificate") {
    Cluster cluster;
    Site b(cluster, "sin", {"m"});
    const uint16_t port = b.daemon->peer_port();
    const std::string forwarded = testing::http_request(
        "POST", "/v1/chat/completions", chat_body(false),
        "X-Edgeserve-Forwarded-By: fra\r\nX-Edgeserve-Tenant: acme\r\n");
    // The refusal is counted on the peer listener's own series (a site whose cluster
    // certificate expired shows there), not on the public listener's.
    // The server's side of the handshake may end after the client saw the refusal: waited for.
    auto peer_refusal_counted = [&] {
        const std::string counted =
            "edgeserve_peer_tls_handshake_failures_total{reason=\"client_certificate\"} 1";
        std::string text = b.daemon->metrics().serialize();
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (text.find(counted) == std::string::npos &&
               std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            text = b.daemon->metrics().serialize();
        }
        CHECK_MESSAGE(text.find(counted) != std::string::npos, text);
        CHECK(text.find("edgeserve_tls_handshake_failures_total{") == std::string::npos);
    };

    SUBCASE("no client certificate") {
        auto c = TlsClient::connect(port);
        // TLS 1.3 finishes the client's side first; the refusal arrives on the first read.
        if (c.ok()) {
            (void)(*c)->send(forwarded);
            CHECK_FALSE((*c)->read_response().ok());
        }
        CHECK_FALSE(b.generator.wait_for_request(0, 0));
        peer_refusal_counted();
    }
    SUBCASE("a certificate from another CA") {
        testing::TempDir other;
        testing::TestCa rogue_ca = testing::make_ca(other.path(), "rogue", "rogue CA");
        auto rogue = testing::make_signed_certificate(rogue_ca, other.path(), "rogue",
                                                      {"rogue.test"});
        testing::TlsClientOptions options;
        options.client_cert_path = rogue.cert_path;
        options.client_key_path = rogue.key_path;
        auto c = TlsClient::connect(port, options);
        if (c.ok()) {
            (void)(*c)->send(forwarded);
            CHECK_FALSE((*c)->read_response().ok());
        }
        CHECK_FALSE(b.generator.wait_for_request(0, 0));
        peer_refusal_counted();
    }
    SUBCASE("a cluster certificate: forwarded requests run, others are refused") {
        auto site =
            testing::make_signed_certificate(cluster.ca, cluster.dir.path(), "fra", {"fra"});
        testing::TlsClientOptions options;
        options.client_cert_path = site.cert_path;
        options.client_key_path = site.key_path;
        auto c = TlsClient::connect(port, options);
        REQUIRE(c.ok());
        REQUIRE((*c)->send(testing::http_request("POST", "/v1/chat/completions",
                                                 chat_body(false)))
                    .ok());
        auto plain = (*c)->read_response();
        REQUIRE(plain.ok());
        CHECK(plain->status == 400);
        CHECK(error_code_of(*plain) == "not_a_forwarded_request");

        auto c2 = TlsClient::connect(port, options);
        REQUIRE(c2.ok());
        REQUIRE((*c2)->send(forwarded).ok());
        REQUIRE(b.generator.wait_for_request(0));
        CHECK(b.generator.request(0).tenant == daemon::kForwardedTenant);
        b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
        auto r = (*c2)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        CHECK(b.planner.plans() == 0);  // A forwarded request is never planned again.

        // The forwarding site's cap on a default max_tokens: applied, or refused when malformed.
        auto c3 = TlsClient::connect(port, options);
        REQUIRE(c3.ok());
        REQUIRE((*c3)->send(testing::http_request(
                                "POST", "/v1/chat/completions", chat_body(false),
                                "X-Edgeserve-Forwarded-By: fra\r\nX-Edgeserve-Tenant: acme\r\n"
                                "X-Edgeserve-Max-Tokens: 7\r\n"))
                    .ok());
        REQUIRE(b.generator.wait_for_request(1));
        CHECK(b.generator.request(1).sampling.max_tokens == 7);
        b.generator.finish(1, engine::FinishReason::kLength, engine::Usage{1, 7, 0});
        REQUIRE((*c3)->read_response().ok());
        REQUIRE((*c3)->send(testing::http_request(
                                "POST", "/v1/chat/completions", chat_body(false),
                                "X-Edgeserve-Forwarded-By: fra\r\nX-Edgeserve-Tenant: acme\r\n"
                                "X-Edgeserve-Max-Tokens: 7x\r\n"))
                    .ok());
        auto bad = (*c3)->read_response();
        REQUIRE(bad.ok());
        CHECK(bad->status == 400);
        CHECK(bad->body.find("X-Edgeserve-Max-Tokens must be a positive integer") !=
              std::string::npos);
        CHECK_FALSE(b.generator.wait_for_request(2, 0));
    }
}

TEST_CASE("forwarded tenant names: a known one keeps its entry, others share one name") {
    // Every tenant name a peer sends would otherwise become the engine's per-tenant series and
    // fair-share entries here, without bound. A tenant this site configures is served as its
    // own; any other under kForwardedTenant with the default settings, each still with a
    // prefix cache of its own; a header that cannot be a tenant name is refused.
    Cluster cluster;
    Site b(cluster, "sin", {"m"}, tenants_section());
    auto site = testing::make_signed_certificate(cluster.ca, cluster.dir.path(), "fra", {"fra"});
    testing::TlsClientOptions options;
    options.client_cert_path = site.cert_path;
    options.client_key_path = site.key_path;
    auto c = TlsClient::connect(b.daemon->peer_port(), options);
    REQUIRE(c.ok());
    auto send_as = [&](const std::string& tenant) {
        REQUIRE((*c)
                    ->send(testing::http_request(
                        "POST", "/v1/chat/completions", chat_body(false),
                        "X-Edgeserve-Forwarded-By: fra\r\nX-Edgeserve-Tenant: " + tenant + "\r\n"))
                    .ok());
    };
    const std::string names[] = {"acme", "made-up-1", "made-up-2"};
    for (size_t i = 0; i < 3; ++i) {
        send_as(names[i]);
        REQUIRE(b.generator.wait_for_request(i));
        b.generator.finish(i, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
    }
    CHECK(b.generator.request(0).tenant == "acme");
    CHECK(b.generator.request(0).cache_scope.starts_with("acme#"));  // Its scope here.
    for (size_t i : {1, 2}) {
        CHECK(b.generator.request(i).tenant == daemon::kForwardedTenant);
        CHECK(b.generator.request(i).cache_scope == "forwarded:" + names[i]);
    }
    CHECK_FALSE(daemon::is_identifier(daemon::kForwardedTenant));  // No configured tenant's.
    for (const std::string& bad : {std::string(65, 'a'), std::string("a b"), std::string("(x)")}) {
        CAPTURE(bad);
        send_as(bad);
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 400);
        CHECK(error_code_of(*r) == "invalid_forwarded_tenant");
    }
    CHECK_FALSE(b.generator.wait_for_request(3, 0));
}

namespace {

// A certificate of `ca` whose subject common name is `common_name` and whose only subjectAltName
// is IP 127.0.0.1: no DNS name at all (made by hand or by another tool than
// deploy/make-cluster-certs). `<dir>/<stem>.crt` and `.key`.
testing::TestCertificate make_certificate_without_dns_names(const testing::TestCa& ca,
                                                            const std::string& dir,
                                                            const std::string& stem,
                                                            const std::string& common_name) {
    auto read_pem = [](const std::string& path, auto reader) {
        FILE* f = std::fopen(path.c_str(), "r");
        REQUIRE(f != nullptr);
        auto* read = reader(f, nullptr, nullptr, nullptr);
        std::fclose(f);
        REQUIRE(read != nullptr);
        return read;
    };
    X509* ca_cert = read_pem(ca.cert_path, PEM_read_X509);
    EVP_PKEY* ca_key = read_pem(ca.key_path, PEM_read_PrivateKey);
    EVP_PKEY* key = EVP_EC_gen("P-256");
    REQUIRE(key != nullptr);
    X509* cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 90'001);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 2 * 24 * 3600);
    X509_set_pubkey(cert, key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                               -1, 0);
    X509_set_issuer_name(cert, X509_get_subject_name(ca_cert));
    for (auto [nid, value] : {std::pair{NID_subject_alt_name, "IP:127.0.0.1"},
                              std::pair{NID_basic_constraints, "CA:FALSE"},
                              std::pair{NID_ext_key_usage, "serverAuth,clientAuth"}}) {
        X509V3_CTX ctx;
        X509V3_set_ctx_nodb(&ctx);
        X509V3_set_ctx(&ctx, ca_cert, cert, nullptr, nullptr, 0);
        X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
        REQUIRE(ext != nullptr);
        X509_add_ext(cert, ext, -1);
        X509_EXTENSION_free(ext);
    }
    REQUIRE(X509_sign(cert, ca_key, EVP_sha256()) > 0);
    testing::TestCertificate out{dir + "/" + stem + ".crt", dir + "/" + stem + ".key",
                                 common_name};
    FILE* f = std::fopen(out.cert_path.c_str(), "w");
    REQUIRE(f != nullptr);
    PEM_write_X509(f, cert);
    std::fclose(f);
    testing::write_private_key(out.key_path, key);
    X509_free(cert);
    EVP_PKEY_free(key);
    EVP_PKEY_free(ca_key);
    X509_free(ca_cert);
    return out;
}

}  // namespace

TEST_CASE("a site's certificate speaks for that site only, on both ends of a forward") {
    Cluster cluster;
    SUBCASE("the listener: a hop header naming another site than the certificate is refused") {
        Site b(cluster, "sin", {"m"});
        auto gru = testing::make_signed_certificate(cluster.ca, cluster.dir.path(), "gru-only",
                                                    {"gru", "localhost"});
        testing::TlsClientOptions options;
        options.client_cert_path = gru.cert_path;
        options.client_key_path = gru.key_path;
        auto as = [&](const std::string& hop) {
            auto c = TlsClient::connect(b.daemon->peer_port(), options);
            REQUIRE(c.ok());
            REQUIRE(
                (*c)->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false),
                                                 "X-Edgeserve-Forwarded-By: " + hop +
                                                     "\r\nX-Edgeserve-Tenant: acme\r\n"))
                    .ok());
            return c;
        };
        auto posing = as("fra");
        auto r = (*posing)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 403);
        CHECK(error_code_of(*r) == "peer_identity_mismatch");
        CHECK(r->body.find("does not name site 'fra'") != std::string::npos);
        CHECK(r->body.find("\"type\":\"permission_error\"") != std::string::npos);
        // Marked for the forwarding site: a refusal of that site, not an answer to relay.
        CHECK(r->headers["x-edgeserve-peer-refusal"] == "peer_identity_mismatch");
        CHECK_FALSE(b.generator.wait_for_request(0, 0));
        // Its own name (DNS names compare without case) runs.
        auto own = as("GRU");
        REQUIRE(b.generator.wait_for_request(0));
        b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
        auto ok = (*own)->read_response();
        REQUIRE(ok.ok());
        CHECK(ok->status == 200);
    }
    SUBCASE("the forwarding client: a peer whose certificate names another site is not used") {
        // sin's listener presents a certificate of the cluster CA made for gru.
        cluster.premade["sin"] = testing::make_signed_certificate(
            cluster.ca, cluster.dir.path(), "sin-as-gru", {"gru", "localhost"});
        Site a(cluster, "fra", {"m"}, tenants_section());
        Site b(cluster, "sin", {"m"});
        a.planner.route_to({b.target()});
        auto c = a.client();
        REQUIRE(c->send(chat_request(false)).ok());
        auto r = c->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 503);
        CHECK(error_code_of(*r) == "upstream_unavailable");
        CHECK_MESSAGE(r->body.find("does not name site 'sin'") != std::string::npos, r->body);
        CHECK_FALSE(b.generator.wait_for_request(0, 0));
    }
    SUBCASE("the forwarding client: a common name without a DNS subjectAltName names no site") {
        // The listener's hop check reads DNS subjectAltNames only; OpenSSL's host check would
        // fall back to the common name of a certificate without one: not taken either.
        cluster.premade["sin"] = make_certificate_without_dns_names(cluster.ca, cluster.dir.path(),
                                                                    "sin-cn-only", "sin");
        Site a(cluster, "fra", {"m"}, tenants_section());
        Site b(cluster, "sin", {"m"});
        a.planner.route_to({b.target()});
        auto c = a.client();
        REQUIRE(c->send(chat_request(false)).ok());
        // Taken by sin, it would wait there for an answer: finished, so the reply is read.
        const bool ran_at_sin = b.generator.wait_for_request(0, 1000);
        if (ran_at_sin) {
            b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
        }
        CHECK_FALSE(ran_at_sin);
        auto r = c->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 503);
        CHECK(error_code_of(*r) == "upstream_unavailable");
        CHECK_MESSAGE(r->body.find("does not name site 'sin'") != std::string::npos, r->body);
    }
    SUBCASE("peer.verify_site_identity: false trusts every certificate of the CA, as before") {
        cluster.premade["sin"] = testing::make_signed_certificate(cluster.ca, cluster.dir.path(),
                                                                  "sin-unnamed", {"localhost"});
        cluster.premade["fra"] = testing::make_signed_certificate(cluster.ca, cluster.dir.path(),
                                                                  "fra-unnamed", {"localhost"});
        Site a(cluster, "fra", {"m"}, tenants_section(), true, "  verify_site_identity: false\n");
        Site b(cluster, "sin", {"m"}, "", true, "  verify_site_identity: false\n");
        a.planner.route_to({b.target()});
        auto c = a.client();
        REQUIRE(c->send(chat_request(false)).ok());
        REQUIRE(b.generator.wait_for_request(0));
        b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
        auto r = c->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
    }
}

TEST_CASE("a peer's listener refusing this site's certificate: the next target runs it") {
    // fra's certificate does not name fra (verify_site_identity off there, a migration half
    // done) while sin checks it: sin's 403 peer_identity_mismatch was relayed to the client as
    // the answer, sin reported healthy, no other target tried, the tenant charged.
    Cluster cluster;
    cluster.premade["fra"] = testing::make_signed_certificate(cluster.ca, cluster.dir.path(),
                                                              "fra-unnamed", {"localhost"});
    Site a(cluster, "fra", {"m"}, tenants_section(), true, "  verify_site_identity: false\n");
    Site b(cluster, "sin", {"m"});
    SUBCASE("another site takes it") {
        Site c(cluster, "gru", {"m"}, "", true, "  verify_site_identity: false\n");
        a.planner.route_to({b.target(), c.target()});
        auto client = a.client();
        REQUIRE(client->send(chat_request(false)).ok());
        REQUIRE(c.generator.wait_for_request(0));
        c.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
        auto r = client->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        CHECK(r->headers["x-edgeserve-site"] == "gru");
        auto reports = a.planner.reports();
        REQUIRE(reports.size() == 2);
        CHECK(reports[0].site == "sin");
        CHECK_FALSE(reports[0].ok);
        CHECK(reports[1].site == "gru");
        CHECK(reports[1].ok);
        CHECK(metrics_contain(a, "edgeserve_forward_retries_total{reason=\"connect\"} 1"));
    }
    SUBCASE("this site is next in the plan: it runs here") {
        a.planner.route_to({b.target(), RouteTarget{true, "fra", "", 0.0, "m"}});
        auto client = a.client();
        a.answered_here(*client, chat_request(false));
    }
    SUBCASE("no other target: 503 upstream_unavailable, refunded as refused") {
        a.planner.route_to({b.target()});
        auto r = a.ask(chat_request(false));
        CHECK(r->status == 503);
        CHECK(error_code_of(*r) == "upstream_unavailable");
        CHECK_MESSAGE(r->body.find("peer_identity_mismatch") != std::string::npos, r->body);
        CHECK(r->headers.count("x-edgeserve-peer-refusal") == 0);
        auto reports = a.planner.reports();
        REQUIRE(reports.size() == 1);
        CHECK_FALSE(reports[0].ok);
        CHECK(metrics_contain(
            a, "edgeserve_tenant_rejections_total{reason=\"peer_refused\",tenant=\"acme\"} 1"));
    }
    CHECK_FALSE(b.generator.wait_for_request(0, 0));
}

TEST_CASE("a forwarding loop cannot form") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"other"}, tenants_section());

    SUBCASE("the hop header on the public listener is refused") {
        auto c = a.client();
        REQUIRE(c->send(chat_request(false, "m", "X-Edgeserve-Forwarded-By: sin\r\n")).ok());
        auto r = c->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 400);
        CHECK(error_code_of(*r) == "forwarding_header_not_allowed");
        CHECK(a.planner.plans() == 0);
        CHECK_FALSE(a.generator.wait_for_request(0, 0));
    }
    SUBCASE("two sites whose planners point at each other") {
        a.planner.route_to({b.target()});
        b.planner.route_to({a.target()});
        auto c = a.client();
        REQUIRE(c->send(chat_request(false)).ok());
        auto r = c->read_response();
        REQUIRE(r.ok());
        // B does not serve the model and never forwards a forwarded request: a clear error.
        CHECK(r->status == 503);
        CHECK(error_code_of(*r) == "model_not_served_here");
        std::string message(json_of(r->body)["error"].as_object()["message"].as_string());
        CHECK(message.find("never forwarded again") != std::string::npos);
        CHECK(a.planner.plans() == 1);
        CHECK(b.planner.plans() == 0);
        CHECK_FALSE(a.generator.wait_for_request(0, 0));
    }
    SUBCASE("a planner that routes a site to itself runs the request there once") {
        a.planner.route_to({a.target()});
        auto c = a.client();
        REQUIRE(c->send(chat_request(false)).ok());
        REQUIRE(a.generator.wait_for_request(0));
        a.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
        auto r = c->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        CHECK(a.planner.plans() == 1);
    }
}

TEST_CASE("no pool can take the request: 503 saying why, Retry-After when waiting helps") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    struct Case {
        RouteRejection rejection;
        int retry_after;
        const char* code;
    };
    for (Case k : {Case{RouteRejection::kNoPoolServesModel, 0, "no_pool_serves_model"},
                   Case{RouteRejection::kVersionPinUnmatched, 0, "version_pin_unmatched"},
                   Case{RouteRejection::kAllSaturated, 3, "all_pools_saturated"}}) {
        CAPTURE(k.code);
        RoutePlan plan;
        plan.rejection = k.rejection;
        plan.message = std::string("because: ") + k.code;
        plan.retry_after_seconds = k.retry_after;
        a.planner.set(plan);
        auto c = a.client();
        REQUIRE(c->send(chat_request(false)).ok());
        auto r = c->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 503);
        CHECK(error_code_of(*r) == k.code);
        CHECK(json_of(r->body)["error"].as_object()["message"].as_string() == plan.message.c_str());
        if (k.retry_after > 0) {
            CHECK(r->headers["retry-after"] == std::to_string(k.retry_after));
        } else {
            CHECK(r->headers.count("retry-after") == 0);
        }
    }
    CHECK_FALSE(a.generator.wait_for_request(0, 0));
    CHECK(metrics_contain(
        a, "edgeserve_tenant_rejections_total{reason=\"route_rejected\",tenant=\"acme\"} 3"));
}

TEST_CASE("a plan to another site without a peer section fails clearly, no planner runs here") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section(), false);
    CHECK(a.daemon->peer_port() == 0);
    CHECK(a.daemon->forwarder() == nullptr);
    a.planner.route_to({RouteTarget{false, "sin", "127.0.0.1:1", 0.0, "m"}});
    auto c = a.client();
    REQUIRE(c->send(chat_request(false)).ok());
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 503);
    CHECK(error_code_of(*r) == "forwarding_unavailable");

    a.daemon->set_route_planner(nullptr);
    REQUIRE(c->send(chat_request(false)).ok());
    REQUIRE(a.generator.wait_for_request(0));
    a.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
    auto local = c->read_response();
    REQUIRE(local.ok());
    CHECK(local->status == 200);
}

TEST_CASE("deploy/make-cluster-certs certificates carry a forwarded stream to curl") {
    if (!testing::have_program("openssl") || !testing::have_program("curl")) {
        MESSAGE("openssl or curl missing: skipped");
        return;
    }
    Cluster cluster;
    std::string certs = cluster.dir.file("made");
    auto made = testing::run({EDGE_SOURCE_DIR "/deploy/make-cluster-certs", certs,
                              "fra:localhost,127.0.0.1", "sin:localhost,127.0.0.1"});
    REQUIRE_MESSAGE(made.exit_code == 0, made.err);
    cluster.ca = testing::TestCa{certs + "/ca.crt", certs + "/ca.key"};
    for (const char* site : {"fra", "sin"}) {
        cluster.premade[site] = testing::TestCertificate{certs + "/" + site + ".crt",
                                                         certs + "/" + site + ".key", site};
    }
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"m"});
    a.planner.route_to({b.target()});

    // curl streams through fra to sin.
    testing::CommandResult streamed;
    std::thread curl([&] {
        streamed = testing::run(
            {"curl", "-sS", "-N", "--cacert", cluster.ca.cert_path,
             "https://localhost:" + std::to_string(a.daemon->public_port()) +
                 "/v1/chat/completions",
             "-H", std::string("Authorization: Bearer ") + kKey, "-H",
             "Content-Type: application/json", "-d", chat_body(true)});
    });
    REQUIRE(b.generator.wait_for_request(0, 10'000));
    b.generator.emit(0, "curl-sees-this");
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{2, 1, 0});
    curl.join();
    CHECK_MESSAGE(streamed.exit_code == 0, streamed.err);
    CHECK(streamed.out.find("curl-sees-this") != std::string::npos);
    CHECK(streamed.out.find("data: [DONE]") != std::string::npos);

    // curl as a peer: the site's certificate opens sin's peer listener; without one it is shut.
    std::string peer_url =
        "https://127.0.0.1:" + std::to_string(b.daemon->peer_port()) + "/v1/models";
    auto as_peer = testing::run({"curl", "-sS", "--cacert", cluster.ca.cert_path, "--cert",
                                 certs + "/fra.crt", "--key", certs + "/fra.key", "-H",
                                 "X-Edgeserve-Forwarded-By: fra", "-H",
                                 "X-Edgeserve-Tenant: acme", peer_url});
    CHECK_MESSAGE(as_peer.exit_code == 0, as_peer.err);
    CHECK(as_peer.out.find("\"id\":\"m\"") != std::string::npos);
    auto stranger = testing::run({"curl", "-sS", "--cacert", cluster.ca.cert_path, peer_url});
    CHECK(stranger.exit_code != 0);
}

TEST_CASE("SIGHUP reloads the cluster certificates, a broken file keeps the old ones") {
    namespace fs = std::filesystem;
    Cluster cluster;  // Its CA is the first cluster CA.
    testing::TempDir second;
    testing::TestCa ca2 = testing::make_ca(second.path(), "ca2", "edgeserve second cluster CA");
    const std::string live = cluster.dir.file("live");
    fs::create_directories(live);
    // Makes SITE's certificate (common name `cn`) signed by `ca` and installs it, its key and
    // the CA as the files the site's config names.
    auto install = [&](const std::string& site, const testing::TestCa& ca, const std::string& where,
                       const std::string& cn) {
        auto made = testing::make_signed_certificate(ca, where, site + "-" + cn, {cn, site});
        fs::copy_file(made.cert_path, live + "/" + site + ".crt",
                      fs::copy_options::overwrite_existing);
        fs::copy_file(made.key_path, live + "/" + site + ".key",
                      fs::copy_options::overwrite_existing);
        fs::copy_file(ca.cert_path, live + "/" + site + "-ca.pem",
                      fs::copy_options::overwrite_existing);
        return made;
    };
    auto fra1 = install("fra", cluster.ca, cluster.dir.path(), "fra.cluster.test");
    install("sin", cluster.ca, cluster.dir.path(), "sin.cluster.test");
    for (const char* site : {"fra", "sin"}) {
        cluster.premade[site] = testing::TestCertificate{live + "/" + site + ".crt",
                                                         live + "/" + site + ".key", site};
        cluster.ca_files[site] = live + "/" + site + "-ca.pem";
    }
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"m"});
    a.planner.route_to({b.target()});

    size_t served = 0;
    auto forward = [&]() -> int {
        auto c = a.client();
        REQUIRE(c->send(chat_request(false)).ok());
        if (!b.generator.wait_for_request(served)) {
            auto r = c->read_response();
            FAIL((r.ok() ? std::to_string(r->status) + r->body : r.status().to_string()));
        }
        b.generator.finish(served++, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
        auto r = c->read_response();
        REQUIRE(r.ok());
        CHECK(r->headers["x-edgeserve-site"] == "sin");
        return r->status;
    };
    // A fresh handshake with sin's peer listener presenting `client`: the common name of the
    // certificate sin presents, or "" when sin refuses the client.
    auto handshake = [&](const testing::TestCertificate& client) -> std::string {
        testing::TlsClientOptions options;
        options.client_cert_path = client.cert_path;
        options.client_key_path = client.key_path;
        auto c = TlsClient::connect(b.daemon->peer_port(), options);
        if (!c.ok()) {
            return "";
        }
        (void)(*c)->send(testing::http_request(
            "GET", "/v1/models", "",
            "X-Edgeserve-Forwarded-By: fra\r\nX-Edgeserve-Tenant: acme\r\n"));
        auto r = (*c)->read_response();
        return r.ok() && r->status == 200 ? (*c)->peer_common_name() : "";
    };

    CHECK(forward() == 200);
    CHECK(a.daemon->forwarder()->connections_opened() == 1);
    CHECK(handshake(fra1) == "sin.cluster.test");

    SUBCASE("a broken file keeps the old certificates, and the error names it") {
        std::ofstream(live + "/sin.crt") << "not a certificate\n";
        Status s = b.daemon->reload_certificates();
        CHECK_FALSE(s.ok());
        CHECK_MESSAGE(s.message().find(live + "/sin.crt") != std::string::npos, s.message());
        std::ofstream(live + "/fra-ca.pem") << "-----BEGIN CERTIFICATE-----\nbroken\n";
        Status f = a.daemon->reload_certificates();
        CHECK_FALSE(f.ok());
        CHECK_MESSAGE(f.message().find(live + "/fra-ca.pem") != std::string::npos, f.message());
        CHECK(handshake(fra1) == "sin.cluster.test");  // sin's peer listener: as before.
        CHECK(forward() == 200);
        CHECK(metrics_contain(
            a, "edgeserve_forwarded_requests_total{outcome=\"ok\",site=\"sin\"} 2"));
    }
    SUBCASE("a site's certificate copied over the CA file changes neither side") {
        // The peer listener refuses such a file; the forwarding client alone would have taken
        // it, trusting only that certificate: every new handshake with a peer would then fail.
        fs::copy_file(live + "/fra.crt", live + "/fra-ca.pem",
                      fs::copy_options::overwrite_existing);
        Status f = a.daemon->reload_certificates();
        CHECK_FALSE(f.ok());
        CHECK_MESSAGE(f.message().find(live + "/fra-ca.pem") != std::string::npos, f.message());
        CHECK_MESSAGE(f.message().find("holds no CA certificate") != std::string::npos,
                      f.message());
        for (const char* side : {"peer", "forwarding_client"}) {
            CHECK_MESSAGE(metrics_contain(a, std::string("edgeserve_certificate_reloads_total{"
                                                         "listener=\"") +
                                                 side + "\",result=\"error\"} 1"),
                          side);
        }
        // The forwarding client: one forward holds the pooled connection, so a second one at
        // the same time handshakes afresh, with the CA as it was.
        auto held = a.client();
        REQUIRE(held->send(chat_request(false)).ok());
        REQUIRE(b.generator.wait_for_request(served));
        const size_t held_index = served++;
        CHECK(forward() == 200);
        CHECK(a.daemon->forwarder()->connections_opened() == 2);
        b.generator.finish(held_index, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
        auto r = held->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        // fra's peer listener: sin's certificate, of the old CA, still gets in.
        testing::TlsClientOptions options;
        options.client_cert_path = live + "/sin.crt";
        options.client_key_path = live + "/sin.key";
        auto c = TlsClient::connect(a.daemon->peer_port(), options);
        REQUIRE(c.ok());
        REQUIRE((*c)->send(testing::http_request("GET", "/v1/models", "",
                                                 "X-Edgeserve-Forwarded-By: sin\r\n"
                                                 "X-Edgeserve-Tenant: acme\r\n"))
                    .ok());
        auto models = (*c)->read_response();
        REQUIRE(models.ok());
        CHECK(models->status == 200);
    }
    SUBCASE("rotating to a new CA: new handshakes use the new certificate and CA") {
        auto fra2 = install("fra", ca2, second.path(), "fra-2.cluster.test");
        install("sin", ca2, second.path(), "sin-2.cluster.test");
        REQUIRE(b.daemon->reload_certificates().ok());
        CHECK(handshake(fra1) == "");                     // Signed by the old CA: refused now.
        CHECK(handshake(fra2) == "sin-2.cluster.test");  // The new certificate, the new CA.
        REQUIRE(a.daemon->reload_certificates().ok());
        // fra's pooled connection went with the reload: the next forward handshakes afresh, which
        // sin accepts only from a certificate of the new CA, presenting one only it trusts.
        CHECK(forward() == 200);
        CHECK(a.daemon->forwarder()->connections_opened() == 2);
    }
}
