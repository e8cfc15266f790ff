#include "engine/sampling/string_format.h"

#include <algorithm>
#include <array>

namespace edge::engine::sampling {
namespace {

bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool is_alnum(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Dates and times: the characters written (bits 0-5), the digit before (6-9), a value (10-30).
struct Packed {
    int32_t pos;
    int32_t prev;
    int32_t value;
};
Packed unpack(int32_t state) { return {state & 63, (state >> 6) & 15, state >> 10}; }
int32_t pack(int32_t pos, int32_t prev, int32_t value) { return pos | prev << 6 | value << 10; }

int32_t days_in(int32_t year, int32_t month) {
    static constexpr std::array<int32_t, 13> kDays = {0,  31, 28, 31, 30, 31, 30,
                                                      31, 31, 30, 31, 30, 31};
    const bool leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    return month == 2 && leap ? 29 : kDays[static_cast<size_t>(month)];
}

// YYYY-MM-DD, the year 0001 to 9999. The value: the year, and from the month on year * 16 +
// month, so that the day is checked against its month: a tens digit only where some day of the
// month has it.
constexpr int32_t kDateLength = 10;
int32_t date_step(int32_t state, unsigned char c) {
    const auto [pos, prev, value] = unpack(state);
    const int32_t d = c - '0';
    if (pos == 4 || pos == 7) {
        return c == '-' ? pack(pos + 1, 0, value) : -1;
    }
    if (pos >= kDateLength || !is_digit(c)) {
        return -1;
    }
    switch (pos) {
        case 5:
            return d <= 1 ? pack(6, d, value) : -1;
        case 6: {
            const int32_t month = prev * 10 + d;
            return month >= 1 && month <= 12 ? pack(7, 0, value * 16 + month) : -1;
        }
        case 8:
            return d * 10 <= days_in(value >> 4, value & 15) ? pack(9, d, value) : -1;
        case 9: {
            const int32_t day = prev * 10 + d;
            return day >= 1 && day <= days_in(value >> 4, value & 15) ? pack(10, 0, value) : -1;
        }
        default:  // The year's digits; year 0000 is refused, as Python's date does (1 to 9999).
            return pos == 3 && value * 10 + d == 0 ? -1 : pack(pos + 1, 0, value * 10 + d);
    }
}

// hh:mm:ss (positions 0-8), '.' (9) and 1 to kMaxFraction digits (10-18), then 'Z' or a sign
// (20) and hh:mm (21-25); 25: complete.
constexpr int32_t kMaxFraction = 9;
constexpr int32_t kFractionAt = 10;
constexpr int32_t kOffsetAt = 20;
constexpr int32_t kTimeEnd = 25;
int32_t offset_or_end(unsigned char c) {
    if (c == 'Z') {
        return pack(kTimeEnd, 0, 0);
    }
    return c == '+' || c == '-' ? pack(kOffsetAt, 0, 0) : -1;
}
int32_t time_step(int32_t state, unsigned char c) {
    const int32_t pos = unpack(state).pos;
    const int32_t prev = unpack(state).prev;
    const int32_t d = c - '0';
    const bool digit = is_digit(c);
    switch (pos) {
        case 0:
        case kOffsetAt:  // Hours' tens.
            return digit && d <= 2 ? pack(pos + 1, d, 0) : -1;
        case 1:
        case kOffsetAt + 1:
            return digit && prev * 10 + d <= 23 ? pack(pos + 1, 0, 0) : -1;
        case 2:
        case 5:
        case kOffsetAt + 2:
            return c == ':' ? pack(pos + 1, 0, 0) : -1;
        case 3:
        case 6:
        case kOffsetAt + 3:  // Minutes' and seconds' tens.
            return digit && d <= 5 ? pack(pos + 1, 0, 0) : -1;
        case 4:
        case 7:
        case kOffsetAt + 4:
        case kFractionAt - 1:  // After '.'.
            return digit ? pack(pos + 1, 0, 0) : -1;
        case 8:
            return c == '.' ? pack(kFractionAt - 1, 0, 0) : offset_or_end(c);
        default:
            if (pos >= kFractionAt && pos < kFractionAt + kMaxFraction) {
                if (digit) {
                    return pos + 1 < kFractionAt + kMaxFraction ? pack(pos + 1, 0, 0) : -1;
                }
                return offset_or_end(c);
            }
            return -1;
    }
}

// A date, 'T' at kDateLength, then a time whose positions are offset by kDateLength + 1.
constexpr int32_t kTimeAt = kDateLength + 1;
int32_t date_time_step(int32_t state, unsigned char c) {
    const int32_t pos = state & 63;
    if (pos < kDateLength) {
        return date_step(state, c);
    }
    if (pos == kDateLength) {
        return c == 'T' ? pack(kTimeAt, 0, 0) : -1;
    }
    const int32_t next = time_step(state - kTimeAt, c);
    return next < 0 ? -1 : next + kTimeAt;
}

// 8-4-4-4-12 hex digits: the state is the characters written.
constexpr int32_t kUuidLength = 36;
int32_t uuid_step(int32_t pos, unsigned char c) {
    if (pos == 8 || pos == 13 || pos == 18 || pos == 23) {
        return c == '-' ? pos + 1 : -1;
    }
    return pos < kUuidLength && is_hex(c) ? pos + 1 : -1;
}

// The octets written before this one (bits 0-1), this one's digits (2-3) and value (4-11).
int32_t ipv4_step(int32_t state, unsigned char c) {
    const int32_t octet = state & 3;
    const int32_t digits = (state >> 2) & 3;
    const int32_t value = state >> 4;
    if (is_digit(c)) {
        const int32_t v = value * 10 + (c - '0');
        if ((digits == 1 && value == 0) || digits == 3 || v > 255) {
            return -1;  // A leading zero, or past 255.
        }
        return octet | (digits + 1) << 2 | v << 4;
    }
    return c == '.' && digits > 0 && octet < 3 ? octet + 1 : -1;
}
bool ipv4_complete(int32_t state) { return (state & 3) == 3 && ((state >> 2) & 3) > 0; }

// The last part written (bits 0-3), then a number's digits (4-7). The parts in RFC 3339's
// order: each unit only after the one its grammar lets it follow.
enum Duration : int32_t {
    kStart,
    kP,
    kYears,
    kMonths,
    kDays,
    kT,
    kHours,
    kMinutes,
    kSeconds,
    kWeeks,
};
constexpr int32_t kMaxDurationDigits = 9;
int32_t duration_step(int32_t state, unsigned char c) {
    const int32_t part = state & 15;
    const int32_t digits = state >> 4;
    if (part == kStart) {
        return c == 'P' ? kP : -1;
    }
    if (is_digit(c)) {
        const bool number_due = part == kP || part == kYears || part == kMonths || part == kT ||
                                part == kHours || part == kMinutes;
        return number_due && digits < kMaxDurationDigits ? part | (digits + 1) << 4 : -1;
    }
    if (c == 'T') {
        return digits == 0 && part >= kP && part <= kDays ? kT : -1;
    }
    if (digits == 0) {
        return -1;  // A unit needs its number.
    }
    switch (c) {
        case 'Y':
            return part == kP ? kYears : -1;
        case 'W':
            return part == kP ? kWeeks : -1;
        case 'M':
            if (part == kP || part == kYears) {
                return kMonths;
            }
            return part == kT || part == kHours ? kMinutes : -1;
        case 'D':
            return part == kP || part == kMonths ? kDays : -1;
        case 'H':
            return part == kT ? kHours : -1;
        case 'S':
            return part == kT || part == kMinutes ? kSeconds : -1;
        default:
            return -1;
    }
}
bool duration_complete(int32_t state) {
    const int32_t part = state & 15;
    return state >> 4 == 0 && part != kStart && part != kP && part != kT;
}

// A hostname's state (an email's domain's in its low byte): the label's characters so far (bits
// 0-5), whether the last was a hyphen (6), whether a dot has come (7). `need_dot`: the name must
// have two labels at least (an email's domain). `left`: characters allowed after `c`.
constexpr int32_t kMaxLabel = 63;
constexpr int32_t kHyphen = 1 << 6;
constexpr int32_t kDotted = 1 << 7;
int32_t domain_step(int32_t state, unsigned char c, int64_t left, bool need_dot) {
    const int32_t label = state & 63;
    const int32_t dotted = state & kDotted;
    // What a whole name needs after a label's last character: a dot and a label, where one is
    // due and none has come yet.
    const int64_t after_label = need_dot && dotted == 0 ? 2 : 0;
    if (is_alnum(c)) {
        return label < kMaxLabel && left >= after_label ? dotted | (label + 1) : -1;
    }
    if (c == '-') {  // Never first or last in a label.
        return label > 0 && label + 1 < kMaxLabel && left >= 1 + after_label
                   ? dotted | kHyphen | (label + 1)
                   : -1;
    }
    return c == '.' && label > 0 && (state & kHyphen) == 0 && left >= 1 ? kDotted : -1;
}
bool domain_complete(int32_t state, bool need_dot) {
    return (state & 63) > 0 && (state & kHyphen) == 0 && (!need_dot || (state & kDotted) != 0);
}

// An email's state: in the domain (bit 8), its low byte the domain's; in the local part, its
// length (bits 9-15) and whether the last character was a dot (16). The shortest end of a local
// part is "@a.b".
constexpr int32_t kInDomain = 1 << 8;
constexpr int32_t kLocalDot = 1 << 16;
constexpr int32_t kMaxLocal = 64;
bool is_local(unsigned char c) {
    return is_alnum(c) || c == '_' || c == '%' || c == '+' || c == '-';
}
int32_t email_step(int32_t state, unsigned char c, int64_t left) {
    if ((state & kInDomain) != 0) {
        const int32_t domain = domain_step(state & 255, c, left, true);
        return domain < 0 ? -1 : kInDomain | domain;
    }
    const int32_t length = (state >> 9) & 127;
    const bool after_dot = (state & kLocalDot) != 0;
    if (is_local(c)) {
        return length < kMaxLocal && left >= 4 ? (length + 1) << 9 : -1;
    }
    if (c == '.') {
        return length > 0 && !after_dot && length + 1 < kMaxLocal && left >= 5
                   ? (length + 1) << 9 | kLocalDot
                   : -1;
    }
    return c == '@' && length > 0 && !after_dot && left >= 3 ? kInDomain : -1;
}

// Groups ended (bits 0-3), the group's digits so far (4-6), whether "::" has come (7), and the
// colons just written (8-9): 1 after a group, 2 a "::", 3 a leading ':' (a "::" must follow).
int32_t ipv6_state(int32_t groups, int32_t digits, bool compressed, int32_t colons) {
    return groups | digits << 4 | (compressed ? 128 : 0) | colons << 8;
}
int32_t ipv6_step(int32_t state, unsigned char c) {
    const int32_t groups = state & 15;
    const int32_t digits = (state >> 4) & 7;
    const bool compressed = (state & 128) != 0;
    const int32_t colons = (state >> 8) & 3;
    // Groups written out: eight, or with "::" (one group at least) seven.
    const int32_t most = compressed ? 7 : 8;
    if (is_hex(c)) {
        if (colons == 3) {
            return -1;
        }
        if (digits > 0) {
            return digits < 4 ? ipv6_state(groups, digits + 1, compressed, 0) : -1;
        }
        return groups + 1 <= most ? ipv6_state(groups, 1, compressed, 0) : -1;
    }
    if (c != ':') {
        return -1;
    }
    if (digits > 0) {
        // The group ends: a group after it (or a "::", standing for one at least) must fit.
        return groups + 1 < most ? ipv6_state(groups + 1, 0, compressed, 1) : -1;
    }
    if (colons == 1 || colons == 3) {
        return compressed ? -1 : ipv6_state(groups, 0, true, 2);
    }
    return state == 0 ? ipv6_state(0, 0, false, 3) : -1;
}
bool ipv6_complete(int32_t state) {
    const int32_t colons = (state >> 8) & 3;
    const int32_t digits = (state >> 4) & 7;
    return colons == 2 || (digits > 0 && ((state & 128) != 0 || (state & 15) + 1 == 8));
}

}  // namespace

StringFormat string_format(std::string_view name) {
    static constexpr std::array<std::pair<std::string_view, StringFormat>, 9> kNames = {{
        {"date", StringFormat::kDate},
        {"time", StringFormat::kTime},
        {"date-time", StringFormat::kDateTime},
        {"uuid", StringFormat::kUuid},
        {"ipv4", StringFormat::kIpv4},
        {"duration", StringFormat::kDuration},
        {"email", StringFormat::kEmail},
        {"hostname", StringFormat::kHostname},
        {"ipv6", StringFormat::kIpv6},
    }};
    for (const auto& [n, format] : kNames) {
        if (n == name) {
            return format;
        }
    }
    return StringFormat::kNone;
}

FormatLengths format_lengths(StringFormat format) {
    switch (format) {
        case StringFormat::kDate:
            return {kDateLength, kDateLength};
        case StringFormat::kTime:  // "hh:mm:ssZ"; a fraction of kMaxFraction and an offset.
            return {9, 8 + 1 + kMaxFraction + 6};
        case StringFormat::kDateTime:
            return {kTimeAt + 9, kTimeAt + 8 + 1 + kMaxFraction + 6};
        case StringFormat::kUuid:
            return {kUuidLength, kUuidLength};
        case StringFormat::kIpv4:
            return {7, 15};
        case StringFormat::kDuration:  // "P1D"; all six units of kMaxDurationDigits, and 'T'.
            return {3, 2 + 6 * (kMaxDurationDigits + 1)};
        case StringFormat::kEmail:
            return {5, 254};
        case StringFormat::kHostname:
            return {1, 253};
        case StringFormat::kIpv6:  // "::"; eight groups of four.
            return {2, 39};
        case StringFormat::kNone:
            break;
    }
    return {0, INT32_MAX};
}

int32_t format_step(StringFormat format, int32_t state, unsigned char c, int64_t left) {
    switch (format) {
        case StringFormat::kDate:
            return date_step(state, c);
        case StringFormat::kTime:
            return time_step(state, c);
        case StringFormat::kDateTime:
            return date_time_step(state, c);
        case StringFormat::kUuid:
            return uuid_step(state, c);
        case StringFormat::kIpv4:
            return ipv4_step(state, c);
        case StringFormat::kDuration:
            return duration_step(state, c);
        case StringFormat::kEmail:
            return email_step(state, c, left);
        case StringFormat::kHostname:
            return domain_step(state, c, left, false);
        case StringFormat::kIpv6:
            return ipv6_step(state, c);
        case StringFormat::kNone:
            break;
    }
    return -1;
}

bool format_complete(StringFormat format, int32_t state) {
    switch (format) {
        case StringFormat::kDate:
            return (state & 63) == kDateLength;
        case StringFormat::kTime:
            return (state & 63) == kTimeEnd;
        case StringFormat::kDateTime:
            return (state & 63) == kTimeAt + kTimeEnd;
        case StringFormat::kUuid:
            return state == kUuidLength;
        case StringFormat::kIpv4:
            return ipv4_complete(state);
        case StringFormat::kDuration:
            return duration_complete(state);
        case StringFormat::kEmail:
            return (state & kInDomain) != 0 && domain_complete(state & 255, true);
        case StringFormat::kHostname:
            return domain_complete(state, false);
        case StringFormat::kIpv6:
            return ipv6_complete(state);
        case StringFormat::kNone:
            break;
    }
    return true;
}

bool format_matches(StringFormat format, std::string_view text, int64_t max_length) {
    if (format == StringFormat::kNone) {
        return true;
    }
    const int64_t limit = std::min<int64_t>(max_length, format_lengths(format).max);
    int32_t state = 0;
    for (size_t i = 0; i < text.size(); ++i) {
        const int64_t left = limit - static_cast<int64_t>(i) - 1;
        if (left < 0) {
            return false;
        }
        state = format_step(format, state, static_cast<unsigned char>(text[i]), left);
        if (state < 0) {
            return false;
        }
    }
    return format_complete(format, state);
}

}  // namespace edge::engine::sampling
