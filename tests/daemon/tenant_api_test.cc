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
#include "tests/testing/scripted_daemon.h"
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

boost::json::object json_of(const std::string& s) { return testing::json_object_of(s); }

struct TenantFixture : testing::ScriptedDaemon {
    explicit TenantFixture(const std::string& limits) : ScriptedDaemon({"test-model"}) {
        start(tenant_yaml(kOldKey, limits));
    }

    // POST /v1/chat/completions with `key`.
    testing::HttpReply call(const std::string& body, const std::string& key) {
        return ScriptedDaemon::call("POST", "/v1/chat/completions", body, auth(key));
    }

    // A client whose chat request with `key` reached the engine as its request `index`, not
    // yet answered.
    std::unique_ptr<TlsClient> start_request(size_t index, const std::string& key) {
        auto c = client();
        REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false),
                                              auth(key)))
                    .ok());
        REQUIRE(generator.wait_for_request(index));
        return c;
    }

    // The tenants section replaced by a reload: one tenant, newco, with `key`.
    std::optional<std::vector<daemon::TenantConfig>> renamed_newco(const std::string& key) {
        auto renamed = daemon::parse_config(
            testing::config_yaml(cert.cert_path, cert.key_path,
                                 "tenants:\n  - name: newco\n    api_key_sha256: [" +
                                     daemon::TenantTable::sha256_hex(key) +
                                     "]\nmodels:\n  - {name: test-model, path: /m}\n"),
            dir.file("c.yaml"));
        REQUIRE(renamed.ok());
        return renamed->tenants;
    }
};

}  // namespace

TEST_CASE("a request accepted, then ended for capacity before any token, is given back") {
    // No free sequence slot, or no KV room for it once queued: the engine ends it with an
    // error, as a full queue refuses at submit. The tenant did nothing wrong: like that refusal,
    // it keeps no request token (the clock does not move here).
    TenantFixture f("    requests_per_second: 1\n    burst: 1\n");
    auto c = f.start_request(0, kOldKey);
    f.generator.finish(0, engine::FinishReason::kError, {},
                       unavailable_error("no free sequence slot for this model"));
    CHECK(c->read_response()->status == 503);
    auto again = f.start_request(1, kOldKey);
    f.generator.finish(1, engine::FinishReason::kStop, {});
    CHECK(again->read_response()->status == 200);
    // Counted as that refusal is: rejected for load, not an error.
    const std::string m = f.metrics();
    CHECK(m.find(R"(edgeserve_tenant_rejections_total{reason="overloaded",tenant="acme"} 1)") !=
          std::string::npos);
    CHECK(m.find(R"(edgeserve_tenant_requests_total{outcome="rejected",tenant="acme"} 1)") !=
          std::string::npos);
    CHECK(m.find(R"(outcome="error")") == std::string::npos);
}

