// The OpenAI API end to end: the real Daemon (TLS listener, router, admin listener) on loopback
// with a ScriptedGenerator whose timing the test drives.

#include <doctest/doctest.h>

#include <filesystem>
#include <future>
#include <thread>

#include <boost/json.hpp>

#include "daemon/api/api_router_internal.h"
#include "daemon/api/completion.h"
#include "daemon/api/deferred_response.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/tenants.h"
#include "engine/engine.h"
#include "tests/testing/config_yaml.h"
#include "tests/testing/scripted_daemon.h"
#include "tests/testing/scripted_generator.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/test_daemon.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using edge::testing::TlsClient;

namespace {

constexpr const char* kKey = "sk-test-key-1";

struct ApiFixture : testing::ScriptedDaemon {
    explicit ApiFixture(const std::string& extra = "")
        : ScriptedDaemon({"test-model", "other-model"}) {
        start(extra);
    }
};

boost::json::object json_of(const std::string& s) { return testing::json_object_of(s); }

std::string chat_body(bool stream, const std::string& extra = "") {
    return std::string(R"({"model":"test-model","messages":[{"role":"user","content":"hi"}])") +
           (stream ? R"(,"stream":true)" : "") + extra + "}";
}

const std::string kStreamWithUsage =
    chat_body(true, R"(,"stream_options":{"include_usage":true})");

using testing::sse_events;

// A completions answer's first choice, its events joined when streamed: the text and the legacy
// logprobs' tokens and offsets.
struct EchoedChoice {
    std::string text;
    boost::json::array tokens;
    boost::json::array offsets;
};

EchoedChoice first_choice(const std::string& body, bool stream) {
    EchoedChoice out;
    auto add = [&](boost::json::object& choice) {
        out.text += choice["text"].as_string();
        if (choice["logprobs"].is_object()) {
            boost::json::object& lp = choice["logprobs"].as_object();
            for (const auto& t : lp["tokens"].as_array()) {
                out.tokens.push_back(t);
            }
            for (const auto& o : lp["text_offset"].as_array()) {
                out.offsets.push_back(o);
            }
        }
    };
    if (!stream) {
        add(json_of(body)["choices"].as_array()[0].as_object());
        return out;
    }
    for (const std::string& event : sse_events(body)) {
        if (event != "[DONE]") {
            add(json_of(event)["choices"].as_array()[0].as_object());
        }
    }
    return out;
}

}  // namespace

TEST_CASE("routes: models list, unknown route 404, wrong method 405") {
    ApiFixture f;
    auto models = f.call("GET", "/v1/models");
    CHECK(models.status == 200);
    auto m = json_of(models.body);
    CHECK(m["object"] == "list");
    REQUIRE(m["data"].as_array().size() == 2);
    CHECK(m["data"].as_array()[0].as_object().at("id") == "test-model");

    // The absolute form is the same request (RFC 9112 section 3.2.2).
    CHECK(f.call("GET", "https://localhost/v1/models").status == 200);
    auto missing = f.call("GET", "/v1/nothing");
    CHECK(missing.status == 404);
    CHECK(json_of(missing.body)["error"].as_object().contains("message"));
    auto wrong = f.call("POST", "/v1/models", "{}");
    CHECK(wrong.status == 405);
    CHECK(wrong.headers["allow"] == "GET, HEAD");
    auto head_client = f.client();
    REQUIRE(head_client->send(testing::http_request("HEAD", "/v1/models")).ok());
    auto head = head_client->read_until("\r\n\r\n");
    REQUIRE(head.ok());
    CHECK(head->rfind("HTTP/1.1 200", 0) == 0);
    CHECK(head->find("Content-Length: 0\r\n") == std::string::npos);  // The GET's length.
    // No body followed: the next answer on the connection starts right after the head.
    REQUIRE(head_client->send(testing::http_request("GET", "/v1/models")).ok());
    auto next = head_client->read_response();
    REQUIRE(next.ok());
    CHECK(next->status == 200);
    CHECK(f.call("GET", "/v1/chat/completions").status == 405);
    // A compressed body: 415 naming the coding, not a JSON parse error.
    auto gz = f.call("POST", "/v1/chat/completions", "\x1f\x8b\x08", "Content-Encoding: gzip\r\n");
    CHECK(gz.status == 415);
    CHECK(json_of(gz.body)["error"].as_object().at("code") == "unsupported_content_encoding");
    CHECK(gz.headers["accept-encoding"] == "identity");
}

