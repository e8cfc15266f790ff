#include "daemon/api/openai_request.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/json_text.h"
#include "common/log.h"
#include "engine/sampling/json_prefix.h"
#include "engine/sampling/sampler.h"

using namespace edge;
using namespace edge::daemon::api;

namespace {

ApiError error_of(Endpoint e, const std::string& body) {
    auto r = parse_openai_request(e, body);
    REQUIRE(std::holds_alternative<ApiError>(r));
    return std::get<ApiError>(r);
}

ParsedRequest parse(Endpoint e, const std::string& body) {
    auto r = parse_openai_request(e, body);
    if (auto* err = std::get_if<ApiError>(&r)) {
        FAIL("unexpected error: " << err->message);
    }
    return std::get<ParsedRequest>(r);
}

}  // namespace

TEST_CASE("a full chat request maps onto GenerateRequest") {
    ParsedRequest p = parse(Endpoint::kChatCompletions, R"({
        "model": "m", "stream": true, "stream_options": {"include_usage": true},
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}], "name": "bob"},
            {"role": "assistant", "content": null, "reasoning_content": "thought"}
        ],
        "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7, "max_completion_tokens": 12,
        "stop": ["\n\n"], "presence_penalty": 0.1, "frequency_penalty": -0.2,
        "logprobs": true, "top_logprobs": 3, "n": 1, "user": "u", "tools": [], "tool_choice": "none",
        "response_format": {"type": "text"}, "logit_bias": {}, "parallel_tool_calls": false
    })");
    CHECK(p.stream);
    CHECK(p.include_usage);
    const auto& g = p.generate;
    CHECK(g.model == "m");
    const auto& msgs = std::get<std::vector<engine::ChatMessage>>(g.prompt);
    REQUIRE(msgs.size() == 3);
    CHECK(msgs[0].role == "system");
    CHECK(msgs[1].content == "hi \nthere");  // parts are joined by a newline, as vLLM does
    CHECK(msgs[1].name == "bob");
    CHECK(msgs[2].reasoning_content == std::optional<std::string>("thought"));
    CHECK_FALSE(msgs[1].reasoning_content);
    CHECK(g.sampling.temperature == doctest::Approx(0.5));
    CHECK(g.sampling.top_k == 40);
    CHECK(*g.sampling.seed == 7);
    CHECK(g.sampling.max_tokens == 12);
    CHECK(g.sampling.stop == std::vector<std::string>{"\n\n"});
    CHECK(g.sampling.logprobs);
    CHECK(g.sampling.top_logprobs == 3);
    CHECK_FALSE(p.parallel_tool_calls);
}

TEST_CASE("an assistant's refusal parts come back as its text, other roles have none") {
    // OpenAI answers a refused request with message.refusal, and its clients send such a
    // conversation back with the assistant's content as text and refusal parts.
    ParsedRequest p = parse(Endpoint::kChatCompletions, R"({"model": "m", "messages": [
        {"role": "user", "content": "help"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."},
                                          {"type": "text", "text": "Ask another way."}],
         "refusal": "I can't."},
        {"role": "user", "content": "why?"}]})");
    const auto& msgs = std::get<std::vector<engine::ChatMessage>>(p.generate.prompt);
    REQUIRE(msgs.size() == 3);
    CHECK(msgs[1].content == "I can't.\nAsk another way.");
    // As OpenAI's Python client sends its reply back: a null content and the refusal's text.
    ParsedRequest echoed = parse(Endpoint::kChatCompletions, R"({"model": "m", "messages": [
        {"role": "user", "content": "help"},
        {"role": "assistant", "content": null, "refusal": "I can't help with that."},
        {"role": "assistant", "refusal": "No."},
        {"role": "user", "content": "why?", "refusal": null}]})");
    const auto& turns = std::get<std::vector<engine::ChatMessage>>(echoed.generate.prompt);
    REQUIRE(turns.size() == 4);
    CHECK(turns[1].content == "I can't help with that.");
    CHECK(turns[2].content == "No.");
    CHECK(turns[3].content == "why?");
    ApiError user =
        error_of(Endpoint::kChatCompletions, R"({"model":"m","messages":[{"role":"user","content":)"
                                             R"([{"type":"refusal","refusal":"no"}]}]})");
    CHECK(user.param == "messages[0].content[0].type");
    CHECK(user.message == "content part type 'refusal' is not supported (text)");
    ApiError missing = error_of(Endpoint::kChatCompletions,
                                R"({"model":"m","messages":[{"role":"assistant","content":)"
                                R"([{"type":"refusal","text":"no"}]}]})");
    CHECK(missing.param == "messages[0].content[0].text");  // A refusal's text is `refusal`.
    CHECK(error_of(Endpoint::kChatCompletions,
                   R"({"model":"m","messages":[{"role":"assistant","content":)"
                   R"([{"type":"refusal"}]}]})")
              .param == "messages[0].content[0].refusal");
}

TEST_CASE("a top_p too small for a float keeps the most likely token instead of failing") {
    auto p = parse(Endpoint::kCompletions, R"({"model":"m","prompt":"abc","top_p":1e-300})");
    CHECK(p.generate.sampling.top_p > 0.0f);
    CHECK(p.generate.sampling.top_p < 1e-30f);
}

