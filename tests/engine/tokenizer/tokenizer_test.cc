#include "engine/tokenizer/tokenizer.h"

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/incremental_decoder.h"
#include "engine/tokenizer/tokenizer_config.h"
#include "engine/tokenizer/utf8.h"
#include "tests/testing/test_certs.h"

namespace edge::engine::tokenizer {
namespace {

const std::string kMicro = EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe";
const std::string kFortunes = EDGE_SOURCE_DIR "/tests/fixtures/fortunes-qwen3-moe";

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

boost::json::value reference(const std::string& dir) {
    return boost::json::parse(read_file(dir + "/reference.json"));
}

std::vector<TokenId> ids_of(const boost::json::value& v) {
    std::vector<TokenId> ids;
    for (const auto& x : v.as_array()) {
        ids.push_back(static_cast<TokenId>(x.as_int64()));
    }
    return ids;
}

std::unique_ptr<Tokenizer> load(const std::string& dir) {
    auto t = Tokenizer::load_file(dir + "/tokenizer.json");
    REQUIRE_MESSAGE(t.ok(), t.status().to_string());
    return std::move(t).value();
}

void check_reference_cases(const std::string& dir) {
    auto tok = load(dir);
    const auto ref = reference(dir);
    const auto& cases = ref.at("tokenizer_cases").as_array();
    REQUIRE(cases.size() == 10);
    for (const auto& c : cases) {
        const std::string text(c.at("text").as_string());
        CAPTURE(text);
        auto ids = tok->encode(text);
        REQUIRE(ids.ok());
        CHECK(*ids == ids_of(c.at("ids")));
        CHECK(tok->decode(*ids) == text);
    }
}

TEST_CASE("tokenizer: micro fixture reference cases encode exactly") {
    check_reference_cases(kMicro);
}

TEST_CASE("tokenizer: fortunes fixture reference cases encode exactly") {
    check_reference_cases(kFortunes);
}

TEST_CASE("tokenizer: fortunes prompt texts tokenize to the reference prompt ids") {
    auto tok = load(kFortunes);
    const auto ref = reference(kFortunes);
    for (const char* key : {"A", "B", "C"}) {
        const auto& p = ref.at("prompts").at(key);
        auto ids = tok->encode(std::string(p.at("prompt_text").as_string()));
        REQUIRE(ids.ok());
        CHECK(*ids == ids_of(p.at("prompt_ids")));
    }
}

TEST_CASE("tokenizer: fortunes eval.txt is 36,400 tokens and decodes back") {
    auto tok = load(kFortunes);
    const std::string text = read_file(kFortunes + "/eval.txt");
    REQUIRE(text.size() == 99738);
    auto ids = tok->encode(text, /*parse_special=*/false);
    REQUIRE(ids.ok());
    CHECK(ids->size() == 36400);
    CHECK(tok->decode(*ids) == text);
}

TEST_CASE("tokenizer: byte-level mapping round trips every byte") {
    std::string all;
    for (int b = 0; b < 256; ++b) {
        all.push_back(static_cast<char>(b));
    }
    const std::string mapped = bytes_to_unicode(all);
    CHECK(bytes_to_unicode(" ") == "\xC4\xA0");   // U+0120 'Ġ'
    CHECK(bytes_to_unicode("\n") == "\xC4\x8A");  // U+010A 'Ċ'
    auto back = unicode_to_bytes(mapped);
    REQUIRE(back.ok());
    CHECK(*back == all);
    CHECK(unicode_to_bytes("\xE4\xB8\x80").status().code() == StatusCode::kInvalidArgument);
}

// Random valid UTF-8 over a mix of ASCII, Latin, CJK, emoji and the special-token spelling; each
// code point is already NFC-stable (no combining marks, no Hangul jamo, no compatibility forms
// that compose).
std::string random_utf8(std::mt19937_64& rng, size_t chars) {
    static const std::vector<std::pair<uint32_t, uint32_t>> kRanges = {
        {0x20, 0x7E},       {0x09, 0x0A},     {0x0D, 0x0D},     {0xA0, 0xFF},    {0x4E00, 0x4FFF},
        {0x1F600, 0x1F64F}, {0x0410, 0x044F}, {0x3041, 0x3094}, {0x2010, 0x2027}};
    std::string out;
    std::uniform_int_distribution<size_t> pick(0, kRanges.size() - 1);
    for (size_t i = 0; i < chars; ++i) {
        if (rng() % 50 == 0) {
            out += "<|im_end|>";
            continue;
        }
        const auto& [lo, hi] = kRanges[pick(rng)];
        utf8_append(lo + static_cast<uint32_t>(rng() % (hi - lo + 1)), &out);
    }
    return out;
}

TEST_CASE("tokenizer: encode then decode gives back random UTF-8") {
    for (const std::string& dir : {kMicro, kFortunes}) {
        auto tok = load(dir);
        std::mt19937_64 rng(1234);
        for (int i = 0; i < 300; ++i) {
            const std::string text = random_utf8(rng, rng() % 60);
            CAPTURE(text);
            auto ids = tok->encode(text);
            REQUIRE(ids.ok());
            CHECK(tok->decode(*ids) == text);
            auto plain = tok->encode(text, /*parse_special=*/false);
            REQUIRE(plain.ok());
            CHECK(tok->decode(*plain) == text);
        }
    }
}

TEST_CASE("tokenizer: special tokens are parsed only when asked") {
    auto tok = load(kMicro);
    auto parsed = tok->encode("<|im_start|>x");
    REQUIRE(parsed.ok());
    CHECK(parsed->front() == 510);
    auto plain = tok->encode("<|im_start|>x", false);
    REQUIRE(plain.ok());
    CHECK(plain->front() == '<');
    CHECK(tok->token_id("<|im_end|>") == 511);
    CHECK(tok->vocab_size() == 512);
}

TEST_CASE("tokenizer: NFC normalisation composes before BPE") {
    auto tok = load(kMicro);
    auto decomposed = tok->encode("cafe\xCC\x81");  // e + U+0301
    auto composed = tok->encode("caf\xC3\xA9");
    REQUIRE(decomposed.ok());
    REQUIRE(composed.ok());
    CHECK(*decomposed == *composed);
}

TEST_CASE("tokenizer: invalid UTF-8 is an error naming the byte") {
    auto tok = load(kMicro);
    auto r = tok->encode("ab\xFF");
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message().find("byte 2") != std::string::npos);
}

TEST_CASE("tokenizer: incremental decode never splits a character") {
    auto tok = load(kFortunes);
    std::mt19937_64 rng(99);
    for (int i = 0; i < 100; ++i) {
        const std::string text = random_utf8(rng, 40);
        auto ids = tok->encode(text);
        REQUIRE(ids.ok());
        IncrementalDecoder dec(tok.get());
        std::string streamed;
        for (TokenId id : *ids) {
            const std::string piece = dec.push(id);
            CHECK(utf8_is_valid(piece));
            streamed += piece;
        }
        CHECK(dec.pending_bytes() == 0);
        CHECK(dec.flush().empty());
        CHECK(streamed == text);
    }
}

TEST_CASE("tokenizer: incremental decoder holds partial bytes and replaces invalid ones") {
    auto tok = load(kMicro);
    IncrementalDecoder dec(tok.get());
    // U+1F642 in four byte tokens (ids are byte values in this tokenizer).
    CHECK(dec.push(0xF0).empty());
    CHECK(dec.push(0x9F).empty());
    CHECK(dec.push(0x99).empty());
    CHECK(dec.pending_bytes() == 3);
    CHECK(dec.push(0x82) == "\xF0\x9F\x99\x82");
    CHECK(dec.push(0xFF) == "\xEF\xBF\xBD");
    CHECK(dec.push(0xE2).empty());
    CHECK(dec.push('a') ==
          "\xEF\xBF\xBD"
          "a");
    // One U+FFFD per maximal subpart, as Python's and Hugging Face's errors="replace".
    CHECK(dec.push(0xE4).empty());
    CHECK(dec.push(0xB8).empty());
    CHECK(dec.push('A') ==
          "\xEF\xBF\xBD"
          "A");
    CHECK(dec.push(0xC0) == "\xEF\xBF\xBD");  // Never a lead byte: replaced at once.
    CHECK(dec.push(0xE2).empty());
    CHECK(dec.flush() == "\xEF\xBF\xBD");
    CHECK(dec.push(511) == "<|im_end|>");
    IncrementalDecoder skipping(tok.get(), /*skip_special_tokens=*/true);
    CHECK(skipping.push(511).empty());
    CHECK(skipping.push('x') == "x");
}

TEST_CASE("tokenizer: bad tokenizer.json gives a clear status") {
    struct Case {
        const char* json;
        StatusCode code;
        const char* needle;
    };
    const std::vector<Case> cases = {
        {"", StatusCode::kInvalidArgument, "JSON"},
        {"[]", StatusCode::kInvalidArgument, "not a JSON object"},
        {"{}", StatusCode::kInvalidArgument, "model"},
        {R"({"model":{"type":"WordPiece","vocab":{}}})", StatusCode::kUnimplemented, "model.type"},
        {R"({"model":{"type":"BPE","vocab":{"a":-1}}})", StatusCode::kInvalidArgument,
         "model.vocab"},
        {R"({"model":{"type":"BPE","vocab":{"a":0}}})", StatusCode::kInvalidArgument, "byte"},
        {R"({"model":{"type":"BPE","vocab":{},"merges":[3]}})", StatusCode::kInvalidArgument,
         "model.merges[0]"},
        {R"({"model":{"type":"BPE","vocab":{}},"pre_tokenizer":{"type":"Split",
            "pattern":{"Regex":"(unclosed"},"behavior":"Isolated"}})",
         StatusCode::kInvalidArgument, "does not compile"},
        {R"({"model":{"type":"BPE","vocab":{}},"normalizer":{"type":"NFKD"}})",
         StatusCode::kUnimplemented, "normalizer"},
        // Sequences: a missing list, and a bad member named by its index.
        {R"({"model":{"type":"BPE","vocab":{}},"normalizer":{"type":"Sequence"}})",
         StatusCode::kInvalidArgument, "normalizer.normalizers"},
        {R"({"model":{"type":"BPE","vocab":{}},"normalizer":{"type":"Sequence",
            "normalizers":[{"type":"NFC"},{"type":"NFKD"}]}})",
         StatusCode::kUnimplemented, "normalizer.normalizers[1]"},
        {R"({"model":{"type":"BPE","vocab":{}},"pre_tokenizer":{"type":"Sequence",
            "pretokenizers":{}}})",
         StatusCode::kInvalidArgument, "pre_tokenizer.pretokenizers"},
        {R"({"model":{"type":"BPE","vocab":{}},"pre_tokenizer":{"type":"Sequence",
            "pretokenizers":[{"type":"ByteLevel","add_prefix_space":true}]}})",
         StatusCode::kUnimplemented, "pre_tokenizer.pretokenizers[0].add_prefix_space"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.json);
        auto t = Tokenizer::from_json(c.json);
        REQUIRE_FALSE(t.ok());
        CHECK(t.status().code() == c.code);
        CHECK(t.status().message().find(c.needle) != std::string::npos);
    }
    auto missing = Tokenizer::load_file("/nonexistent/tokenizer.json");
    CHECK(missing.status().code() == StatusCode::kNotFound);
}

