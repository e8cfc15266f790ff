// ReasoningParser on thinking models' outputs, fed whole, byte by byte and cut at every pair of
// byte boundaries: the thought and the answer come out the same every time, and nothing that
// could still be a marker or the thought's closing newlines is released early.

#include "engine/chat/reasoning_parser.h"

#include <doctest/doctest.h>

#include <vector>

namespace edge::engine::chat {
namespace {

struct Split {
    std::string reasoning;
    std::string content;
    bool operator==(const Split&) const = default;
};

Split run(const std::vector<std::string>& pieces, bool opened) {
    ReasoningParser parser;
    if (opened) {
        parser.open_thought();
    }
    Split s;
    auto add = [&](const ReasoningDelta& d) {
        s.reasoning += d.reasoning;
        s.content += d.content;
        // Released text is final: no marker and no newline the thought may still drop.
        CHECK(d.reasoning.find("</think>") == std::string::npos);
        CHECK_FALSE(d.reasoning.ends_with('\n'));
    };
    for (const std::string& p : pieces) {
        add(parser.feed(p));
    }
    add(parser.finish());
    return s;
}

Split check_all_splits(const std::string& text, bool opened = false) {
    const Split whole = run({text}, opened);
    std::vector<std::string> bytes;
    for (char c : text) {
        bytes.emplace_back(1, c);
    }
    CHECK(run(bytes, opened) == whole);
    for (size_t i = 0; i <= text.size(); ++i) {
        for (size_t j = i; j <= text.size(); ++j) {
            const Split cut =
                run({text.substr(0, i), text.substr(i, j - i), text.substr(j)}, opened);
            CHECK_MESSAGE(cut == whole, "cut at " << i << ", " << j);
        }
    }
    return whole;
}

TEST_CASE("reasoning: a Qwen3 thought then its answer") {
    const Split s =
        check_all_splits("<think>\nThe user greets.\n\nReply briefly.\n</think>\n\nHi!");
    CHECK(s.reasoning == "The user greets.\n\nReply briefly.");
    CHECK(s.content == "Hi!");
}

TEST_CASE("reasoning: GLM-4.5 writes no newlines around the thought") {
    const Split s = check_all_splits("<think>short</think>Answer\n\nwith lines\n");
    CHECK(s.reasoning == "short");
    CHECK(s.content == "Answer\n\nwith lines\n");
}

TEST_CASE("reasoning: an output without a thought is all answer, unchanged") {
    for (const std::string text : {"Hello <think> there", "  \n leading space kept", "<thin", "<",
                                   "", "\n\n", "plain </think> text"}) {
        const Split s = check_all_splits(text);
        CHECK(s.reasoning.empty());
        CHECK(s.content == text);
    }
}

TEST_CASE("reasoning: whitespace before the opening marker is dropped") {
    const Split s = check_all_splits(" \n<think>x</think>y");
    CHECK(s.reasoning == "x");
    CHECK(s.content == "y");
}

TEST_CASE("reasoning: the 64-byte whitespace limit holds however the text is split") {
    // Up to the limit, the marker after the whitespace opens a thought.
    const Split at_limit = check_all_splits(std::string(64, ' ') + "<think>x</think>y");
    CHECK(at_limit.reasoning == "x");
    CHECK(at_limit.content == "y");
    // One byte past it the output is an answer, even when the marker arrives in the same piece:
    // fed byte by byte, the whitespace has gone out as answer before the marker is seen.
    const std::string past = std::string(65, ' ') + "<think>x</think>y";
    const Split past_limit = check_all_splits(past);
    CHECK(past_limit.reasoning.empty());
    CHECK(past_limit.content == past);
}

TEST_CASE("reasoning: the prompt opened the thought (DeepSeek-V3.1 thinking)") {
    const Split s = check_all_splits("Let me see.\n</think>The answer is 4.", true);
    CHECK(s.reasoning == "Let me see.");
    CHECK(s.content == "The answer is 4.");
    // A <think> the model writes anyway is part of the thought's text, not a new marker.
    CHECK(check_all_splits("<think>a</think>b", true).reasoning == "<think>a");
}

TEST_CASE("reasoning: an output cut inside its thought is all thought") {
    const Split s = check_all_splits("<think>\nStill thinking\n\n</thi");
    CHECK(s.reasoning == "Still thinking\n\n</thi");
    CHECK(s.content.empty());
    CHECK(check_all_splits("<think>\n\n").reasoning.empty());
}

TEST_CASE("reasoning: after the thought everything is answer, markers included") {
    const Split s = check_all_splits("<think>t</think>\n\nA <think>b</think> c");
    CHECK(s.reasoning == "t");
    CHECK(s.content == "A <think>b</think> c");
}

TEST_CASE("reasoning: an empty thought (thinking off) leaves the answer alone") {
    const Split s = check_all_splits("<think>\n\n</think>\n\nDone.");
    CHECK(s.reasoning.empty());
    CHECK(s.content == "Done.");
}

TEST_CASE("reasoning: what is held back stays bounded, token by token") {
    // Whitespace past 64 bytes before any <think>: an answer, released as it comes.
    ReasoningParser lead;
    std::string content;
    for (int i = 0; i < 100; ++i) {
        content += lead.feed(" ").content;
    }
    CHECK(content.size() >= 100 - 64);
    content += lead.feed("<think>x</think>").content + lead.finish().content;
    CHECK(content == std::string(100, ' ') + "<think>x</think>");
    // A long run of newlines inside a thought: at most 16 held; the thought keeps them all.
    ReasoningParser deep;
    std::string thought = deep.feed("<think>a").reasoning;
    for (int i = 0; i < 40; ++i) {
        thought += deep.feed("\n").reasoning;
    }
    CHECK(thought.size() >= 1 + 40 - 16);
    const ReasoningDelta rest = deep.feed("b</think>c");
    thought += rest.reasoning + deep.finish().reasoning;
    CHECK(thought == "a" + std::string(40, '\n') + "b");
    CHECK(rest.content == "c");
}

TEST_CASE("reasoning: multi-byte text and newlines inside the thought stay whole") {
    const Split s = check_all_splits("<think>日本\n\n語 🙂\n</think>答え");
    CHECK(s.reasoning == "日本\n\n語 🙂");
    CHECK(s.content == "答え");
}

}  // namespace
}  // namespace edge::engine::chat