TEST_CASE("top_p 0 is taken, as OpenAI takes it: the most likely token only") {
    // OpenAI accepts [0, 1]; 0 becomes the smallest positive float, whose nucleus is one token.
    for (const char* zero : {"0", "0.0"}) {
        auto p = parse(Endpoint::kChatCompletions,
                       std::string(R"({"model":"m","messages":[{"role":"user","content":"x"}],)") +
                           R"("top_p":)" + zero + "}");
        CHECK(p.generate.sampling.top_p > 0.0f);
        CHECK(p.generate.sampling.top_p < 1e-30f);
        CHECK(p.top_p_set);
        CHECK(engine::sampling::validate_sampling_params(p.generate.sampling).ok());
    }
}

TEST_CASE("a lone UTF-16 surrogate escape reads as U+FFFD, as Python reads JSON, pairs unchanged") {
    auto content = [](const std::string& text) {
        const std::string body =
            R"({"model":"m","messages":[{"role":"user","content":")" + text + R"("}]})";
        const ParsedRequest p = parse(Endpoint::kChatCompletions, body);
        return std::get<std::vector<engine::ChatMessage>>(p.generate.prompt)[0].content;
    };
    CHECK(content(R"(a\ud800b)") == "a\xEF\xBF\xBD" "b");
    CHECK(content(R"(\udc00)") == "\xEF\xBF\xBD");
    CHECK(content(R"(\ud83d\ude00 \ud83d)") == "\xF0\x9F\x98\x80 \xEF\xBF\xBD");
    CHECK(content(R"(\\ud800 \"\ud800)") == "\\ud800 \"\xEF\xBF\xBD");
    // Not JSON for another reason: still refused as such.
    CHECK(error_of(Endpoint::kChatCompletions, R"({"model":"m","x":"\ud800",})").message ==
          "the request body is not valid JSON at line 1, column 27: syntax error");
}

TEST_CASE("modalities text, prompt_cache_key and safety_identifier are accepted, others refused") {
    const std::string head = R"({"model":"m","messages":[{"role":"user","content":"x"}],)";
    parse(Endpoint::kChatCompletions, head + R"("modalities":["text"]})");
    parse(Endpoint::kChatCompletions, head + R"("prompt_cache_key":"k","safety_identifier":"u"})");
    CHECK(error_of(Endpoint::kChatCompletions, head + R"("modalities":["text","audio"]})").param ==
          "modalities");
    CHECK(error_of(Endpoint::kChatCompletions, head + R"("prompt_cache_key":5})").param ==
          "prompt_cache_key");
    CHECK(parse(Endpoint::kChatCompletions, head + R"("parallel_tool_calls":null})")
              .parallel_tool_calls);
    CHECK(error_of(Endpoint::kChatCompletions, head + R"("parallel_tool_calls":"no"})").param ==
          "parallel_tool_calls");
}

TEST_CASE("completions accept a string, token ids or a list of prompts") {
    auto p = parse(Endpoint::kCompletions, R"({"model":"m","prompt":"abc","logprobs":2})");
    CHECK(std::get<std::string>(p.generate.prompt) == "abc");
    CHECK(p.generate.sampling.max_tokens == 16);
    CHECK(p.generate.sampling.top_logprobs == 2);
    auto ids = parse(Endpoint::kCompletions, R"({"model":"m","prompt":[1,2,3]})");
    CHECK(std::get<std::vector<engine::TokenId>>(ids.generate.prompt).size() == 3);
    CHECK(parse(Endpoint::kCompletions, R"({"model":"m","prompt":["a","b"]})").prompts() == 2);
    CHECK(error_of(Endpoint::kCompletions, R"({"model":"m","prompt":[1,-2]})").param ==
          "prompt[1]");
    // One prompt of token ids in a list of prompts, as lm-evaluation-harness sends them.
    auto nested = parse(Endpoint::kCompletions, R"({"model":"m","prompt":[[40,1079,2]]})");
    CHECK(std::get<std::vector<engine::TokenId>>(nested.generate.prompt) ==
          std::vector<engine::TokenId>{40, 1079, 2});
    // A list of prompts (batch_prompts_api_test.cc has its cases).
    CHECK(parse(Endpoint::kCompletions, R"({"model":"m","prompt":[[1],[2]]})").prompts() == 2);
    CHECK(error_of(Endpoint::kCompletions, R"({"model":"m","prompt":[[]]})").message ==
          "'prompt[0]' is an empty list of token ids");
    CHECK(error_of(Endpoint::kCompletions, R"({"model":"m","prompt":[["a"]]})").param ==
          "prompt[0][0]");
    CHECK(error_of(Endpoint::kCompletions, R"({"model":"m","prompt":[[1,-2]]})").param ==
          "prompt[0][1]");
}