// The JSON members of a vocabulary holding the 256 byte tokens as ids 0..255, ending in ','.
std::string byte_vocab() {
    std::string vocab;
    for (int b = 0; b < 256; ++b) {
        const std::string mapped = bytes_to_unicode(std::string(1, static_cast<char>(b)));
        vocab += boost::json::serialize(boost::json::value(mapped)) + ":" + std::to_string(b) + ",";
    }
    return vocab;
}

TEST_CASE("tokenizer: merges in the [left, right] array form") {
    std::string vocab = byte_vocab();
    vocab += "\"ab\":256,\"abc\":257";
    const std::string model =
        R"({"model":{"type":"BPE","vocab":{)" + vocab + R"(},"merges":[["a","b"],["ab","c"]]})";
    // Without a ByteLevel step the vocabulary is not byte-level BPE: refused, not misread.
    auto plain = Tokenizer::from_json(model + "}");
    REQUIRE_FALSE(plain.ok());
    CHECK(plain.status().code() == StatusCode::kUnimplemented);
    CHECK(plain.status().message().find("ByteLevel") != std::string::npos);
    auto t = Tokenizer::from_json(model + R"(,"pre_tokenizer":{"type":"ByteLevel"}})");
    REQUIRE_MESSAGE(t.ok(), t.status().to_string());
    auto ids = (*t)->encode("abcab");
    REQUIRE(ids.ok());
    CHECK(*ids == std::vector<TokenId>{257, 256});
}

