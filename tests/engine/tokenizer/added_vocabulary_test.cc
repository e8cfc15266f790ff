#include "engine/tokenizer/added_vocabulary.h"

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <fstream>
#include <sstream>
#include <variant>

#include "engine/tokenizer/tokenizer.h"

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

}  // namespace
}  // namespace edge::engine::tokenizer