TEST_CASE("tenant limits: 429 with Retry-After and the OpenAI shape, clock refills the bucket") {
    TenantFixture f("    requests_per_second: 1\n    burst: 1\n");
    auto c = f.start_request(0, kOldKey);
    f.generator.finish(0, engine::FinishReason::kStop, {});
    CHECK(c->read_response()->status == 200);

    testing::HttpReply limited = f.call(chat_body(false), kOldKey);
    CHECK(limited.status == 429);
    CHECK(limited.headers["retry-after"] == "1");
    boost::json::object error = json_of(limited.body)["error"].as_object();
    CHECK(error["type"] == "rate_limit_error");
    CHECK(error["code"] == "requests_per_second");
    CHECK(error["message"].as_string().size() > 0);

    f.clock.advance(std::chrono::seconds(1));
    auto again = f.start_request(1, kOldKey);
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

TEST_CASE("tenant limits: a tenant over its rate gets 429 before its body is parsed") {
    // Reviewer's note: the body was parsed, its tool and response_format schemas compiled on the
    // I/O thread, before the limits were asked; a tenant held back could keep the site compiling
    // schemas by the 128, each answered 429 only afterwards (or 400, as here).
    TenantFixture f("    requests_per_second: 1\n    burst: 1\n");
    auto c = f.start_request(0, kOldKey);
    f.generator.finish(0, engine::FinishReason::kStop, {});
    CHECK(c->read_response()->status == 200);

    const std::string bad_schema = chat_body(
        false, R"(,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":)"
               R"({"type":"object","properties":{"age":{"type":"integer","multipleOf":2}}}}})");
    for (const std::string& body : {bad_schema, std::string(R"({"model":"test-model",)")}) {
        CAPTURE(body);
        testing::HttpReply limited = f.call(body, kOldKey);
        CHECK(limited.status == 429);
        CHECK(limited.headers["retry-after"] == "1");
        boost::json::object error = json_of(limited.body)["error"].as_object();
        CHECK(error["type"] == "rate_limit_error");
        CHECK(error["code"] == "requests_per_second");
    }
    std::string m = f.metrics();
    CHECK(m.find(R"(edgeserve_tenant_rejections_total{reason="requests_per_second",tenant="acme"} 2)") !=
          std::string::npos);
    CHECK(m.find(R"(reason="invalid_request")") == std::string::npos);

    // Within its rate the same bodies get their 400, each spending its request (it was parsed),
    // while the 429s before parsing took nothing: each is answered once a second has passed.
    f.clock.advance(std::chrono::seconds(1));
    testing::HttpReply schema = f.call(bad_schema, kOldKey);
    CHECK(schema.status == 400);
    CHECK(json_of(schema.body)["error"].as_object()["message"].as_string().find(
              "'multipleOf' is not supported") != std::string::npos);
    f.clock.advance(std::chrono::seconds(1));
    CHECK(f.call(R"({"model":"test-model",)", kOldKey).status == 400);
    f.clock.advance(std::chrono::seconds(1));
    auto again = f.start_request(1, kOldKey);
    f.generator.finish(1, engine::FinishReason::kStop, {});
    CHECK(again->read_response()->status == 200);
    m = f.metrics();
    CHECK(m.find(R"(edgeserve_tenant_rejections_total{reason="invalid_request",tenant="acme"} 2)") !=
          std::string::npos);
    CHECK(m.find(R"(edgeserve_tenant_requests_total{outcome="rejected",tenant="acme"} 4)") !=
          std::string::npos);
    // A bad key is still told so first.
    CHECK(f.call(R"({"model":"test-model",)", "sk-unknown").status == 401);
}

TEST_CASE("tenant limits: a request refused once its body was read spends its request") {
    // Only admission took a request token, so a body that did not parse, a
    // model the tenant may not use or max_tokens over its caps cost nothing, and a tenant at
    // requests_per_second 1 could have the site parse 4 MB bodies and compile their schemas
    // thousands of times a second, never held back by the 429 before parsing.
    testing::ScriptedDaemon f({"test-model", "other-model"});
    f.start("tenants:\n  - name: acme\n    api_key_sha256: [" +
            daemon::TenantTable::sha256_hex(kOldKey) +
            "]\n    requests_per_second: 1\n    burst: 1\n    max_output_tokens: 10\n"
            "    models: [test-model]\nmodels:\n  - {name: test-model, path: /m}\n"
            "  - {name: other-model, path: /o}\n");
    auto call = [&](const std::string& body) {
        return f.call("POST", "/v1/chat/completions", body, auth(kOldKey));
    };
    struct Refused {
        std::string body;
        int status;
    };
    const std::vector<Refused> refusals = {
        {R"({"model":"other-model","messages":[{"role":"user","content":"hi"}]})", 403},
        {R"({"model":"no-such-model","messages":[{"role":"user","content":"hi"}]})", 404},
        {R"({"model":"test-model",)", 400},              // Does not parse.
        {chat_body(false, R"(,"max_tokens":11)"), 400},  // Over max_output_tokens.
    };
    for (const Refused& r : refusals) {
        CAPTURE(r.body);
        CHECK(call(r.body).status == r.status);
        // The same instant: that request was the second's one.
        testing::HttpReply limited = call(chat_body(false));
        CHECK(limited.status == 429);
        CHECK(limited.headers["retry-after"] == "1");
        CHECK(json_of(limited.body)["error"].as_object()["code"] == "requests_per_second");
        f.clock.advance(std::chrono::seconds(1));
    }
    const std::string m = f.metrics();
    CHECK(m.find(R"(edgeserve_tenant_rejections_total{reason="requests_per_second",tenant="acme"} 4)") !=
          std::string::npos);
}

