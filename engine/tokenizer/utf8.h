#pragma once

// UTF-8 helpers for the tokenizer and the streaming decoder: validation, the length of a
// sequence from its lead byte, and encoding a code point. Pure functions, thread-safe.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace edge::engine::tokenizer {

// Bytes a sequence starting with `lead` takes (1..4), or 0 when `lead` cannot start one.
int utf8_sequence_length(uint8_t lead);

// Length of the valid UTF-8 sequence at the start of `text` (1..4), 0 when the bytes there are
// not a complete valid sequence (truncated, overlong, surrogate, beyond U+10FFFF, bad lead byte).
size_t utf8_valid_sequence(std::string_view text);

// True when `text` could still become a valid sequence with more bytes appended: a lead byte
// followed by fewer continuation bytes than it needs, each allowed at its place.
bool utf8_incomplete_prefix(std::string_view text);

// Bytes of the maximal subpart at the start of `text`, which does not start a valid sequence:
// the lead byte and the continuation bytes allowed after it (1..3). Replacing each maximal
// subpart with one U+FFFD is Unicode's recommended practice (Python's and Rust's decoders, so
// Hugging Face's): "\xE4\xB8A" decodes as U+FFFD then "A". 0 for empty text.
size_t utf8_maximal_subpart(std::string_view text);

// Byte offset of the first invalid sequence in `text`, or text.size() when it is all valid.
size_t utf8_first_invalid(std::string_view text);

inline bool utf8_is_valid(std::string_view text) { return utf8_first_invalid(text) == text.size(); }

// Code points in valid UTF-8 text (its bytes that are not continuation bytes).
size_t utf8_length(std::string_view text);

// Appends the UTF-8 encoding of `code_point` (must be <= U+10FFFF and not a surrogate).
void utf8_append(uint32_t code_point, std::string* out);

// Decodes the valid sequence at the start of `text` (caller checked with utf8_valid_sequence).
uint32_t utf8_decode(std::string_view text, size_t length);

}  // namespace edge::engine::tokenizer