TEST_CASE("X-Model-Version on a site without a cluster: its own version or 503") {
    ApiFixture f;
    auto models = json_of(f.call("GET", "/v1/models").body);
    CHECK(models["data"].as_array()[0].as_object().at("version") == "v1");  // What a pin names.
    auto other = f.call("POST", "/v1/chat/completions", chat_body(false),
                        "X-Model-Version: deadbeef\r\n");
    CHECK(other.status == 503);
    CHECK(json_of(other.body)["error"].as_object().at("code") == "version_pin_unmatched");
    CHECK(json_of(other.body)["error"].as_object().at("message").as_string().find(
              "version v1, not the pinned deadbeef; this site has no cluster") !=
          std::string::npos);
    CHECK_FALSE(f.generator.wait_for_request(0, 0));
    auto pinned = f.client();
    REQUIRE(pinned->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false),
                                               "X-Model-Version: v1\r\n"))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
    CHECK(pinned->read_response()->status == 200);
}

TEST_CASE("error messages quote bytes of the request target that are not UTF-8 as \\xNN") {
    ApiFixture f;
    auto unknown = f.call("GET", "/\xff\xfe/x");
    CHECK(unknown.status == 404);
    // json_of parses strictly: invalid UTF-8 in the body fails it.
    CHECK(json_of(unknown.body)["error"].as_object().at("message") ==
          "Unknown request URL: GET /\\xff\\xfe/x");
    auto model = f.call("GET", "/v1/models/\xff");
    CHECK(model.status == 404);
    CHECK(json_of(model.body)["error"].as_object().at("message").as_string().find("'\\xff'") !=
          std::string::npos);
}

TEST_CASE("non-streaming chat completion with usage") {
    ApiFixture f;
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false))).ok());
    REQUIRE(f.generator.wait_for_request(0));
    auto req = f.generator.request(0);
    CHECK(req.model == "test-model");
    CHECK(req.tenant == "anonymous");
    CHECK(std::get<std::vector<engine::ChatMessage>>(req.prompt)[0].content == "hi");
    f.generator.emit(0, "Hello");
    f.generator.emit(0, " world");
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{5, 2, 1});
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    auto body = json_of(r->body);
    CHECK(body["object"] == "chat.completion");
    auto choice = body["choices"].as_array()[0].as_object();
    CHECK(choice["message"].as_object()["content"] == "Hello world");
    CHECK(choice["finish_reason"] == "stop");
    auto usage = body["usage"].as_object();
    CHECK(usage["total_tokens"] == 7);
    CHECK(usage["prompt_tokens_details"].as_object()["cached_tokens"] == 1);
}

TEST_CASE("streaming chat: chunks arrive as produced, then usage and DONE") {
    ApiFixture f;
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", kStreamWithUsage)).ok());
    REQUIRE(f.generator.wait_for_request(0));
    f.generator.emit(0, "Hel");
    auto first = c->read_until("Hel");
    REQUIRE(first.ok());  // Delivered before the generation finished.
    CHECK(first->find("text/event-stream") != std::string::npos);
    f.generator.emit(0, "lo");
    f.generator.finish(0, engine::FinishReason::kLength, engine::Usage{3, 2, 0});
    auto rest = c->read_until("0\r\n\r\n");
    REQUIRE(rest.ok());
    std::string all = *first + *rest;
    // De-chunking is not needed to find the events: each is inside one chunk.
    auto events = sse_events(all);
    REQUIRE(events.size() == 6);
    CHECK(json_of(events[0])["choices"].as_array()[0].as_object()["delta"].as_object()["role"] ==
          "assistant");
    CHECK(json_of(events[1])["choices"].as_array()[0].as_object()["delta"].as_object()["content"] ==
          "Hel");
    CHECK(json_of(events[1])["object"] == "chat.completion.chunk");
    CHECK(json_of(events[3])["choices"].as_array()[0].as_object()["finish_reason"] == "length");
    auto usage = json_of(events[4]);
    CHECK(usage["choices"].as_array().empty());
    CHECK(usage["usage"].as_object()["completion_tokens"] == 2);
    CHECK(events[5] == "[DONE]");
    // Keep-alive after a stream.
    REQUIRE(c->send(testing::http_request("GET", "/v1/models")).ok());
    CHECK(c->read_response()->status == 200);
}

