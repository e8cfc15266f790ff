// Forwarded answers a peer accepted and then cut or left silent: what the client gets (a
// well-formed end), what the tenant is charged (once, the peer's report when it came), and what
// the outlier detector hears. Real sites and real TLS peers (forward_fixture.h); the timeouts
// are the forwarding client's socket expiries on the real steady clock, so the tests set short
// ones and wait on the client's read, never on a sleep.

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/status.h"
#include "tests/daemon/forward/forward_fixture.h"

using namespace edge;
using namespace edge::testing::forward;

namespace {

// The events of a de-chunked event-stream body, each checked well-formed: a comment, or one
// `data:` line holding a JSON object or [DONE]; the body ends with a blank line and [DONE] comes
// once, last. Returns the data of the `data:` events.
std::vector<std::string> sse_data(const std::string& body) {
    std::vector<std::string> data;
    size_t at = 0;
    while (at < body.size()) {
        const size_t end = body.find("\n\n", at);
        REQUIRE_MESSAGE(end != std::string::npos, "an event without its blank line: " << body);
        const std::string event = body.substr(at, end - at);
        at = end + 2;
        if (event.starts_with(":")) {
            continue;
        }
        REQUIRE_MESSAGE(event.starts_with("data: "), event);
        REQUIRE_MESSAGE(event.find('\n') == std::string::npos, event);
        data.push_back(event.substr(6));
        if (data.back() != "[DONE]") {
            json_of(data.back());  // A JSON object, or the test fails.
        }
    }
    REQUIRE(!data.empty());
    CHECK(data.back() == "[DONE]");
    CHECK(std::count(data.begin(), data.end(), "[DONE]") == 1);
    return data;
}

// The error events' objects among `data`.
std::vector<boost::json::object> error_events(const std::vector<std::string>& data) {
    std::vector<boost::json::object> errors;
    for (const std::string& d : data) {
        if (d != "[DONE]") {
            boost::json::object o = json_of(d);
            if (o.contains("error")) {
                errors.push_back(o["error"].as_object());
            }
        }
    }
    return errors;
}

// Whether the tenant's next request is refused for its output budget (429): it was charged
// what a request may generate (its max_tokens, the budget), not a count the peer reported. One
// admitted goes to a site that refuses the connection (a 503 at once).
bool charged_reservation(Site& a) {
    a.planner.route_to(
        {RouteTarget{false, "ams", "127.0.0.1:" + std::to_string(refused_port()), 0.0, "m"}});
    auto next = a.client();
    REQUIRE(next->send(chat_request(true)).ok());
    auto r = next->read_response();
    REQUIRE(r.ok());
    return r->status == 429;
}

}  // namespace

