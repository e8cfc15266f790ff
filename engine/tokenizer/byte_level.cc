#include "engine/tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "engine/tokenizer/utf8.h"

namespace edge::engine::tokenizer {

namespace {

bool maps_to_itself(int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
    std::array<uint32_t, 256> to_code_point{};
    std::array<int16_t, 324> to_byte{};  // Indexed by code point; every mapped one is < 324.

    Tables() {
        to_byte.fill(-1);
        uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            to_code_point[b] = maps_to_itself(b) ? static_cast<uint32_t>(b) : next++;
            to_byte[to_code_point[b]] = static_cast<int16_t>(b);
        }
    }
};

const Tables& tables() {
    static const Tables kTables;
    return kTables;
}

}  // namespace

std::string bytes_to_unicode(std::string_view bytes) {
    const Tables& t = tables();
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) {
        utf8_append(t.to_code_point[static_cast<uint8_t>(c)], &out);
    }
    return out;
}

Result<std::string> unicode_to_bytes(std::string_view mapped) {
    const Tables& t = tables();
    std::string out;
    out.reserve(mapped.size());
    size_t pos = 0;
    while (pos < mapped.size()) {
        const size_t n = utf8_valid_sequence(mapped.substr(pos));
        if (n == 0) {
            return invalid_argument_error("invalid UTF-8 at byte " + std::to_string(pos));
        }
        const uint32_t cp = utf8_decode(mapped.substr(pos), n);
        if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) {
            return invalid_argument_error("character U+" + std::to_string(cp) + " at byte " +
                                          std::to_string(pos) +
                                          " is not in the byte-level alphabet");
        }
        out.push_back(static_cast<char>(t.to_byte[cp]));
        pos += n;
    }
    return out;
}

}  // namespace edge::engine::tokenizer
