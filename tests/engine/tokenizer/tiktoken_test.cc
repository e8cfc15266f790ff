// tiktoken model loading (Kimi K2's format) on a small generated file: ranks become merges that
// reproduce tiktoken's lowest-rank-pair BPE, Kimi K2's pre-tokenizer pattern compiles and splits,
// special tokens come from tokenizer_config.json, and bad lines are named.

#include "engine/tokenizer/tiktoken.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "engine/tools/quant_eval.h"

namespace edge::engine::tokenizer {
namespace {

std::string base64(std::string_view in) {
    static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    size_t i = 0;
    for (; i + 2 < in.size(); i += 3) {
        const uint32_t n = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
        out += {k[n >> 18], k[(n >> 12) & 63], k[(n >> 6) & 63], k[n & 63]};
    }
    if (in.size() - i == 1) {
        const uint32_t n = uint8_t(in[i]) << 16;
        out += {k[n >> 18], k[(n >> 12) & 63], '=', '='};
    } else if (in.size() - i == 2) {
        const uint32_t n = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
        out += {k[n >> 18], k[(n >> 12) & 63], k[(n >> 6) & 63], '='};
    }
    return out;
}

// 256 single bytes, then a few merged tokens, shuffled line order.
std::string model_text() {
    const char* merged[] = {"he", "ll", "hell", "hello", " w", "or", " wor", "ld", " world"};
    std::string out;
    int rank = 256;
    for (const char* m : merged) {
        out += base64(m) + " " + std::to_string(rank++) + "\n";
    }
    for (int b = 255; b >= 0; --b) {
        out += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
    }
    return out;
}

const std::vector<AddedToken> kSpecials = {{300, "[BOS]", true}, {301, "<|im_end|>", true}};

TEST_CASE("tiktoken: ranks merge like tiktoken") {
    auto tok = tokenizer_from_tiktoken(model_text(), kimi_k2_pattern(), kSpecials, "t.model");
    REQUIRE_MESSAGE(tok.ok(), tok.status().to_string());
    auto ids = (*tok)->encode("hello world");
    REQUIRE(ids.ok());
    CHECK(*ids == std::vector<TokenId>{259, 264});
    // "Hello's" is one piece (upper-then-lower letters with a contraction); only "ll" merges.
    ids = (*tok)->encode("Hello's");
    REQUIRE(ids.ok());
    CHECK(*ids == std::vector<TokenId>{72, 101, 257, 111, 39, 115});
    // Han runs are their own piece; bytes without merges stay bytes and decode back.
    const std::string mixed = "[BOS]hello中文 world<|im_end|>\n\n  x";
    ids = (*tok)->encode(mixed);
    REQUIRE(ids.ok());
    CHECK(ids->front() == 300);
    CHECK(ids->at(1) == 259);
    CHECK(std::count(ids->begin(), ids->end(), 301) == 1);
    CHECK((*tok)->decode(*ids) == mixed);
    ids = (*tok)->encode("<|im_end|>", /*parse_special=*/false);
    REQUIRE(ids.ok());
    CHECK(ids->size() > 1);
    CHECK((*tok)->is_special(301));
    CHECK((*tok)->vocab_size() == 302);
}

TEST_CASE("tiktoken: a piece that is itself a token is taken whole, as tiktoken does") {
    // "bc" ranks before "ab" and "cd", so merging alone stops at a, bc, d; tiktoken looks the
    // piece up before merging.
    std::string text;
    int rank = 256;
    for (const char* m : {"bc", "ab", "cd", "abcd"}) {
        text += base64(m) + " " + std::to_string(rank++) + "\n";
    }
    for (int b = 0; b < 256; ++b) {
        text += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
    }
    auto tok = tokenizer_from_tiktoken(text, kimi_k2_pattern(), {}, "t.model");
    REQUIRE_MESSAGE(tok.ok(), tok.status().to_string());
    auto ids = (*tok)->encode("abcd");
    REQUIRE(ids.ok());
    CHECK(*ids == std::vector<TokenId>{259});
    // Inside a longer piece the merges apply as before.
    ids = (*tok)->encode("abcde");
    REQUIRE(ids.ok());
    CHECK(*ids == std::vector<TokenId>{'a', 256, 'd', 'e'});
}

TEST_CASE("tiktoken: loads a directory with tokenizer_config.json specials") {
    const auto dir =
        std::filesystem::temp_directory_path() / ("tiktoken_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "tiktoken.model") << model_text();
    std::ofstream(dir / "tokenizer_config.json")
        << "{\"added_tokens_decoder\": {\"300\": {\"content\": \"<|im_user|>\", \"special\": "
           "true}, \"301\": {\"content\": \"<|im_middle|>\", \"special\": true}}}";
    auto tok = load_tiktoken_dir(dir.string());
    REQUIRE_MESSAGE(tok.ok(), tok.status().to_string());
    CHECK((*tok)->token_id("<|im_middle|>") == 301);
    auto ids = (*tok)->encode("<|im_user|>hello");
    REQUIRE(ids.ok());
    CHECK(*ids == std::vector<TokenId>{300, 259});
    std::ofstream(dir / "tokenizer_config.json") << "{\"added_tokens_decoder\": {\"x\": {}}}";
    auto bad = load_tiktoken_dir(dir.string());
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().to_string().find("added_tokens_decoder") != std::string::npos);
    std::filesystem::remove_all(dir);
}

TEST_CASE("tiktoken: a tokenizer_config.json that cannot be read or parsed is an error") {
    const auto dir =
        std::filesystem::temp_directory_path() / ("tiktoken_cfg_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "tiktoken.model") << model_text();
    const auto config = dir / "tokenizer_config.json";
    // Absent: no special tokens, not an error.
    CHECK(load_tiktoken_dir(dir.string()).ok());
    auto check_refused = [&](const std::string& why) {
        auto tok = load_tiktoken_dir(dir.string());
        REQUIRE_FALSE(tok.ok());
        const std::string message = tok.status().to_string();
        INFO(message);
        CHECK(message.find(config.string()) != std::string::npos);
        CHECK(message.find(why) != std::string::npos);
    };
    SUBCASE("a directory") {
        std::filesystem::create_directory(config);
        check_refused("not a regular file");
    }
    SUBCASE("a dangling link") {
        std::filesystem::create_symlink(dir / "missing.json", config);
        check_refused("cannot open");
    }
    SUBCASE("not JSON") {
        std::ofstream(config) << "{\"added_tokens_decoder\": ";
        check_refused("not valid JSON");
    }
    std::filesystem::remove_all(dir);
}

TEST_CASE("tiktoken: quant-eval tokenizes a checkpoint with tiktoken.model, no tokenizer.json") {
    // Kimi K2 ships tiktoken.model only; quant-eval loaded tokenizer.json ("cannot open").
    const auto dir =
        std::filesystem::temp_directory_path() / ("tiktoken_eval_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string micro = std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/micro-qwen3-moe";
    for (const char* f : {"config.json", "model.safetensors"}) {
        std::filesystem::copy_file(micro + "/" + f, dir / f);
    }
    std::ofstream(dir / "tiktoken.model") << model_text();
    std::string text;
    for (int i = 0; i < 16; ++i) {
        text += "hello world\n";
    }
    std::ofstream(dir / "eval.txt") << text;
    QuantEvalOptions o;
    o.model_dir = dir.string();
    o.tokens = 24;
    o.chunk = 24;
    o.decode_steps = 0;
    o.per_class = false;
    o.policies = {"all-int8"};
    auto from_text = run_quant_eval(o);
    REQUIRE_MESSAGE(from_text.ok(), from_text.status().to_string());
    // The same figures as the ids tiktoken.model gives ("hello", " world", "\n" each line).
    auto tok = load_tiktoken_dir(dir.string());
    REQUIRE(tok.ok());
    auto ids = (*tok)->encode(text, false);
    REQUIRE(ids.ok());
    REQUIRE(ids->size() == 48);
    CHECK(std::vector<TokenId>(ids->begin(), ids->begin() + 3) ==
          std::vector<TokenId>{259, 264, 10});
    o.token_ids.assign(ids->begin(), ids->begin() + 24);
    auto from_ids = run_quant_eval(o);
    REQUIRE_MESSAGE(from_ids.ok(), from_ids.status().to_string());
    REQUIRE(from_text->size() == 2);
    REQUIRE(from_ids->size() == 2);
    CHECK((*from_text)[1].positions == (*from_ids)[1].positions);
    CHECK((*from_text)[1].mean_kl == (*from_ids)[1].mean_kl);
    CHECK((*from_text)[1].perplexity == (*from_ids)[1].perplexity);
    std::filesystem::remove_all(dir);
}

TEST_CASE("tiktoken: bad model lines are named") {
    auto r = parse_tiktoken("aGU= 256\nnot-base64! 3\n", "m");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().to_string().find("line 2") != std::string::npos);
    CHECK_FALSE(parse_tiktoken("aGU=256\n", "m").ok());
    CHECK_FALSE(parse_tiktoken("aGU= 2x\n", "m").ok());
    CHECK_FALSE(parse_tiktoken("", "m").ok());
    // A vocabulary without every single byte is refused by the BPE builder.
    auto t = tokenizer_from_tiktoken("aGU= 0\n", kimi_k2_pattern(), {}, "m");
    CHECK_FALSE(t.ok());
    auto dup =
        tokenizer_from_tiktoken(model_text() + base64("he") + " 400\n", kimi_k2_pattern(), {}, "m");
    CHECK_FALSE(dup.ok());
}

}  // namespace
}  // namespace edge::engine::tokenizer