TEST_CASE("invalid JSON and wrong types give 400 with the param") {
    ApiError bad = error_of(Endpoint::kChatCompletions, "{not json");
    CHECK(bad.status == 400);
    CHECK(bad.message == "the request body is not valid JSON at line 1, column 2: syntax error");
    // Where, on a later line; and nesting past kMaxJsonDepth says so.
    CHECK(error_of(Endpoint::kChatCompletions, "{\"model\": \"m\",\n  \"n\": 1,,}").message ==
          "the request body is not valid JSON at line 2, column 10: syntax error");
    const std::string deep = R"({"model":"m","x":)" + std::string(kMaxJsonDepth, '[');
    CHECK(error_of(Endpoint::kChatCompletions, deep).message ==
          "the request body is not valid JSON at line 1, column " +
              std::to_string(17 + kMaxJsonDepth) +
              ": too deep (more than 64 nested arrays and objects)");
    CHECK(error_of(Endpoint::kChatCompletions, R"({"model":"m")")
              .message.find("line 1, column 13: incomplete JSON") != std::string::npos);
    CHECK_FALSE(bad.param.has_value());
    CHECK(error_of(Endpoint::kChatCompletions, "[1]").message.find("JSON object") !=
          std::string::npos);
    struct Case {
        const char* body;
        const char* param;
    };
    for (
        Case c : std::initializer_list<Case>{
            {R"({"messages":[{"role":"user","content":"x"}]})", "model"},
            {R"({"model":"m"})", "messages"},
            {R"({"model":5,"messages":[]})", "model"},
            {R"({"model":"m","messages":[]})", "messages"},
            {R"({"model":"m","messages":"hi"})", "messages"},
            {R"({"model":"m","messages":[{"role":"king","content":"x"}]})", "messages[0].role"},
            {R"({"model":"m","messages":[{"content":"x"}]})", "messages[0].role"},
            {R"({"model":"m","messages":[{"role":"user"}]})", "messages[0].content"},
            {R"({"model":"m","messages":[{"role":"user","content":5}]})", "messages[0].content"},
            {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
             "messages[0].content[0].type"},
            {R"({"model":"m","messages":[{"role":"tool","content":"rain"}]})",
             "messages[0].tool_call_id"},
            {R"({"model":"m","messages":[{"role":"tool","content":"x","tool_call_id":null}]})",
             "messages[0].tool_call_id"},
            {R"({"model":"m","messages":[{"role":"user","content":"x","extra":1}]})",
             "messages[0].extra"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"})",
             "temperature"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":3})",
             "temperature"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_p":-0.1})", "top_p"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_p":1.5})", "top_p"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0})",
             "max_tokens"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.5})",
             "max_tokens"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"})",
             "stream"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":[1]})", "stop[0]"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]})",
             "stop"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":17})", "n"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"x":1}})",
             "logit_bias"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"-1":1}})",
             "logit_bias"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"7":101}})",
             "logit_bias.7"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":[1]})",
             "logit_bias"},
            // One token under two spellings: the sampler would add both biases.
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"7":100,"007":100}})",
             "logit_bias.007"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{}]})",
             "tools[0].type"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":{}})", "tools"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"code"}]})",
             "tools[0].type"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]})",
             "tools[0].function.name"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]})",
             "tools[0].function.parameters"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]})",
             "tools[1].function.name"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","x":1}}]})",
             "tools[0].function.x"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required"})",
             "tool_choice"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"maybe","tools":[{"type":"function","function":{"name":"f"}}]})",
             "tool_choice"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"g"}},"tools":[{"type":"function","function":{"name":"f"}}]})",
             "tool_choice.function.name"},
            {R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f"}}]}]})",
             "messages[0].tool_calls[0].function.arguments"},
            {R"({"model":"m","messages":[{"role":"user","content":"x","tool_calls":[{}]}]})",
             "messages[0].tool_calls"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}})",
             "stream_options"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"x":1}})",
             "stream_options.x"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":30,"logprobs":true})",
             "top_logprobs"},
            {R"({"model":"m","messages":[{"role":"user","content":"x"}],"wat":1})", "wat"},
        }) {
        CAPTURE(c.body);
        ApiError e = error_of(Endpoint::kChatCompletions, c.body);
        CHECK(e.status == 400);
        CHECK(e.type == "invalid_request_error");
        REQUIRE(e.param.has_value());
        CHECK(*e.param == c.param);
    }
}

TEST_CASE("stream_options of any content are refused without stream, null is absent") {
    // OpenAI refuses them whatever they ask; include_usage false and {} used to pass.
    for (const char* options :
         {R"({"include_usage":true})", R"({"include_usage":false})", R"({})",
          R"({"include_obfuscation":true})", R"({"continuous_usage_stats":true})"}) {
        for (const char* stream : {"", R"("stream":false,)", R"("stream":null,)"}) {
            CAPTURE(options);
            CAPTURE(stream);
            const std::string rest = std::string(stream) + R"("stream_options":)" + options + "}";
            ApiError chat =
                error_of(Endpoint::kChatCompletions,
                         R"({"model":"m","messages":[{"role":"user","content":"x"}],)" + rest);
            CHECK(chat.status == 400);
            CHECK(chat.param == "stream_options");
            CHECK(error_of(Endpoint::kCompletions, R"({"model":"m","prompt":"x",)" + rest).param ==
                  "stream_options");
        }
        // With a stream, whichever comes first.
        CHECK(parse(Endpoint::kCompletions, std::string(R"({"model":"m","prompt":"x",)") +
                                                R"("stream_options":)" + options +
                                                R"(,"stream":true})")
                  .stream);
    }
    for (const char* stream : {"", R"(,"stream":false)"}) {
        ParsedRequest p = parse(Endpoint::kChatCompletions,
                                std::string(R"({"model":"m","messages":[{"role":"user",)") +
                                    R"("content":"x"}],"stream_options":null)" + stream + "}");
        CHECK_FALSE(p.stream);
        CHECK_FALSE(p.include_usage);
    }
}

