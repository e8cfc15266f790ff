// OpenAI `n`: several choices for one prompt, through the real HTTPS server and the API, each a
// generation of its own on the scripted generator. Whole answers list the choices by index with
// the usage summed (the prompt once); streams interleave the choices' chunks by index and end
// once, after the last; one choice failing or refused fails the request and stops the others.

#include <doctest/doctest.h>

#include <chrono>
#include <future>

#include "daemon/api/completion.h"
#include "tests/testing/scripted_daemon.h"

using namespace edge;

namespace {

std::string chat_body(const std::string& extra) {
    return R"({"model":"test-model","messages":[{"role":"user","content":"hi"}])" + extra + "}";
}

struct Fixture : testing::ScriptedDaemon {
    explicit Fixture(const std::string& extra = "") : ScriptedDaemon({"test-model"}) {
        start(extra);
    }
    // A connection that has sent a chat request with `extra` fields, once the generator has
    // recorded `submitted` requests (its choices).
    std::unique_ptr<testing::TlsClient> chat(const std::string& extra, size_t submitted) {
        auto c = client();
        REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(extra)))
                    .ok());
        REQUIRE(generator.wait_for_request(submitted - 1));
        return c;
    }
};

boost::json::object json_of(const std::string& s) { return testing::json_object_of(s); }

// A generator that cancels as the engine does: cancel() only flags the request, whose
// on_finish(kCancelled) comes later (the test sends it). Request `fail_at` fails at once, its
// on_finish(kError) running inside submit() (an engine thread that failed its prefill first).
class LateCancelGenerator final : public engine::Generator {
  public:
    struct Handle final : engine::GenerationHandle {
        void cancel() override { cancelled = true; }
        bool cancelled = false;
    };

    explicit LateCancelGenerator(size_t fail_at) : fail_at_(fail_at) {}

    std::vector<engine::ModelInfo> models() const override {
        engine::ModelInfo m;
        m.name = "test-model";
        return {m};
    }
    Result<std::shared_ptr<engine::GenerationHandle>> submit(
        engine::GenerateRequest, std::shared_ptr<engine::GenerationSink> sink) override {
        auto handle = std::make_shared<Handle>();
        if (sinks.size() == fail_at_) {
            engine::Finish finish;
            finish.reason = engine::FinishReason::kError;
            finish.error = unavailable_error("the device failed");
            sink->on_finish(finish);
        }
        sinks.push_back(sink);
        handles.push_back(handle);
        return std::shared_ptr<engine::GenerationHandle>(handle);
    }
    bool ready() const override { return true; }
    std::vector<engine::ModelLoad> load() const override { return {}; }

    std::vector<std::shared_ptr<engine::GenerationSink>> sinks;
    std::vector<std::shared_ptr<Handle>> handles;

  private:
    const size_t fail_at_;
};

// What an answer wrote, in order.
struct RecordingChannel final : tls::ResponseChannel {
    void respond(tls::HttpResponse response) override { log.push_back(response); }
    void begin_stream(tls::HttpResponse head) override { log.push_back(head); }
    void write(std::string chunk) override { log.back().body += chunk; }
    void end_stream() override {}
    void on_client_gone(std::function<void()>) override {}
    void note(std::string, std::variant<std::string, int64_t>) override {}
    std::vector<tls::HttpResponse> log;
};

}  // namespace