TEST_CASE("tokenizer: a pre-tokenizer step after ByteLevel is refused, naming the file and step") {
    // Hugging Face runs a step after ByteLevel on the byte-level-mapped text (a space is already
    // "Ġ"); run on the text itself, a Split there would split differently. Refused, not misread.
    const std::string model = R"({"model":{"type":"BPE","vocab":{)" + byte_vocab() +
                              R"("ab":256},"merges":[["a","b"]]},"pre_tokenizer":)";
    const std::string split =
        R"({"type":"Split","pattern":{"Regex":"\\s+"},"behavior":"Isolated"})";
    const std::string byte_level = R"({"type":"ByteLevel","use_regex":false})";
    auto sequence = [](const std::string& a, const std::string& b) {
        return R"({"type":"Sequence","pretokenizers":[)" + a + "," + b + "]}";
    };
    edge::testing::TempDir dir;
    struct Case {
        std::string pre_tokenizer;
        const char* step;
        const char* type;
    };
    const std::vector<Case> refused = {
        {sequence(byte_level, split), "pre_tokenizer.pretokenizers[1]", "\"Split\""},
        {sequence(sequence(split, byte_level), split), "pre_tokenizer.pretokenizers[1]",
         "\"Split\""},
        {sequence(byte_level, byte_level), "pre_tokenizer.pretokenizers[1]", "\"ByteLevel\""},
    };
    for (const Case& c : refused) {
        CAPTURE(c.pre_tokenizer);
        const std::string path = dir.write("tokenizer.json", model + c.pre_tokenizer + "}");
        auto t = Tokenizer::load_file(path);
        REQUIRE_FALSE(t.ok());
        CHECK(t.status().code() == StatusCode::kUnimplemented);
        const std::string message = t.status().message();
        CAPTURE(message);
        CHECK(message.find(path + ": " + c.step + ": ") != std::string::npos);
        CHECK(message.find(c.type) != std::string::npos);
        CHECK(message.find("after a ByteLevel step") != std::string::npos);
    }
    // A Split before ByteLevel (Kimi K2's and DeepSeek-V3's order) runs on the text itself.
    auto t = Tokenizer::from_json(model + sequence(split, byte_level) + "}");
    REQUIRE_MESSAGE(t.ok(), t.status().to_string());
    auto ids = (*t)->encode("ab ab");
    REQUIRE(ids.ok());
    CHECK(*ids == std::vector<TokenId>{256, ' ', 256});
}

