// A /v1/completions list of prompts forwarded to another site: the serving site parses the body
// as the forwarding one did and runs every prompt's choices; the forwarding site charges the
// tenant the summed usage the peer reports (each prompt once, every choice's tokens).

#include <doctest/doctest.h>

#include <string>

#include "tests/daemon/forward/forward_fixture.h"
#include "tests/testing/scripted_daemon.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using namespace edge::testing::forward;

TEST_CASE("a forwarded list of prompts runs every prompt there, charged the summed usage") {
    for (bool stream : {false, true}) {
        CAPTURE(stream);
        Cluster cluster;
        Site a(cluster, "fra", {"m"}, tenants_section());
        Site b(cluster, "sin", {"m"});
        a.planner.route_to({b.target()});
        auto c = a.client();
        REQUIRE(
            c->send(testing::http_request("POST", "/v1/completions",
                                          std::string(R"({"model":"m","prompt":["x","y"],"n":2)") +
                                              (stream ? R"(,"stream":true})" : "}"),
                                          auth()))
                .ok());
        REQUIRE(b.generator.wait_for_request(3));
        for (size_t i = 0; i < 4; ++i) {
            CHECK(std::get<std::string>(b.generator.request(i).prompt) == (i < 2 ? "x" : "y"));
            b.generator.emit(i, "t" + std::to_string(i));
            b.generator.finish(i, engine::FinishReason::kStop, engine::Usage{i < 2 ? 3 : 5, 2, 0});
        }
        std::string text;
        if (stream) {
            auto all = c->read_until("0\r\n\r\n");
            REQUIRE(all.ok());
            CHECK(all->find("edgeserve-usage") == std::string::npos);
            for (const std::string& e : testing::sse_events(*all)) {
                if (e != "[DONE]") {
                    auto choice = json_of(e)["choices"].as_array()[0].as_object();
                    text += std::to_string(choice["index"].as_int64()) + "=" +
                            std::string(choice["text"].as_string()) + ";";
                }
            }
        } else {
            auto r = c->read_response();
            REQUIRE(r.ok());
            CHECK(r->status == 200);
            auto body = json_of(r->body);
            for (const auto& choice : body["choices"].as_array()) {
                text += std::to_string(choice.as_object().at("index").as_int64()) + "=" +
                        std::string(choice.as_object().at("text").as_string()) + ";";
            }
            CHECK(body["usage"].as_object()["prompt_tokens"] == 8);
        }
        // Streamed, each choice's finish chunk adds an empty text.
        CHECK(text.find("0=t0;") != std::string::npos);
        CHECK(text.find("3=t3;") != std::string::npos);
        CHECK(request_counted(a));
        CHECK(
            metrics_contain(a, "edgeserve_tenant_tokens_total{kind=\"prompt\",tenant=\"acme\"} 8"));
        CHECK(metrics_contain(
            a, "edgeserve_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 8"));
    }
}
