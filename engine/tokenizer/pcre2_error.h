#pragma once

// PCRE2 with 8-bit code units, as the engine uses it (the pre-tokenizer's split patterns, the
// quantization config's module patterns), and the text of one of its error codes.

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <string>

namespace edge::engine::tokenizer {

inline std::string pcre2_error_message(int code) {
    PCRE2_UCHAR buffer[256];
    const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
    if (n < 0) {
        return "PCRE2 error " + std::to_string(code);
    }
    return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

}  // namespace edge::engine::tokenizer
