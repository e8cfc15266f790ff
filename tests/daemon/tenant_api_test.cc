// Tenant limits through the real HTTPS server: 429 with Retry-After and the OpenAI error shape,
// 400 for max_tokens beyond the tenant's cap, concurrency released on finish and on cancel,
// per-tenant metrics without keys, and key rotation by reload while a request is running.

#include <doctest/doctest.h>

#include <thread>

#include <boost/json.hpp>

#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/tenants.h"
#include "tests/testing/config_yaml.h"
#include "tests/testing/scripted_generator.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using edge::testing::TlsClient;

namespace {

constexpr const char* kOldKey = "sk-tenant-old-key";
constexpr const char* kNewKey = "sk-tenant-new-key";

std::string tenant_yaml(const std::string& key, const std::string& limits) {
    return "tenants:\n  - name: acme\n    api_key_sha256: [" + daemon::TenantTable::sha256_hex(key) +
           "]\n" + limits + "models:\n  - {name: test-model, path: /m}\n";
}

std::string auth(const std::string& key) { return "Authorization: Bearer " + key + "\r\n"; }

std::string chat_body(bool stream, const std::string& extra = "") {
    return std::string(R"({"model":"test-model","messages":[{"role":"user","content":"secret prompt"}])") +
           (stream ? R"(,"stream":true)" : "") + extra + "}";
}

boost::json::object json_of(const std::string& s) {
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(s, ec);
    REQUIRE_MESSAGE(!ec, s);
    REQUIRE(v.is_object());
    return v.get_object();
}

struct TenantFixture {
    explicit TenantFixture(const std::string& limits) {
        cert = testing::make_certificate(dir.path(), "srv", {"localhost"});
        config_text = testing::config_yaml(cert.cert_path, cert.key_path,
                                           tenant_yaml(kOldKey, limits));
        auto config = daemon::parse_config(config_text, dir.file("c.yaml"));
        REQUIRE_MESSAGE(config.ok(), config.status().to_string());
        auto d = daemon::Daemon::create(*config, generator, clock);
        REQUIRE_MESSAGE(d.ok(), d.status().to_string());
        daemon = std::move(d).value();
        daemon->start();
    }

    std::unique_ptr<TlsClient> client() {
        auto c = TlsClient::connect(daemon->public_port());
        REQUIRE(c.ok());
        return std::move(c).value();
    }

    testing::HttpReply call(const std::string& body, const std::string& key) {
        auto c = client();
        REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", body, auth(key)))
                    .ok());
        auto r = c->read_response();
        REQUIRE(r.ok());
        return *r;
    }

    std::string metrics() {
        auto m = testing::plain_http_get(daemon->admin_port(), "/metrics");
        REQUIRE(m.ok());
        return m->body;
    }

    testing::TempDir dir;
    testing::TestCertificate cert;
    std::string config_text;
    ManualClock clock;
    testing::ScriptedGenerator generator{{"test-model"}};
    std::unique_ptr<daemon::Daemon> daemon;
};

}  // namespace

TEST_CASE("tenant limits: 429 with Retry-After and the OpenAI shape; clock refills the bucket") {
    TenantFixture f("    requests_per_second: 1\n    burst: 1\n");
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false),
                                          auth(kOldKey)))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    f.generator.finish(0, engine::FinishReason::kStop, {});
    CHECK(c->read_response()->status == 200);

    testing::HttpReply limited = f.call(chat_body(false), kOldKey);
    CHECK(limited.status == 429);
    CHECK(limited.headers["retry-after"] == "1");
    boost::json::object error = json_of(limited.body)["error"].as_object();
    CHECK(error["type"] == "rate_limit_exceeded");
    CHECK(error["code"] == "requests_per_second");
    CHECK(error["message"].as_string().size() > 0);

    f.clock.advance(std::chrono::seconds(1));
    auto again = f.client();
    REQUIRE(again->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false),
                                              auth(kOldKey)))
                .ok());
    REQUIRE(f.generator.wait_for_request(1));
    f.generator.finish(1, engine::FinishReason::kStop, {});
    CHECK(again->read_response()->status == 200);

    std::string m = f.metrics();
    CHECK(m.find(R"(edgeserve_tenant_rejections_total{reason="requests_per_second",tenant="acme"} 1)") !=
          std::string::npos);
    CHECK(m.find(R"(edgeserve_tenant_requests_total{outcome="ok",tenant="acme"} 2)") !=
          std::string::npos);
    CHECK(m.find(R"(edgeserve_tenant_requests_total{outcome="rejected",tenant="acme"} 1)") !=
          std::string::npos);
    CHECK(m.find(kOldKey) == std::string::npos);
    CHECK(m.find("secret prompt") == std::string::npos);
}