TEST_CASE("n: a whole answer lists every choice by index, usage summed with the prompt once") {
    Fixture f;
    auto c = f.chat(R"(,"n":3,"seed":41,"temperature":0.7)", 3);
    for (size_t i = 0; i < 3; ++i) {
        // One sequence per choice, each with its own seed (seed + index).
        CHECK(f.generator.request(i).sampling.seed == std::optional<uint64_t>(41 + i));
        CHECK(f.generator.request(i).sampling.temperature == doctest::Approx(0.7));
    }
    // They end in any order; the answer waits for the last.
    f.generator.emit(2, "third");
    f.generator.finish(2, engine::FinishReason::kLength, engine::Usage{5, 4, 2});
    f.generator.emit(0, "first");
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{5, 1, 2});
    f.generator.emit(1, "second");
    f.generator.finish(1, engine::FinishReason::kStop, engine::Usage{5, 2, 2});
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    auto body = json_of(r->body);
    auto& choices = body["choices"].as_array();
    REQUIRE(choices.size() == 3);
    const char* texts[] = {"first", "second", "third"};
    for (size_t i = 0; i < 3; ++i) {
        auto& choice = choices[i].as_object();
        CHECK(choice["index"] == static_cast<int64_t>(i));
        CHECK(choice["message"].as_object()["content"] == texts[i]);
    }
    CHECK(choices[2].as_object()["finish_reason"] == "length");
    auto& usage = body["usage"].as_object();
    CHECK(usage["prompt_tokens"] == 5);
    CHECK(usage["completion_tokens"] == 7);
    CHECK(usage["total_tokens"] == 12);
    CHECK(usage["prompt_tokens_details"].as_object()["cached_tokens"] == 2);
}

TEST_CASE("n: a stream opens every choice, tags each chunk with its index and ends once") {
    Fixture f;
    auto c = f.client();
    REQUIRE(c->send(testing::http_request(
                        "POST", "/v1/completions",
                        R"({"model":"test-model","prompt":"hi","n":2,"stream":true,)"
                        R"("stream_options":{"include_usage":true}})"))
                .ok());
    REQUIRE(f.generator.wait_for_request(1));
    CHECK_FALSE(f.generator.request(0).sampling.seed.has_value());  // Unseeded: each its own.
    f.generator.emit(1, "B1");
    auto first = c->read_until("B1");
    REQUIRE(first.ok());  // A choice's tokens go out as they come, not after the others.
    f.generator.emit(0, "A1");
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{4, 1, 0});
    auto mid = c->read_until("\"stop\"");
    REQUIRE(mid.ok());
    CHECK(mid->find("[DONE]") == std::string::npos);  // Choice 1 still runs.
    f.generator.emit(1, "B2");
    f.generator.finish(1, engine::FinishReason::kStop, engine::Usage{4, 2, 0});
    auto rest = c->read_until("0\r\n\r\n");
    REQUIRE(rest.ok());
    auto events = testing::sse_events(*first + *mid + *rest);
    std::map<int64_t, std::string> text;
    std::map<int64_t, int> finished;
    size_t usage_events = 0;
    for (const std::string& e : events) {
        if (e == "[DONE]") {
            continue;
        }
        auto o = json_of(e);
        if (o["choices"].as_array().empty()) {
            ++usage_events;
            CHECK(o["usage"].as_object()["prompt_tokens"] == 4);
            CHECK(o["usage"].as_object()["completion_tokens"] == 3);
            continue;
        }
        auto& choice = o["choices"].as_array()[0].as_object();
        const int64_t index = choice["index"].as_int64();
        text[index] += std::string(choice["text"].as_string());
        if (!choice["finish_reason"].is_null()) {
            ++finished[index];
        }
    }
    CHECK(text[0] == "A1");
    CHECK(text[1] == "B1B2");
    CHECK(finished[0] == 1);
    CHECK(finished[1] == 1);
    CHECK(usage_events == 1);
    REQUIRE_FALSE(events.empty());
    CHECK(events.back() == "[DONE]");
    CHECK(std::count(events.begin(), events.end(), "[DONE]") == 1);
}