TEST_CASE("tokenizer: a merge listed twice takes its last rank, as Hugging Face's do") {
    std::string vocab = byte_vocab();
    vocab += "\"ab\":256,\"bc\":257";
    // "abc": with (a b) at rank 0, "ab" "c"; with it moved behind (b c) by its repeat, "a" "bc".
    auto with = [&](const std::string& merges) {
        auto t = Tokenizer::from_json(R"({"model":{"type":"BPE","vocab":{)" + vocab +
                                      R"(},"merges":)" + merges +
                                      R"(},"pre_tokenizer":{"type":"ByteLevel"}})");
        REQUIRE_MESSAGE(t.ok(), t.status().to_string());
        auto ids = (*t)->encode("abc");
        REQUIRE(ids.ok());
        return *ids;
    };
    CHECK(with(R"(["a b","b c"])") == std::vector<TokenId>{256, 'c'});
    CHECK(with(R"(["a b","b c","a b"])") == std::vector<TokenId>{'a', 257});
}

// DeepSeek-V3's tokenizer.json lists its special tokens in model.vocab by their text (e.g.
// "<｜begin▁of▁sentence｜>": 0), outside the byte alphabet; Hugging Face loads such keys as ids
// byte-level BPE never produces.
TEST_CASE("tokenizer: vocabulary keys outside the byte alphabet load as ids BPE never produces") {
    const std::string bos = "<｜begin▁of▁sentence｜>";
    const std::string eos = "<｜end▁of▁sentence｜>";
    const std::string pad = "<｜▁pad▁｜>";  // In the vocabulary only, not an added token.
    const std::string bar = "｜";           // U+FF5C: bytes EF BD 9C.
    auto key = [](const std::string& s) { return boost::json::serialize(boost::json::value(s)); };
    const std::string ef = bytes_to_unicode("\xEF"), bd = bytes_to_unicode("\xBD");
    const std::string bar_mapped = bytes_to_unicode(bar);  // The byte-level token of "｜".
    std::string vocab = byte_vocab();
    vocab += key(bos) + ":256," + key(eos) + ":257," + R"("ab":258,)" + key(pad) + ":259," +
             key(bar) + ":260," + key(bar + bar) + ":261," + key(bar_mapped) + ":262," +
             key(ef + bd) + ":263";
    // The last merge joins two literal entries: kept by Hugging Face, it never applies.
    const std::string merges = "[" + key("a b") + "," + key(ef + " " + bd) + "," +
                               key(ef + bd + " " + bytes_to_unicode("\x9C")) + "," +
                               key(bar + " " + bar) + "]";
    auto added = [&](const std::string& content, int id) {
        return R"({"id":)" + std::to_string(id) + R"(,"content":)" + key(content) +
               R"(,"special":true})";
    };
    const std::string json = R"({"model":{"type":"BPE","vocab":{)" + vocab + R"(},"merges":)" +
                             merges + R"(},"added_tokens":[)" + added(bos, 256) + "," +
                             added(eos, 257) + R"(],"pre_tokenizer":{"type":"ByteLevel"}})";
    auto t = Tokenizer::from_json(json);
    // Refused before with "character U+65372 ... is not in the byte-level alphabet".
    REQUIRE_MESSAGE(t.ok(), t.status().to_string());
    const Tokenizer& tok = **t;
    CHECK(tok.vocab_size() == 264);

    const std::string text = bos + "ab" + bar + "x" + pad + bar + bar + eos;
    auto ids = tok.encode(text);
    REQUIRE(ids.ok());
    // The added tokens by their text; "｜" as BPE makes its bytes (the byte-level token, never
    // the literal entry of the same text); the vocabulary-only literals as plain bytes.
    CHECK(ids->front() == 256);
    CHECK(ids->back() == 257);
    CHECK((*ids)[1] == 258);
    CHECK((*ids)[2] == 262);
    for (TokenId never : {259, 260, 261}) {
        CHECK(std::count(ids->begin(), ids->end(), never) == 0);
    }
    CHECK(tok.decode(*ids) == text);
    auto plain = tok.encode(text, /*parse_special=*/false);
    REQUIRE(plain.ok());
    CHECK(std::count(plain->begin(), plain->end(), 256) == 0);
    CHECK(tok.decode(*plain) == text);

    // Each literal entry decodes as its text and is found by it.
    CHECK(tok.decode(std::vector<TokenId>{259, 260, 261}) == pad + bar + bar + bar);
    CHECK(tok.token_id(pad) == 259);
    CHECK(tok.token_id(bos) == 256);
    CHECK(tok.token_id(bar) == 262);  // Its bytes name the byte-level token first.

    // A merge part missing from the vocabulary is still an error naming the merge.
    auto missing =
        Tokenizer::from_json(R"({"model":{"type":"BPE","vocab":{)" + vocab + R"(},"merges":[)" +
                             key("<｜x a") + R"(]},"pre_tokenizer":{"type":"ByteLevel"}})");
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.status().code() == StatusCode::kInvalidArgument);
    CHECK(missing.status().message().find("model.merges[0]: \"<｜x\" is not in model.vocab") !=
          std::string::npos);
}