TEST_CASE("tenant limits: max_tokens and context caps, defaults lowered, tokens counted") {
    TenantFixture f("    max_output_tokens: 50\n    max_context_tokens: 100\n"
                    "    output_tokens_per_minute: 60\n");
    testing::HttpReply too_many = f.call(chat_body(false, R"(,"max_tokens":51)"), kOldKey);
    CHECK(too_many.status == 400);
    CHECK(json_of(too_many.body)["error"].as_object()["param"] == "max_tokens");

    auto c = f.start_request(0, kOldKey);
    engine::GenerateRequest seen = f.generator.request(0);
    CHECK(seen.sampling.max_tokens == 50);  // The chat default (4096) lowered to the cap.
    CHECK(seen.max_context_tokens == 100);
    CHECK(seen.tenant == "acme");
    engine::Usage usage;
    usage.prompt_tokens = 7;
    usage.completion_tokens = 90;  // 30 tokens of output debt, past the 50 reserved.
    f.generator.finish(0, engine::FinishReason::kStop, usage);
    CHECK(c->read_response()->status == 200);

    // A default max_tokens reserves a quarter of the 60 (15): the bucket went 60 -> 45, and the
    // 90 generated take it to -30; the next default request's 15 come back in 45 s.
    testing::HttpReply limited = f.call(chat_body(false), kOldKey);
    CHECK(limited.status == 429);
    CHECK(limited.headers["retry-after"] == "45");
    CHECK(json_of(limited.body)["error"].as_object()["code"] == "output_tokens_per_minute");
    std::string m = f.metrics();
    CHECK(m.find(R"(edgeserve_tenant_tokens_total{kind="completion",tenant="acme"} 90)") !=
          std::string::npos);
    CHECK(m.find(R"(edgeserve_tenant_rejections_total{reason="max_output_tokens",tenant="acme"} 1)") !=
          std::string::npos);
}