TEST_CASE("completions: non-streaming and streaming without usage") {
    ApiFixture f;
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/completions",
                                          R"({"model":"test-model","prompt":"x","logprobs":1})"))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    f.generator.emit(0, "\xC3\xA9");  // é
    f.generator.emit(0, "bc");
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 2, 0});
    auto r = c->read_response();
    REQUIRE(r.ok());
    auto body = json_of(r->body);
    CHECK(body["object"] == "text_completion");
    auto choice = body["choices"].as_array()[0].as_object();
    CHECK(choice["text"] == "\xC3\xA9" "bc");
    auto& logprobs = choice["logprobs"].as_object();
    CHECK(logprobs["tokens"].as_array() == boost::json::array{"\xC3\xA9", "bc"});
    // Offsets count characters, as Python indexes the text.
    CHECK(logprobs["text_offset"].as_array() == boost::json::array{0, 1});
    // The sampled token is always in top_logprobs, as OpenAI's legacy shape has it.
    CHECK(logprobs["top_logprobs"].as_array() ==
          boost::json::array{boost::json::object{{"\xC3\xA9", -0.5}},
                             boost::json::object{{"bc", -0.5}}});

    REQUIRE(c->send(testing::http_request("POST", "/v1/completions",
                                          R"({"model":"test-model","prompt":"x","stream":true})"))
                .ok());
    REQUIRE(f.generator.wait_for_request(1));
    f.generator.emit(1, "z");
    f.generator.finish(1, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    auto s = c->read_response();
    REQUIRE(s.ok());
    auto events = sse_events(s->body);
    REQUIRE(events.size() == 3);
    CHECK(json_of(events[0])["choices"].as_array()[0].as_object()["text"] == "z");
    CHECK_FALSE(json_of(events[0]).contains("usage"));
    CHECK(events[2] == "[DONE]");
}

TEST_CASE("completions: return_token_ids gives the generated ids, whole or per chunk") {
    ApiFixture f;
    auto c = f.client();
    REQUIRE(c->send(testing::http_request(
                        "POST", "/v1/completions",
                        R"({"model":"test-model","prompt":[5,6],"return_token_ids":true})"))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    f.generator.emit(0, "a");
    f.generator.emit(0, "b");
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{2, 2, 0});
    auto r = c->read_response();
    REQUIRE(r.ok());
    auto choice = json_of(r->body)["choices"].as_array()[0].as_object();
    CHECK(choice["token_ids"].as_array() == boost::json::array{1, 1});

    REQUIRE(c->send(testing::http_request(
                        "POST", "/v1/chat/completions",
                        R"({"model":"test-model","messages":[{"role":"user","content":"x"}],)"
                        R"("stream":true,"return_token_ids":true})"))
                .ok());
    REQUIRE(f.generator.wait_for_request(1));
    f.generator.emit(1, "z");
    f.generator.finish(1, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    auto s = c->read_response();
    REQUIRE(s.ok());
    auto events = sse_events(s->body);
    REQUIRE(events.size() == 4);  // Role, "z", the finish, [DONE].
    auto delta_choice = json_of(events[1])["choices"].as_array()[0].as_object();
    CHECK(delta_choice["delta"].as_object()["content"] == "z");
    CHECK(delta_choice["token_ids"].as_array() == boost::json::array{1});
    CHECK(json_of(events[2])["choices"].as_array()[0].as_object()["token_ids"].as_array().empty());
}

TEST_CASE("errors: bad JSON, wrong types, submit() failures mapped to OpenAI errors") {
    ApiFixture f;
    auto bad = f.call("POST", "/v1/chat/completions", "{oops");
    CHECK(bad.status == 400);
    CHECK(json_of(bad.body)["error"].as_object()["type"] == "invalid_request_error");
    auto typed = f.call("POST", "/v1/chat/completions", chat_body(false, R"(,"top_k":"x")"));
    CHECK(typed.status == 400);
    CHECK(json_of(typed.body)["error"].as_object()["param"] == "top_k");

    auto unknown = f.call("POST", "/v1/chat/completions",
                          R"({"model":"nope","messages":[{"role":"user","content":"x"}]})");
    CHECK(unknown.status == 404);
    CHECK(json_of(unknown.body)["error"].as_object()["code"] == "model_not_found");

    f.generator.fail_next_submit(resource_exhausted_error("queue full"));
    auto busy = f.call("POST", "/v1/chat/completions", chat_body(false));
    CHECK(busy.status == 429);
    CHECK(busy.headers["retry-after"] == "1");
    f.generator.fail_next_submit(unavailable_error("loading"));
    CHECK(f.call("POST", "/v1/chat/completions", chat_body(false)).status == 503);
    f.generator.fail_next_submit(invalid_argument_error("max_tokens: beyond the context"));
    auto inv = f.call("POST", "/v1/chat/completions", chat_body(false));
    CHECK(inv.status == 400);
    CHECK(json_of(inv.body)["error"].as_object()["param"] == "max_tokens");

    f.generator.fail_next_submit(out_of_range_error("messages: the prompt does not fit"));
    auto too_long = f.call("POST", "/v1/chat/completions", chat_body(false));
    CHECK(too_long.status == 400);
    CHECK(json_of(too_long.body)["error"].as_object()["code"] == "context_length_exceeded");
    CHECK(json_of(too_long.body)["error"].as_object()["param"] == "messages");

    // A stream the engine refuses gets the refusal's status and headers, not a 200 event stream
    // with the error inside: clients retry a 429 only when they see one.
    f.generator.fail_next_submit(resource_exhausted_error("queue full"));
    auto streamed = f.call("POST", "/v1/chat/completions", chat_body(true));
    CHECK(streamed.status == 429);
    CHECK(streamed.headers["retry-after"] == "1");
    CHECK(json_of(streamed.body)["error"].as_object()["code"] == "rate_limit_exceeded");
    auto streamed_unknown =
        f.call("POST", "/v1/chat/completions",
               R"({"model":"nope","messages":[{"role":"user","content":"x"}],"stream":true})");
    CHECK(streamed_unknown.status == 404);

    // What the engine refused counts as rejected, by reason, not as an error of the tenant's.
    auto metrics = testing::plain_http_get(f.daemon->admin_port(), "/metrics");
    REQUIRE(metrics.ok());
    const std::string& m = metrics->body;
    CHECK(
        m.find(R"(edgeserve_tenant_rejections_total{reason="queue_full",tenant="anonymous"} 2)") !=
        std::string::npos);
    CHECK(m.find(R"(reason="context_length_exceeded",tenant="anonymous"} 1)") != std::string::npos);
    CHECK(m.find(R"(edgeserve_tenant_requests_total{outcome="error")") == std::string::npos);
}

TEST_CASE("a stream that fails after it opened reports the error in-band") {
    ApiFixture f;
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(true))).ok());
    REQUIRE(f.generator.wait_for_request(0));
    auto head = c->read_until("assistant");  // The head and role chunk, before any token.
    REQUIRE(head.ok());
    CHECK(head->find("200 OK") != std::string::npos);
    f.generator.finish(0, engine::FinishReason::kError, engine::Usage{},
                       unavailable_error("engine stopped"));
    auto rest = c->read_until("0\r\n\r\n");
    REQUIRE(rest.ok());
    auto events = sse_events(*head + *rest);
    REQUIRE(events.size() == 3);  // role chunk, error, [DONE]
    CHECK(json_of(events[1])["error"].as_object()["code"] == "service_unavailable");
    CHECK(events[2] == "[DONE]");
}

