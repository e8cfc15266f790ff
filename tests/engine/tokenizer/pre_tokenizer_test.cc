#include "engine/tokenizer/pre_tokenizer.h"

#include <doctest/doctest.h>

#include <algorithm>

#include "engine/tokenizer/pcre2_error.h"
#include "engine/tokenizer/tiktoken.h"
#include "engine/tokenizer/utf8.h"

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

TEST_CASE("pre-tokenizer: an empty match splits where it is, as Hugging Face's Isolated does") {
    // Hugging Face's Split gives every match and every gap between matches as a piece and drops
    // the empty ones, so a look-ahead splits before what it looks at: "AbcDe" is "Abc", "De".
    auto upper = PreTokenizer::create({"(?=[A-Z])"});
    REQUIRE(upper.ok());
    CHECK(split(**upper, "AbcDe") == std::vector<std::string>{"Abc", "De"});
    CHECK(split(**upper, "abCDe") == std::vector<std::string>{"ab", "C", "De"});
    CHECK(split(**upper, "abc") == std::vector<std::string>{"abc"});
    const std::string e_acute = "\xC3\xA9";
    CHECK(split(**upper, e_acute + "A" + e_acute) ==
          std::vector<std::string>{e_acute, "A" + e_acute});
    auto boundary = PreTokenizer::create({R"(\b)"});
    REQUIRE(boundary.ok());
    CHECK(split(**boundary, "ab  cd!") == std::vector<std::string>{"ab", "  ", "cd", "!"});
    // A later step splits the pieces an empty match made.
    auto then_digits = PreTokenizer::create({"(?=[A-Z])", R"(\p{N}+)"});
    REQUIRE(then_digits.ok());
    CHECK(split(**then_digits, "ab12Cd3") == std::vector<std::string>{"ab", "12", "Cd", "3"});
}

// The split patterns of the supported models' tokenizer.json files (Kimi K2's is in tiktoken.cc).
const char* kQwen3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kGlm45Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::vector<std::string> kDeepseekV3Patterns = {
    R"(\p{N}{1,3})",
    "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+",
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};

std::vector<std::vector<std::string>> supported_patterns() {
    return {{kQwen3Pattern},
            {kGlm45Pattern},
            kDeepseekV3Patterns,
            {kimi_k2_pattern()},
            {PreTokenizer::gpt2_pattern()}};
}

std::string repeat(std::string_view unit, size_t bytes) {
    std::string out;
    out.reserve(bytes);
    while (out.size() + unit.size() <= bytes) {
        out += unit;
    }
    return out;
}

// Splits `text` and checks that the pieces are non-empty and concatenate back to it.
size_t split_count(const PreTokenizer& pt, std::string_view text) {
    std::vector<std::string_view> pieces;
    const Status s = pt.split(text, &pieces);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    size_t at = 0;
    bool contiguous = true;
    for (std::string_view p : pieces) {
        contiguous = contiguous && !p.empty() && p.data() == text.data() + at;
        at += p.size();
    }
    CHECK(contiguous);
    CHECK(at == text.size());
    return pieces.size();
}

TEST_CASE("pre-tokenizer: an empty match far ahead is searched for once, not from each character") {
    // Searching again from each character before an empty match finds the same match each time:
    // n searches of up to n characters, minutes for a 1 MB prompt.
    auto upper = PreTokenizer::create({"(?=[A-Z])"});
    REQUIRE(upper.ok());
    for (const size_t n : {size_t{4096}, size_t{1} << 20}) {
        CAPTURE(n);
        const std::string run = repeat("a", n);
        const std::string tail = "A" + run;
        const std::string text = run + tail;
        std::vector<std::string_view> pieces;
        size_t searches = 0;
        REQUIRE((*upper)->split(text, &pieces, &searches).ok());
        REQUIRE(searches <= 3);
        CHECK(pieces == std::vector<std::string_view>{run, tail});
    }
}

TEST_CASE("pre-tokenizer: long runs of one class split under every supported pattern") {
    // A prompt of one character repeated (or a base64 blob) is one long run for the regex. Kimi
    // K2's letter classes were groups with a look-ahead, a backtracking frame per letter: 2 MB of
    // capitals failed the request with PCRE2's match limit (the 3 MiB runs below).
    std::string b64;
    uint32_t x = 1;
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    while (b64.size() < (1u << 20)) {
        x = x * 1103515245u + 12345u;
        b64 += alphabet[(x >> 16) % 64];
    }
    const size_t n = 1 << 20;
    const std::vector<std::string> runs = {repeat("a", n),
                                           repeat("A", n),
                                           repeat("\xC3\xA9", n),
                                           repeat("\xE4\xB8\xAD", n),
                                           repeat("7", n),
                                           repeat(" ", n),
                                           repeat("!", n),
                                           repeat("\n", n),
                                           repeat("\xF0\x9F\x98\x80", n),
                                           " " + repeat("A", n),
                                           b64};
    for (const auto& patterns : supported_patterns()) {
        auto pt = PreTokenizer::create(patterns);
        REQUIRE(pt.ok());
        for (const std::string& run : runs) {
            CAPTURE(patterns.back().substr(0, 20));
            CAPTURE(run.substr(0, 8));
            split_count(**pt, run);
        }
    }
    auto kimi = PreTokenizer::create({kimi_k2_pattern()});
    REQUIRE(kimi.ok());
    for (const std::string unit : {"a", "A", "\xC3\xA9"}) {
        const std::string word = repeat(unit, 3 << 20);
        CHECK(split(**kimi, word + " x") == std::vector<std::string>{word, " x"});
    }
}

