// A thinking model's thought comes back apart, as `reasoning_content`, through the real Daemon
// (TLS listener, router) on loopback: the ScriptedGenerator plays a model that writes
// <think>...</think> before its answer (or whose prompt opened the thought), streamed and not,
// with tools, and a model that does not think keeps its text as it is.

#include <doctest/doctest.h>

#include <boost/json.hpp>

#include "tests/testing/scripted_daemon.h"
#include "tests/testing/scripted_generator.h"
#include "tests/testing/tls_client.h"

using namespace edge;
namespace json = boost::json;

namespace {

struct ThinkFixture : testing::ScriptedDaemon {
    ThinkFixture() : ScriptedDaemon({"qwen3", "v31", "plain"}) {
        generator.set_thinks("qwen3");
        generator.set_thinks("v31", /*prompt_opens_thought=*/true);
        generator.set_tool_call_format("qwen3", "hermes");
        start();
    }

    // One chat request whose model writes `output` in pieces of `step` bytes; the reply body.
    std::string ask(testing::TlsClient& c, const std::string& model, const std::string& output,
                    bool stream, size_t step, const std::string& extra = "") {
        const std::string body = R"({"model":")" + model +
                                 R"(","messages":[{"role":"user","content":"2+2?"}])" +
                                 (stream ? R"(,"stream":true)" : "") + extra + "}";
        REQUIRE(c.send(testing::http_request("POST", "/v1/chat/completions", body)).ok());
        REQUIRE(generator.wait_for_request(next));
        for (size_t i = 0; i < output.size(); i += step) {
            generator.emit(next, output.substr(i, step));
        }
        generator.finish(next, engine::FinishReason::kStop, engine::Usage{5, 9, 0});
        ++next;
        auto reply = c.read_response();
        REQUIRE(reply.ok());
        REQUIRE(reply->status == 200);
        return reply->body;
    }

    size_t next = 0;
};

struct Answer {
    json::value reasoning;  // null when the answer had none.
    json::value content;
    json::value tool_calls;  // null when none.
    std::string finish_reason;
};

Answer message_of(const std::string& body) {
    json::object root = testing::json_object_of(body);
    const json::object& choice = root["choices"].as_array().at(0).as_object();
    const json::object& m = choice.at("message").as_object();
    Answer a;
    REQUIRE_MESSAGE(m.contains("reasoning_content"), body);
    a.reasoning = m.at("reasoning_content");
    a.content = m.at("content");
    a.tool_calls = m.contains("tool_calls") ? m.at("tool_calls") : json::value(nullptr);
    a.finish_reason = choice.at("finish_reason").as_string();
    return a;
}

// The streamed deltas joined.
struct Streamed {
    std::string reasoning;
    std::string content;
    int tool_call_deltas = 0;
    std::string finish_reason;
};

Streamed streamed_of(const std::string& body) {
    std::vector<std::string> events = testing::sse_events(body);
    REQUIRE(!events.empty());
    CHECK(events.back() == "[DONE]");
    events.pop_back();
    Streamed s;
    for (const std::string& e : events) {
        json::object chunk = testing::json_object_of(e);
        const json::object& choice = chunk["choices"].as_array().at(0).as_object();
        const json::object& delta = choice.at("delta").as_object();
        if (const json::value* r = delta.if_contains("reasoning_content")) {
            CHECK_MESSAGE(s.content.empty(), "thought after the answer began: " << e);
            s.reasoning += r->as_string();
        }
        if (const json::value* c = delta.if_contains("content"); c && c->is_string()) {
            s.content += c->as_string();
        }
        if (delta.contains("tool_calls")) {
            ++s.tool_call_deltas;
        }
        if (!choice.at("finish_reason").is_null()) {
            s.finish_reason = choice.at("finish_reason").as_string();
        }
    }
    return s;
}

constexpr const char* kQwenOutput = "<think>\nAdd two and two.\n</think>\n\nIt is 4.";

}  // namespace

TEST_CASE("reasoning: a thinking model's thought comes back as reasoning_content") {
    ThinkFixture f;
    auto c = f.client();
    const Answer a = message_of(f.ask(*c, "qwen3", kQwenOutput, false, 5));
    CHECK(a.reasoning == "Add two and two.");
    CHECK(a.content == "It is 4.");
    CHECK(a.finish_reason == "stop");
    // Thinking switched off: the model answers at once and there is no thought.
    const Answer off = message_of(f.ask(*c, "qwen3", "It is 4.", false, 3));
    CHECK(off.reasoning.is_null());
    CHECK(off.content == "It is 4.");
}

TEST_CASE("reasoning: streamed, the thought goes out in reasoning_content deltas for any split") {
    ThinkFixture f;
    auto c = f.client();
    for (size_t step : {1, 4, 100}) {
        CAPTURE(step);
        const Streamed s = streamed_of(f.ask(*c, "qwen3", kQwenOutput, true, step));
        CHECK(s.reasoning == "Add two and two.");
        CHECK(s.content == "It is 4.");
        CHECK(s.finish_reason == "stop");
    }
}

TEST_CASE("reasoning: a prompt that opened the thought (DeepSeek-V3.1 thinking)") {
    ThinkFixture f;
    auto c = f.client();
    const std::string output = "Two plus two.</think>4";
    const Answer a = message_of(f.ask(*c, "v31", output, false, 3));
    CHECK(a.reasoning == "Two plus two.");
    CHECK(a.content == "4");
    const Streamed s = streamed_of(f.ask(*c, "v31", output, true, 2));
    CHECK(s.reasoning == "Two plus two.");
    CHECK(s.content == "4");
}