TEST_CASE("a stream cut by the drain deadline still ends with the usage a client asked for") {
    ApiFixture f;
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", kStreamWithUsage)).ok());
    REQUIRE(f.generator.wait_for_request(0));
    f.generator.emit(0, "Hel");
    auto head = c->read_until("Hel");
    REQUIRE(head.ok());
    f.generator.finish(0, engine::FinishReason::kCancelled, engine::Usage{4, 1, 0});
    auto rest = c->read_until("0\r\n\r\n");
    REQUIRE(rest.ok());
    auto events = sse_events(*head + *rest);
    REQUIRE(events.size() == 5);  // role, "Hel", error, usage, [DONE]
    CHECK(json_of(events[2])["error"].as_object()["code"] == "service_unavailable");
    auto usage = json_of(events[3]);
    CHECK(usage["choices"].as_array().empty());
    CHECK(usage["usage"].as_object()["completion_tokens"] == 1);
    CHECK(usage["usage"].as_object()["prompt_tokens"] == 4);
    CHECK(events[4] == "[DONE]");
}

TEST_CASE("client disconnect cancels the generation (streaming and not)") {
    ApiFixture f;
    {
        auto c = f.client();
        REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(true)))
                    .ok());
        REQUIRE(f.generator.wait_for_request(0));
        f.generator.emit(0, "partial");
        REQUIRE(c->read_until("partial").ok());
    }
    CHECK(f.generator.wait_cancelled(0));
    {
        auto c = f.client();
        REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false)))
                    .ok());
        REQUIRE(f.generator.wait_for_request(1));
    }
    CHECK(f.generator.wait_cancelled(1));
}