// Choice 0's events wait until every choice is submitted (the stream opens then): here 24 of
// ~800 bytes, generated while choice 1 was submitted, more than this connection's 4 KiB stream
// buffer. Written one by one they marked the client a slow reader, and cut it, before it could
// read a byte.
TEST_CASE("n: what a choice generated while the others were submitted goes out whole") {
    Fixture f("limits:\n  max_stream_buffer_bytes: 4096\n");
    const std::string piece(700, 'x');
    std::promise<void> emitted;
    f.generator.on_submit_at(1, [&] {
        for (int i = 0; i < 24; ++i) {
            f.generator.emit(0, piece);
        }
        emitted.set_value();
    });
    auto c = f.client();
    REQUIRE(c->send(testing::http_request(
                        "POST", "/v1/completions",
                        R"({"model":"test-model","prompt":"hi","n":2,"stream":true})"))
                .ok());
    // Recorded first, then the hook runs: choice 0 ends only after it emitted everything.
    REQUIRE(emitted.get_future().wait_for(std::chrono::seconds(10)) ==
            std::future_status::ready);
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 24, 0});
    f.generator.finish(1, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
    auto all = c->read_until("0\r\n\r\n");
    REQUIRE_MESSAGE(all.ok(), all.status().to_string());
    std::string text;
    for (const std::string& e : testing::sse_events(*all)) {
        if (e != "[DONE]") {
            auto o = json_of(e);
            auto& choice = o["choices"].as_array()[0].as_object();
            if (choice["index"] == 0) {
                text += std::string(choice["text"].as_string());
            }
        }
    }
    CHECK(text.size() == 24 * piece.size());
    CHECK(f.metrics().find("edgeserve_http_streams_cancelled_total{reason=\"slow_reader\"} 1") ==
          std::string::npos);
}

// A chat stream opens with a role chunk for each choice, written inside the handler before the
// session can send a byte: here 16 of ~250 bytes (continuous usage), more than this connection's
// 4 KiB stream buffer. Written one by one they marked the client a slow reader, and cut it,
// before it could read anything.
TEST_CASE("n: a chat stream's role chunks go out whole, however many choices") {
    Fixture f("limits:\n  max_stream_buffer_bytes: 4096\n");
    constexpr int kChoices = 16;
    auto c = f.chat(R"(,"n":16,"stream":true,)"
                    R"("stream_options":{"include_usage":true,"continuous_usage_stats":true})",
                    kChoices);
    // The whole opening first: the connection must have survived it.
    auto body = c->read_until("\"index\":15,");
    REQUIRE_MESSAGE(body.ok(), body.status().to_string());
    for (int i = 0; i < kChoices; ++i) {
        f.generator.finish(static_cast<size_t>(i), engine::FinishReason::kStop,
                           engine::Usage{1, 0, 0});
        // Read as they come: sixteen finish chunks held at once would fill the buffer too.
        auto finish = c->read_until("\"stop\"");
        REQUIRE_MESSAGE(finish.ok(), finish.status().to_string());
        *body += *finish;
    }
    auto rest = c->read_until("0\r\n\r\n");
    REQUIRE_MESSAGE(rest.ok(), rest.status().to_string());
    *body += *rest;
    int roles = 0;
    int finished = 0;
    int usage_events = 0;
    const std::vector<std::string> events = testing::sse_events(*body);
    for (const std::string& e : events) {
        if (e == "[DONE]") {
            continue;
        }
        auto o = json_of(e);
        if (o["choices"].as_array().empty()) {
            ++usage_events;
            continue;
        }
        auto& choice = o["choices"].as_array()[0].as_object();
        roles += choice["delta"].as_object().contains("role") ? 1 : 0;
        finished += choice["finish_reason"].is_null() ? 0 : 1;
    }
    CHECK(roles == kChoices);
    CHECK(finished == kChoices);
    CHECK(usage_events == 1);
    REQUIRE_FALSE(events.empty());
    CHECK(events.back() == "[DONE]");
    CHECK(f.metrics().find("edgeserve_http_streams_cancelled_total{reason=\"slow_reader\"}") ==
          std::string::npos);
}

