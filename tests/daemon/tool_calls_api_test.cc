// OpenAI tools end to end through the real Daemon (TLS listener, router) on loopback: the
// ScriptedGenerator plays a model of each tool-call format (Qwen3 / Hermes, GLM-4.5, Kimi K2)
// writing calls in pieces, and the client sees OpenAI's tool_calls, streamed and not.

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <map>

#include "daemon/config.h"
#include "daemon/daemon.h"
#include "engine/sampling/json_prefix.h"
#include "tests/testing/config_yaml.h"
#include "tests/testing/scripted_daemon.h"
#include "tests/testing/scripted_generator.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using edge::testing::TlsClient;
namespace json = boost::json;

namespace {

struct ToolFixture : testing::ScriptedDaemon {
    ToolFixture() : ScriptedDaemon({"qwen", "glm", "kimi", "plain"}) {
        generator.set_tool_call_format("qwen", "hermes");
        generator.set_tool_call_format("glm", "glm4_5");
        generator.set_tool_call_format("kimi", "kimi_k2");
        start();
    }
};

json::object json_of(const std::string& s) { return testing::json_object_of(s); }

using testing::sse_events;

constexpr const char* kTools =
    R"("tools":[{"type":"function","function":{"name":"get_weather","description":"Weather.",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"},)"
    R"("days":{"type":"integer"}}}}}])";

std::string tool_body(const std::string& model, bool stream, const std::string& extra = "") {
    return R"({"model":")" + model +
           R"(","messages":[{"role":"user","content":"Weather in Oslo?"}],)" + kTools +
           (stream ? R"(,"stream":true)" : "") + extra + "}";
}

// What each family's model writes for get_weather(city="Oslo", days=2) after some text.
struct Recorded {
    const char* model;
    std::string output;
};

std::vector<Recorded> recorded_outputs() {
    return {
        {"qwen",
         "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
         "\"Oslo\", \"days\": 2}}\n</tool_call>"},
        {"glm",
         "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo"
         "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"},
        {"kimi",
         "Let me check.\n<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
         "<|tool_call_argument_begin|>{\"city\": \"Oslo\", \"days\": 2}<|tool_call_end|>"
         "<|tool_calls_section_end|>"},
    };
}

// Emits `text` in pieces of `step` bytes.
void emit_in_pieces(testing::ScriptedGenerator& g, size_t index, const std::string& text,
                    size_t step) {
    for (size_t i = 0; i < text.size(); i += step) {
        g.emit(index, text.substr(i, step));
    }
}

struct StreamedCall {
    std::string id;
    std::string name;
    std::string arguments;
    int headers = 0;  // Deltas that carried the id and name.
};

struct Streamed {
    std::string content;
    std::map<int64_t, StreamedCall> calls;
    std::string finish_reason;
    json::value abandoned;
};

Streamed collect(const std::string& body) {
    Streamed out;
    std::vector<std::string> events = sse_events(body);
    REQUIRE(!events.empty());
    CHECK(events.back() == "[DONE]");
    events.pop_back();
    for (const std::string& e : events) {
        json::object chunk = json_of(e);
        REQUIRE_MESSAGE(chunk.contains("choices"), e);
        const json::object& choice = chunk["choices"].as_array().at(0).as_object();
        const json::object& delta = choice.at("delta").as_object();
        if (const json::value* c = delta.if_contains("content"); c && c->is_string()) {
            out.content += c->as_string();
        }
        if (const json::value* calls = delta.if_contains("tool_calls")) {
            for (const json::value& v : calls->as_array()) {
                const json::object& call = v.as_object();
                StreamedCall& sc = out.calls[call.at("index").as_int64()];
                const json::object& fn = call.at("function").as_object();
                if (call.contains("id")) {
                    CHECK(call.at("type") == "function");
                    sc.id = call.at("id").as_string();
                    sc.name = fn.at("name").as_string();
                    ++sc.headers;
                } else {
                    CHECK_FALSE(fn.contains("name"));
                }
                CHECK_MESSAGE(sc.headers == 1, "argument delta before the call's header");
                sc.arguments += fn.at("arguments").as_string();
            }
        }
        if (!choice.at("finish_reason").is_null()) {
            out.finish_reason = choice.at("finish_reason").as_string();
            if (const json::value* a = choice.if_contains("abandoned_tool_calls")) {
                out.abandoned = *a;
            }
        }
    }
    return out;
}