TEST_CASE("a model's generation_config.json sampling applies to fields the request left unset") {
    ApiFixture f;
    f.generator.set_sampling_defaults("test-model", {0.6f, 0.95f, 20});
    const std::string base = R"({"model":"test-model","messages":[{"role":"user","content":"x"}])";
    struct Case {
        std::string extra;
        float temperature, top_p;
        int32_t top_k;
    };
    const std::vector<Case> cases = {
        {"", 0.6f, 0.95f, 20},
        {R"(,"temperature":0)", 0.0f, 0.95f, 20},  // The client's value wins, 0 included.
        {R"(,"top_p":1,"top_k":-1)", 0.6f, 1.0f, 0},
        {R"(,"temperature":null)", 0.6f, 0.95f, 20},  // null is unset.
    };
    size_t index = 0;
    for (const Case& c : cases) {
        CAPTURE(c.extra);
        auto client = f.client();
        REQUIRE(client->send(testing::http_request("POST", "/v1/chat/completions",
                                                   base + c.extra + "}"))
                    .ok());
        REQUIRE(f.generator.wait_for_request(index));
        const engine::SamplingParams s = f.generator.request(index).sampling;
        CHECK(s.temperature == doctest::Approx(c.temperature));
        CHECK(s.top_p == doctest::Approx(c.top_p));
        CHECK(s.top_k == c.top_k);
        f.generator.finish(index, engine::FinishReason::kStop, {});
        CHECK(client->read_response()->status == 200);
        ++index;
    }
}

TEST_CASE("tenants: 401 without or with a wrong key, 403 for a model not allowed") {
    std::string extra = "tenants:\n  - name: acme\n    api_key_sha256: [" +
                        daemon::TenantTable::sha256_hex(kKey) +
                        "]\n    models: [test-model]\nmodels:\n  - {name: test-model, path: /m}\n"
                        "  - {name: other-model, path: /o}\n";
    ApiFixture f(extra);
    auto none = f.call("GET", "/v1/models");
    CHECK(none.status == 401);
    CHECK(json_of(none.body)["error"].as_object()["code"] == "invalid_api_key");
    CHECK(none.headers["www-authenticate"] == "Bearer");
    auto wrong = f.call("GET", "/v1/models", "", "Authorization: Bearer wrong\r\n");
    CHECK(wrong.status == 401);
    CHECK(wrong.headers["www-authenticate"] == "Bearer error=\"invalid_token\"");
    CHECK(f.call("GET", "/v1/models", "", std::string("Authorization: BEARER ") + kKey + "\r\n")
              .status == 200);
    std::string auth = std::string("Authorization: Bearer ") + kKey + "\r\n";
    // The list holds only the models this tenant may use; each can be fetched by id.
    auto listed = f.call("GET", "/v1/models", "", auth);
    CHECK(listed.status == 200);
    auto data = json_of(listed.body)["data"].as_array();
    REQUIRE(data.size() == 1);
    CHECK(data[0].as_object().at("id") == "test-model");
    auto one = f.call("GET", "/v1/models/test-model", "", auth);
    CHECK(one.status == 200);
    CHECK(json_of(one.body)["id"] == "test-model");
    CHECK(json_of(one.body)["object"] == "model");
    CHECK(f.call("GET", "/v1/models/other-model", "", auth).status == 404);
    CHECK(f.call("GET", "/v1/models/nope", "", auth).status == 404);
    // Clients escape the id in the path (the official ones always do).
    CHECK(f.call("GET", "/v1/models/test%2dmodel", "", auth).status == 200);
    CHECK(f.call("GET", "/v1/models/test%2Dmodel%", "", auth).status == 404);
    // Two keys, in either order, or two version pins: refused, whichever a proxy would read.
    for (const std::string& twice :
         {auth + "Authorization: Bearer wrong\r\n", "Authorization: Bearer wrong\r\n" + auth,
          auth + "X-Model-Version: a\r\nx-model-version: b\r\n"}) {
        auto dup = f.call("GET", "/v1/models", "", twice);
        CHECK(dup.status == 400);
        CHECK(json_of(dup.body)["error"].as_object()["message"].as_string().find(
                  "appears more than once") != std::string::npos);
    }
    CHECK(f.metrics().find("edgeserve_http_requests_total{route=\"/v1/models/{model}\",") !=
          std::string::npos);
    auto forbidden = f.call("POST", "/v1/chat/completions",
                            R"({"model":"other-model","messages":[{"role":"user","content":"x"}]})",
                            auth);
    CHECK(forbidden.status == 403);
    // A model no site serves is not found, not forbidden.
    auto unknown = f.call("POST", "/v1/chat/completions",
                          R"({"model":"nope","messages":[{"role":"user","content":"x"}]})", auth);
    CHECK(unknown.status == 404);
    CHECK(json_of(unknown.body)["error"].as_object()["code"] == "model_not_found");

    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(false), auth))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    CHECK(f.generator.request(0).tenant == "acme");
    f.generator.finish(0, engine::FinishReason::kStop, {});
    CHECK(c->read_response()->status == 200);
}