TEST_CASE("tenant limits: output tokens are reserved at admission, the unused part refunded") {
    TenantFixture f("    output_tokens_per_minute: 60\n    input_tokens_per_minute: 500\n");
    // More than a whole minute's budget can never be admitted: 400, not an endless 429.
    testing::HttpReply huge = f.call(chat_body(false, R"(,"max_tokens":61)"), kOldKey);
    CHECK(huge.status == 400);
    CHECK(json_of(huge.body)["error"].as_object()["param"] == "max_tokens");
    CHECK(json_of(huge.body)["error"].as_object()["message"].as_string().find(
              "output_tokens_per_minute of 60") != std::string::npos);
    // Two at once of 40 each: the first reserves 40 of 60, the second waits for 20 more.
    auto first = f.client();
    REQUIRE(first->send(testing::http_request("POST", "/v1/chat/completions",
                                              chat_body(false, R"(,"max_tokens":40)"),
                                              auth(kOldKey)))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    CHECK(f.generator.request(0).max_prompt_tokens == 500);  // The engine refuses longer ones.
    testing::HttpReply second = f.call(chat_body(false, R"(,"max_tokens":40)"), kOldKey);
    CHECK(second.status == 429);
    CHECK(second.headers["retry-after"] == "20");
    CHECK(json_of(second.body)["error"].as_object()["code"] == "output_tokens_per_minute");
    // The first used 10 of its 40: 30 come back, and the second fits at once.
    engine::Usage usage;
    usage.completion_tokens = 10;
    f.generator.finish(0, engine::FinishReason::kStop, usage);
    CHECK(first->read_response()->status == 200);
    auto third = f.client();
    REQUIRE(third->send(testing::http_request("POST", "/v1/chat/completions",
                                              chat_body(false, R"(,"max_tokens":40)"),
                                              auth(kOldKey)))
                .ok());
    REQUIRE(f.generator.wait_for_request(1));
    f.generator.finish(1, engine::FinishReason::kStop, usage);
    CHECK(third->read_response()->status == 200);
}

TEST_CASE("tenant limits: a prompt counts against input tokens once tokenized, not at its end") {
    TenantFixture f("    input_tokens_per_minute: 60\n");
    f.generator.set_prompt_tokens(90);
    auto first = f.client();
    REQUIRE(first->send(testing::http_request("POST", "/v1/chat/completions", chat_body(true),
                                              auth(kOldKey)))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    // Still running, its 90 prompt tokens already taken the bucket to -30: the next one waits.
    testing::HttpReply second = f.call(chat_body(false), kOldKey);
    CHECK(second.status == 429);
    CHECK(json_of(second.body)["error"].as_object()["code"] == "input_tokens_per_minute");
    CHECK(second.headers["retry-after"] == "30");
    // Its end reports the same 90: not charged twice.
    engine::Usage usage;
    usage.prompt_tokens = 90;
    usage.completion_tokens = 1;
    f.generator.finish(0, engine::FinishReason::kStop, usage);
    REQUIRE(first->read_until("data: [DONE]").ok());
    testing::HttpReply third = f.call(chat_body(false), kOldKey);
    CHECK(third.status == 429);
    CHECK(third.headers["retry-after"] == "30");
    CHECK(f.metrics().find(R"(edgeserve_tenant_tokens_total{kind="prompt",tenant="acme"} 90)") !=
          std::string::npos);
}

TEST_CASE("tenant metrics: a body the API refuses counts as the tenant's rejected request") {
    TenantFixture f("");
    testing::HttpReply bad = f.call(chat_body(false, R"(,"n":30)"), kOldKey);
    CHECK(bad.status == 400);
    std::string m = f.metrics();
    CHECK(m.find(R"(edgeserve_tenant_rejections_total{reason="invalid_request",tenant="acme"} 1)") !=
          std::string::npos);
    CHECK(m.find(R"(edgeserve_tenant_requests_total{outcome="rejected",tenant="acme"} 1)") !=
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
    auto d = f.start_request(2, kOldKey);
    f.generator.finish(2, engine::FinishReason::kStop, {});
    CHECK(d->read_response()->status == 200);
}

TEST_CASE("tenant limits: a 429 names every limit that refused, Retry-After waits for all") {
    TenantFixture f("    max_concurrent: 1\n    requests_per_second: 0.25\n");
    auto running = f.start_request(0, kOldKey);
    testing::HttpReply busy = f.call(chat_body(false), kOldKey);
    CHECK(busy.status == 429);
    CHECK(busy.headers["retry-after"] == "4");  // The rate's wait, longer than the slot's 1 s.
    boost::json::object error = json_of(busy.body)["error"].as_object();
    CHECK(error["code"] == "requests_per_second");
    CHECK(error["message"] == "Tenant 'acme' exceeded its limits requests_per_second and "
                              "max_concurrent; retry after 4 s.");
    f.generator.finish(0, engine::FinishReason::kStop, {});
    CHECK(running->read_response()->status == 200);
    f.clock.advance(std::chrono::seconds(4));  // As Retry-After said: admitted.
    auto again = f.start_request(1, kOldKey);
    f.generator.finish(1, engine::FinishReason::kStop, {});
    CHECK(again->read_response()->status == 200);
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
    // A config that lost its tenants section would turn authentication off: refused.
    CHECK(f.daemon->reload_tenants(std::nullopt).code() == StatusCode::kFailedPrecondition);
    CHECK(f.call(chat_body(false), "sk-unknown").status == 401);
    REQUIRE(f.daemon->reload_tenants(reloaded->tenants).ok());

    testing::HttpReply old_key = f.call(chat_body(false), kOldKey);
    CHECK(old_key.status == 401);
    CHECK(json_of(old_key.body)["error"].as_object()["code"] == "invalid_api_key");
    // The running request still holds one of the (now two) slots; the new key gets the other.
    auto fresh = f.start_request(1, kNewKey);
    CHECK(f.call(chat_body(false), kNewKey).status == 429);  // Two running: the cap.
    // Every key replaced: for the prefix cache it may be another customer under the same name.
    CHECK(f.generator.request(0).cache_scope.starts_with("acme#"));
    CHECK(f.generator.request(1).cache_scope.starts_with("acme#"));
    CHECK(f.generator.request(1).cache_scope != f.generator.request(0).cache_scope);

    f.generator.emit(0, "after-reload");
    f.generator.finish(0, engine::FinishReason::kStop, {});
    Result<std::string> rest = running->read_until("[DONE]");
    REQUIRE(rest.ok());
    CHECK(rest->find("after-reload") != std::string::npos);
    CHECK_FALSE(f.generator.cancelled(0));
    f.generator.finish(1, engine::FinishReason::kStop, {});
    CHECK(fresh->read_response()->status == 200);
}

TEST_CASE("engine admission: tenant queue full is 429, model queue full is 503, both Retry-After") {
    TenantFixture f("");
    f.generator.fail_next_submit(resource_exhausted_error("tenant 'acme' already has 2 requests "
                                                          "waiting for this model"));
    testing::HttpReply tenant_full = f.call(chat_body(false), kOldKey);
    CHECK(tenant_full.status == 429);
    CHECK(tenant_full.headers["retry-after"] == "1");
    CHECK(json_of(tenant_full.body)["error"].as_object()["type"] == "rate_limit_error");
    f.generator.fail_next_submit(unavailable_error("the model's queue is full"));
    testing::HttpReply overloaded = f.call(chat_body(false), kOldKey);
    CHECK(overloaded.status == 503);
    CHECK(overloaded.headers["retry-after"] == "1");
}

TEST_CASE("engine admission: a request the engine refuses gives back its rate token and slot") {
    // Audit 7 note: a routing refusal gave the token back, an engine refusal (a full queue)
    // kept it, so the tenant's next request was refused for requests_per_second. (The model's
    // queue full or its overload: the tenant's own queue full is its doing, the test below.)
    TenantFixture f("    requests_per_second: 1\n    burst: 1\n    max_concurrent: 1\n"
                    "    output_tokens_per_minute: 100\n");
    for (Status refusal : {unavailable_error("the model's queue is full"),
                           unavailable_error("the model is overloaded")}) {
        f.generator.fail_next_submit(refusal);
        testing::HttpReply full = f.call(chat_body(false, R"(,"max_tokens":100)"), kOldKey);
        CHECK(full.status == 503);
        CHECK(json_of(full.body)["error"].as_object()["code"] != "requests_per_second");
    }
    // The same instant: the token, the slot and the whole output budget are back.
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions",
                                          chat_body(false, R"(,"max_tokens":100)"), auth(kOldKey)))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    f.generator.finish(0, engine::FinishReason::kStop, {});
    CHECK(c->read_response()->status == 200);
}

TEST_CASE("engine admission: the tenant's own queue full keeps its rate token, not its slot") {
    // The tenant's queue here full (429 naming it) was refunded as a capacity
    // refusal, after the engine had tokenized the prompt: with its queue full by its own doing,
    // a tenant's requests were never held to its rate.
    TenantFixture f("    requests_per_second: 1\n    burst: 1\n    max_concurrent: 1\n"
                    "    output_tokens_per_minute: 100\n");
    f.generator.fail_next_submit(
        resource_exhausted_error("tenant 'acme' already has 2 requests waiting for this model"));
    testing::HttpReply full = f.call(chat_body(false, R"(,"max_tokens":100)"), kOldKey);
    CHECK(full.status == 429);
    CHECK(json_of(full.body)["error"].as_object()["message"].as_string().find(
              "tenant 'acme' already has 2 requests") != std::string::npos);
    // The same instant: its rate token is spent, and nothing more reaches the engine...
    testing::HttpReply limited = f.call(chat_body(false, R"(,"max_tokens":100)"), kOldKey);
    CHECK(limited.status == 429);
    CHECK(limited.headers["retry-after"] == "1");
    CHECK(json_of(limited.body)["error"].as_object()["code"] == "requests_per_second");
    CHECK_FALSE(f.generator.wait_for_request(0, 50));
    // ...while the slot and the output reservation are back: a second later it is admitted.
    f.clock.advance(std::chrono::seconds(1));
    auto c = f.start_request(0, kOldKey);
    f.generator.finish(0, engine::FinishReason::kStop, {});
    CHECK(c->read_response()->status == 200);
}

TEST_CASE("engine admission: a request refused for itself keeps its rate token, not its slot") {
    // A prompt beyond the context is read and tokenized before the engine refuses it: refunding
    // the rate token let a tenant have that done without end, never meeting a 429.
    TenantFixture f(
        "    requests_per_second: 1\n    burst: 1\n    max_concurrent: 1\n"
        "    output_tokens_per_minute: 100\n");
    f.generator.fail_next_submit(
        out_of_range_error("the prompt is 5000 tokens, beyond the "
                           "context of 4096"));
    testing::HttpReply refused = f.call(chat_body(false, R"(,"max_tokens":100)"), kOldKey);
    CHECK(refused.status == 400);
    // The same instant: the rate token is spent...
    testing::HttpReply limited = f.call(chat_body(false, R"(,"max_tokens":100)"), kOldKey);
    CHECK(limited.status == 429);
    CHECK(json_of(limited.body)["error"].as_object()["code"] == "requests_per_second");
    // ...and the slot and the output reservation are back: a second later it is admitted.
    f.clock.advance(std::chrono::seconds(1));
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions",
                                          chat_body(false, R"(,"max_tokens":100)"), auth(kOldKey)))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    f.generator.finish(0, engine::FinishReason::kStop, {});
    CHECK(c->read_response()->status == 200);
}