json::value parsed(const std::string& s) {
    boost::system::error_code ec;
    json::value v = json::parse(s, ec);
    CHECK_MESSAGE(!ec, s);
    return v;
}

const json::value kWeatherArgs = json::parse(R"({"city": "Oslo", "days": 2})");

}  // namespace

TEST_CASE("tools: each family's call comes back as OpenAI tool_calls (non-streaming)") {
    ToolFixture f;
    auto c = f.client();
    size_t index = 0;
    for (const Recorded& r : recorded_outputs()) {
        CAPTURE(r.model);
        REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions",
                                              tool_body(r.model, false)))
                    .ok());
        REQUIRE(f.generator.wait_for_request(index));
        engine::GenerateRequest req = f.generator.request(index);
        REQUIRE(req.tools.size() == 1);
        CHECK(req.tools[0].name == "get_weather");
        CHECK(req.assistant_prefix.empty());  // "auto": nothing forced.
        emit_in_pieces(f.generator, index, r.output, 7);
        f.generator.finish(index, engine::FinishReason::kStop, engine::Usage{10, 20, 0});
        auto reply = c->read_response();
        REQUIRE(reply.ok());
        REQUIRE(reply->status == 200);
        json::object body = json_of(reply->body);
        const json::object& choice = body["choices"].as_array()[0].as_object();
        CHECK(choice.at("finish_reason") == "tool_calls");
        const json::object& message = choice.at("message").as_object();
        CHECK(message.at("content") == "Let me check.\n");
        const json::array& calls = message.at("tool_calls").as_array();
        REQUIRE(calls.size() == 1);
        const json::object& call = calls[0].as_object();
        CHECK(call.at("type") == "function");
        CHECK_FALSE(call.at("id").as_string().empty());
        CHECK(call.at("function").as_object().at("name") == "get_weather");
        CHECK(parsed(std::string(call.at("function").as_object().at("arguments").as_string())) ==
              kWeatherArgs);
        ++index;
    }
}

TEST_CASE("tools: with n > 1 each choice's calls have their own ids") {
    // The choices' parsers shared one id prefix: both choices' first call was call_<id>_0, and
    // a client filing results by tool_call_id across choices mixed them up.
    ToolFixture f;
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions",
                                          tool_body("qwen", false, R"(,"n":2)")))
                .ok());
    const std::string output = recorded_outputs()[0].output;
    for (size_t i = 0; i < 2; ++i) {
        REQUIRE(f.generator.wait_for_request(i));
        emit_in_pieces(f.generator, i, output, 5);
        f.generator.finish(i, engine::FinishReason::kStop, engine::Usage{10, 20, 0});
    }
    auto reply = c->read_response();
    REQUIRE(reply.ok());
    REQUIRE(reply->status == 200);
    json::object body = json_of(reply->body);
    const json::array& choices = body["choices"].as_array();
    REQUIRE(choices.size() == 2);
    std::vector<std::string> ids;
    for (const json::value& ch : choices) {
        const json::array& calls =
            ch.as_object().at("message").as_object().at("tool_calls").as_array();
        REQUIRE(calls.size() == 1);
        ids.emplace_back(calls[0].as_object().at("id").as_string());
    }
    CHECK(ids[0] != ids[1]);
}

TEST_CASE("tools: streamed argument deltas in OpenAI's delta shape for any split") {
    ToolFixture f;
    auto c = f.client();
    size_t index = 0;
    for (const Recorded& r : recorded_outputs()) {
        for (size_t step : {1, 3, 64}) {
            CAPTURE(r.model);
            CAPTURE(step);
            REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions",
                                                  tool_body(r.model, true)))
                        .ok());
            REQUIRE(f.generator.wait_for_request(index));
            emit_in_pieces(f.generator, index, r.output, step);
            f.generator.finish(index, engine::FinishReason::kStop, engine::Usage{10, 20, 0});
            auto reply = c->read_response();
            REQUIRE(reply.ok());
            Streamed s = collect(reply->body);
            CHECK(s.content == "Let me check.\n");
            CHECK(s.finish_reason == "tool_calls");
            REQUIRE(s.calls.size() == 1);
            CHECK(s.calls[0].name == "get_weather");
            CHECK(parsed(s.calls[0].arguments) == kWeatherArgs);
            ++index;
        }
    }
}

