#include "engine/tokenizer/pre_tokenizer.h"

#include <doctest/doctest.h>

#include "engine/tokenizer/tiktoken.h"

namespace edge::engine::tokenizer {
namespace {

std::vector<std::string> split(const PreTokenizer& pt, std::string_view text) {
    std::vector<std::string_view> pieces;
    REQUIRE(pt.split(text, &pieces).ok());
    return {pieces.begin(), pieces.end()};
}

TEST_CASE("pre-tokenizer: the Qwen2 pattern isolates words, digits and contractions") {
    auto pt = PreTokenizer::create(
        {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"});
    REQUIRE(pt.ok());
    CHECK(split(**pt, "I'M here  42!\n") ==
          std::vector<std::string>{"I", "'M", " here", " ", " ", "4", "2", "!\n"});
    CHECK(split(**pt, "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC") ==
          std::vector<std::string>{"caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC"});
    CHECK(split(**pt, "").empty());
}

TEST_CASE("pre-tokenizer: several Split steps apply in sequence, gaps kept") {
    // DeepSeek-V3 style: digits in groups of up to three, then words.
    auto pt = PreTokenizer::create({R"(\p{N}{1,3})", R"([A-Za-z]+)"});
    REQUIRE(pt.ok());
    CHECK(split(**pt, "ab12345cd-e") ==
          std::vector<std::string>{"ab", "123", "45", "cd", "-", "e"});
}

TEST_CASE("pre-tokenizer: a pattern that matches empty strings does not loop") {
    auto pt = PreTokenizer::create({"x*"});
    REQUIRE(pt.ok());
    CHECK(split(**pt, "axxb") == std::vector<std::string>{"a", "xx", "b"});
}

TEST_CASE("pre-tokenizer: a long run of letters splits under Kimi K2's pattern") {
    // Its letter classes are groups repeated with a look-ahead inside, one JIT stack frame per
    // character: ~10k letters in one word used to fail the whole request.
    auto pt = PreTokenizer::create({kimi_k2_pattern()});
    REQUIRE(pt.ok());
    for (const std::string unit : {"a", "A", "\xC3\xA9"}) {
        std::string word;
        for (int i = 0; i < 50000; ++i) {
            word += unit;
        }
        CHECK(split(**pt, word + " x") == std::vector<std::string>{word, " x"});
    }
}

}  // namespace
}  // namespace edge::engine::tokenizer
