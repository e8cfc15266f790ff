// libFuzzer target for the tokenizer. The first input byte picks the mode:
//   even: the rest is a tokenizer.json; when it loads, a fixed text and the input are encoded and
//         decoded with it (loading and encoding with a hostile vocabulary / regex);
//   odd:  the rest is text encoded with a built-in byte-level BPE tokenizer that has the Qwen2
//         split regex, NFC and ChatML special tokens; valid NFC text must round-trip exactly and
//         the incremental decoder must only ever emit valid UTF-8.
// Any crash, sanitizer report, or a broken invariant (trap) is a finding.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/incremental_decoder.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace {

using edge::engine::TokenId;
using namespace edge::engine::tokenizer;

std::string json_string(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (u < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", u);
            out += buf;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

std::string builtin_json() {
    std::string vocab;
    int next = 0;
    for (int b = 0; b < 256; ++b) {
        vocab += json_string(bytes_to_unicode(std::string(1, static_cast<char>(b)))) + ":" +
                 std::to_string(next++) + ",";
    }
    std::string merges;
    const char* pairs[][2] = {{" ", "t"}, {"h", "e"}, {" t", "he"},     {"i", "n"}, {" ", "a"},
                              {"e", "r"}, {"o", "n"}, {"\xc3", "\xa9"}, {"in", "g"}};
    for (const auto& p : pairs) {
        vocab += json_string(bytes_to_unicode(std::string(p[0]) + p[1])) + ":" +
                 std::to_string(next++) + ",";
        merges += "[" + json_string(bytes_to_unicode(p[0])) + "," +
                  json_string(bytes_to_unicode(p[1])) + "],";
    }
    vocab.pop_back();
    merges.pop_back();
    const std::string regex =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    return R"({"added_tokens":[{"id":)" + std::to_string(next) +
           R"(,"content":"<|im_start|>","special":true},{"id":)" + std::to_string(next + 1) +
           R"(,"content":"<|im_end|>","special":true}],"normalizer":{"type":"NFC"},)"
           R"("pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":)"
           R"({"Regex":)" +
           json_string(regex) +
           R"(},"behavior":"Isolated","invert":false},{"type":"ByteLevel","use_regex":false}]},)"
           R"("model":{"type":"BPE","vocab":{)" +
           vocab + R"(},"merges":[)" + merges + "]}}";
}

const Tokenizer& builtin() {
    static const auto tok = [] {
        auto t = Tokenizer::from_json(builtin_json());
        if (!t.ok()) {
            __builtin_trap();
        }
        return std::move(t).value();
    }();
    return *tok;
}

void exercise(const Tokenizer& tok, std::string_view text, bool check_round_trip) {
    for (bool special : {true, false}) {
        auto ids = tok.encode(text, special);
        if (!ids.ok()) {
            continue;
        }
        const std::string back = tok.decode(*ids);
        if (check_round_trip && back != text) {
            __builtin_trap();
        }
        IncrementalDecoder dec(&tok);
        for (TokenId id : *ids) {
            if (!utf8_is_valid(dec.push(id))) {
                __builtin_trap();
            }
        }
        if (!utf8_is_valid(dec.flush())) {
            __builtin_trap();
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) {
        return 0;
    }
    const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    if (data[0] % 2 == 0) {
        auto tok = Tokenizer::from_json(rest);
        if (tok.ok()) {
            exercise(**tok, "Hello, world! caf\xC3\xA9 <|im_start|>x 123", false);
        }
        return 0;
    }
    const Tokenizer& tok = builtin();
    // Round trips hold for valid UTF-8 that NFC leaves unchanged.
    bool stable = false;
    if (utf8_is_valid(rest)) {
        auto nfc = Normalizer(NormalizerKind::kNfc).normalize(rest);
        stable = nfc.ok() && *nfc == rest;
    }
    exercise(tok, rest, stable);
    return 0;
}