TEST_CASE("tools: arguments stream as the model writes them before the call ends") {
    ToolFixture f;
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", tool_body("qwen", true)))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    f.generator.emit(0, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os");
    // The header and the valid JSON prefix are out while the model is still writing.
    auto first = c->read_until("\\\"Os");
    REQUIRE(first.ok());
    CHECK(first->find("\"name\":\"get_weather\"") != std::string::npos);
    f.generator.emit(0, "lo\"}}\n</tool_call>");
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    auto rest = c->read_until("0\r\n\r\n");
    REQUIRE(rest.ok());
    Streamed s = collect(*first + *rest);
    CHECK(parsed(s.calls[0].arguments) == json::parse(R"({"city": "Oslo"})"));
    CHECK(s.finish_reason == "tool_calls");
}

TEST_CASE("tools: tool_choice required and named force the call's start in every format") {
    ToolFixture f;
    auto c = f.client();
    struct Case {
        const char* model;
        const char* choice;
        const char* prefix;
        const char* rest;  // What the model writes after the forced prefix.
    };
    const Case cases[] = {
        {"qwen", R"("required")", "<tool_call>\n",
         "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n"
         "</tool_call>"},
        {"qwen", R"({"type":"function","function":{"name":"get_weather"}})",
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\":",
         " {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>"},
        // GLM-4.5's template writes a newline between the empty thought and the call.
        {"glm", R"("required")", "\n<tool_call>",
         "get_weather\n<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>days</arg_key>"
         "<arg_value>2</arg_value></tool_call>"},
        {"glm", R"({"type":"function","function":{"name":"get_weather"}})",
         "\n<tool_call>get_weather\n",
         "<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>days</arg_key>"
         "<arg_value>2</arg_value></tool_call>"},
        {"kimi", R"("required")", "<|tool_calls_section_begin|><|tool_call_begin|>",
         "functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Oslo\", \"days\": 2}"
         "<|tool_call_end|><|tool_calls_section_end|>"},
        {"kimi", R"({"type":"function","function":{"name":"get_weather"}})",
         "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
         "<|tool_call_argument_begin|>",
         "{\"city\": \"Oslo\", \"days\": 2}<|tool_call_end|><|tool_calls_section_end|>"},
    };
    size_t index = 0;
    for (const Case& k : cases) {
        for (bool stream : {false, true}) {
            CAPTURE(k.model);
            CAPTURE(k.choice);
            CAPTURE(stream);
            REQUIRE(c->send(testing::http_request(
                                "POST", "/v1/chat/completions",
                                tool_body(k.model, stream,
                                          std::string(",\"tool_choice\":") + k.choice)))
                        .ok());
            REQUIRE(f.generator.wait_for_request(index));
            CHECK(f.generator.request(index).assistant_prefix == k.prefix);
            emit_in_pieces(f.generator, index, k.rest, 5);
            f.generator.finish(index, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
            auto reply = c->read_response();
            REQUIRE(reply.ok());
            REQUIRE(reply->status == 200);
            if (stream) {
                Streamed s = collect(reply->body);
                CHECK(s.content.empty());
                CHECK(s.finish_reason == "tool_calls");
                REQUIRE(s.calls.size() == 1);
                CHECK(s.calls[0].name == "get_weather");
                CHECK(parsed(s.calls[0].arguments) == kWeatherArgs);
            } else {
                json::object body = json_of(reply->body);
                const json::object& choice = body["choices"].as_array()[0].as_object();
                CHECK(choice.at("finish_reason") == "tool_calls");
                CHECK(choice.at("message").as_object().at("content").is_null());
                const json::array& calls =
                    choice.at("message").as_object().at("tool_calls").as_array();
                REQUIRE(calls.size() == 1);
                CHECK(parsed(std::string(calls[0]
                                             .as_object()
                                             .at("function")
                                             .as_object()
                                             .at("arguments")
                                             .as_string())) == kWeatherArgs);
            }
            ++index;
        }
    }
}

TEST_CASE("tools: a Kimi K2 call forced by name is numbered after the conversation's calls") {
    // Its ids number every call of the conversation: a second forced call to get_weather as
    // functions.get_weather:0 gave two tool results the same tool_call_id.
    ToolFixture f;
    auto c = f.client();
    const std::string body =
        R"({"model":"kimi","messages":[{"role":"user","content":"Weather in Oslo?"},)"
        R"({"role":"assistant","content":"","tool_calls":[{"id":"functions.get_weather:0",)"
        R"("type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\"}"}}]},)"
        R"({"role":"tool","tool_call_id":"functions.get_weather:0","content":"rain"},)"
        R"({"role":"user","content":"And in Rome?"}],)" +
        std::string(kTools) +
        R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}}})";
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", body)).ok());
    REQUIRE(f.generator.wait_for_request(0));
    CHECK(f.generator.request(0).assistant_prefix ==
          "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:1"
          "<|tool_call_argument_begin|>");
    f.generator.emit(0, "{\"city\": \"Rome\"}<|tool_call_end|><|tool_calls_section_end|>");
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    auto reply = c->read_response();
    REQUIRE(reply.ok());
    REQUIRE(reply->status == 200);
    const json::object body_out = json_of(reply->body);
    const json::object& message =
        body_out.at("choices").as_array()[0].as_object().at("message").as_object();
    CHECK(message.at("tool_calls").as_array()[0].as_object().at("id") == "functions.get_weather:1");
}