TEST_CASE("n: chat streams open with a role chunk for each choice") {
    Fixture f;
    auto c = f.chat(R"(,"n":2,"stream":true)", 2);
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
    f.generator.finish(1, engine::FinishReason::kStop, engine::Usage{1, 0, 0});
    auto all = c->read_until("0\r\n\r\n");
    REQUIRE(all.ok());
    auto events = testing::sse_events(*all);
    REQUIRE(events.size() == 5);  // Two role chunks, two finish chunks, [DONE].
    for (int i = 0; i < 2; ++i) {
        auto event = json_of(events[static_cast<size_t>(i)]);
        auto& choice = event["choices"].as_array()[0].as_object();
        CHECK(choice["index"] == i);
        CHECK(choice["delta"].as_object()["role"] == "assistant");
    }
}

TEST_CASE("n: one choice failing stops the others and fails the request") {
    Fixture f;
    auto c = f.chat(R"(,"n":2)", 2);
    f.generator.emit(0, "half");
    f.generator.finish(1, engine::FinishReason::kError, engine::Usage{3, 1, 0},
                       unavailable_error("the device failed"));
    CHECK(f.generator.wait_cancelled(0));
    f.generator.finish(0, engine::FinishReason::kCancelled, engine::Usage{3, 1, 0});
    // The error, not the cancellation it caused.
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 503);
    CHECK(json_of(r->body)["error"].as_object()["message"].as_string().find(
              "the device failed") != std::string::npos);
}

TEST_CASE("n: the engine refusing a later choice refuses the request, the earlier ones stop") {
    Fixture f;
    f.generator.fail_submit_at(1, resource_exhausted_error("queue full"));
    auto c = f.chat(R"(,"n":3,"stream":true)", 1);
    CHECK(f.generator.wait_cancelled(0));
    // The refusal's own status, not a 200 stream: nothing went out before it.
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 429);
    CHECK(r->headers["retry-after"] == "1");
    // What the cancelled choice does next goes nowhere.
    f.generator.emit(0, "late");
    f.generator.finish(0, engine::FinishReason::kCancelled, engine::Usage{1, 1, 0});
    REQUIRE(c->send(testing::http_request("GET", "/v1/models")).ok());
    auto next = c->read_response();
    REQUIRE(next.ok());
    CHECK(next->status == 200);
    CHECK(next->body.find("late") == std::string::npos);
}

TEST_CASE("n: a choice failing while the request is still being submitted stops the later ones") {
    Fixture f;
    // Choice 0 fails before choice 1 is submitted: the failure's cancel_all() found only it.
    f.generator.error_in_submit_at(0, unavailable_error("the device failed"));
    auto c = f.chat(R"(,"n":3)", 3);
    CHECK(f.generator.wait_cancelled(1));  // They ran to max_tokens, and the answer waited.
    CHECK(f.generator.wait_cancelled(2));
    f.generator.finish(1, engine::FinishReason::kCancelled, engine::Usage{3, 0, 0});
    f.generator.finish(2, engine::FinishReason::kCancelled, engine::Usage{3, 0, 0});
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 503);
    CHECK(r->body.find("the device failed") != std::string::npos);
}

TEST_CASE("n: a stream whose choice failed before it opened answers the error's own status") {
    // Choice 0 fails before the request is accepted; choice 1 is cancelled, but its end comes
    // after. Nothing went out yet: the error's status (503, Retry-After), not a 200 event stream
    // with the error inside, which clients do not retry.
    LateCancelGenerator generator(0);
    auto channel = std::make_shared<RecordingChannel>();
    auto parsed = daemon::api::parse_openai_request(daemon::api::Endpoint::kChatCompletions,
                                                    chat_body(R"(,"n":2,"stream":true)"));
    REQUIRE(std::holds_alternative<daemon::api::ParsedRequest>(parsed));
    daemon::api::run_completion(generator, std::get<daemon::api::ParsedRequest>(parsed), channel,
                                0);
    REQUIRE(generator.sinks.size() == 2);
    CHECK(generator.handles[1]->cancelled);
    CHECK(channel->log.empty());  // Waiting for choice 1's end.
    engine::TokenDelta late;
    late.text = "late";
    generator.sinks[1]->on_delta(late);
    engine::Finish cancelled;
    cancelled.reason = engine::FinishReason::kCancelled;
    generator.sinks[1]->on_finish(cancelled);
    REQUIRE(channel->log.size() == 1);
    const tls::HttpResponse& r = channel->log[0];
    CHECK(r.status == 503);
    CHECK(r.content_type == "application/json");
    CHECK(r.body.find("the device failed") != std::string::npos);
    CHECK(r.body.find("late") == std::string::npos);
}