TEST_CASE("admin listener: metrics, healthz, readyz") {
    ApiFixture f;
    f.call("GET", "/v1/models");
    f.call("GET", "/nowhere");
    uint16_t admin = f.daemon->admin_port();
    auto metrics = testing::plain_http_get(admin, "/metrics");
    REQUIRE(metrics.ok());
    CHECK(metrics->status == 200);
    const std::string& m = metrics->body;
    CHECK(m.find(R"(edgeserve_http_requests_total{route="/v1/models",status="200"} 1)") !=
          std::string::npos);
    CHECK(m.find(R"(edgeserve_http_requests_total{route="other",status="404"} 1)") !=
          std::string::npos);
    CHECK(m.find("edgeserve_http_request_duration_seconds_bucket") != std::string::npos);
    CHECK(m.find(R"(edgeserve_tls_handshakes_total{resumed="false"} 2)") != std::string::npos);
    CHECK(m.find("edgeserve_open_connections") != std::string::npos);
    CHECK(m.find(R"(edgeserve_build_info{version=")") != std::string::npos);
    CHECK(testing::plain_http_get(admin, "/healthz")->status == 200);
    CHECK(testing::plain_http_get(admin, "/readyz")->status == 200);
    f.generator.set_ready(false);
    CHECK(testing::plain_http_get(admin, "/readyz")->status == 503);
    CHECK(testing::plain_http_get(admin, "/nope")->status == 404);
}

TEST_CASE("graceful drain in process: a stream in progress completes, new connections refused") {
    ApiFixture f;
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(true))).ok());
    REQUIRE(f.generator.wait_for_request(0));
    f.generator.emit(0, "before");
    REQUIRE(c->read_until("before").ok());
    auto stopper = std::async(std::launch::async,
                              [&] { f.daemon->stop(std::chrono::seconds(10)); });
    bool refused = false;
    for (int i = 0; i < 400 && !refused; ++i) {
        refused = !testing::accepts_connections(f.daemon->public_port());
        if (!refused) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));  // Waits on the acceptor.
        }
    }
    CHECK(refused);
    f.generator.emit(0, "after");
    f.generator.finish(0, engine::FinishReason::kStop, {});
    auto rest = c->read_until("data: [DONE]");
    REQUIRE(rest.ok());
    CHECK(rest->find("after") != std::string::npos);
    CHECK(stopper.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
    CHECK_FALSE(f.generator.cancelled(0));
}

TEST_CASE("logprobs token text: whole characters as they are, other bytes as \\xNN") {
    using daemon::api::logprob_token_text;
    CHECK(logprob_token_text("hello") == "hello");
    CHECK(logprob_token_text("\xE4\xBD\xA0") == "\xE4\xBD\xA0");  // 你
    CHECK(logprob_token_text("\x9a") == "\\x9a");
    CHECK(logprob_token_text("\xE4\xBD") == "\\xe4\\xbd");  // Half a character.
    CHECK(logprob_token_text("a\xC3") == "a\\xc3");
    CHECK(logprob_token_text("\xF0\x9F\x98\x80!") == "\xF0\x9F\x98\x80!");  // 😀
    CHECK(logprob_token_text("\xC3") != logprob_token_text("\xC4"));
    // A token whose text is a backslash escape is not the byte that escape names: its backslash
    // is escaped, and only where it would read as an escape.
    CHECK(logprob_token_text("\\xff") == "\\x5cxff");
    CHECK(logprob_token_text("\\xff") != logprob_token_text("\xFF"));
    CHECK(logprob_token_text("a\\x5c") == "a\\x5cx5c");
    CHECK(logprob_token_text("\\XFF") == "\\XFF");
    CHECK(logprob_token_text("\\xf") == "\\xf");
    CHECK(logprob_token_text("\\n\\\\") == "\\n\\\\");
    CHECK(logprob_token_text("\\\xFF") == "\\\\xff");  // A backslash, then the byte.
}

TEST_CASE("deferred answers: encode then decode gives the response back, bad bytes are refused") {
    using daemon::api::decode_deferred_response;
    using daemon::api::encode_deferred_response;
    tls::HttpResponse r;
    r.status = 429;
    r.content_type = "application/json";
    r.headers.push_back({"Retry-After", "7"});
    r.body = "{\"error\":{}}\nsecond line\n\n";
    auto back = decode_deferred_response(encode_deferred_response(r));
    REQUIRE(back.has_value());
    CHECK(back->status == 429);
    CHECK(back->content_type == "application/json");
    REQUIRE(back->headers.size() == 1);
    CHECK(back->headers[0].name == "Retry-After");
    CHECK(back->headers[0].value == "7");
    CHECK(back->body == r.body);
    for (const char* bad : {"", "200", "abc\njson\n\n", "99\njson\n\n", "200\njson\nNoColon\n\n",
                            "200\njson\nX: 1\n"}) {
        CAPTURE(bad);
        CHECK_FALSE(decode_deferred_response(bad).has_value());
    }
}