TEST_CASE("tools: a forced call is held, to a strict tool's parameters or to any object") {
    // The engine receives the tool's compiled parameters (any object for a tool that is not
    // strict) and the format's end of a call (SamplingParams::json: schema and tail; for GLM-4.5,
    // whose arguments are key/value pairs, which keys are raw strings) when tool_choice names a
    // tool, and for "required" a head per tool (json_heads); response_format
    // never shapes a forced call; a strict tool whose parameters cannot be followed is refused
    // up front.
    ToolFixture f;
    auto c = f.client();
    const std::string strict_tools =
        R"("tools":[{"type":"function","function":{"name":"get_weather","strict":true,)"
        R"("parameters":{"type":"object","properties":{"city":{"type":"string"},)"
        R"("days":{"type":"integer"}},"required":["city","days"],)"
        R"("additionalProperties":false}}}])";
    auto body = [&](const std::string& model, const std::string& tools, const char* choice,
                    const std::string& extra) {
        return R"({"model":")" + model +
               R"(","messages":[{"role":"user","content":"Weather in Oslo?"}],)" + tools +
               R"(,"tool_choice":)" + choice + extra + "}";
    };
    const char* named = R"({"type":"function","function":{"name":"get_weather"}})";
    const std::string json_object = R"(,"response_format":{"type":"json_object"})";
    struct Case {
        const char* model;
        const char* choice;
        bool strict;
        const char* tail;  // nullptr: no schema reaches the engine.
        const char* head;  // "required": the one head, naming the tool; else nullptr.
    };
    const char* qwen_tail = "}\n</tool_call>";
    const char* kimi_tail = "<|tool_call_end|><|tool_calls_section_end|>";
    const Case cases[] = {
        {"qwen", named, true, qwen_tail, nullptr},
        {"kimi", named, true, kimi_tail, nullptr},
        {"glm", named, true, "</tool_call>", nullptr},  // Key/value pairs.
        {"qwen", named, false, qwen_tail, nullptr},     // Not strict: any object.
        {"qwen", R"("required")", true, qwen_tail, R"({"name": "get_weather", "arguments": )"},
        {"kimi", R"("required")", true, kimi_tail,
         "functions.get_weather:0<|tool_call_argument_begin|>"},
        {"glm", R"("required")", true, "</tool_call>", "get_weather\n"},
        {"qwen", R"("required")", false, qwen_tail, R"({"name": "get_weather", "arguments": )"},
        {"glm", R"("required")", false, "</tool_call>", "get_weather\n"},
        {"kimi", named, false, kimi_tail, nullptr},
        {"qwen", R"("auto")", false, nullptr, nullptr},  // Nothing strict: calls not held.
    };
    // The arguments {"city": "Oslo", "days": 2} as the model writes them, and its first bytes
    // with "days" first (out of the schema's order).
    auto arguments = [](bool pairs) -> std::pair<std::string, std::string> {
        if (pairs) {
            return {
                "<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
                "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n",
                "<arg_key>days"};
        }
        return {R"({"city": "Oslo", "days": 2})", R"({"days")"};
    };
    size_t index = 0;
    for (const Case& k : cases) {
        CAPTURE(k.model);
        CAPTURE(k.choice);
        CAPTURE(k.strict);
        REQUIRE(c->send(testing::http_request(
                            "POST", "/v1/chat/completions",
                            body(k.model, k.strict ? strict_tools : kTools, k.choice, json_object)))
                    .ok());
        REQUIRE(f.generator.wait_for_request(index));
        const engine::SamplingParams& sampling = f.generator.request(index).sampling;
        if (k.head != nullptr) {
            CHECK(sampling.json.schema == nullptr);
            REQUIRE(sampling.json.heads.size() == 1);
            // Kimi K2's call index is the model's to write ("functions.get_weather:0").
            const int32_t number_at = sampling.json.heads[0].number_at;
            CHECK((number_at >= 0) == (std::string_view(k.model) == "kimi"));
            std::string head = sampling.json.heads[0].text;
            if (number_at >= 0) {
                head.insert(static_cast<size_t>(number_at), "0");
            }
            CHECK(head == k.head);
            CHECK(sampling.json.tail == k.tail);
            const bool pairs = sampling.json.heads[0].pairs != nullptr;
            CHECK(pairs == (std::string_view(k.model) == "glm"));
            const auto [args, out_of_order] = arguments(pairs);
            engine::sampling::JsonPrefix call(sampling.json);
            CHECK_FALSE(call.accepts(args));  // The head first,
            CHECK(call.feed(k.head));
            // then the strict parameters; a tool that is not strict takes any object.
            CHECK(call.accepts(out_of_order) == !k.strict);
            if (!pairs) {
                CHECK_FALSE(call.accepts("[1]"));
            }
            CHECK(call.feed(args + sampling.json.tail));
            CHECK(call.complete());
            // Kimi K2's tail closes the section of calls: with parallel calls (the default) the
            // section may instead go on with another call, its index counted up.
            CHECK(sampling.json.next.empty() == (std::string_view(k.model) != "kimi"));
            if (!sampling.json.next.empty()) {
                CHECK(sampling.json.next == "<|tool_call_begin|>");
                CHECK(sampling.json.tail.substr(0, sampling.json.next_at) == "<|tool_call_end|>");
                engine::sampling::JsonPrefix two(sampling.json);
                REQUIRE(two.feed(head + args + "<|tool_call_end|><|tool_call_begin|>"));
                CHECK_FALSE(two.accepts(sampling.json.heads[0].text));  // A number first.
                std::string second = head;
                second.replace(static_cast<size_t>(number_at), 1, "12");
                CHECK(two.feed(second + args));
                CHECK_FALSE(two.complete());
                CHECK(two.feed(sampling.json.tail));
                CHECK(two.complete());
            }
            // Held from the start; with parallel calls (the default), the next opening holds
            // the reply again.
            CHECK(sampling.json.held_at_start);
            CHECK(sampling.json.again);
            CHECK(sampling.json.trigger ==
                  (std::string_view(k.model) == "qwen" ? "<tool_call>\n"
                   : std::string_view(k.model) == "glm"
                       ? "<tool_call>"
                       : "<|tool_calls_section_begin|><|tool_call_begin|>"));
        } else if (k.tail != nullptr) {
            // Named: Qwen's prefix ends at "arguments": and the reply starts with the space its
            // template writes there, then the arguments (one head, held from the start).
            const std::string lead = std::string_view(k.model) == "qwen" ? " " : "";
            std::shared_ptr<const engine::sampling::ArgumentPairs> pairs_of = sampling.json.pairs;
            if (lead.empty()) {
                REQUIRE(sampling.json.schema != nullptr);
                CHECK(sampling.json.heads.empty());
            } else {
                CHECK(sampling.json.schema == nullptr);
                REQUIRE(sampling.json.heads.size() == 1);
                CHECK(sampling.json.heads[0].text == lead);
                CHECK(sampling.json.heads[0].schema != nullptr);
                CHECK(sampling.json.trigger.empty());
                CHECK(sampling.json.from_start());
                pairs_of = sampling.json.heads[0].pairs;
            }
            CHECK(sampling.json.tail == k.tail);
            const bool pairs = pairs_of != nullptr;
            CHECK(pairs == (std::string_view(k.model) == "glm"));
            if (pairs) {
                // "city" is a declared string: its value is raw text.
                CHECK(pairs_of->raw_keys == std::vector<std::string>{"city"});
            }
            const auto [text, out_of_order] = arguments(pairs);
            engine::sampling::JsonPrefix args(sampling.json);
            CHECK(args.feed(lead + text));
            CHECK_FALSE(args.complete());
            CHECK(args.feed(sampling.json.tail));
            CHECK(args.complete());
            CHECK(engine::sampling::JsonPrefix(sampling.json).feed(lead + out_of_order) ==
                  !k.strict);
            if (!pairs) {
                CHECK_FALSE(engine::sampling::JsonPrefix(sampling.json).feed(lead + "[1]"));
            }
            if (!lead.empty()) {
                CHECK_FALSE(engine::sampling::JsonPrefix(sampling.json).accepts(text));
            }
        } else {
            // Only response_format's object holds the content.
            CHECK(sampling.json.heads.empty());
            CHECK(sampling.json.tail.empty());
            CHECK(sampling.json.trigger.empty());
        }
        f.generator.finish(index, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
        auto reply = c->read_response();
        REQUIRE(reply.ok());
        CHECK(reply->status == 200);
        ++index;
    }
    // "auto": the calls the model opens are held from their opening (the trigger) on...
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions",
                                          body("qwen", strict_tools, R"("auto")", "")))
                .ok());
    REQUIRE(f.generator.wait_for_request(index));
    {
        const engine::SamplingParams& sampling = f.generator.request(index).sampling;
        CHECK(sampling.json.schema == nullptr);
        REQUIRE(sampling.json.heads.size() == 1);
        CHECK(sampling.json.heads[0].text == R"({"name": "get_weather", "arguments": )");
        CHECK(sampling.json.tail == qwen_tail);
        CHECK(sampling.json.trigger == "<tool_call>\n");
        CHECK_FALSE(sampling.json.held_at_start);
        CHECK(sampling.json.again);
    }
    f.generator.finish(index++, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    REQUIRE(c->read_response().ok());
    // parallel_tool_calls false: the reply is one call, held even without a strict tool (any
    // object as its arguments), and ends with the call's end.
    for (const char* choice : {R"("required")", R"("auto")"}) {
        CAPTURE(choice);
        REQUIRE(c->send(testing::http_request(
                            "POST", "/v1/chat/completions",
                            body("qwen", kTools, choice, R"(,"parallel_tool_calls":false)")))
                    .ok());
        REQUIRE(f.generator.wait_for_request(index));
        const engine::SamplingParams& sampling = f.generator.request(index).sampling;
        REQUIRE(sampling.json.heads.size() == 1);
        REQUIRE(sampling.json.heads[0].schema != nullptr);
        CHECK(sampling.json.heads[0].schema->compact());  // As a schema's, not json_object's.
        CHECK(engine::sampling::JsonPrefix(*sampling.json.heads[0].schema)
                  .feed(R"({"any": [1, {"key": null}]})"));
        CHECK(sampling.json.tail == qwen_tail);
        CHECK(sampling.json.trigger == "<tool_call>\n");
        CHECK(sampling.json.held_at_start == (std::string_view(choice) == R"("required")"));
        CHECK_FALSE(sampling.json.again);
        f.generator.finish(index++, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
        REQUIRE(c->read_response().ok());
    }
    // The same for GLM-4.5: its key/value pairs held as any object, declared strings raw.
    REQUIRE(c->send(testing::http_request(
                        "POST", "/v1/chat/completions",
                        body("glm", kTools, R"("auto")", R"(,"parallel_tool_calls":false)")))
                .ok());
    REQUIRE(f.generator.wait_for_request(index));
    {
        const engine::SamplingParams& sampling = f.generator.request(index).sampling;
        REQUIRE(sampling.json.heads.size() == 1);
        REQUIRE(sampling.json.heads[0].pairs != nullptr);
        CHECK(sampling.json.heads[0].pairs->raw_keys == std::vector<std::string>{"city"});
        CHECK(sampling.json.tail == "</tool_call>");
        CHECK(sampling.json.trigger == "<tool_call>");
        engine::sampling::JsonPrefix call(sampling.json);
        CHECK(
            call.feed("get_weather\n<arg_key>city</arg_key>\n<arg_value>[1]</arg_value>\n"
                      "<arg_key>any</arg_key>\n<arg_value>[1]</arg_value>\n</tool_call>"));
        CHECK(call.complete());
    }
    f.generator.finish(index++, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    REQUIRE(c->read_response().ok());
    // ...unless response_format shapes the content, which then has no call.
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions",
                                          body("qwen", strict_tools, R"("auto")", json_object)))
                .ok());
    REQUIRE(f.generator.wait_for_request(index));
    CHECK(f.generator.request(index).sampling.json.schema != nullptr);
    CHECK(f.generator.request(index).sampling.json.tail.empty());
    CHECK(f.generator.request(index).sampling.json.heads.empty());
    f.generator.finish(index, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    REQUIRE(c->read_response().ok());

    const std::string unfollowable =
        R"("tools":[{"type":"function","function":{"name":"f","strict":true,)"
        R"("parameters":{"type":"object","properties":{"s":{"type":"string",)"
        R"("pattern":"^a"}}}}}])";
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions",
                                          body("qwen", unfollowable, R"("auto")", "")))
                .ok());
    auto reply = c->read_response();
    REQUIRE(reply.ok());
    CHECK(reply->status == 400);
    json::object error = json_of(reply->body)["error"].as_object();
    CHECK(error.at("param") == "tools[0].function.parameters");
    CHECK(std::string(error.at("message").as_string()).find("pattern") != std::string::npos);
}