TEST_CASE("n: the client leaving cancels every choice") {
    Fixture f;
    {
        auto c = f.chat(R"(,"n":2,"stream":true)", 2);
        f.generator.emit(1, "partial");
        REQUIRE(c->read_until("partial").ok());
    }
    CHECK(f.generator.wait_cancelled(0));
    CHECK(f.generator.wait_cancelled(1));
}

TEST_CASE("n: a tenant's output budget covers every choice") {
    Fixture f(
        "tenants:\n"
        "  - name: acme\n"
        "    api_key_sha256: [" +
        std::string("6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b") +
        "]\n"
        "    output_tokens_per_minute: 100\n");
    const std::string auth = "Authorization: Bearer 1\r\n";
    // 4 x 30 tokens is more than the minute's 100: refused, naming max_tokens.
    auto over = f.call("POST", "/v1/chat/completions", chat_body(R"(,"n":4,"max_tokens":30)"),
                       auth);
    CHECK(over.status == 400);
    CHECK(json_of(over.body)["error"].as_object()["param"] == "max_tokens");
    CHECK(json_of(over.body)["error"].as_object()["message"].as_string().find(
              "4 choices of 30 tokens") != std::string::npos);
    // Without max_tokens the default is lowered to the choices' share of the budget.
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", chat_body(R"(,"n":4)"),
                                          auth))
                .ok());
    REQUIRE(f.generator.wait_for_request(3));
    CHECK(f.generator.request(0).sampling.max_tokens <= 25);
    for (size_t i = 0; i < 4; ++i) {
        f.generator.finish(i, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    }
    CHECK(c->read_response()->status == 200);
}

TEST_CASE("min_tokens above a default lowered for the tenant's limits is refused for itself") {
    Fixture f(
        "tenants:\n"
        "  - name: acme\n"
        "    api_key_sha256: [" +
        std::string("6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b") +
        "]\n"
        "    max_output_tokens: 100\n");
    const std::string auth = "Authorization: Bearer 1\r\n";
    // Unset, max_tokens is lowered to the tenant's 100: a reply of at least 150 cannot be, and
    // the engine, seeing only the 100, would blame the context's room.
    auto over = f.call("POST", "/v1/chat/completions", chat_body(R"(,"min_tokens":150)"), auth);
    CHECK(over.status == 400);
    CHECK(json_of(over.body)["error"].as_object()["param"] == "min_tokens");
    CHECK(json_of(over.body)["error"].as_object()["message"].as_string().find(
              "exceeds the 100 tokens this tenant's limits") != std::string::npos);
    CHECK_FALSE(f.generator.wait_for_request(0, 0));
    // Within the lowered default it runs.
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions",
                                          chat_body(R"(,"min_tokens":100)"), auth))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    CHECK(f.generator.request(0).sampling.max_tokens == 100);
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 100, 0});
    CHECK(c->read_response()->status == 200);
}