TEST_CASE("chat_template_kwargs: the thinking switch is read, other keys are refused by name") {
    auto off = parse(Endpoint::kChatCompletions,
                     R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                     R"("chat_template_kwargs":{"enable_thinking":false}})");
    CHECK(off.generate.thinking == std::optional<bool>(false));
    auto on = parse(Endpoint::kChatCompletions,
                    R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                    R"("chat_template_kwargs":{"thinking":true}})");
    CHECK(on.generate.thinking == std::optional<bool>(true));
    CHECK_FALSE(parse(Endpoint::kChatCompletions,
                      R"({"model":"m","messages":[{"role":"user","content":"x"}]})")
                    .generate.thinking.has_value());
    ApiError other = error_of(Endpoint::kChatCompletions,
                              R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                              R"("chat_template_kwargs":{"tools_in_user_message":true}})");
    CHECK(other.param == "chat_template_kwargs.tools_in_user_message");
    CHECK(other.message.find("not supported") != std::string::npos);
    CHECK(error_of(Endpoint::kChatCompletions,
                   R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                   R"("chat_template_kwargs":{"enable_thinking":"no"}})")
              .param == "chat_template_kwargs.enable_thinking");
    // Both names of the switch: agreeing is fine, disagreeing is refused.
    auto both = parse(Endpoint::kChatCompletions,
                      R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                      R"("chat_template_kwargs":{"enable_thinking":true,"thinking":true}})");
    CHECK(both.generate.thinking == std::optional<bool>(true));
    ApiError disagree = error_of(Endpoint::kChatCompletions,
                                 R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                                 R"("chat_template_kwargs":{"enable_thinking":false,)"
                                 R"("thinking":true}})");
    CHECK(disagree.message.find("disagree") != std::string::npos);
    // Null is unset, as for every other field (clients that always send the key).
    CHECK_FALSE(parse(Endpoint::kChatCompletions,
                      R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                      R"("chat_template_kwargs":null})")
                    .generate.thinking.has_value());
}

TEST_CASE("logit_bias is parsed, and optional fields take null as their default") {
    auto p = parse(Endpoint::kCompletions,
                   R"({"model":"m","prompt":"x","logit_bias":{"50256":-100,"7":2.5},"n":null,)"
                   R"("best_of":null,"echo":null,"ignore_eos":null})");
    const auto& bias = p.generate.sampling.logit_bias;
    REQUIRE(bias.size() == 2);
    CHECK(bias[0] == std::pair<engine::TokenId, float>{50256, -100.0f});
    CHECK(bias[1] == std::pair<engine::TokenId, float>{7, 2.5f});
    CHECK_FALSE(p.generate.sampling.ignore_eos);
    // A key that is no token id is quoted in the error, at most 64 bytes of it and cut on a
    // character boundary: a cut inside "é" made the error body invalid UTF-8.
    std::string key = "a";
    for (int i = 0; i < 40; ++i) {
        key += "\xC3\xA9";  // é
    }
    ApiError long_key = error_of(Endpoint::kCompletions,
                                 R"({"model":"m","prompt":"x","logit_bias":{")" + key + R"(":1}})");
    std::string quoted = "a";
    for (int i = 0; i < 31; ++i) {
        quoted += "\xC3\xA9";
    }
    CHECK(long_key.message == "'logit_bias' key '" + quoted + "' is not a token id");
}

TEST_CASE("top_k: -1 is vLLM's off, as 0 is, below that is refused") {
    CHECK(parse(Endpoint::kCompletions, R"({"model":"m","prompt":"x","top_k":-1})")
              .generate.sampling.top_k == 0);
    CHECK(error_of(Endpoint::kCompletions, R"({"model":"m","prompt":"x","top_k":-2})")
              .param == "top_k");
}

TEST_CASE("stop: empty or over 256 bytes is refused, named as sent, and integers beyond 64 bits "
          "are out of range") {
    const std::string head = R"({"model":"m","prompt":"x",)";
    ApiError one = error_of(Endpoint::kCompletions, head + R"("stop":""})");
    CHECK(one.param == "stop");
    CHECK(one.message == "'stop' must not be empty");
    ApiError second = error_of(Endpoint::kCompletions, head + R"("stop":["a",""]})");
    CHECK(second.param == "stop[1]");
    CHECK(second.message == "'stop[1]' must not be empty");
    ApiError long_stop =
        error_of(Endpoint::kCompletions, head + R"("stop":")" + std::string(257, 'x') + "\"}");
    CHECK(long_stop.message == "'stop' is longer than 256 bytes");
    CHECK(parse(Endpoint::kCompletions, head + R"("stop":")" + std::string(256, 'x') + "\"}")
              .generate.sampling.stop.size() == 1);
    for (const char* n : {"18446744073709551616", "1e30", "-99999999999999999999999"}) {
        CAPTURE(n);
        ApiError big = error_of(Endpoint::kCompletions, head + R"("seed":)" + n + "}");
        CHECK(big.message == "'seed' is outside the 64-bit integer range");
    }
    CHECK(parse(Endpoint::kCompletions, head + R"("seed":1e16})").generate.sampling.seed ==
          uint64_t{10000000000000000});
    CHECK(error_of(Endpoint::kCompletions, head + R"("seed":1.5})").message ==
          "'seed' must be an integer");
}

TEST_CASE("a tool of another type is refused for its type, not for its type's fields") {
    ApiError e = error_of(Endpoint::kChatCompletions,
                          R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                          R"("tools":[{"type":"custom","custom":{"name":"f"}}]})");
    CHECK(e.param == "tools[0].type");
    CHECK(e.message == "'tools[0].type' must be \"function\"");
}

