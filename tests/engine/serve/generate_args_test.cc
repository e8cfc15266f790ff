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
    };
    for (const Case& c : cases) {
        auto a = parse(c.words);
        REQUIRE_FALSE(a.ok());
        CHECK(a.status().code() == StatusCode::kInvalidArgument);
        CHECK(a.status().message().find(c.needle) != std::string::npos);
    }
}

}  // namespace
}  // namespace edge::engine