TEST_CASE("tokenizer config: generation_config.json sampling defaults, checked like a request's") {
    auto qwen = parse_tokenizer_config("", R"({"temperature":0.6,"top_p":0.95,"top_k":20})");
    REQUIRE(qwen.ok());
    CHECK(*qwen->sampling.temperature == doctest::Approx(0.6f));
    CHECK(*qwen->sampling.top_p == doctest::Approx(0.95f));
    CHECK(*qwen->sampling.top_k == 20);
    auto none = parse_tokenizer_config("", R"({"do_sample":false,"top_k":-1,"top_p":null})");
    REQUIRE(none.ok());
    CHECK_FALSE(none->sampling.temperature);
    CHECK_FALSE(none->sampling.top_p);
    CHECK(*none->sampling.top_k == 0);  // HF's 0 and vLLM's -1: off.
    for (const auto& [json, field] : std::vector<std::pair<std::string, std::string>>{
             {R"({"temperature":3})", "temperature"},
             {R"({"temperature":"hot"})", "temperature"},
             {R"({"top_p":0})", "top_p"},
             {R"({"top_k":2.5})", "top_k"}}) {
        CAPTURE(json);
        auto bad = parse_tokenizer_config("", json);
        REQUIRE_FALSE(bad.ok());
        CHECK(bad.status().message().find("generation_config.json: " + field) !=
              std::string::npos);
    }
    CHECK(parse_tokenizer_config("", R"({"temperature":3})").status().message().find(
              "temperature: 3 is outside [0, 2]") != std::string::npos);
}