TEST_CASE(
    "response_format: text, json_object and json_schema, other types and extra keys are "
    "refused") {
    const std::string head = R"({"model":"m","messages":[{"role":"user","content":"x"}],)";
    CHECK_FALSE(parse(Endpoint::kChatCompletions, head + R"("response_format":{"type":"text"}})")
                    .generate.sampling.json.schema);
    ApiError extra =
        error_of(Endpoint::kChatCompletions, head + R"("response_format":{"type":"text","x":1}})");
    CHECK(extra.param == "response_format");
    CHECK(extra.message.find("response_format.x") != std::string::npos);
    CHECK(parse(Endpoint::kChatCompletions, head + R"("response_format":{"type":"json_object"}})")
              .generate.sampling.json.schema == engine::sampling::JsonSchema::any_object());
    CHECK(parse(Endpoint::kCompletions,
                R"({"model":"m","prompt":"x","response_format":{"type":"json_object"}})")
              .generate.sampling.json.schema == engine::sampling::JsonSchema::any_object());
    ApiError other =
        error_of(Endpoint::kChatCompletions, head + R"("response_format":{"type":"xml"}})");
    CHECK(other.param == "response_format");

    // json_schema: the schema is compiled with the request.
    const std::string schema =
        R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],)"
        R"("additionalProperties":false})";
    const auto parsed = parse(Endpoint::kChatCompletions,
                              head +
                                  R"("response_format":{"type":"json_schema","json_schema":)"
                                  R"({"name":"thing","strict":true,"schema":)" +
                                  schema + "}}}");
    REQUIRE(parsed.generate.sampling.json.schema);
    CHECK(parsed.generate.sampling.json.schema != engine::sampling::JsonSchema::any_object());
    // What is wrong with it, said: missing parts, a bad name, an unsupported keyword with its
    // place in the schema, an unknown field.
    const std::vector<std::pair<std::string, std::string>> bad = {
        {R"({"type":"json_schema"})", "'response_format.json_schema' must be an object"},
        {R"({"type":"json_schema","json_schema":{"schema":{"type":"object"}}})",
         "'response_format.json_schema.name' must be"},
        {R"({"type":"json_schema","json_schema":{"name":"a b","schema":{"type":"object"}}})",
         "'response_format.json_schema.name' must be"},
        {R"({"type":"json_schema","json_schema":{"name":"n"}})",
         "'response_format.json_schema.schema' must be a JSON Schema object"},
        {R"({"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object",)"
         R"("properties":{"age":{"type":"integer","multipleOf":2}}}}})",
         "schema at '#/properties/age': 'multipleOf' is not supported"},
        {R"({"type":"json_schema","json_schema":{"name":"n","schema":{"type":"array"}}})",
         "the root must be an object"},
        {R"({"type":"json_schema","json_schema":{"name":"n","strict":1,)"
         R"("schema":{"type":"object"}}})",
         "'response_format.json_schema.strict' must be"},
        {R"({"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object"},"x":1}})",
         "unrecognized field 'response_format.json_schema.x'"},
        {R"({"type":"json_object","json_schema":{}})",
         "unrecognized field 'response_format.json_schema'"},
    };
    for (const auto& [format, message] : bad) {
        CAPTURE(format);
        ApiError e =
            error_of(Endpoint::kChatCompletions, head + R"("response_format":)" + format + "}");
        CHECK(e.message.find(message) != std::string::npos);
        CHECK(e.param.value_or("").rfind("response_format", 0) == 0);
    }
}

TEST_CASE("deeply nested JSON is refused, not recursed into") {
    std::string deep(10000, '[');
    CHECK(error_of(Endpoint::kChatCompletions, deep).status == 400);
}

TEST_CASE("submit() status codes map to OpenAI errors") {
    CHECK(api_error_from_status(not_found_error("x"), "m").code == "model_not_found");
    CHECK(api_error_from_status(not_found_error("x"), "m").status == 404);
    ApiError inv = api_error_from_status(invalid_argument_error("max_tokens: too many"), "m");
    CHECK(inv.status == 400);
    CHECK(inv.param == "max_tokens");
    CHECK(inv.message == "max_tokens: too many");
    ApiError indexed = api_error_from_status(invalid_argument_error("prompt[3]: out of range"), "m");
    CHECK(indexed.param == "prompt[3]");
    ApiError prose = api_error_from_status(invalid_argument_error("bad thing: x y"), "m");
    CHECK_FALSE(prose.param.has_value());
    ApiError busy = api_error_from_status(resource_exhausted_error("queue full"), "m");
    CHECK(busy.status == 429);
    CHECK(busy.to_response().headers.at(0).name == "Retry-After");
    CHECK(api_error_from_status(unavailable_error("x"), "m").status == 503);
    // An internal error's cause is logged (at error level), not answered.
    std::vector<std::string> lines;
    log::set_sink([&](std::string_view line) { lines.emplace_back(line); });
    CHECK(api_error_from_status(internal_error("secret detail"), "m").message == "internal error");
    log::set_sink(nullptr);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find(R"("level":"error","event":"internal_error")") != std::string::npos);
    CHECK(lines[0].find(R"("message":"secret detail")") != std::string::npos);
}

