// The forwarding site's prompt cap for its tenant (input_tokens_per_minute: a longer prompt could
// never fit the budget, and gets 400 there) travels with a forwarded request
// (X-Edgeserve-Max-Prompt-Tokens), and the serving site holds the engine to it whether or not
// its own config knows the tenant: otherwise such a prompt ran there and the forwarding site
// charged it as debt.

#include <doctest/doctest.h>

#include <string>

#include "daemon/tenants.h"
#include "tests/daemon/forward/forward_fixture.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using edge::testing::TlsClient;
using namespace edge::testing::forward;

TEST_CASE("a forwarded request carries its tenant's prompt cap to a site that lacks the tenant") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section() + "    input_tokens_per_minute: 100\n");
    Site b(cluster, "sin", {"m"});  // No tenants: acme has no cap of its own here.
    a.planner.route_to({b.target()});
    auto c = a.client();
    // A client's own copy of the header is not the forwarding site's: replaced.
    REQUIRE(c->send(chat_request(false, "m", "X-Edgeserve-Max-Prompt-Tokens: 100000\r\n")).ok());
    REQUIRE(b.generator.wait_for_request(0));
    CHECK(b.generator.request(0).tenant == daemon::kForwardedTenant);
    // The engine refuses a longer prompt with the 400 fra's engine gives ("exceeds this
    // tenant's input_tokens_per_minute of 100").
    CHECK(b.generator.request(0).max_prompt_tokens == 100);
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
}

TEST_CASE("the peer listener holds a forwarded prompt to the tighter cap, refusing a bad header") {
    Cluster cluster;
    Site b(cluster, "sin", {"m"}, tenants_section() + "    input_tokens_per_minute: 50\n");
    auto site = testing::make_signed_certificate(cluster.ca, cluster.dir.path(), "fra", {"fra"});
    testing::TlsClientOptions options;
    options.client_cert_path = site.cert_path;
    options.client_key_path = site.key_path;
    auto c = TlsClient::connect(b.daemon->peer_port(), options);
    REQUIRE(c.ok());
    auto forward = [&](const std::string& tenant, const std::string& cap) {
        REQUIRE((*c)->send(testing::http_request(
                               "POST", "/v1/chat/completions", chat_body(false),
                               "X-Edgeserve-Forwarded-By: fra\r\nX-Edgeserve-Tenant: " + tenant +
                                   "\r\nX-Edgeserve-Max-Prompt-Tokens: " + cap + "\r\n"))
                    .ok());
    };
    // acme is configured here with 50: the forwarding site's looser 100 does not lift it, its
    // tighter 10 holds; a tenant this site lacks gets the forwarding site's.
    struct Case {
        std::string tenant;
        std::string cap;
        int64_t held;
    };
    const Case cases[] = {{"acme", "100", 50}, {"acme", "10", 10}, {"other", "70", 70}};
    size_t n = 0;
    for (const Case& k : cases) {
        INFO(k.tenant << " " << k.cap);
        forward(k.tenant, k.cap);
        REQUIRE(b.generator.wait_for_request(n));
        CHECK(b.generator.request(n).max_prompt_tokens == k.held);
        b.generator.finish(n++, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
    }
    forward("acme", "0");
    auto bad = (*c)->read_response();
    REQUIRE(bad.ok());
    CHECK(bad->status == 400);
    CHECK_MESSAGE(bad->body.find("X-Edgeserve-Max-Prompt-Tokens must be a positive integer, "
                                 "not '0'") != std::string::npos,
                  bad->body);
    CHECK_FALSE(b.generator.wait_for_request(n, 0));
}