TEST_CASE("reasoning: the thought is split off before the tool-call parser reads the answer") {
    ThinkFixture f;
    auto c = f.client();
    const std::string tools =
        R"(,"tools":[{"type":"function","function":{"name":"add","parameters":)"
        R"({"type":"object","properties":{"a":{"type":"integer"}}}}}])";
    // A call written inside the thought is thinking aloud, not a call.
    const std::string output =
        "<think>Maybe <tool_call>\n{\"name\": \"no\"}\n</tool_call>?</think>\n\n"
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2}}\n</tool_call>";
    const Answer a = message_of(f.ask(*c, "qwen3", output, false, 6, tools));
    CHECK(a.reasoning == "Maybe <tool_call>\n{\"name\": \"no\"}\n</tool_call>?");
    CHECK(a.finish_reason == "tool_calls");
    REQUIRE(a.tool_calls.is_array());
    REQUIRE(a.tool_calls.as_array().size() == 1);
    CHECK(a.tool_calls.as_array()[0].at("function").at("name") == "add");
    const Streamed s = streamed_of(f.ask(*c, "qwen3", output, true, 1, tools));
    CHECK(s.reasoning == "Maybe <tool_call>\n{\"name\": \"no\"}\n</tool_call>?");
    CHECK(s.tool_call_deltas > 0);
    CHECK(s.finish_reason == "tool_calls");
}

TEST_CASE("reasoning: a model that does not think keeps <think> in its content") {
    ThinkFixture f;
    auto c = f.client();
    json::object root = testing::json_object_of(f.ask(*c, "plain", kQwenOutput, false, 5));
    const json::object& m = root["choices"].as_array()[0].as_object().at("message").as_object();
    CHECK(m.at("content") == kQwenOutput);
    CHECK_FALSE(m.contains("reasoning_content"));
    // Completions are raw text on every model.
    REQUIRE(c->send(testing::http_request("POST", "/v1/completions",
                                          R"({"model":"qwen3","prompt":"x"})"))
                .ok());
    REQUIRE(f.generator.wait_for_request(f.next));
    f.generator.emit(f.next, kQwenOutput);
    f.generator.finish(f.next, engine::FinishReason::kStop, engine::Usage{1, 9, 0});
    auto reply = c->read_response();
    REQUIRE(reply.ok());
    json::object comp = testing::json_object_of(reply->body);
    CHECK(comp["choices"].as_array()[0].at("text") == kQwenOutput);
}

TEST_CASE("reasoning: usage counts the thought's tokens as completion_tokens_details") {
    // OpenAI's usage.completion_tokens_details.reasoning_tokens: the thought's share of
    // completion_tokens, its markers included. Each emit below is one token.
    ThinkFixture f;
    auto c = f.client();
    auto reasoning_tokens = [&](const std::string& model, const std::vector<std::string>& pieces,
                                bool stream) {
        const std::string body = R"({"model":")" + model +
                                 R"(","messages":[{"role":"user","content":"2+2?"}])" +
                                 (stream ? R"(,"stream":true,"stream_options":{"include_usage":true})"
                                         : "") +
                                 "}";
        REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", body)).ok());
        REQUIRE(f.generator.wait_for_request(f.next));
        for (const std::string& piece : pieces) {
            f.generator.emit(f.next, piece);
        }
        f.generator.finish(f.next, engine::FinishReason::kStop,
                           engine::Usage{5, static_cast<int64_t>(pieces.size()), 0});
        ++f.next;
        auto reply = c->read_response();
        REQUIRE(reply.ok());
        REQUIRE(reply->status == 200);
        json::object usage;
        if (stream) {
            std::vector<std::string> events = testing::sse_events(reply->body);
            REQUIRE(events.size() >= 2);
            usage = testing::json_object_of(events[events.size() - 2])["usage"].as_object();
        } else {
            usage = testing::json_object_of(reply->body)["usage"].as_object();
        }
        CHECK(usage["completion_tokens"] == static_cast<int64_t>(pieces.size()));
        return usage["completion_tokens_details"].as_object()["reasoning_tokens"].as_int64();
    };
    for (bool stream : {false, true}) {
        CAPTURE(stream);
        // <think>, two thought tokens, </think>: 4; the answer's two are content.
        CHECK(reasoning_tokens("qwen3", {"<think>", "\nAdd two", " and two.", "</think>", "\n\nIt",
                                         " is 4."},
                               stream) == 4);
        // A marker split over two tokens: both are the thought's, the opening one too.
        CHECK(reasoning_tokens("qwen3", {"<think>", "Sum.", "</th", "ink>", "4"}, stream) == 4);
        CHECK(reasoning_tokens("qwen3", {"<th", "ink>", "Sum.", "</think>", "4"}, stream) == 4);
        // One delta that opens and closes it (a stop string's hold-back releases several).
        CHECK(reasoning_tokens("qwen3", {"<th", "ink>Sum.</think>", "4"}, stream) == 2);
        // An answer that only looked like it might open one: none.
        CHECK(reasoning_tokens("qwen3", {"<th", "e answer"}, stream) == 0);
        // The prompt opened the thought: from the first token.
        CHECK(reasoning_tokens("v31", {"Two plus", " two.", "</think>", "4"}, stream) == 3);
        // No thought: none.
        CHECK(reasoning_tokens("qwen3", {"It is", " 4."}, stream) == 0);
        CHECK(reasoning_tokens("plain", {"<think>", "x", "</think>", "4"}, stream) == 0);
    }
}