TEST_CASE("tools: a malformed call comes back as content with finish_reason malformed_tool_call") {
    ToolFixture f;
    auto c = f.client();
    const std::string bad =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
        "</tool_cal>oops";
    // Non-streaming: no tool_calls, the text verbatim.
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", tool_body("qwen", false)))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    emit_in_pieces(f.generator, 0, bad, 4);
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    auto reply = c->read_response();
    REQUIRE(reply.ok());
    json::object body = json_of(reply->body);
    const json::object& choice = body["choices"].as_array()[0].as_object();
    CHECK(choice.at("finish_reason") == "malformed_tool_call");
    CHECK(choice.at("message").as_object().at("content").as_string() == std::string_view(bad));
    CHECK_FALSE(choice.at("message").as_object().contains("tool_calls"));

    // Streaming: the call had started, so the client is told which index to drop.
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", tool_body("qwen", true)))
                .ok());
    REQUIRE(f.generator.wait_for_request(1));
    emit_in_pieces(f.generator, 1, bad, 4);
    f.generator.finish(1, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    reply = c->read_response();
    REQUIRE(reply.ok());
    Streamed s = collect(reply->body);
    CHECK(s.finish_reason == "malformed_tool_call");
    CHECK(s.content == bad);
    REQUIRE(s.abandoned.is_array());
    CHECK(s.abandoned.as_array().size() == 1);
    CHECK(s.abandoned.as_array()[0] == 0);

    // The output ends inside a call: content, and the engine's reason when it was cut off.
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", tool_body("kimi", false)))
                .ok());
    REQUIRE(f.generator.wait_for_request(2));
    const std::string cut =
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        "<|tool_call_argument_begin|>{\"city\": \"Os";
    f.generator.emit(2, cut);
    f.generator.finish(2, engine::FinishReason::kLength, engine::Usage{1, 1, 0});
    reply = c->read_response();
    REQUIRE(reply.ok());
    body = json_of(reply->body);
    const json::object& cut_choice = body["choices"].as_array()[0].as_object();
    CHECK(cut_choice.at("finish_reason") == "length");
    CHECK(cut_choice.at("message").as_object().at("content").as_string() == std::string_view(cut));

    // A forced call that the model's first token already breaks: its header is never streamed,
    // so a client that accumulates deltas ends with the non-streamed answer (no tool_calls).
    REQUIRE(c->send(testing::http_request(
                        "POST", "/v1/chat/completions",
                        tool_body("qwen", true,
                                  R"(,"tool_choice":{"type":"function","function":)"
                                  R"({"name":"get_weather"}})")))
                .ok());
    REQUIRE(f.generator.wait_for_request(3));
    f.generator.emit(3, " > nonsense");
    f.generator.finish(3, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    reply = c->read_response();
    REQUIRE(reply.ok());
    s = collect(reply->body);
    CHECK(s.finish_reason == "malformed_tool_call");
    CHECK(s.calls.empty());
    CHECK_FALSE(s.abandoned.is_array());
    CHECK(s.content == "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": > nonsense");
}

TEST_CASE("tools: none is not offered and a model without a tool format refuses tools") {
    ToolFixture f;
    auto c = f.client();
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions",
                                          tool_body("qwen", false, R"(,"tool_choice":"none")")))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    CHECK(f.generator.request(0).tools.empty());
    const std::string text = "<tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call>";
    f.generator.emit(0, text);
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    auto reply = c->read_response();
    REQUIRE(reply.ok());
    json::object body = json_of(reply->body);
    const json::object& choice = body["choices"].as_array()[0].as_object();
    CHECK(choice.at("finish_reason") == "stop");
    CHECK(choice.at("message").as_object().at("content").as_string() == std::string_view(text));

    REQUIRE(
        c->send(testing::http_request("POST", "/v1/chat/completions", tool_body("plain", false)))
            .ok());
    reply = c->read_response();
    REQUIRE(reply.ok());
    CHECK(reply->status == 400);
    json::object error = json_of(reply->body)["error"].as_object();
    CHECK(error.at("param") == "tools");
}

