#pragma once

// StringFormat: the JSON Schema `format` values that a compiled schema enforces on a string (the
// ones OpenAI's structured outputs support), each as a small state machine over the string's
// characters that JsonPrefix runs byte by byte. A state is an int32_t (0: nothing written yet)
// that a string's frame carries; format_step() takes a character to the next state, or refuses
// it, and takes only characters after which the value can still be completed within the length
// left, so that a sampler held to it never finds no token; format_complete() says where the
// closing quote may come.
//
// Every format is written in printable ASCII without a character JSON must escape, so the
// machines take the string's raw bytes and no escape at all ('\\' is never taken): a formatted
// string is written as its value, byte for byte. What they take is a subset of what the format's
// specification allows, chosen to be valid under the common validators too (Ajv's ajv-formats,
// Python's):
//   date       RFC 3339 full-date, YYYY-MM-DD, the day within its month (29 February in leap
//              years only), the year 0001 to 9999 (Python's date has no year 0000).
//   time       RFC 3339 full-time, hh:mm:ss, an optional fraction of 1 to 9 digits, then 'Z' or
//              an offset +hh:mm / -hh:mm; seconds 00-59 (no leap second), upper-case 'Z'.
//   date-time  date 'T' time (upper-case 'T').
//   uuid       8-4-4-4-12 hex digits, either case.
//   ipv4       a dotted quad of 0-255, no leading zeros.
//   duration   RFC 3339 appendix A: P, then years, months, days (each optional but in that order
//              and contiguous: Y then M then D) and/or T with hours, minutes, seconds (likewise),
//              or weeks alone; numbers of 1 to 9 digits.
//   email      local@domain: a local part of [A-Za-z0-9_%+-] runs joined by single dots, at most
//              64 characters; a domain of at least two hostname labels; 254 characters in all.
//   hostname   RFC 1123: labels of letters, digits and inner hyphens, 1 to 63 characters each,
//              joined by dots, 253 characters in all, no trailing dot.
//   ipv6       RFC 4291 text: eight groups of 1 to 4 hex digits, or fewer with one "::"; no
//              embedded IPv4 and no zone.
//
// Threading: pure functions of their arguments.

#include <cstdint>
#include <string_view>

namespace edge::engine::sampling {

enum class StringFormat : uint8_t {
    kNone,  // Not a format enforced here (unknown ones are annotations).
    kDate,
    kTime,
    kDateTime,
    kUuid,
    kIpv4,
    kDuration,
    kEmail,
    kHostname,
    kIpv6,
};

// The format a `format` keyword's value names; kNone for one not enforced here.
StringFormat string_format(std::string_view name);

// The lengths (characters, which are bytes here) of the format's values that format_step() can
// write: a maxLength at least `max` never cuts one short (email and hostname take a lower limit
// as they go, through `left`), and a minLength at most `min` never asks for a longer one.
struct FormatLengths {
    int32_t min;
    int32_t max;
};
FormatLengths format_lengths(StringFormat format);

// The state after `c`, or -1 where no value of the format with at most `left` more characters
// after `c` begins with the characters so far and `c`. `state` is 0 or one that format_step()
// returned.
int32_t format_step(StringFormat format, int32_t state, unsigned char c, int64_t left);
// Whether the characters so far are a whole value of the format.
bool format_complete(StringFormat format, int32_t state);
// Whether `text` (decoded) is a value of the format that format_step() writes, at most
// `max_length` characters long.
bool format_matches(StringFormat format, std::string_view text, int64_t max_length);

}  // namespace edge::engine::sampling