TEST_CASE("tools and tool_choice and tool history are parsed") {
    const char* body = R"({"model":"m","messages":[
        {"role":"user","content":"weather?"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
            "function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\"}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":"rain"}],
        "tools":[{"type":"function","function":{"name":"get_weather","description":"Weather.",
            "parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":false}},
            {"type":"function","function":{"name":"get-time"}}],
        "tool_choice":{"type":"function","function":{"name":"get_weather"}},
        "parallel_tool_calls":true})";
    auto parsed = parse_openai_request(Endpoint::kChatCompletions, body);
    REQUIRE(std::holds_alternative<ParsedRequest>(parsed));
    const ParsedRequest& p = std::get<ParsedRequest>(parsed);
    CHECK(p.tool_choice == ToolChoice::kFunction);
    CHECK(p.tool_choice_function == "get_weather");
    CHECK(p.parallel_tool_calls);
    REQUIRE(p.generate.tools.size() == 2);
    CHECK(p.generate.tools[0].name == "get_weather");
    CHECK(p.generate.tools[0].description == "Weather.");
    CHECK(p.generate.tools[0].parameters_json ==
          R"({"type":"object","properties":{"city":{"type":"string"}}})");
    CHECK(p.generate.tools[1].parameters_json == "{}");
    CHECK(p.generate.tools[0].strict_schema == nullptr);  // Not strict: not compiled.
    const auto& messages = std::get<std::vector<edge::engine::ChatMessage>>(p.generate.prompt);
    REQUIRE(messages.size() == 3);
    REQUIRE(messages[1].tool_calls.size() == 1);
    CHECK(messages[1].tool_calls[0].id == "call_1");
    CHECK(messages[1].tool_calls[0].name == "get_weather");
    CHECK(messages[1].tool_calls[0].arguments == R"({"city": "Oslo"})");
    CHECK(messages[2].tool_call_id == "call_1");

    auto with = [](const std::string& choice) {
        std::string b = std::string(R"({"model":"m","messages":[{"role":"user","content":"x"}],)") +
                        R"("tools":[{"type":"function","function":{"name":"f"}}])" + choice + "}";
        auto r = parse_openai_request(Endpoint::kChatCompletions, b);
        REQUIRE(std::holds_alternative<ParsedRequest>(r));
        return std::get<ParsedRequest>(r);
    };
    CHECK(with("").tool_choice == ToolChoice::kAuto);
    CHECK(with(R"(,"tool_choice":"auto")").tool_choice == ToolChoice::kAuto);
    CHECK(with(R"(,"tool_choice":"required")").tool_choice == ToolChoice::kRequired);
    ParsedRequest none = with(R"(,"tool_choice":"none")");
    CHECK(none.tool_choice == ToolChoice::kNone);
    CHECK(none.generate.tools.empty());  // Not offered at all.
}