TEST_CASE("tools: several calls in one reply keep their order and indexes") {
    ToolFixture f;
    auto c = f.client();
    const std::string two =
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        "<|tool_call_argument_begin|>{\"city\": \"Oslo\"}<|tool_call_end|>"
        "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\": "
        "\"Rome\"}<|tool_call_end|><|tool_calls_section_end|>";
    REQUIRE(c->send(testing::http_request("POST", "/v1/chat/completions", tool_body("kimi", true)))
                .ok());
    REQUIRE(f.generator.wait_for_request(0));
    emit_in_pieces(f.generator, 0, two, 2);
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    auto reply = c->read_response();
    REQUIRE(reply.ok());
    Streamed s = collect(reply->body);
    REQUIRE(s.calls.size() == 2);
    CHECK(s.calls[0].id == "functions.get_weather:0");
    CHECK(s.calls[1].id == "functions.get_weather:1");
    CHECK(parsed(s.calls[1].arguments) == json::parse(R"({"city": "Rome"})"));
    CHECK(s.finish_reason == "tool_calls");
}

TEST_CASE("tools: a forced call the model writes nothing of is an empty reply, not the prefix") {
    // The forced prefix is the server's, put in the prompt: a model that ends at once never
    // wrote it, and the client must not get it back as content (as a malformed call).
    ToolFixture f;
    auto c = f.client();
    struct Case {
        const char* model;
        const char* choice;
    };
    const Case cases[] = {
        {"qwen", R"("required")"},
        {"qwen", R"({"type":"function","function":{"name":"get_weather"}})"},
        {"glm", R"("required")"},
        {"kimi", R"({"type":"function","function":{"name":"get_weather"}})"},
    };
    size_t index = 0;
    for (const Case& k : cases) {
        for (engine::FinishReason reason :
             {engine::FinishReason::kStop, engine::FinishReason::kLength}) {
            for (bool stream : {false, true}) {
                CAPTURE(k.model);
                CAPTURE(k.choice);
                CAPTURE(stream);
                const bool stop = reason == engine::FinishReason::kStop;
                CAPTURE(stop);
                REQUIRE(c->send(testing::http_request(
                                    "POST", "/v1/chat/completions",
                                    tool_body(k.model, stream,
                                              std::string(",\"tool_choice\":") + k.choice)))
                            .ok());
                REQUIRE(f.generator.wait_for_request(index));
                REQUIRE_FALSE(f.generator.request(index).assistant_prefix.empty());
                if (stop) {
                    f.generator.emit(index, "");  // The end of sequence's delta: no text.
                }
                f.generator.finish(index, reason, engine::Usage{1, 1, 0});
                auto reply = c->read_response();
                REQUIRE(reply.ok());
                REQUIRE(reply->status == 200);
                const std::string_view expected = stop ? "stop" : "length";
                if (stream) {
                    Streamed s = collect(reply->body);
                    CHECK(s.content.empty());
                    CHECK(s.calls.empty());
                    CHECK(s.finish_reason == expected);
                    CHECK_FALSE(s.abandoned.is_array());
                } else {
                    json::object body = json_of(reply->body);
                    const json::object& choice = body["choices"].as_array()[0].as_object();
                    CHECK(choice.at("finish_reason").as_string() == expected);
                    const json::object& message = choice.at("message").as_object();
                    CHECK(message.at("content") == "");
                    CHECK_FALSE(message.contains("tool_calls"));
                }
                ++index;
            }
        }
    }
}