TEST_CASE("tenant limits: max_tokens and context caps, defaults lowered, tokens counted") {
    TenantFixture f("    max_output_tokens: 50\n    max_context_tokens: 100\n"
                    "    output_tokens_per_minute: 60\n");
    testing::HttpReply too_many = f.call(chat_body(false, R"(,"max_tokens":51)"), kOldKey);
    CHECK(too_many.status == 400);
    CHECK(json_of(too_many.body)["error"].as_object()["param"] == "max_tokens");

    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false),
                                          auth(kOldKey)))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    engine::GenerateRequest seen = f.generator.request(0);
    CHECK(seen.sampling.max_tokens == 50);  // The chat default (4096) lowered to the cap.
    CHECK(seen.max_context_tokens == 100);
    CHECK(seen.tenant == "acme");
    engine::Usage usage;
    usage.prompt_tokens = 7;
    usage.completion_tokens = 90;  // 30 tokens of output debt: 30 s.
    f.generator.finish(0, engine::FinishReason::kStop, usage);
    CHECK(c->read_response()->status == 200);

    testing::HttpReply limited = f.call(chat_body(false), kOldKey);
    CHECK(limited.status == 429);
    CHECK(limited.headers["retry-after"] == "30");
    CHECK(json_of(limited.body)["error"].as_object()["code"] == "output_tokens_per_minute");
    std::string m = f.metrics();
    CHECK(m.find(R"(edgeserve_tenant_tokens_total{kind="completion",tenant="acme"} 90)") !=
          std::string::npos);
    CHECK(m.find(R"(edgeserve_tenant_rejections_total{reason="max_output_tokens",tenant="acme"} 1)") !=
          std::string::npos);
}

TEST_CASE("tenant limits: max_concurrent counts running requests, released on finish and cancel") {
    TenantFixture f("    max_concurrent: 1\n");
    {
        auto c = f.client();
        REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(true),
                                              auth(kOldKey)))
                    .ok());
        REQUIRE(f.generator.wait_for_request(0));
        testing::HttpReply busy = f.call(chat_body(false), kOldKey);
        CHECK(busy.status == 429);
        CHECK(json_of(busy.body)["error"].as_object()["code"] == "max_concurrent");
        CHECK(!busy.headers["retry-after"].empty());
    }  // The client leaves: the generation is cancelled and the slot released.
    REQUIRE(f.generator.wait_cancelled(0));
    // The slot is released by the cancel callback on the server's thread; wait for it to land.
    int status = 0;
    std::unique_ptr<TlsClient> c;
    for (int attempt = 0; attempt < 200 && status != -1; ++attempt) {
        c = f.client();
        REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false),
                                              auth(kOldKey)))
                    .ok());
        if (f.generator.wait_for_request(1, 20)) {
            status = -1;
            break;
        }
        auto r = c->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 429);
    }
    REQUIRE(status == -1);
    f.generator.finish(1, engine::FinishReason::kStop, {});
    CHECK(c->read_response()->status == 200);
    // Finished: the slot is free again.
    auto d = f.client();
    REQUIRE(d->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false),
                                          auth(kOldKey)))
                .ok());
    REQUIRE(f.generator.wait_for_request(2));
    f.generator.finish(2, engine::FinishReason::kStop, {});
    CHECK(d->read_response()->status == 200);
}

TEST_CASE("reload rotates a key while a request runs: old key 401 after, running one completes") {
    TenantFixture f("    max_concurrent: 1\n");
    auto running = f.client();
    REQUIRE(running->send(testing::http_request("POST", "/v1/chat/completions", chat_body(true),
                                                auth(kOldKey)))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    f.generator.emit(0, "before-reload");
    REQUIRE(running->read_until("before-reload").ok());

    auto reloaded = daemon::parse_config(
        testing::config_yaml(f.cert.cert_path, f.cert.key_path,
                             tenant_yaml(kNewKey, "    max_concurrent: 2\n")),
        f.dir.file("c.yaml"));
    REQUIRE(reloaded.ok());
    f.daemon->reload_tenants(reloaded->tenants);

    testing::HttpReply old_key = f.call(chat_body(false), kOldKey);
    CHECK(old_key.status == 401);
    CHECK(json_of(old_key.body)["error"].as_object()["code"] == "invalid_api_key");
    // The running request still holds one of the (now two) slots; the new key gets the other.
    auto fresh = f.client();
    REQUIRE(fresh->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false),
                                              auth(kNewKey)))
                .ok());
    REQUIRE(f.generator.wait_for_request(1));
    CHECK(f.call(chat_body(false), kNewKey).status == 429);  // Two running: the cap.

    f.generator.emit(0, "after-reload");
    f.generator.finish(0, engine::FinishReason::kStop, {});
    Result<std::string> rest = running->read_until("[DONE]");
    REQUIRE(rest.ok());
    CHECK(rest->find("after-reload") != std::string::npos);
    CHECK_FALSE(f.generator.cancelled(0));
    f.generator.finish(1, engine::FinishReason::kStop, {});
    CHECK(fresh->read_response()->status == 200);
}