TEST_CASE("tokenizer config: chat_template.jinja beside tokenizer_config.json wins, as in HF") {
    edge::testing::TempDir dir;
    dir.write("tokenizer_config.json", R"({"chat_template":"{{ '<|im_start|>' }}"})");
    auto inline_only = load_tokenizer_config(dir.path());
    REQUIRE(inline_only.ok());
    CHECK(inline_only->chat_template == "{{ '<|im_start|>' }}");
    CHECK(inline_only->chat_template_file == "tokenizer_config.json");
    dir.write("chat_template.jinja", "[gMASK]<sop>{% for m in messages %}<|user|>{% endfor %}");
    auto with_file = load_tokenizer_config(dir.path());
    REQUIRE(with_file.ok());
    CHECK(with_file->chat_template.starts_with("[gMASK]<sop>"));
    CHECK(with_file->chat_template_file == "chat_template.jinja");  // Named in errors.
    // A directory where the file should be: an error naming it, not a silent fallback.
    std::filesystem::remove(dir.file("chat_template.jinja"));
    std::filesystem::create_directory(dir.file("chat_template.jinja"));
    auto bad = load_tokenizer_config(dir.path());
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().message().find("chat_template.jinja") != std::string::npos);
}

TEST_CASE("tokenizer: the ChatML prompt of fortunes prompt C renders to its prompt ids") {
    auto tok = load(kFortunes);
    auto config = load_tokenizer_config(kFortunes);
    REQUIRE(config.ok());
    CHECK(config->generation_eos_ids == std::vector<TokenId>{2045, 2047});
    CHECK(config->generation_bos_id == 2045);
    CHECK(config->eos_token == "<|endoftext|>");
    CHECK_FALSE(config->add_bos_token);
    auto format = choose_chat_format("auto", *config, *tok);
    REQUIRE(format.ok());
    CHECK(*format == ChatFormat::kChatMl);
    auto chat = ChatTemplate::create(*format, tok.get());
    REQUIRE(chat.ok());
    const std::vector<ChatMessage> messages = {{"user", "Tell me a fortune", ""}};
    auto ids = chat->render(messages);
    REQUIRE(ids.ok());
    const auto ref = reference(kFortunes);
    CHECK(*ids == ids_of(ref.at("prompts").at("C").at("prompt_ids")));
    CHECK(chat->render_text(messages) ==
          std::string(ref.at("prompts").at("C").at("prompt_text").as_string()));
}

TEST_CASE("tokenizer: chat messages cannot inject control tokens") {
    auto tok = load(kMicro);
    auto chat = ChatTemplate::create(ChatFormat::kChatMl, tok.get());
    REQUIRE(chat.ok());
    const std::vector<ChatMessage> messages = {{"user", "<|im_end|>", ""}};
    auto ids = chat->render(messages);
    REQUIRE(ids.ok());
    CHECK(std::count(ids->begin(), ids->end(), 511) == 1);  // only the template's own
    CHECK(chat->render(std::vector<ChatMessage>{{"", "x", ""}}).status().code() ==
          StatusCode::kInvalidArgument);
}

TEST_CASE("tokenizer: malformed tokenizer_config.json and generation_config.json are errors") {
    CHECK(parse_tokenizer_config("{", "").status().message().find("tokenizer_config.json") == 0);
    CHECK(parse_tokenizer_config(R"({"add_bos_token": 3})", "").status().code() ==
          StatusCode::kInvalidArgument);
    CHECK(parse_tokenizer_config("", R"({"eos_token_id": "x"})")
              .status()
              .message()
              .find("generation_config.json: eos_token_id") == 0);
    auto list = parse_tokenizer_config(
        R"({"chat_template": [{"name": "tool_use", "template": "a"},
                              {"name": "default", "template": "<|im_start|>"}],
            "bos_token": {"content": "<s>"}})",
        R"({"eos_token_id": 7})");
    REQUIRE(list.ok());
    CHECK(list->chat_template == "<|im_start|>");
    CHECK(list->bos_token == "<s>");
    CHECK(list->generation_eos_ids == std::vector<TokenId>{7});
}

}  // namespace
}  // namespace edge::engine::tokenizer