TEST_CASE("echo: prompt bytes that are not UTF-8 (ids of lone byte tokens) come back as U+FFFD") {
    ApiFixture f;
    for (bool stream : {false, true}) {
        CAPTURE(stream);
        auto c = f.client();
        const std::string body = std::string(R"({"model":"test-model","prompt":[872,198],)") +
                                 R"("echo":true,"max_tokens":2)" +
                                 (stream ? R"(,"stream":true})" : "}");
        REQUIRE(c->send(testing::http_request("POST", "/v1/completions", body)).ok());
        const size_t index = stream ? 1 : 0;
        REQUIRE(f.generator.wait_for_request(index));
        // "hi" then a lone lead byte of a two-byte character, which nothing completes.
        f.generator.emit_prompt(index, {"hi", "\xC6"});
        f.generator.emit(index, " ok");
        f.generator.finish(index, engine::FinishReason::kLength, engine::Usage{2, 1, 0});
        auto r = c->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        std::string text;
        if (stream) {
            for (const std::string& event : sse_events(r->body)) {
                if (event != "[DONE]") {
                    text += json_of(event)["choices"].as_array()[0].as_object()["text"].as_string();
                }
            }
        } else {
            text = json_of(r->body)["choices"].as_array()[0].as_object()["text"].as_string();
        }
        CHECK(text == "hi\xEF\xBF\xBD ok");
    }
}

TEST_CASE("echo: text_offset indexes the returned text where prompt bytes became U+FFFD") {
    // The engine counts the prompt's offsets in its tokens' bytes; each byte that is not UTF-8
    // comes back as U+FFFD, three bytes but one character, so raw offsets ran ahead.
    struct Case {
        std::vector<std::string> tokens;
        std::string text;  // The echoed prompt as returned.
        boost::json::array offsets;
    };
    const std::string fffd = "\xEF\xBF\xBD";
    const Case cases[] = {
        // Two bad bytes in a row, then text.
        {{"a", "\xFF", "\xFE", "b"}, "a" + fffd + fffd + "b", {0, 1, 2, 3, 4}},
        // A character split over two tokens: the second starts where the character does, as a
        // generated token's offset does.
        {{"\xC3", "\xA9", "x"}, "\xC3\xA9x", {0, 0, 1, 2}},
        // Half a character that the next token does not complete: one U+FFFD, then the token.
        {{"\xE4\xBD", "\xE4\xBD", "y"}, fffd + fffd + "y", {0, 1, 2, 3}},
    };
    ApiFixture f;
    size_t index = 0;
    for (const Case& k : cases) {
        for (bool stream : {false, true}) {
            CAPTURE(index);
            auto c = f.client();
            const std::string body =
                std::string(R"({"model":"test-model","prompt":[1,2],"echo":true,"logprobs":1)") +
                (stream ? R"(,"stream":true})" : "}");
            REQUIRE(c->send(testing::http_request("POST", "/v1/completions", body)).ok());
            REQUIRE(f.generator.wait_for_request(index));
            f.generator.emit_prompt(index, k.tokens);
            f.generator.emit(index, "!");
            f.generator.finish(index, engine::FinishReason::kLength, engine::Usage{2, 1, 0});
            auto r = c->read_response();
            REQUIRE(r.ok());
            REQUIRE(r->status == 200);
            const EchoedChoice choice = first_choice(r->body, stream);
            CHECK(choice.text == k.text + "!");
            CHECK(choice.offsets == k.offsets);
            ++index;
        }
    }
}

TEST_CASE("echo: a text prompt comes back as the client sent it, not as its tokens read") {
    // The tokenizer may add a BOS (DeepSeek-V3's) and normalise the text (NFC, as Qwen's): the
    // echo is the client's text all the same, as OpenAI's and vLLM's. The tokens keep their
    // entries, the BOS's included, with offsets into that text: the BOS at 0, the NFC "é" where
    // the text's "e\u0301" starts, " x" where it is.
    ApiFixture f;
    for (bool stream : {false, true}) {
        CAPTURE(stream);
        auto c = f.client();
        const std::string body =
            std::string(R"({"model":"test-model","prompt":"cafe\u0301 x","echo":true,)") +
            R"("logprobs":1)" + (stream ? R"(,"stream":true})" : "}");
        REQUIRE(c->send(testing::http_request("POST", "/v1/completions", body)).ok());
        const size_t index = stream ? 1 : 0;
        REQUIRE(f.generator.wait_for_request(index));
        f.generator.emit_prompt(index, {"<｜begin▁of▁sentence｜>", "caf", "\xC3\xA9", " x"});
        f.generator.emit(index, "!");
        f.generator.finish(index, engine::FinishReason::kLength, engine::Usage{4, 1, 0});
        auto r = c->read_response();
        REQUIRE(r.ok());
        REQUIRE(r->status == 200);
        const auto [text, tokens, offsets] = first_choice(r->body, stream);
        CHECK(text == "cafe\xCC\x81 x!");
        CHECK(tokens ==
              boost::json::array{"<｜begin▁of▁sentence｜>", "caf", "\xC3\xA9", " x", "!"});
        CHECK(offsets == boost::json::array{0, 0, 3, 5, 7});
    }
}