TEST_CASE("engine admission: a prompt refused for itself is charged to input_tokens_per_minute") {
    // The engine tokenized 5000 tokens before refusing them: a tenant limited only by input
    // tokens could otherwise have that done without end.
    TenantFixture f("    input_tokens_per_minute: 1000\n");
    f.generator.set_prompt_tokens(5000);
    f.generator.fail_next_submit(
        out_of_range_error("the prompt is 5000 tokens, beyond the "
                           "context of 4096"));
    testing::HttpReply refused = f.call(chat_body(false), kOldKey);
    CHECK(refused.status == 400);
    f.generator.set_prompt_tokens(10);
    testing::HttpReply limited = f.call(chat_body(false), kOldKey);
    CHECK(limited.status == 429);
    CHECK(json_of(limited.body)["error"].as_object()["code"] == "input_tokens_per_minute");
    // A capacity refusal gives its prompt back, as before.
    f.clock.advance(std::chrono::minutes(10));
    f.generator.set_prompt_tokens(900);
    f.generator.fail_next_submit(unavailable_error("the model's queue is full"));
    CHECK(f.call(chat_body(false), kOldKey).status == 503);
    f.generator.set_prompt_tokens(900);
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false),
                                          auth(kOldKey)))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    f.generator.finish(0, engine::FinishReason::kStop, {});
    CHECK(c->read_response()->status == 200);
}

