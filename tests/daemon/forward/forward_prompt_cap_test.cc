// The forwarding site's prompt cap for its tenant (input_tokens_per_minute: a longer prompt could
// never fit the budget, and gets 400 there) and its context cap (max_context_tokens) travel with
// a forwarded request (X-Edgeserve-Max-Prompt-Tokens, X-Edgeserve-Max-Context-Tokens), and the
// serving site holds the engine to them whether or not its own config knows the tenant:
// otherwise such a request ran there and the forwarding site charged it.

#include <doctest/doctest.h>

#include <string>
#include <tuple>

#include "daemon/tenants.h"
#include "tests/daemon/forward/forward_fixture.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using edge::testing::TlsClient;
using namespace edge::testing::forward;

TEST_CASE("a forwarded request carries its tenant's prompt cap to a site that lacks the tenant") {
    Cluster cluster;
    Site a(cluster, "fra", {"m"},
           tenants_section() + "    input_tokens_per_minute: 100\n    max_context_tokens: 300\n");
    Site b(cluster, "sin", {"m"});  // No tenants: acme has no cap of its own here.
    a.planner.route_to({b.target()});
    auto c = a.client();
    // A client's own copy of the header is not the forwarding site's: replaced.
    REQUIRE(c->send(chat_request(false, "m",
                                 "X-Edgeserve-Max-Prompt-Tokens: 100000\r\n"
                                 "X-Edgeserve-Max-Context-Tokens: 100000\r\n"))
                .ok());
    REQUIRE(b.generator.wait_for_request(0));
    CHECK(b.generator.request(0).tenant == daemon::kForwardedTenant);
    // The engine refuses a longer prompt with the 400 fra's engine gives ("exceeds this
    // tenant's input_tokens_per_minute of 100").
    CHECK(b.generator.request(0).max_prompt_tokens == 100);
    CHECK(b.generator.request(0).max_context_tokens == 300);
    b.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
}

TEST_CASE("the peer listener holds a forwarded prompt to the tighter cap, refusing a bad header") {
    Cluster cluster;
    Site b(cluster, "sin", {"m"},
           tenants_section() + "    input_tokens_per_minute: 50\n    max_context_tokens: 60\n");
    auto site = testing::make_signed_certificate(cluster.ca, cluster.dir.path(), "fra", {"fra"});
    testing::TlsClientOptions options;
    options.client_cert_path = site.cert_path;
    options.client_key_path = site.key_path;
    auto c = TlsClient::connect(b.daemon->peer_port(), options);
    REQUIRE(c.ok());
    auto forward = [&](const std::string& tenant, const std::string& prompt_cap,
                       const std::string& context_cap) {
        REQUIRE((*c)->send(testing::http_request(
                               "POST", "/v1/chat/completions", chat_body(false),
                               "X-Edgeserve-Forwarded-By: fra\r\nX-Edgeserve-Tenant: " + tenant +
                                   "\r\nX-Edgeserve-Max-Prompt-Tokens: " + prompt_cap +
                                   "\r\nX-Edgeserve-Max-Context-Tokens: " + context_cap +
                                   "\r\n"))
                    .ok());
    };
    // acme is configured here with 50 and 60: the forwarding site's looser caps do not lift
    // them, its tighter ones hold; a tenant this site lacks gets the forwarding site's.
    struct Case {
        std::string tenant;
        std::string prompt_cap;
        std::string context_cap;
        int64_t prompt_held;
        int64_t context_held;
    };
    const Case cases[] = {{"acme", "100", "1000", 50, 60},
                          {"acme", "10", "20", 10, 20},
                          {"other", "70", "80", 70, 80}};
    size_t n = 0;
    for (const Case& k : cases) {
        INFO(k.tenant << " " << k.prompt_cap << " " << k.context_cap);
        forward(k.tenant, k.prompt_cap, k.context_cap);
        REQUIRE(b.generator.wait_for_request(n));
        CHECK(b.generator.request(n).max_prompt_tokens == k.prompt_held);
        CHECK(b.generator.request(n).max_context_tokens == k.context_held);
        b.generator.finish(n++, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
    }
    for (const auto& [prompt_cap, context_cap, header] :
         {std::tuple{"0", "10", "X-Edgeserve-Max-Prompt-Tokens"},
          std::tuple{"10", "0", "X-Edgeserve-Max-Context-Tokens"}}) {
        forward("acme", prompt_cap, context_cap);
        auto bad = (*c)->read_response();
        REQUIRE(bad.ok());
        CHECK(bad->status == 400);
        CHECK_MESSAGE(bad->body.find(std::string(header) + " must be a positive integer, not '0'") !=
                          std::string::npos,
                      bad->body);
    }
    CHECK_FALSE(b.generator.wait_for_request(n, 0));
}