TEST_CASE("echo: the engine's BOS and NFC stay out of an echoed text prompt, in its logprobs") {
    // The real engine on the micro checkpoint, told to add a BOS as DeepSeek-V3's tokenizer_config
    // does (its generation_config's <|endoftext|>), whose tokenizer normalises to NFC.
    testing::TempDir dir;
    const std::string model = dir.file("micro");
    std::filesystem::copy(std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/micro-qwen3-moe", model);
    std::string tokenizer_config = testing::read_file(model + "/tokenizer_config.json");
    const std::string no_bos = "\"add_bos_token\": false";
    REQUIRE(tokenizer_config.find(no_bos) != std::string::npos);
    tokenizer_config.replace(tokenizer_config.find(no_bos), no_bos.size(),
                             "\"add_bos_token\": true");
    dir.write("micro/tokenizer_config.json", tokenizer_config);
    engine::EngineConfig engine_config;
    engine_config.threads = 1;
    engine_config.max_batch_sequences = 2;
    engine_config.kv_cache_bytes = 16 << 20;
    engine_config.kv_swap_bytes = 0;
    engine_config.models.push_back(engine::ModelConfig{"micro", model});
    auto generator = engine::create_engine(engine_config);
    REQUIRE_MESSAGE(generator.ok(), generator.status().to_string());
    const testing::TestCertificate cert =
        testing::make_certificate(dir.path(), "srv", {"localhost"});
    ManualClock clock;
    auto daemon = testing::make_daemon(testing::config_yaml(cert.cert_path, cert.key_path),
                                       dir.file("c.yaml"), **generator, clock);
    daemon->start();
    auto c = TlsClient::connect(daemon->public_port());
    REQUIRE(c.ok());
    const std::string body =
        R"({"model":"micro","prompt":"cafe\u0301 x","echo":true,"logprobs":1,"max_tokens":2,)"
        R"("temperature":0})";
    REQUIRE((*c)->send(testing::http_request("POST", "/v1/completions", body)).ok());
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
    boost::json::object answer = json_of(r->body);
    CHECK(answer["usage"].as_object()["prompt_tokens"] == 6);
    boost::json::object& choice = answer["choices"].as_array()[0].as_object();
    CHECK(std::string(choice["text"].as_string()).rfind("cafe\xCC\x81 x", 0) == 0);
    boost::json::object& lp = choice["logprobs"].as_object();
    const boost::json::array& tokens = lp["tokens"].as_array();
    const boost::json::array& offsets = lp["text_offset"].as_array();
    REQUIRE(tokens.size() >= 6);
    REQUIRE(offsets.size() == tokens.size());
    // The prompt as read: the BOS, "c", "af", the two bytes of the NFC "é", " x".
    CHECK(boost::json::array(tokens.begin(), tokens.begin() + 6) ==
          boost::json::array{"<|endoftext|>", "c", "af", "\\xc3", "\\xa9", " x"});
    CHECK(boost::json::array(offsets.begin(), offsets.begin() + 6) ==
          boost::json::array{0, 0, 1, 3, 3, 5});
    for (size_t i = 6; i < offsets.size(); ++i) {
        CHECK(offsets[i].as_int64() >= 7);  // The completion's, after the prompt's 7 characters.
    }
}

TEST_CASE("a planner's refusal quoting a version pin of any bytes stays valid UTF-8") {
    // X-Model-Version may hold bytes that are not UTF-8; the planner quotes the pin in its
    // message, which goes into the JSON error as it is.
    daemon::cluster::RoutePlan plan;
    plan.rejection = daemon::cluster::RouteRejection::kVersionPinUnmatched;
    plan.message = "no pool serves version '\xff\xfe' of model 'm'";
    const daemon::api::ApiError e = daemon::api::route_rejection_error(plan, "m");
    CHECK(e.message == "no pool serves version '\\xff\\xfe' of model 'm'");
    CHECK(e.code == std::optional<std::string>("version_pin_unmatched"));
    CHECK(json_of(e.to_response().body)["error"].as_object().at("message").as_string() ==
          "no pool serves version '\\xff\\xfe' of model 'm'");
}