TEST_CASE("engine serving figures: priority reaches the engine, /metrics has per-tenant series") {
    TenantFixture f("    priority: 7\n");
    auto c = f.start_request(0, kOldKey);
    CHECK(f.generator.request(0).priority == 7);
    engine::Usage usage;
    usage.prompt_tokens = 40;
    usage.completion_tokens = 1;
    usage.cached_tokens = 32;
    f.generator.finish(0, engine::FinishReason::kStop, usage);
    auto reply = c->read_response();
    REQUIRE(reply.ok());
    CHECK(reply->status == 200);
    CHECK(json_of(reply->body)["usage"].as_object()["prompt_tokens_details"].as_object()
              ["cached_tokens"] == 32);

    engine::ServingStats s;
    s.model = "test-model";
    s.kv_use = 0.25;
    s.kv_blocks_total = 64;
    s.kv_blocks_used = 16;
    s.kv_blocks_cached = 6;
    engine::TenantServingStats& t = s.tenants["acme"];
    t.queued = 3;
    t.running = 2;
    t.generated_tokens = 40;
    t.prefix_query_tokens = 100;
    t.prefix_hit_tokens = 64;
    t.ttft.observe(0.02);
    t.ttft.observe(0.3);
    f.generator.set_serving_stats({s});
    const std::string m = f.metrics();
    CHECK(m.find("edgeserve_tenant_queued_requests{model=\"test-model\",tenant=\"acme\"} 3") !=
          std::string::npos);
    CHECK(m.find("edgeserve_tenant_running_requests{model=\"test-model\",tenant=\"acme\"} 2") !=
          std::string::npos);
    CHECK(m.find("edgeserve_kv_cache_usage_ratio{model=\"test-model\"} 0.25") !=
          std::string::npos);
    // The states partition the budget's blocks, so sum() over them is the total.
    CHECK(m.find("edgeserve_kv_cache_blocks{model=\"test-model\",state=\"used\"} 16") !=
          std::string::npos);
    CHECK(m.find("edgeserve_kv_cache_blocks{model=\"test-model\",state=\"cached\"} 6") !=
          std::string::npos);
    CHECK(m.find("edgeserve_kv_cache_blocks{model=\"test-model\",state=\"free\"} 42") !=
          std::string::npos);
    CHECK(m.find("state=\"total\"") == std::string::npos);
    CHECK(m.find("edgeserve_prefix_cache_hits_total{model=\"test-model\",tenant=\"acme\"} 64") !=
          std::string::npos);
    CHECK(m.find("edgeserve_time_to_first_token_seconds_bucket{model=\"test-model\",tenant="
                 "\"acme\",le=\"0.025\"} 1") != std::string::npos);
    CHECK(m.find("edgeserve_time_to_first_token_seconds_count{model=\"test-model\",tenant="
                 "\"acme\"} 2") != std::string::npos);
    CHECK(m.find("# TYPE edgeserve_inter_token_latency_seconds histogram") != std::string::npos);
    CHECK(m.find(kOldKey) == std::string::npos);
}

