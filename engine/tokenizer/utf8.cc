#include "engine/tokenizer/utf8.h"

#include <algorithm>

namespace edge::engine::tokenizer {

int utf8_sequence_length(uint8_t lead) {
    if (lead < 0x80) {
        return 1;
    }
    if (lead >= 0xC2 && lead <= 0xDF) {
        return 2;
    }
    if (lead >= 0xE0 && lead <= 0xEF) {
        return 3;
    }
    if (lead >= 0xF0 && lead <= 0xF4) {
        return 4;
    }
    return 0;
}

namespace {

// Range the second byte may take after `lead` (RFC 3629 table), excluding overlongs, surrogates
// and code points past U+10FFFF.
void second_byte_range(uint8_t lead, uint8_t* lo, uint8_t* hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (lead == 0xE0) {
        *lo = 0xA0;
    } else if (lead == 0xED) {
        *hi = 0x9F;
    } else if (lead == 0xF0) {
        *lo = 0x90;
    } else if (lead == 0xF4) {
        *hi = 0x8F;
    }
}

// Checks the bytes present (at most the sequence length); true when each is allowed.
bool prefix_bytes_allowed(std::string_view text, int length) {
    const auto lead = static_cast<uint8_t>(text[0]);
    for (size_t i = 1; i < text.size() && i < static_cast<size_t>(length); ++i) {
        const auto b = static_cast<uint8_t>(text[i]);
        uint8_t lo = 0x80;
        uint8_t hi = 0xBF;
        if (i == 1) {
            second_byte_range(lead, &lo, &hi);
        }
        if (b < lo || b > hi) {
            return false;
        }
    }
    return true;
}

}  // namespace

size_t utf8_valid_sequence(std::string_view text) {
    if (text.empty()) {
        return 0;
    }
    const int length = utf8_sequence_length(static_cast<uint8_t>(text[0]));
    if (length == 0 || text.size() < static_cast<size_t>(length)) {
        return 0;
    }
    return prefix_bytes_allowed(text, length) ? static_cast<size_t>(length) : 0;
}

bool utf8_incomplete_prefix(std::string_view text) {
    if (text.empty()) {
        return false;
    }
    const int length = utf8_sequence_length(static_cast<uint8_t>(text[0]));
    if (length <= 1 || text.size() >= static_cast<size_t>(length)) {
        return false;
    }
    return prefix_bytes_allowed(text, length);
}

size_t utf8_maximal_subpart(std::string_view text) {
    if (text.empty()) {
        return 0;
    }
    const int length = utf8_sequence_length(static_cast<uint8_t>(text[0]));
    size_t n = 1;
    // The lead byte and each following byte allowed at its place, short of a whole sequence.
    while (length > 1 && n < text.size() && n < static_cast<size_t>(length) &&
           prefix_bytes_allowed(text.substr(0, n + 1), length)) {
        ++n;
    }
    return n;
}

size_t utf8_first_invalid(std::string_view text) {
    size_t pos = 0;
    while (pos < text.size()) {
        if (static_cast<uint8_t>(text[pos]) < 0x80) {
            ++pos;
            continue;
        }
        const size_t n = utf8_valid_sequence(text.substr(pos));
        if (n == 0) {
            return pos;
        }
        pos += n;
    }
    return text.size();
}

void utf8_append(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
        out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

uint32_t utf8_decode(std::string_view text, size_t length) {
    const auto b0 = static_cast<uint8_t>(text[0]);
    if (length == 1) {
        return b0;
    }
    uint32_t cp = b0 & (0x7F >> length);
    for (size_t i = 1; i < length; ++i) {
        cp = (cp << 6) | (static_cast<uint8_t>(text[i]) & 0x3F);
    }
    return cp;
}

size_t utf8_length(std::string_view text) {
    return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
        return (static_cast<uint8_t>(c) & 0xC0) != 0x80;
    }));
}

}  // namespace edge::engine::tokenizer
