#include "engine/tools/generate_args.h"

#include <doctest/doctest.h>

namespace edge::engine {
namespace {

Result<GenerateArgs> parse(std::vector<std::string> words) {
    std::vector<char*> argv;
    for (std::string& w : words) {
        argv.push_back(w.data());
    }
    return parse_generate_args(static_cast<int>(argv.size()), argv.data(), 0);
}

TEST_CASE("generate args: a full command line parses") {
    auto a = parse({"--model", "/m", "--prompt-ids", "1,2,3", "--max-tokens", "7", "--temperature",
                    "0.5", "--seed", "9", "--ids", "--threads", "2"});
    REQUIRE_MESSAGE(a.ok(), a.status().to_string());
    CHECK(a->model_dir == "/m");
    CHECK(*a->prompt_ids == std::vector<TokenId>{1, 2, 3});
    CHECK(a->max_tokens == 7);
    CHECK(a->temperature == 0.5f);
    CHECK(*a->seed == 9);
    CHECK(a->ids);
    CHECK(a->threads == 2);
    auto chat = parse({"--model", "/m", "--prompt", "hi there", "--chat"});
    REQUIRE(chat.ok());
    CHECK(*chat->prompt == "hi there");
    CHECK(chat->chat);
    // An empty user message still makes a prompt through the chat template.
    CHECK(parse({"--model", "/m", "--prompt", "", "--chat"}).ok());
    // The engine's limits, inclusive.
    auto edges =
        parse({"--model", "/m", "--prompt", "x", "--max-tokens", "1", "--temperature", "2"});
    REQUIRE_MESSAGE(edges.ok(), edges.status().to_string());
    CHECK(edges->max_tokens == 1);
    CHECK(edges->temperature == 2.0f);
}

TEST_CASE("generate args: mistakes name the flag") {
    struct Case {
        std::vector<std::string> words;
        const char* needle;
    };
    const std::vector<Case> cases = {
        {{"--prompt", "x"}, "--model"},
        {{"--model", "/m"}, "exactly one"},
        {{"--model", "/m", "--prompt", "x", "--prompt-ids", "1"}, "exactly one"},
        {{"--model", "/m", "--prompt-ids", "1,,2"}, "--prompt-ids"},
        {{"--model", "/m", "--prompt-ids", "1,"}, "--prompt-ids"},
        {{"--model", "/m", "--prompt-ids", ""}, "--prompt-ids"},
        {{"--model", "/m", "--prompt", "x", "--max-tokens", "ten"}, "--max-tokens"},
        {{"--model", "/m", "--prompt", "x", "--temperature"}, "--temperature needs a value"},
        {{"--model", "/m", "--prompt", "x", "--bogus", "1"}, "unknown flag --bogus"},
        {{"--model", "/m", "--prompt-ids", "1", "--chat"}, "--chat"},
        {{"--model", "/m", "--prompt", "x", "--threads", "100000"}, "--threads"},
        {{"--model", "/m", "--prompt", "x", "--threads", "-1"}, "--threads"},
        // Refused here, before the model loads, not by the engine after it.
        {{"--model", "/m", "--prompt", "x", "--max-tokens", "0"}, "--max-tokens"},
        {{"--model", "/m", "--prompt", "x", "--max-tokens", "-1"}, "--max-tokens"},
        {{"--model", "/m", "--prompt", "x", "--temperature", "nan"}, "--temperature"},
        {{"--model", "/m", "--prompt", "x", "--temperature", "inf"}, "--temperature"},
        {{"--model", "/m", "--prompt", "x", "--temperature", "-0.5"}, "--temperature"},
        {{"--model", "/m", "--prompt", "x", "--temperature", "2.5"}, "--temperature"},
        {{"--model", "/m", "--prompt-ids", "1,-1"}, "--prompt-ids"},
        {{"--model", "/m", "--prompt", ""}, "--prompt is empty"},
        // A stray word or an unknown flag last is what it is, not a flag missing its value.
        {{"--model", "/m", "--prompt", "x", "junk"}, "unexpected argument 'junk'"},
        {{"--model", "/m", "--prompt", "x", "--bogus"}, "unknown flag --bogus"},
        // Which one was meant? Not the last one, silently.
        {{"--model", "/a", "--model", "/b", "--prompt", "x"}, "--model given twice"},
        {{"--model", "/m", "--prompt", "x", "--seed", "1", "--seed", "2"}, "--seed given twice"},
        {{"--model", "/m", "--prompt", "x", "--chat", "--chat"}, "--chat given twice"},
    };
    for (const Case& c : cases) {
        auto a = parse(c.words);
        REQUIRE_FALSE(a.ok());
        CHECK(a.status().code() == StatusCode::kInvalidArgument);
        CHECK_MESSAGE(a.status().message().find(c.needle) != std::string::npos,
                      a.status().message());
    }
}

}  // namespace
}  // namespace edge::engine
