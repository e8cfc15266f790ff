// The plan's local fallback (this site listed after the remote targets): what makes the request
// run here after the last remote target failed with nothing relayed, and what is relayed when the
// plan holds no local target. A refused connection: forward_test.cc. Real sites and real TLS
// peers (forward_fixture.h).

#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>

#include "common/status.h"
#include "tests/daemon/forward/forward_fixture.h"

using namespace edge;
using namespace edge::testing::forward;

TEST_CASE("the last remote target answers 5xx and this site is next in the plan: it runs here") {
    // A 503 (the peer's engine queue full) from the last remote target was relayed to the client
    // while a refused connection to it ran the request here: only remote targets counted as next.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "ams", {"m"});
    const RouteTarget here{true, "fra", "", 0.0, "m"};
    b.generator.fail_next_submit(unavailable_error("engine queue full"));
    a.planner.route_to({b.target(), here});
    auto client = a.client();

    SUBCASE("non-streamed") {
        testing::HttpReply r = a.answered_here(*client, chat_request(false));
        CHECK(r.body.find("engine queue full") == std::string::npos);
        CHECK(r.headers["x-edgeserve-site"] != "ams");
    }
    SUBCASE("streamed") {
        REQUIRE(client->send(chat_request(true)).ok());
        REQUIRE(a.generator.wait_for_request(0));
        a.generator.emit(0, "streamed here");
        a.generator.finish(0, engine::FinishReason::kStop, engine::Usage{3, 2, 0});
        auto all = client->read_until("data: [DONE]");
        REQUIRE(all.ok());
        CHECK(all->starts_with("HTTP/1.1 200"));
        CHECK(all->find("streamed here") != std::string::npos);
        CHECK(all->find("engine queue full") == std::string::npos);
    }
    // Charged once, what ran here; a refusal is load, not ill health: the detector hears nothing.
    CHECK(request_counted(a, "ok"));
    CHECK(
        metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 2"));
    CHECK(a.planner.reports().empty());
}

TEST_CASE("the last remote target answers 5xx and the plan holds no local target: it is relayed") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "ams", {"m"});
    b.generator.fail_next_submit(unavailable_error("engine queue full"));
    a.planner.route_to({b.target()});
    auto r = a.ask(chat_request(false));
    CHECK(r->status == 503);
    CHECK(r->headers["x-edgeserve-site"] == "ams");
    CHECK(json_of(r->body)["error"].as_object()["message"] == "engine queue full");
    CHECK_FALSE(a.generator.wait_for_request(0, 0));
}

TEST_CASE("a deferred answer cut at the last remote target and this site next: it runs here") {
    // The peer accepted (its deferred head, with the prompt's length), then died: nothing reached
    // the client, which got upstream_cut although this site was in the plan.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    RawPeer raw(cluster, kAcceptedDeferredHead);
    const RouteTarget here{true, "fra", "", 0.0, "m"};
    a.planner.route_to({raw.target(), here});
    auto client = a.client();
    testing::HttpReply r = a.answered_here(*client, chat_request(false));
    CHECK(r.body.find("upstream_cut") == std::string::npos);
    // Charged once, the run here (not the prompt the peer told); the cut is the peer's failure.
    CHECK(request_counted(a, "ok"));
    CHECK(metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 3"));
    auto reports = a.planner.reports();
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].site == "raw");
    CHECK_FALSE(reports[0].ok);
}

// Site a routes to b, then to itself; b's request 0 is accepted (its deferred head out, once
// submit() returned, and at a), then ended with `error` before any token, on a thread of its own.
struct AcceptedThenEnded {
    explicit AcceptedThenEnded(Status error) {
        a.planner.route_to({b.target(), RouteTarget{true, "fra", "", 0.0, "m"}});
        peer = std::jthread([this, error] {
            if (!b.generator.wait_for_request(0)) {
                return;  // The test's own wait fails it.
            }
            // An end before the deferred head went out is a plain refusal at submit, which is
            // another case; the test checks `accepted`.
            accepted = peer_head_arrived(a, "ams");
            b.generator.finish(0, engine::FinishReason::kError, engine::Usage{3, 0, 0}, error);
        });
    }
    Cluster cluster;
    Site a{cluster, "fra", {"m"}, tenants_section()};
    Site b{cluster, "ams", {"m"}};
    std::atomic<bool> accepted{false};  // The deferred head reached a before the end.
    std::jthread peer;  // Joined first, however the test ends.
};

TEST_CASE("a peer that accepted, then ended the request for capacity: it runs here") {
    // The peer's engine took the request (its deferred head went out), then found no room for
    // it: its deferred answer, a 503, was relayed although this site was next in the plan.
    AcceptedThenEnded f(unavailable_error("the model has no free sequence slot"));
    auto client = f.a.client();
    testing::HttpReply r = f.a.answered_here(*client, chat_request(false));
    CHECK(f.accepted);
    CHECK(r.body.find("no free sequence slot") == std::string::npos);
    // Charged once, the run here; a refusal for capacity is load, not ill health.
    CHECK(request_counted(f.a, "ok"));
    CHECK(metrics_contain(f.a,
                          "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 3"));
    CHECK(f.a.planner.reports().empty());
}

TEST_CASE("a peer that accepted, then failed the request itself: its 500 is relayed") {
    // The request ran there and failed (no token continues a JSON reply, say): it would fail at
    // every target, and the peer generated, so it is not run again.
    AcceptedThenEnded f(internal_error("no token of the vocabulary continues the reply"));
    auto r = f.a.ask(chat_request(false));
    CHECK(f.accepted);
    CHECK(r->status == 500);
    CHECK(r->headers["x-edgeserve-site"] == "ams");
    CHECK_FALSE(f.a.generator.wait_for_request(0, 0));
}