TEST_CASE("tenant metrics: a removed tenant's series go once its requests are done") {
    TenantFixture f("");
    auto done = f.start_request(0, kOldKey);
    f.generator.finish(0, engine::FinishReason::kStop, {});
    CHECK(done->read_response()->status == 200);
    auto running = f.start_request(1, kOldKey);
    engine::ServingStats s;
    s.model = "test-model";
    s.tenants["acme"].running = 1;
    f.generator.set_serving_stats({s});
    const std::string acme = R"(tenant="acme")";
    REQUIRE(f.metrics().find(acme) != std::string::npos);

    // acme is renamed newco while one of its requests runs: its series stay while it runs.
    const auto renamed = f.renamed_newco(kNewKey);
    REQUIRE(f.daemon->reload_tenants(renamed).ok());
    CHECK(f.call(chat_body(false), kOldKey).status == 401);  // Counted under tenant "".
    std::string m = f.metrics();
    CHECK(m.find(R"(edgeserve_tenant_requests_total{outcome="ok",tenant="acme"} 1)") !=
          std::string::npos);
    CHECK(m.find(R"(edgeserve_tenant_running_requests{model="test-model",tenant="acme"} 1)") !=
          std::string::npos);

    f.generator.finish(1, engine::FinishReason::kStop, {});
    CHECK(running->read_response()->status == 200);
    s.tenants["acme"].running = 0;
    f.generator.set_serving_stats({s});
    m = f.metrics();
    // The engine holds none of its requests: its engine series are gone at once; the request
    // counters, which the finished request counted into last, at the next reload.
    CHECK(m.find(R"(edgeserve_tenant_running_requests{model="test-model",tenant="acme"})") ==
          std::string::npos);
    CHECK(m.find(R"(edgeserve_tenant_requests_total{outcome="ok",tenant="acme"} 2)") !=
          std::string::npos);
    REQUIRE(f.daemon->reload_tenants(renamed).ok());
    m = f.metrics();
    CHECK(m.find(acme) == std::string::npos);
    CHECK(m.find(R"(edgeserve_tenant_rejections_total{reason="unknown_key",tenant=""} 1)") !=
          std::string::npos);

    // Configured again: its series come back as it is used.
    auto back = daemon::parse_config(
        testing::config_yaml(f.cert.cert_path, f.cert.key_path, tenant_yaml(kOldKey, "")),
        f.dir.file("c.yaml"));
    REQUIRE(back.ok());
    REQUIRE(f.daemon->reload_tenants(back->tenants).ok());
    s.tenants["acme"].queued = 1;
    f.generator.set_serving_stats({s});
    CHECK(f.metrics().find(
              R"(edgeserve_tenant_queued_requests{model="test-model",tenant="acme"} 1)") !=
          std::string::npos);
}

TEST_CASE("tenant metrics: a renamed tenant's old name keeps its series while its request runs") {
    // Renamed with the same key, the new name takes the old one's limiter state; a reload past
    // the grace then let the old name go while its request still ran, so its series went and
    // the request and its tokens were not counted when it ended.
    TenantFixture f("");
    auto running = f.start_request(0, kOldKey);
    const auto renamed = f.renamed_newco(kOldKey);
    REQUIRE(f.daemon->reload_tenants(renamed).ok());
    f.clock.advance(std::chrono::seconds(11));  // Past TenantLimiter::kRetiredGrace.
    REQUIRE(f.daemon->reload_tenants(renamed).ok());

    engine::Usage usage;
    usage.prompt_tokens = 5;
    usage.completion_tokens = 7;
    f.generator.finish(0, engine::FinishReason::kStop, usage);
    CHECK(running->read_response()->status == 200);
    std::string m = f.metrics();
    CHECK_MESSAGE(m.find(R"(edgeserve_tenant_requests_total{outcome="ok",tenant="acme"} 1)") !=
                      std::string::npos,
                  m);
    CHECK(m.find(R"(edgeserve_tenant_tokens_total{kind="completion",tenant="acme"} 7)") !=
          std::string::npos);
    // Done now: the next reload drops them.
    REQUIRE(f.daemon->reload_tenants(renamed).ok());
    CHECK(f.metrics().find(R"(tenant="acme")") == std::string::npos);
}
