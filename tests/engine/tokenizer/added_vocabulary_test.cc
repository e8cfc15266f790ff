#include "engine/tokenizer/added_vocabulary.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cctype>
#include <chrono>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <variant>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace edge::engine::tokenizer {
namespace {

namespace json = boost::json;

// The micro fixture's tokenizer (NFC normaliser, ids up to 511) with `extra` added tokens, given
// as the JSON objects tokenizer.json holds; they get ids from 512 in order.
std::unique_ptr<Tokenizer> with_added(std::vector<json::object> extra, bool nfc = true) {
    std::ifstream in(EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe/tokenizer.json");
    std::ostringstream text;
    text << in.rdbuf();
    json::value root = json::parse(text.str());
    int64_t id = 512;
    for (json::object& t : extra) {
        t["id"] = id++;
        root.at("added_tokens").as_array().push_back(std::move(t));
    }
    if (!nfc) {
        root.as_object()["normalizer"] = nullptr;
    }
    auto tok = Tokenizer::from_json(json::serialize(root));
    REQUIRE_MESSAGE(tok.ok(), tok.status().to_string());
    return std::move(tok).value();
}

json::object token(const char* content, std::initializer_list<const char*> flags) {
    json::object t{{"content", content}, {"special", false}, {"normalized", false}};
    for (const char* f : flags) {
        t[f] = true;
    }
    return t;
}

std::vector<TokenId> encode(const Tokenizer& tok, std::string_view text, bool special = true) {
    auto ids = tok.encode(text, special);
    REQUIRE_MESSAGE(ids.ok(), ids.status().to_string());
    return *ids;
}

using Part = std::variant<const char*, TokenId>;

// Ids of the plain texts and added-token ids in order, each text encoded on its own.
std::vector<TokenId> join(const Tokenizer& tok, std::vector<Part> parts) {
    std::vector<TokenId> out;
    for (const auto& p : parts) {
        if (std::holds_alternative<TokenId>(p)) {
            out.push_back(std::get<TokenId>(p));
        } else {
            const auto ids = encode(tok, std::get<const char*>(p), false);
            out.insert(out.end(), ids.begin(), ids.end());
        }
    }
    return out;
}

TEST_CASE("added tokens: lstrip and rstrip take the whitespace beside the token") {
    auto tok = with_added(
        {token("<L>", {"lstrip", "special"}), token("<R>", {"rstrip"}), token("<P>", {})});
    const TokenId l = 512, r = 513, p = 514;
    CHECK(encode(*tok, "x \n\t<L> y") == join(*tok, {"x", l, " y"}));
    CHECK(encode(*tok, "x <R> \n y") == join(*tok, {"x ", r, "y"}));
    CHECK(encode(*tok, "x <P> y") == join(*tok, {"x ", p, " y"}));
    // lstrip stops where the previous token ended: here <R> already took the spaces.
    CHECK(encode(*tok, "<R>  <L>") == std::vector<TokenId>{r, l});
    CHECK(encode(*tok, "<P>  <L>") == std::vector<TokenId>{p, l});
    // Unicode White_Space, as Rust's \s: U+0085 and U+3000 are stripped, U+FEFF is not.
    CHECK(encode(*tok, "x\u0085\u3000<L>") == join(*tok, {"x", l}));
    CHECK(encode(*tok, "x\ufeff<L>") == join(*tok, {"x\ufeff", l}));
}

TEST_CASE("added tokens: single_word matches only where no word character touches it") {
    auto tok =
        with_added({token("[W]", {"single_word"}), token("ab", {"single_word"}), token("b", {})});
    const TokenId w = 512, ab = 513, b = 514;
    CHECK(encode(*tok, "x [W] y") == join(*tok, {"x ", w, " y"}));
    CHECK(encode(*tok, "-[W].") == join(*tok, {"-", w, "."}));
    CHECK(encode(*tok, "x[W] y") == join(*tok, {"x[W] y"}));
    CHECK(encode(*tok, "x [W]9") == join(*tok, {"x [W]9"}));
    CHECK(encode(*tok, "\u00e9[W]") == join(*tok, {"\u00e9[W]"}));
    CHECK(encode(*tok, "a ab") == join(*tok, {"a ", ab}));
    // A refused match is skipped whole: the "b" inside it is not looked for.
    CHECK(encode(*tok, "xab") == join(*tok, {"xab"}));
    CHECK(encode(*tok, "xa b") == join(*tok, {"xa ", b}));
}

TEST_CASE("added tokens: normalized ones match the normalised text, the others the raw text") {
    // \u00e9 is NFC for "e\u0301".
    json::object hello = token("h\u00e9llo", {"normalized"});
    json::object ex = token("e\u0301x", {"normalized"});
    json::object raw = token("o\u0301k", {});
    json::object implied{{"content", "i\u0301j"}, {"special", false}};  // normalized: !special
    auto tok = with_added({hello, ex, raw, implied});
    const TokenId h = 512, e = 513, o = 514, q = 515;
    CHECK(encode(*tok, "he\u0301llo") == std::vector<TokenId>{h});
    CHECK(encode(*tok, "h\u00e9llo") == std::vector<TokenId>{h});
    CHECK(encode(*tok, "\u00e9x") == std::vector<TokenId>{e});
    CHECK(encode(*tok, "e\u0301x") == std::vector<TokenId>{e});
    CHECK(encode(*tok, "o\u0301k") == std::vector<TokenId>{o});
    CHECK(encode(*tok, "\u00f3k") == join(*tok, {"\u00f3k"}));
    CHECK(encode(*tok, "\u00edj") == std::vector<TokenId>{q});
    // Raw-text tokens are found first, and the normalised ones only between them.
    CHECK(encode(*tok, "o\u0301khe\u0301llo") == std::vector<TokenId>{o, h});
}

TEST_CASE("added tokens: without parse_special none matches, special or not") {
    auto tok = with_added({token("<P>", {}), token("<S>", {"special"})});
    CHECK(encode(*tok, "a<P><S>", false) == join(*tok, {"a<P><S>"}));
    CHECK(encode(*tok, "a<P><S>") == join(*tok, {"a", 512, 513}));
}

TEST_CASE("added tokens: a flag that is not a boolean is an error naming it") {
    auto tok = Tokenizer::from_json(R"({"model":{"type":"BPE","vocab":{}},)"
                                    R"("added_tokens":[{"id":0,"content":"x","lstrip":1}]})");
    REQUIRE_FALSE(tok.ok());
    CHECK(tok.status().code() == StatusCode::kInvalidArgument);
    CHECK(tok.status().message().find("added_tokens[0].lstrip") != std::string::npos);
}

TEST_CASE("added vocabulary: spans cover the text, stripped whitespace inside the token") {
    AddedToken l{7, "<L>", false};
    l.lstrip = true;
    l.rstrip = true;
    auto v = AddedVocabulary::build({l}, Normalizer());
    REQUIRE(v.ok());
    std::vector<AddedVocabulary::Span> spans;
    v->split("a  <L>  b", /*normalized=*/false, &spans);
    REQUIRE(spans.size() == 3);
    CHECK(spans[0].begin == 0);
    CHECK(spans[0].end == 1);
    CHECK(spans[1].begin == 1);
    CHECK(spans[1].end == 8);
    CHECK(spans[1].token->id == 7);
    CHECK(spans[2].begin == 8);
    CHECK(spans[2].token == nullptr);
    v->split("a  <L>  b", /*normalized=*/true, &spans);
    REQUIRE(spans.size() == 1);
    CHECK(spans[0].end == 9);
}

// --- The automaton against the per-pattern search it replaced ---

// The code points the random texts below are made of, with the classes the reference gives
// them (an oracle independent of the ICU lookups the implementation makes).
bool ref_is_word(uint32_t c) {
    return (c < 0x80 && (std::isalnum(static_cast<int>(c)) != 0 || c == '_')) || c == 0xE9 ||
           c == 0x301 || c == 0x200D;
}

bool ref_is_space(uint32_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == 0x85 || c == 0xA0 || c == 0x3000;
}

uint32_t char_at(std::string_view text, size_t at) {
    return utf8_decode(text.substr(at), utf8_valid_sequence(text.substr(at)));
}

size_t char_start_before(std::string_view text, size_t at) {
    do {
        --at;
    } while ((static_cast<uint8_t>(text[at]) & 0xC0) == 0x80);
    return at;
}

struct RefSpan {
    size_t begin = 0;
    size_t end = 0;
    TokenId id = -1;  // -1: text between tokens.
};

// "[0,3) 100 [3,5) -": spans as a failed check prints them.
std::string describe(const std::vector<RefSpan>& spans) {
    std::string out;
    for (const RefSpan& s : spans) {
        out += "[" + std::to_string(s.begin) + "," + std::to_string(s.end) + ") " +
               (s.id < 0 ? std::string("-") : std::to_string(s.id)) + " ";
    }
    return out;
}

// The search AddedVocabulary made before it had an automaton, written plainly: at each byte the
// longest pattern of the pass that starts there (the first token on a tie), refused or taken,
// and the scan goes on after it.
std::vector<RefSpan> reference_split(const std::vector<AddedToken>& tokens,
                                     const Normalizer& normalizer, std::string_view text,
                                     bool normalized) {
    std::vector<std::string> patterns;
    for (const AddedToken& t : tokens) {
        patterns.push_back(t.normalized != normalized ? ""
                           : normalized               ? *normalizer.normalize(t.content)
                                                      : t.content);
    }
    std::vector<RefSpan> out;
    size_t emitted = 0;
    size_t pos = 0;
    while (pos < text.size()) {
        int best = -1;
        for (size_t t = 0; t < tokens.size(); ++t) {
            if (!patterns[t].empty() && text.substr(pos).starts_with(patterns[t]) &&
                (best < 0 || patterns[t].size() > patterns[best].size())) {
                best = static_cast<int>(t);
            }
        }
        if (best < 0) {
            ++pos;
            continue;
        }
        const AddedToken& token = tokens[best];
        size_t begin = pos;
        size_t end = pos + patterns[best].size();
        pos = end;
        if (token.single_word &&
            ((begin > 0 && ref_is_word(char_at(text, char_start_before(text, begin)))) ||
             (end < text.size() && ref_is_word(char_at(text, end))))) {
            continue;
        }
        while (token.lstrip && begin > emitted &&
               ref_is_space(char_at(text, char_start_before(text, begin)))) {
            begin = char_start_before(text, begin);
        }
        while (token.rstrip && end < text.size() && ref_is_space(char_at(text, end))) {
            end += utf8_valid_sequence(text.substr(end));
        }
        if (begin > emitted) {
            out.push_back({emitted, begin, -1});
        }
        out.push_back({std::max(begin, emitted), std::max(end, emitted), token.id});
        emitted = std::max(end, emitted);
    }
    if (emitted < text.size()) {
        out.push_back({emitted, text.size(), -1});
    }
    return out;
}

std::vector<RefSpan> split(const AddedVocabulary& v, std::string_view text, bool normalized) {
    std::vector<AddedVocabulary::Span> spans;
    v.split(text, normalized, &spans);
    std::vector<RefSpan> out;
    for (const AddedVocabulary::Span& s : spans) {
        out.push_back({s.begin, s.end, s.token == nullptr ? -1 : s.token->id});
    }
    return out;
}

// The first `chars` code points of valid UTF-8 `text`.
std::string_view char_prefix(std::string_view text, size_t chars) {
    size_t at = 0;
    for (; chars > 0 && at < text.size(); --chars) {
        at += utf8_valid_sequence(text.substr(at));
    }
    return text.substr(0, at);
}

TEST_CASE("added vocabulary: the automaton splits as the per-pattern search did") {
    // Prefixes of one another, shared suffixes, whitespace tokens (for rstrip runs), and "é"
    // against its decomposition (normalised tokens). Picked with replacement: two tokens may have
    // one content.
    const std::vector<std::string> contents = {"<",
                                               "<|",
                                               "<|a|>",
                                               "<|ab|>",
                                               "<|ab",
                                               "a",
                                               "ab",
                                               "b",
                                               "\uff5c>",
                                               "<\uff5cx\u2581y\uff5c>",
                                               "<\uff5cx\u2581",
                                               "<\uff5cx\u2581y\uff5c>z",
                                               " <s>",
                                               "\n",
                                               "\n\n",
                                               "  ",
                                               "\u3000<",
                                               "\u00e9",
                                               "e\u0301"};
    const std::vector<std::string> other = {"a",      "b", "Z",  "9",      "_",      "\u0301",
                                            "\u200d", " ", "\t", "\n",     "\u3000", "\u0085",
                                            "\u00a0", "<", ">",  "|",      "\uff5c", "\u2581",
                                            "\ufeff", "-", ".",  "\u00e9", "e"};
    const Normalizer nfc(NormalizerKind::kNfc);
    std::mt19937 rng(20261205);
    auto pick = [&rng](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
    size_t compared_tokens = 0;
    for (int vocab = 0; vocab < 1000; ++vocab) {
        std::vector<AddedToken> tokens;
        const size_t count = 1 + pick(8);
        for (size_t i = 0; i < count; ++i) {
            AddedToken t{static_cast<TokenId>(100 + i), contents[pick(contents.size())], false};
            t.single_word = pick(3) == 0;
            t.lstrip = pick(3) == 0;
            t.rstrip = pick(3) == 0;
            t.normalized = pick(3) == 0;
            tokens.push_back(t);
        }
        auto v = AddedVocabulary::build(tokens, nfc);
        REQUIRE_MESSAGE(v.ok(), v.status().to_string());
        for (int trial = 0; trial < 40; ++trial) {
            std::string text;
            const size_t fragments = pick(30);
            for (size_t f = 0; f < fragments; ++f) {
                switch (pick(3)) {
                    case 0:
                        text += tokens[pick(tokens.size())].content;
                        break;
                    case 1: {
                        const std::string& c = tokens[pick(tokens.size())].content;
                        text += char_prefix(c, pick(utf8_length(c) + 1));
                        break;
                    }
                    default:
                        text += other[pick(other.size())];
                }
            }
            for (bool normalized : {false, true}) {
                const std::vector<RefSpan> want = reference_split(tokens, nfc, text, normalized);
                CAPTURE(text);
                CAPTURE(normalized);
                CAPTURE(vocab);
                REQUIRE(describe(split(*v, text, normalized)) == describe(want));
                compared_tokens += static_cast<size_t>(std::count_if(
                    want.begin(), want.end(), [](const RefSpan& s) { return s.id >= 0; }));
            }
        }
    }
    CHECK(compared_tokens > 30000);  // The texts did exercise the tokens.
}

// Fastest of `runs` runs of `fn`, in seconds: the least disturbed by other processes.
double fastest_seconds(int runs, const std::function<void()>& fn) {
    double best = 1e9;
    for (int i = 0; i < runs; ++i) {
        const auto start = std::chrono::steady_clock::now();
        fn();
        best = std::min(
            best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
}

TEST_CASE("added vocabulary: a thousand tokens with one first byte cost what one does") {
    // DeepSeek-V3's ~800 placeholders all start with "<": scanning 1 MiB of "<" tried each of
    // them at every byte (seconds per request).
    std::vector<AddedToken> many;
    for (int i = 0; i < 1000; ++i) {
        many.push_back(
            {i, "<\uff5cplace\u2581holder\u2581no\u2581" + std::to_string(i) + "\uff5c>", true});
    }
    auto one = AddedVocabulary::build({many[0]}, Normalizer());
    auto all = AddedVocabulary::build(many, Normalizer());
    REQUIRE(one.ok());
    REQUIRE(all.ok());
    const std::string text(1 << 20, '<');
    std::vector<AddedVocabulary::Span> spans;
    const double base = fastest_seconds(5, [&] { one->split(text, false, &spans); });
    const double cost = fastest_seconds(3, [&] { all->split(text, false, &spans); });
    CHECK(spans.size() == 1);
    CAPTURE(base);
    CHECK(cost < 20 * base + 0.005);
}

TEST_CASE("added vocabulary: an rstrip token in a long whitespace run costs linear time") {
    // Each "\n" of the run matches and its rstrip takes the rest of the run: walking that again
    // for every match was quadratic in the run.
    AddedToken newline{7, "\n", false};
    newline.rstrip = true;
    auto v = AddedVocabulary::build({newline}, Normalizer());
    REQUIRE(v.ok());
    const std::string small(2048, '\n');
    const std::string large(16 * small.size(), '\n');
    std::vector<AddedVocabulary::Span> spans;
    const double base = fastest_seconds(5, [&] { v->split(small, false, &spans); });
    const double cost = fastest_seconds(3, [&] { v->split(large, false, &spans); });
    REQUIRE(spans.size() == large.size());
    CHECK(spans[0].end == large.size());
    CHECK(spans[1].begin == large.size());
    CAPTURE(base);
    CHECK(cost < 4 * 16 * base + 0.005);
}

}  // namespace
}  // namespace edge::engine::tokenizer