TEST_CASE("a deferred answer cut after its body began is not run again here") {
    // A deferred body starts once the peer's generation has ended: the peer ran the request
    // whole, and running it here too would generate (and charge) it twice.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    // 16 bytes of its body, then the cut.
    RawPeer raw(cluster, std::string(kAcceptedDeferredHead) + "10\r\n{\"id\":\"chatcmpl-\r\n");
    a.planner.route_to({raw.target(), RouteTarget{true, "fra", "", 0.0, "m"}});
    auto r = a.ask(chat_request(false));
    CHECK(r->status == 503);
    CHECK(error_code_of(*r) == "upstream_cut");
    CHECK_FALSE(a.generator.wait_for_request(0, 0));
}

namespace {

// A request sent on `client` (to another site, which forwards it) is served at `at`, its first
// request: the client gets at's 200, with the text "served at <site id>".
void check_served_at(Site& at, testing::TlsClient& client) {
    REQUIRE(client.send(chat_request(false)).ok());
    REQUIRE(at.generator.wait_for_request(0));
    at.generator.emit(0, "served at " + at.id);
    at.generator.finish(0, engine::FinishReason::kStop, engine::Usage{3, 2, 0});
    auto r = client.read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    CHECK(r->headers["x-edgeserve-site"] == at.id);
    CHECK(r->body.find("served at " + at.id) != std::string::npos);
}

}  // namespace

TEST_CASE("this site first in the plan refuses for its load: the next remote target serves it") {
    // The engine here answered 503 (its model's queue full) although the plan named ams next:
    // only a peer's refusal moved a request on.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "ams", {"m"});
    const RouteTarget here{true, "fra", "", 0.0, "m"};
    a.planner.route_to({here, b.target()});
    a.generator.fail_next_submit(unavailable_error("the model's queue is full"));
    auto client = a.client();
    check_served_at(b, *client);
    // Charged once, what ran at ams; the refusal here is load, not ill health: the detector
    // hears only ams's answer.
    CHECK(request_counted(a, "ok"));
    CHECK(
        metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 2"));
    auto reports = a.planner.reports();
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].site == "ams");
    CHECK(reports[0].ok);
}

TEST_CASE("this site first in the plan: the tenant's own queue full here stays a 429") {
    // The tenant's queue limit is this site's fair share for it, not the site's load: sending
    // the overflow to other sites would let one tenant spread its backlog over the cluster.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "ams", {"m"});
    a.planner.route_to({RouteTarget{true, "fra", "", 0.0, "m"}, b.target()});
    a.generator.fail_next_submit(resource_exhausted_error("tenant 'acme' already has 4 waiting"));
    auto r = a.ask(chat_request(false));
    CHECK(r->status == 429);
    CHECK_FALSE(b.generator.wait_for_request(0, 0));
}

TEST_CASE("this site, refusing for its load, is the plan's last target: its 503 is the answer") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "ams", {"m"});
    // ams before this site failed (refused connection), then this site refused: nothing left.
    a.planner.route_to({RouteTarget{false, "ams", "127.0.0.1:" + std::to_string(refused_port()),
                                    0.0, "m"},
                        RouteTarget{true, "fra", "", 0.0, "m"}});
    a.generator.fail_next_submit(unavailable_error("the model's queue is full"));
    auto r = a.ask(chat_request(false));
    CHECK(r->status == 503);
    CHECK(error_code_of(*r) == "service_unavailable");
    CHECK(request_counted(a, "rejected"));
}

TEST_CASE("the shared queue of forwarded tenants full at a peer: the plan's next target runs it") {
    // ams knows no tenant of fra's (authentication off there): every forwarded tenant waits in
    // one queue, "(forwarded)". Its being full was a 429 naming "(forwarded)", relayed to the
    // client although this site was next in the plan: one tenant's burst refused the others.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "ams", {"m"});
    b.generator.fail_next_submit(
        resource_exhausted_error("tenant '(forwarded)' already has 256 requests waiting"));
    a.planner.route_to({b.target(), RouteTarget{true, "fra", "", 0.0, "m"}});
    auto client = a.client();
    testing::HttpReply r = a.answered_here(*client, chat_request(false));
    CHECK(r.body.find("(forwarded)") == std::string::npos);
    CHECK(request_counted(a, "ok"));
}

TEST_CASE("a plan with this site between remote ones: it is tried in its turn, then the rest") {
    // The forwarder tried every remote target before this site's, wherever the plan placed it:
    // [ams, fra, sin] with ams down went to sin, then fra.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site c(cluster, "sin", {"m"});
    const RouteTarget down{false, "ams", "127.0.0.1:" + std::to_string(refused_port()), 0.0, "m"};
    a.planner.route_to({down, RouteTarget{true, "fra", "", 0.0, "m"}, c.target()});
    auto client = a.client();

    SUBCASE("this site runs it, the site after it never sees it") {
        a.answered_here(*client, chat_request(false));
        CHECK_FALSE(c.generator.wait_for_request(0, 0));
    }
    SUBCASE("this site refuses it for its load: the site after it serves it") {
        a.generator.fail_next_submit(unavailable_error("the model's queue is full"));
        check_served_at(c, *client);
    }
    CHECK(request_counted(a, "ok"));
}