TEST_CASE("a forwarded stream cut at any point ends well-formed, a usage report held is charged") {
    // A usage report the scanner held without its blank line was lost at a cut: the tenant was
    // charged its max_tokens instead. And a client whose answer was whole (the report comes
    // after the last event, just before [DONE]) got an upstream_cut error event, and the peer
    // was reported failed.
    const std::string content =
        "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
        "\"delta\":{\"content\":\"whole\"},\"finish_reason\":\"stop\"}]}\n\n";
    const std::string report =
        ": edgeserve-usage {\"prompt_tokens\":3,\"completion_tokens\":1}\n\n";
    struct Cut {
        std::string where;
        std::string events;  // What the peer sent before it closed without the stream's end.
        bool reported;       // Its usage report can be read: charged, and the answer is whole.
    };
    const std::vector<Cut> cuts = {
        {"inside an event", content + content.substr(0, 40), false},
        {"inside the report", content + report.substr(0, 30), false},
        {"after the report's JSON", content + report.substr(0, report.size() - 2), true},
        {"after the report's line", content + report.substr(0, report.size() - 1), true},
        {"after the report", content + report, true},
        {"inside the end event", content + report + "data: [DO", true},
    };
    for (const Cut& cut : cuts) {
        CAPTURE(cut.where);
        Cluster cluster;
        Site a(cluster, "fra", {"m"}, tenants_section() + "    output_tokens_per_minute: 5\n");
        RawPeer raw(cluster, chunked_events(cut.events, /*last_chunk=*/false));
        a.planner.route_to({raw.target()});
        auto client = a.client();
        REQUIRE(client->send(chat_request(true)).ok());
        auto r = client->read_response();  // Fails on a body cut inside a chunk.
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        const std::vector<std::string> data = sse_data(r->body);
        CHECK(data.front().find("whole") != std::string::npos);
        CHECK(r->body.find("edgeserve-usage") == std::string::npos);  // Never relayed.
        const std::vector<boost::json::object> errors = error_events(data);
        REQUIRE(request_counted(a));
        const std::vector<StaticPlanner::Report> reports = a.planner.reports();
        REQUIRE(reports.size() == 1);
        CHECK(reports[0].site == "raw");
        if (cut.reported) {
            CHECK(data.size() == 2);  // The answer and [DONE]: nothing else, no error.
            CHECK(errors.empty());
            CHECK(reports[0].ok);
            // Charged once, what the peer reported (1 of the minute's 5: the next one fits).
            CHECK(metrics_contain(
                a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 1\n"));
            CHECK(metrics_contain(
                a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 3\n"));
            CHECK_FALSE(charged_reservation(a));
        } else {
            // The part of an event held at the cut is not relayed, so the error is an event of
            // its own: the answer, the error, [DONE].
            CHECK(data.size() == 3);
            REQUIRE(errors.size() == 1);
            CHECK(errors[0].at("code") == "upstream_cut");
            CHECK_FALSE(reports[0].ok);
            CHECK(metrics_contain(
                a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 0\n"));
            CHECK(charged_reservation(a));
        }
    }
}

TEST_CASE("a forwarded stream silent past stream_idle_timeout ends with an error event") {
    // The serving site's engine stops producing (and its keepalive comments are off): the
    // forward ends at the idle timeout, the client's stream with an error naming the setting.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section(), true, "  stream_idle_timeout_ms: 300\n");
    Site b(cluster, "sin", {"m"}, "limits:\n  stream_keepalive_ms: 0\n");
    Site c(cluster, "gru", {"m"});
    a.planner.route_to({b.target(), c.target()});
    auto client = a.client();
    REQUIRE(client->send(chat_request(true)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    b.generator.emit(0, "tok");
    auto r = client->read_response();
    REQUIRE(r.ok());
    const std::vector<std::string> data = sse_data(r->body);
    CHECK(r->body.find("\"content\":\"tok\"") != std::string::npos);
    const std::vector<boost::json::object> errors = error_events(data);
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].at("code") == "upstream_timeout");
    CHECK(std::string(errors[0].at("message").as_string()) ==
          "site 'sin' sent nothing for 300 ms while streaming (peer.stream_idle_timeout_ms)");
    CHECK(b.generator.wait_cancelled(0));  // The connection closed: the generation stops there.
    const std::vector<StaticPlanner::Report> reports = a.planner.reports();
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].site == "sin");
    CHECK_FALSE(reports[0].ok);
    CHECK_FALSE(c.generator.wait_for_request(0, 0));  // Bytes were out: not rerun.
    // An error for the tenant's count too (it was "ok": a 200 head), as the same cut here is.
    REQUIRE(request_counted(a, "error"));
    CHECK(
        metrics_contain(a, "edgeserve_forwarded_requests_total{outcome=\"error\",site=\"sin\"} 1"));
    b.generator.finish(0, engine::FinishReason::kCancelled, engine::Usage{3, 1, 0});
}

TEST_CASE("a forwarded stream the peer ends with its own error event: error, or cancelled") {
    // The peer's engine ended the request after its first token: its stream ends with an error
    // event and [DONE], whole, under a 200 head. Counted "ok" before (the head's status).
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    Site b(cluster, "sin", {"m"});
    a.planner.route_to({b.target()});
    auto client = a.client();
    REQUIRE(client->send(chat_request(true)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    // The peer's head goes out once submit() returned (its engine accepted the request): an end
    // before that is a plain 503, which is another case (a refusal, tried at the next site).
    REQUIRE(peer_head_arrived(a, "sin"));
    b.generator.emit(0, "tok");
    std::string outcome;
    SUBCASE("failed there: an error, as here") {
        b.generator.finish(0, engine::FinishReason::kError, engine::Usage{3, 1, 0},
                           internal_error("the device was lost"));
        outcome = "error";
    }
    SUBCASE("stopped there by its drain's deadline: cancelled, as here") {
        b.generator.finish(0, engine::FinishReason::kCancelled, engine::Usage{3, 1, 0});
        outcome = "cancelled";
    }
    auto r = client->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    CHECK(error_events(sse_data(r->body)).size() == 1);
    CHECK(request_counted(a, outcome));
    CHECK(metrics_contain(a, "edgeserve_forwarded_requests_total{outcome=\"" + outcome +
                                 "\",site=\"sin\"} 1"));
    // Charged what the peer reported.
    CHECK(
        metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 1"));
}

TEST_CASE("a deferred answer not made within deferred_answer_timeout: a 504, the peer failed") {
    // A peer that accepted a non-streamed request and then never answered (its engine lost the
    // request, its process hung with its host up) held the client and its slot for good.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section(), true,
           "  deferred_answer_timeout_ms: 300\n  stream_idle_timeout_ms: 60000\n");
    Site b(cluster, "sin", {"m"});
    Site c(cluster, "gru", {"m"});
    a.planner.route_to({b.target(), c.target()});
    auto client = a.client();
    REQUIRE(client->send(chat_request(false)).ok());
    REQUIRE(b.generator.wait_for_request(0));
    b.generator.emit(0, "never sent");
    auto r = client->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 504);
    CHECK(error_code_of(*r) == "upstream_timeout");
    CHECK(r->body.find("site 'sin' accepted the request but sent no answer within 300 ms "
                       "(peer.deferred_answer_timeout_ms)") != std::string::npos);
    CHECK(b.generator.wait_cancelled(0));
    const std::vector<StaticPlanner::Report> reports = a.planner.reports();
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].site == "sin");
    CHECK_FALSE(reports[0].ok);
    // Slow or stuck, not dead: not run again at the next site.
    CHECK_FALSE(c.generator.wait_for_request(0, 0));
    CHECK(request_counted(a, "error"));
    CHECK(
        metrics_contain(a, "edgeserve_forwarded_requests_total{outcome=\"error\",site=\"sin\"} 1"));
    b.generator.finish(0, engine::FinishReason::kCancelled, engine::Usage{3, 1, 0});
}

TEST_CASE("a forwarded stream the peer ends before its end event is cut in-band, not whole") {
    // An edgeserve stream always ends with `data: [DONE]`. A peer whose stream body ended
    // without it (the chunked body's terminator, or the close that ends a body without a length,
    // which is also how a dying peer ends one) truncated the answer, and the client was handed
    // the truncation as a whole answer: no error event, no [DONE], the peer counted healthy.
    const std::string content =
        "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
        "\"delta\":{\"content\":\"part\"},\"finish_reason\":null}]}\n\n";
    struct Ending {
        std::string how;
        std::string answer;  // What the peer sends before it closes.
    };
    const std::vector<Ending> endings = {
        {"chunked, with the terminator", chunked_events(content, /*last_chunk=*/true)},
        {"close-delimited", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + content},
    };
    for (const Ending& ending : endings) {
        CAPTURE(ending.how);
        Cluster cluster;
        Site a(cluster, "fra", {"m"}, tenants_section());
        RawPeer raw(cluster, ending.answer);
        a.planner.route_to({raw.target()});
        auto r = a.ask(chat_request(true));
        CHECK(r->status == 200);
        const std::vector<std::string> data = sse_data(r->body);  // Ends with [DONE], once.
        CHECK(data.front().find("part") != std::string::npos);
        const std::vector<boost::json::object> errors = error_events(data);
        REQUIRE(errors.size() == 1);
        CHECK(errors[0].at("code") == "upstream_cut");
        CHECK(std::string(errors[0].at("message").as_string()).find("site 'raw'") !=
              std::string::npos);
        REQUIRE(request_counted(a));
        const std::vector<StaticPlanner::Report> reports = a.planner.reports();
        REQUIRE(reports.size() == 1);
        CHECK_FALSE(reports[0].ok);
        CHECK(metrics_contain(
            a, "edgeserve_forwarded_requests_total{outcome=\"error\",site=\"raw\"} 1"));
    }
}