TEST_CASE("completions' top_logprobs keep the byte 0xff apart from the token written \\xff") {
    // The legacy shape keys alternatives by their text: two that were written alike merged into
    // one entry, and the client lost one of them.
    LateCancelGenerator generator(SIZE_MAX);
    auto channel = std::make_shared<RecordingChannel>();
    auto parsed = daemon::api::parse_openai_request(
        daemon::api::Endpoint::kCompletions,
        R"({"model":"test-model","prompt":"hi","logprobs":2,"n":2})");
    REQUIRE(std::holds_alternative<daemon::api::ParsedRequest>(parsed));
    daemon::api::run_completion(generator, std::get<daemon::api::ParsedRequest>(parsed), channel,
                                0);
    REQUIRE(generator.sinks.size() == 2);
    for (const auto& sink : generator.sinks) {
        engine::TokenDelta delta;
        delta.text = "\\xff";
        engine::TokenLogprob lp;
        lp.token = "\\xff";
        lp.logprob = -0.5f;
        lp.top = {engine::TopLogprob{"\\xff", 7, -0.5f}, engine::TopLogprob{"\xFF", 8, -1.5f}};
        delta.logprobs.push_back(lp);
        sink->on_delta(delta);
        engine::Finish stop;
        stop.reason = engine::FinishReason::kStop;
        sink->on_finish(stop);
    }
    REQUIRE(channel->log.size() == 1);
    boost::json::object body = json_of(channel->log[0].body);
    for (const auto& choice : body["choices"].as_array()) {
        const boost::json::object& logprobs = choice.as_object().at("logprobs").as_object();
        CHECK(choice.as_object().at("text") == "\\xff");
        CHECK(logprobs.at("tokens").as_array() == boost::json::array{"\\x5cxff"});
        CHECK(logprobs.at("top_logprobs").as_array() ==
              boost::json::array{boost::json::object{{"\\x5cxff", -0.5}, {"\\xff", -1.5}}});
    }
}

TEST_CASE("completions' top_logprobs list a special token left out of the text once") {
    // Its entry's token is empty (the tokens join to the text); its own alternative, keyed by its
    // text, listed it a second time beside the empty key that the sampled token always has.
    LateCancelGenerator generator(SIZE_MAX);
    auto channel = std::make_shared<RecordingChannel>();
    auto parsed =
        daemon::api::parse_openai_request(daemon::api::Endpoint::kCompletions,
                                          R"({"model":"test-model","prompt":"hi","logprobs":2})");
    REQUIRE(std::holds_alternative<daemon::api::ParsedRequest>(parsed));
    daemon::api::run_completion(generator, std::get<daemon::api::ParsedRequest>(parsed), channel,
                                0);
    REQUIRE(generator.sinks.size() == 1);
    engine::TokenDelta special;
    special.token_ids = {510};
    engine::TokenLogprob skipped;
    skipped.id = 510;  // <|im_start|>, not shown.
    skipped.logprob = -0.25f;
    skipped.top = {engine::TopLogprob{"<|im_start|>", 510, -0.25f},
                   engine::TopLogprob{"a", 97, -2.0f}};
    special.logprobs.push_back(skipped);
    generator.sinks[0]->on_delta(special);
    engine::TokenDelta text;
    text.text = "a";
    text.token_ids = {97};
    engine::TokenLogprob shown;
    shown.token = "a";
    shown.id = 97;
    shown.logprob = -1.0f;
    // Another token's alternative keeps its own text.
    shown.top = {engine::TopLogprob{"a", 97, -1.0f},
                 engine::TopLogprob{"<|im_start|>", 510, -1.5f}};
    text.logprobs.push_back(shown);
    generator.sinks[0]->on_delta(text);
    engine::Finish stop;
    stop.reason = engine::FinishReason::kStop;
    generator.sinks[0]->on_finish(stop);
    REQUIRE(channel->log.size() == 1);
    boost::json::object body = json_of(channel->log[0].body);
    const boost::json::object& logprobs =
        body["choices"].as_array()[0].as_object().at("logprobs").as_object();
    CHECK(logprobs.at("tokens").as_array() == boost::json::array{"", "a"});
    CHECK(logprobs.at("top_logprobs").as_array() ==
          boost::json::array{boost::json::object{{"", -0.25}, {"a", -2.0}},
                             boost::json::object{{"a", -1.0}, {"<|im_start|>", -1.5}}});
}