TEST_CASE("a strict tool's parameters are compiled, or refused naming where they fail") {
    auto tools = [](const std::string& function) {
        return std::string(R"({"model":"m","messages":[{"role":"user","content":"x"}],)") +
               R"("tools":[{"type":"function","function":{"name":"ok"}},)" +
               R"({"type":"function","function":{"name":"f",)" + function + "}}]}";
    };
    auto parsed = parse_openai_request(
        Endpoint::kChatCompletions,
        tools(R"("strict":true,"parameters":{"type":"object","properties":)"
              R"({"n":{"type":"integer"}},"required":["n"],"additionalProperties":false})"));
    REQUIRE(std::holds_alternative<ParsedRequest>(parsed));
    const engine::ToolSpec& f = std::get<ParsedRequest>(parsed).generate.tools[1];
    REQUIRE(f.strict_schema != nullptr);
    CHECK(engine::sampling::JsonPrefix(*f.strict_schema).feed(R"({"n": 3})"));
    CHECK_FALSE(engine::sampling::JsonPrefix(*f.strict_schema).feed(R"({"m")"));
    // No parameters: no arguments, {}.
    auto none = parse_openai_request(Endpoint::kChatCompletions, tools(R"("strict":true)"));
    REQUIRE(std::holds_alternative<ParsedRequest>(none));
    const engine::ToolSpec& g = std::get<ParsedRequest>(none).generate.tools[1];
    REQUIRE(g.strict_schema != nullptr);
    engine::sampling::JsonPrefix empty(*g.strict_schema);
    CHECK(empty.feed("{}"));
    CHECK(empty.complete());
    CHECK_FALSE(engine::sampling::JsonPrefix(*g.strict_schema).feed(R"({")"));

    const std::string unfollowable =
        R"("parameters":{"type":"object","properties":{"s":{"type":"string","pattern":"a"}}})";
    // Not strict: passed to the chat template as it is.
    CHECK(std::holds_alternative<ParsedRequest>(
        parse_openai_request(Endpoint::kChatCompletions, tools(unfollowable))));
    const ApiError e =
        error_of(Endpoint::kChatCompletions, tools(R"("strict":true,)" + unfollowable));
    CHECK(e.param == "tools[1].function.parameters");
    CHECK(e.message.find("strict") != std::string::npos);
    CHECK(e.message.find("pattern") != std::string::npos);
}

TEST_CASE("completions echo asks the engine for the prompt back, chat has no echo") {
    auto echo = parse_openai_request(Endpoint::kCompletions,
                                     R"({"model":"m","prompt":"x","echo":true,"logprobs":1})");
    REQUIRE(std::holds_alternative<ParsedRequest>(echo));
    CHECK(std::get<ParsedRequest>(echo).generate.echo_prompt);
    CHECK(std::get<ParsedRequest>(echo).generate.sampling.logprobs);
    auto off = parse_openai_request(Endpoint::kCompletions,
                                    R"({"model":"m","prompt":"x","echo":false})");
    REQUIRE(std::holds_alternative<ParsedRequest>(off));
    CHECK_FALSE(std::get<ParsedRequest>(off).generate.echo_prompt);
    CHECK(error_of(Endpoint::kCompletions, R"({"model":"m","prompt":"x","echo":1})").param ==
          "echo");
    CHECK(error_of(Endpoint::kChatCompletions,
                   R"({"model":"m","messages":[{"role":"user","content":"x"}],"echo":true})")
              .param == "echo");
}

TEST_CASE("vLLM's sampling extensions: repetition_penalty, min_p, min_tokens, stop_token_ids") {
    auto ok = parse_openai_request(
        Endpoint::kCompletions,
        R"({"model":"m","prompt":"x","repetition_penalty":1.2,"min_p":0.05,"min_tokens":3,)"
        R"("max_tokens":8})");
    REQUIRE(std::holds_alternative<ParsedRequest>(ok));
    const engine::SamplingParams& s = std::get<ParsedRequest>(ok).generate.sampling;
    CHECK(s.repetition_penalty == doctest::Approx(1.2));
    CHECK(s.min_p == doctest::Approx(0.05));
    CHECK(s.min_tokens == 3);
    auto nulls = parse_openai_request(
        Endpoint::kChatCompletions,
        R"({"model":"m","messages":[{"role":"user","content":"x"}],"repetition_penalty":null,)"
        R"("min_p":null,"min_tokens":null})");
    REQUIRE(std::holds_alternative<ParsedRequest>(nulls));
    CHECK(std::get<ParsedRequest>(nulls).generate.sampling.repetition_penalty == 1.0f);
    auto stops = parse_openai_request(Endpoint::kCompletions,
                                      R"({"model":"m","prompt":"x","stop_token_ids":[7,9]})");
    REQUIRE(std::holds_alternative<ParsedRequest>(stops));
    CHECK(std::get<ParsedRequest>(stops).generate.sampling.stop_token_ids ==
          std::vector<engine::TokenId>{7, 9});
    for (const auto& [fields, param] : std::vector<std::pair<std::string, std::string>>{
             {R"("repetition_penalty":0)", "repetition_penalty"},
             {R"("repetition_penalty":2.5)", "repetition_penalty"},
             {R"("min_p":1.01)", "min_p"},
             {R"("min_p":"x")", "min_p"},
             {R"("min_tokens":-1)", "min_tokens"},
             {R"("min_tokens":1.5)", "min_tokens"},
             {R"("min_tokens":9,"max_tokens":8)", "min_tokens"},
             {R"("min_tokens":17)", "min_tokens"},  // Above the default max_tokens, 16.
             {R"("stop_token_ids":5)", "stop_token_ids"},
             {R"("stop_token_ids":[1,-2])", "stop_token_ids[1]"}}) {
        CAPTURE(fields);
        ApiError e = error_of(Endpoint::kCompletions,
                              R"({"model":"m","prompt":"x",)" + fields + "}");
        CHECK(e.param == param);
    }
    // Unset, a completion's max_tokens is 16 (what the message names), a chat's the context's
    // room, which the engine checks min_tokens against.
    CHECK(
        error_of(Endpoint::kCompletions, R"({"model":"m","prompt":"x","min_tokens":17})").message ==
        "'min_tokens' (17) must not exceed 'max_tokens' (16, its default for "
        "/v1/completions)");
    CHECK(parse(Endpoint::kCompletions, R"({"model":"m","prompt":"x","min_tokens":16})")
              .generate.sampling.min_tokens == 16);
    CHECK(parse(Endpoint::kChatCompletions,
                R"({"model":"m","messages":[{"role":"user","content":"x"}],"min_tokens":4096})")
              .generate.sampling.min_tokens == 4096);
}

TEST_CASE("n: 1 to 16 choices (null is 1), best_of other than 1 is refused as such") {
    for (const char* n : {"0", "17", "-1", "1000", "2.5", "\"2\""}) {
        CAPTURE(n);
        auto r = parse_openai_request(Endpoint::kCompletions,
                                      std::string(R"({"model":"m","prompt":"x","n":)") + n + "}");
        REQUIRE(std::holds_alternative<ApiError>(r));
        CHECK(std::get<ApiError>(r).param == "n");
    }
    for (const auto& [n, want] : std::vector<std::pair<std::string, int>>{
             {"1", 1}, {"null", 1}, {"4", 4}, {"16", 16}, {"3.0", 3}}) {
        CAPTURE(n);
        auto r = parse_openai_request(Endpoint::kChatCompletions,
                                      R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                                      R"("n":)" + n + "}");
        REQUIRE(std::holds_alternative<ParsedRequest>(r));
        CHECK(std::get<ParsedRequest>(r).n == want);
    }
    for (const char* b : {"0", "2", "-1"}) {
        CAPTURE(b);
        ApiError e = error_of(Endpoint::kCompletions,
                              std::string(R"({"model":"m","prompt":"x","best_of":)") + b + "}");
        CHECK(e.message == "'best_of' must be 1 (use 'n' for several choices)");
        CHECK(e.param == "best_of");
    }
    auto one = parse_openai_request(Endpoint::kCompletions,
                                    R"({"model":"m","prompt":"x","n":1,"best_of":1.0})");
    CHECK(std::holds_alternative<ParsedRequest>(one));
    // Completions' own fields are unknown to chat; sent as null, absent, as any field.
    for (auto [field, value] : {std::pair{"echo", "true"}, std::pair{"suffix", "\"s\""},
                                std::pair{"best_of", "1"}}) {
        CAPTURE(field);
        const std::string head = std::string(R"({"model":"m","messages":[{"role":"user",)") +
                                 R"("content":"x"}],")" + field + R"(":)";
        ApiError e = error_of(Endpoint::kChatCompletions, head + value + "}");
        CHECK(e.param == field);
        CHECK(e.message.find("unrecognized request argument") == 0);
        CHECK(std::holds_alternative<ParsedRequest>(
            parse_openai_request(Endpoint::kChatCompletions, head + "null}")));
    }
    // Fields of OpenAI's schema this server does not know, sent as null by clients that send
    // every field they model, are absent too; with a value they are refused.
    for (const char* field : {"verbosity", "web_search_options"}) {
        CAPTURE(field);
        const std::string head = std::string(R"({"model":"m","messages":[{"role":"user",)") +
                                 R"("content":"x"}],")" + field + R"(":)";
        CHECK(std::holds_alternative<ParsedRequest>(
            parse_openai_request(Endpoint::kChatCompletions, head + "null}")));
        CHECK(error_of(Endpoint::kChatCompletions, head + "\"low\"}").param == field);
    }
}

TEST_CASE("null inside messages, stream_options and chat_template_kwargs is unset, as at the top") {
    // Clients that serialize every field of their message and option types send the unset
    // ones as null; at the top level null was already absent, one level down it was refused.
    const std::string head = R"({"model":"m","messages":[{"role":"user","content":"x")";
    auto parsed = [](const std::string& body) {
        auto r = parse_openai_request(Endpoint::kChatCompletions, body);
        if (auto* e = std::get_if<ApiError>(&r)) {
            FAIL_CHECK("unexpected error: " << e->message);
            return ParsedRequest();
        }
        return std::get<ParsedRequest>(r);
    };
    ParsedRequest named = parsed(head + R"(,"name":null}]})");
    const auto* messages = std::get_if<std::vector<engine::ChatMessage>>(&named.generate.prompt);
    CHECK((messages != nullptr && messages->size() == 1 && (*messages)[0].name.empty()));
    ParsedRequest options =
        parsed(head + R"(}],"stream":true,"stream_options":{"include_usage":null,)"
                      R"("include_obfuscation":null,"continuous_usage_stats":null}})");
    CHECK(options.stream);
    CHECK_FALSE(options.include_usage);
    ParsedRequest kwargs =
        parsed(head + R"(}],"chat_template_kwargs":{"enable_thinking":null,"thinking":null}})");
    CHECK_FALSE(kwargs.generate.thinking.has_value());
    // A key these objects do not know stays refused by name, null or not (at the top level a
    // null one is absent: OpenAI's schema grows new top-level fields clients send as null).
    CHECK(error_of(Endpoint::kChatCompletions,
                   R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,)"
                   R"("stream_options":{"x":null}})")
              .param == "stream_options.x");
    CHECK(error_of(Endpoint::kChatCompletions,
                   R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                   R"("chat_template_kwargs":{"tools_in_user_message":null}})")
              .param == "chat_template_kwargs.tools_in_user_message");
    CHECK(error_of(Endpoint::kChatCompletions,
                   R"({"model":"m","messages":[{"role":"user","content":"x","name":5}]})")
              .param == "messages[0].name");
}