TEST_CASE("pre-tokenizer: a run longer than PCRE2's default match limit still splits") {
    // `\s*[\r\n]+` gives a run of spaces back one at a time before it fails, one step of PCRE2's
    // match limit (10 million by default) each: 11 MiB of spaces failed under every pattern but
    // GPT-2's, and 11 MiB of capitals under Kimi K2's (its first letter branch gives them back).
    const std::string spaces = repeat(" ", 11 << 20);
    for (const auto& patterns : supported_patterns()) {
        CAPTURE(patterns.back().substr(0, 20));
        auto pt = PreTokenizer::create(patterns);
        REQUIRE(pt.ok());
        CHECK(split_count(**pt, spaces) == 1);
    }
    auto kimi = PreTokenizer::create({kimi_k2_pattern()});
    REQUIRE(kimi.ok());
    CHECK(split_count(**kimi, repeat("A", 11 << 20) + " A") == 2);
}

// Kimi K2's letter classes as tokenization_kimi.py writes them (`[...&&[^\p{Han}]]`), spelled
// with a look-ahead, and as kimi_k2_pattern() writes them, as one negated class.
struct ClassPair {
    const char* intersection;
    const char* negated;
};
const ClassPair kKimiClasses[] = {
    {R"((?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])",
     R"([^\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{Han}])"},
    {R"((?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])",
     R"([^\p{Lu}\p{Lt}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{Han}])"},
};

TEST_CASE("pre-tokenizer: Kimi K2's negated letter classes match the intersections") {
    // Every code point, each class anchored on it.
    std::string text;
    std::vector<size_t> offsets;
    for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            continue;
        }
        offsets.push_back(text.size());
        utf8_append(cp, &text);
    }
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    for (const ClassPair& pair : kKimiClasses) {
        CAPTURE(pair.negated);
        std::vector<bool> members[2];
        const char* patterns[2] = {pair.intersection, pair.negated};
        for (int i = 0; i < 2; ++i) {
            int error = 0;
            PCRE2_SIZE error_at = 0;
            pcre2_code* code =
                pcre2_compile(reinterpret_cast<PCRE2_SPTR>(patterns[i]), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP, &error, &error_at, nullptr);
            REQUIRE(code != nullptr);
            pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
            pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
            for (size_t at : offsets) {
                members[i].push_back(pcre2_match(code, subject, text.size(), at,
                                                 PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, match,
                                                 nullptr) > 0);
            }
            pcre2_match_data_free(match);
            pcre2_code_free(code);
        }
        size_t differ = 0;
        for (size_t i = 0; i < offsets.size(); ++i) {
            differ += members[0][i] != members[1][i];
        }
        CHECK(differ == 0);
        CHECK(std::count(members[0].begin(), members[0].end(), true) > 1000);
    }
}

TEST_CASE("pre-tokenizer: Kimi K2's pattern splits like its look-ahead translation") {
    // The whole pattern with the intersections spelled as look-aheads, on text of every code
    // point, with contractions, spaces and newlines between them.
    std::string reference = kimi_k2_pattern();
    for (const ClassPair& pair : kKimiClasses) {
        const std::string negated = pair.negated;
        const std::string group = std::string("(?:") + pair.intersection + ")";
        for (size_t at; (at = reference.find(negated)) != std::string::npos;) {
            reference.replace(at, negated.size(), group);
        }
    }
    REQUIRE(reference != kimi_k2_pattern());
    auto ours = PreTokenizer::create({kimi_k2_pattern()});
    auto theirs = PreTokenizer::create({reference});
    REQUIRE(ours.ok());
    REQUIRE(theirs.ok());
    const char* separators[] = {"", " ", "'s", "\n", "'LL ", "1", "\r\n", "A"};
    std::string text;
    for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            continue;
        }
        utf8_append(cp, &text);
        text += separators[(cp * 2654435761u) >> 29];
        if (text.size() > 4096 || cp == 0x10FFFF) {
            REQUIRE(split(**ours, text) == split(**theirs, text));
            text.clear();
        }
    }
}

}  // namespace
}  // namespace edge::engine::tokenizer
