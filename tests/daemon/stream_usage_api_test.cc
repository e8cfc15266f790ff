// stream_options.continuous_usage_stats (vLLM's) through the real HTTPS server and the API on the
// scripted generator: every streamed chunk with a choice carries `usage`, that choice's prompt
// tokens and its tokens generated so far, as vLLM counts them; the final usage chunk
// (include_usage) still sums the whole request.

#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <vector>

#include "tests/testing/scripted_daemon.h"

using namespace edge;

namespace {

struct Fixture : testing::ScriptedDaemon {
    Fixture() : ScriptedDaemon({"test-model"}) { start(); }

    // The events of a stream for `body` at `path`, once the generator has recorded `choices`
    // requests and `script` has driven them.
    std::vector<std::string> stream(const std::string& path, const std::string& body,
                                    size_t choices, const std::function<void()>& script) {
        auto c = client();
        REQUIRE(c->send(testing::http_request("POST", path, body)).ok());
        REQUIRE(generator.wait_for_request(choices - 1));
        script();
        auto all = c->read_until("0\r\n\r\n");
        REQUIRE(all.ok());
        return testing::sse_events(*all);
    }
};

// A streamed chunk's choice index and usage; the chunks with no choice (the final usage chunk)
// are counted apart.
struct Chunks {
    std::map<int64_t, std::vector<boost::json::object>> usage_by_choice;
    std::vector<boost::json::object> final_usage;
    size_t without_usage = 0;
};

Chunks read_chunks(const std::vector<std::string>& events) {
    Chunks out;
    REQUIRE_FALSE(events.empty());
    CHECK(events.back() == "[DONE]");
    for (size_t i = 0; i + 1 < events.size(); ++i) {
        boost::json::object o = testing::json_object_of(events[i]);
        const boost::json::array& choices = o.at("choices").as_array();
        const boost::json::value* usage = o.if_contains("usage");
        if (usage == nullptr || !usage->is_object()) {
            ++out.without_usage;
            continue;
        }
        if (choices.empty()) {
            out.final_usage.push_back(usage->as_object());
            continue;
        }
        REQUIRE(choices.size() == 1);
        out.usage_by_choice[choices[0].as_object().at("index").as_int64()].push_back(
            usage->as_object());
    }
    return out;
}

// `usage` is {prompt_tokens, completion_tokens, total_tokens} with these counts.
void check_usage(const boost::json::object& usage, int64_t prompt, int64_t completion) {
    CHECK(usage.at("prompt_tokens").as_int64() == prompt);
    CHECK(usage.at("completion_tokens").as_int64() == completion);
    CHECK(usage.at("total_tokens").as_int64() == prompt + completion);
}

// Each choice's chunks carry, in order, `prompt` and the completion counts `expected` lists for
// it (by choice index), and no other choice has chunks.
void check_choices(const Chunks& chunks, int64_t prompt,
                   const std::map<int64_t, std::vector<int64_t>>& expected) {
    REQUIRE(chunks.usage_by_choice.size() == expected.size());
    for (const auto& [index, completions] : expected) {
        CAPTURE(index);
        const auto& got = chunks.usage_by_choice.at(index);
        REQUIRE(got.size() == completions.size());
        for (size_t i = 0; i < got.size(); ++i) {
            CAPTURE(i);
            check_usage(got[i], prompt, completions[i]);
        }
    }
}

}  // namespace

TEST_CASE("continuous usage: each chat chunk counts its choice's tokens so far, then the total") {
    Fixture f;
    f.generator.set_prompt_tokens(7);
    const std::string body =
        R"({"model":"test-model","messages":[{"role":"user","content":"hi"}],"n":2,)"
        R"("stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}})";
    auto events = f.stream("/v1/chat/completions", body, 2, [&] {
        f.generator.emit(0, "a");
        f.generator.emit(1, "b");
        f.generator.emit(0, "c");
        f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{7, 2, 0});
        f.generator.emit(1, "d");
        f.generator.emit(1, "e");
        f.generator.finish(1, engine::FinishReason::kLength, engine::Usage{7, 3, 0});
    });
    Chunks chunks = read_chunks(events);
    CHECK(chunks.without_usage == 0);
    // Choice 0: its role chunk, "a", "c", its finish chunk; choice 1: role, "b", "d", "e",
    // finish. Each counts its own tokens, the prompt once (vLLM's numbers).
    check_choices(chunks, 7, {{0, {0, 1, 2, 2}}, {1, {0, 1, 2, 3, 3}}});
    // The final chunk is unchanged: the prompt once, every choice's tokens, the cached ones.
    REQUIRE(chunks.final_usage.size() == 1);
    check_usage(chunks.final_usage[0], 7, 5);
    CHECK(chunks.final_usage[0].contains("prompt_tokens_details"));
}

TEST_CASE("continuous usage: completions of a list of prompts, with or without include_usage") {
    for (bool include_usage : {true, false}) {
        CAPTURE(include_usage);
        Fixture f;
        f.generator.set_prompt_tokens(4);
        const std::string body =
            std::string(R"({"model":"test-model","prompt":["x","y"],"echo":true,"stream":true,)") +
            R"("stream_options":{"continuous_usage_stats":true)" +
            (include_usage ? R"(,"include_usage":true)" : "") + "}}";
        auto events = f.stream("/v1/completions", body, 2, [&] {
            f.generator.emit_prompt(0, {"x"});
            f.generator.emit_prompt(1, {"y"});
            f.generator.emit(1, "p");
            f.generator.emit(0, "q");
            f.generator.emit(1, "r");
            f.generator.finish(1, engine::FinishReason::kStop, engine::Usage{4, 2, 0});
            f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{4, 1, 0});
        });
        Chunks chunks = read_chunks(events);
        CHECK(chunks.without_usage == 0);
        // The echoed prompt is no completion token; each prompt counts as its own.
        check_choices(chunks, 4, {{0, {0, 1, 1}}, {1, {0, 1, 2, 2}}});
        // include_usage alone asks for the final chunk, which sums both prompts.
        REQUIRE(chunks.final_usage.size() == (include_usage ? 1U : 0U));
        if (include_usage) {
            check_usage(chunks.final_usage[0], 8, 3);
        }
    }
}

TEST_CASE("continuous usage: off, a chunk's usage is null with include_usage, else absent") {
    for (bool include_usage : {true, false}) {
        CAPTURE(include_usage);
        Fixture f;
        f.generator.set_prompt_tokens(4);
        const std::string body =
            std::string(R"({"model":"test-model","prompt":"x","stream":true,"stream_options":{)") +
            R"("continuous_usage_stats":false)" +
            (include_usage ? R"(,"include_usage":true)" : "") + "}}";
        auto events = f.stream("/v1/completions", body, 1, [&] {
            f.generator.emit(0, "p");
            f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{4, 1, 0});
        });
        REQUIRE(events.size() == (include_usage ? 4U : 3U));
        for (size_t i = 0; i < 2; ++i) {
            boost::json::object o = testing::json_object_of(events[i]);
            CHECK(o.contains("usage") == include_usage);
            CHECK((!include_usage || o.at("usage").is_null()));
        }
    }
}