TEST_CASE("an assistant message sent back with its annotations, null or a list, is read") {
    // openai-python's message.model_dump() includes annotations: null (a list of url_citation
    // objects when the answer cited the web); appending it to the next request was a 400.
    const std::string head = R"({"model":"m","messages":[{"role":"user","content":"q"},)"
                             R"({"role":"assistant","content":"a","annotations":)";
    for (const char* value : {"null", "[]",
                              R"([{"type":"url_citation","url_citation":{"url":"https://x"}}])"}) {
        CAPTURE(value);
        auto r = parse_openai_request(Endpoint::kChatCompletions,
                                      head + value + R"(},{"role":"user","content":"more"}]})");
        CHECK(std::holds_alternative<ParsedRequest>(r));
    }
    CHECK(error_of(Endpoint::kChatCompletions, head + R"("x"}]})").param ==
          "messages[1].annotations");
    // Only an assistant's answer has them.
    CHECK(error_of(Endpoint::kChatCompletions,
                   R"({"model":"m","messages":[{"role":"user","content":"q","annotations":[]}]})")
              .param == "messages[0].annotations");
}

TEST_CASE("stream_options.continuous_usage_stats: read with or without include_usage") {
    for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
        const std::string head =
            std::string(endpoint == Endpoint::kCompletions
                            ? R"({"model":"m","prompt":"x",)"
                            : R"({"model":"m","messages":[{"role":"user","content":"x"}],)") +
            R"("stream":true,"stream_options":{)";
        ParsedRequest off =
            parse(endpoint, head + R"("include_usage":true,"continuous_usage_stats":false}})");
        CHECK(off.include_usage);
        CHECK_FALSE(off.continuous_usage);
        ParsedRequest on =
            parse(endpoint, head + R"("include_usage":true,"continuous_usage_stats":true}})");
        CHECK(on.include_usage);
        CHECK(on.continuous_usage);
        ParsedRequest alone = parse(endpoint, head + R"("continuous_usage_stats":true}})");
        CHECK_FALSE(alone.include_usage);
        CHECK(alone.continuous_usage);
        CHECK(error_of(endpoint, head + R"("continuous_usage_stats":1}})").message ==
              "'stream_options.continuous_usage_stats' must be a boolean");
    }
}
