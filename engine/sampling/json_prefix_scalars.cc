// JsonPrefix's scalar values (json_prefix.h): strings with their escapes, UTF-8, lengths and
// formats; numbers in JSON's grammar and the schema's range; and literals (enum values, true,
// false, null).

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "engine/sampling/json_prefix.h"
#include "engine/sampling/json_prefix_internal.h"

namespace edge::engine::sampling {
namespace {

bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// The byte a one-character escape (after '\\') stands for.
char unescaped(unsigned char c) {
    switch (c) {
        case 'b':
            return '\b';
        case 'f':
            return '\f';
        case 'n':
            return '\n';
        case 'r':
            return '\r';
        case 't':
            return '\t';
        default:
            return static_cast<char>(c);  // '"', '\\', '/'.
    }
}

}  // namespace

bool JsonPrefix::utf8_lead(Frame& f, unsigned char c) {
    // Well-formed UTF-8 only (Unicode table 3-7): no overlong forms, surrogates or code points
    // past U+10FFFF, as a strict JSON parser reads it.
    f.utf8_lo = 0x80;
    f.utf8_hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        f.utf8_left = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        f.utf8_left = 2;
        f.utf8_lo = c == 0xE0 ? 0xA0 : 0x80;
        f.utf8_hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        f.utf8_left = 3;
        f.utf8_lo = c == 0xF0 ? 0x90 : 0x80;
        f.utf8_hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        return false;
    }
    return true;
}

int JsonPrefix::step_string(Frame& f, unsigned char c) {
    const JsonSchema::Node& n = schema_->node(f.node);
    switch (f.state) {
        case State::kChars:
            if (f.utf8_left > 0) {
                // A continuation byte of a UTF-8 character, in the range its lead allows.
                if (c < f.utf8_lo || c > f.utf8_hi) {
                    return 0;
                }
                --f.utf8_left;
                f.utf8_lo = 0x80;
                f.utf8_hi = 0xBF;
                if (f.key) {
                    hash_key(std::string_view(reinterpret_cast<const char*>(&c), 1));
                }
                return 1;
            }
            if (f.want_low && c != '\\') {
                return 0;  // A high surrogate escape must be followed by a low one.
            }
            if (c == '"') {
                if (f.count < n.min || !format_complete(n.format, f.format_state) ||
                    (f.key && !end_key())) {
                    return 0;  // Too short, not a whole value, or a key its object has already.
                }
                --depth_;
                return 1;
            }
            if (n.format != StringFormat::kNone) {
                // Only the format's own characters, all plain ASCII (no escape), each leaving
                // room for the rest of a value within maxLength.
                const int64_t limit = std::min<int64_t>(n.max, format_lengths(n.format).max);
                const int32_t next = format_step(n.format, f.format_state, c, limit - f.count - 1);
                if (next < 0) {
                    return 0;
                }
                f.format_state = next;
            }
            // A character begins (the low half of a surrogate pair is the same character).
            if (!f.want_low) {
                if (f.count >= n.max || c < 0x20 || (c >= 0x80 && !utf8_lead(f, c))) {
                    return 0;  // Too long, a raw control character, or not UTF-8.
                }
                ++f.count;
            }
            if (c == '\\') {
                f.state = State::kEscape;
            } else if (f.key) {
                hash_key(std::string_view(reinterpret_cast<const char*>(&c), 1));
            }
            return 1;
        case State::kEscape:
            if (c == 'u') {
                f.state = State::kHex;
                f.hex_left = 4;
                f.candidate = 0;
                return 1;
            }
            if (f.want_low) {
                return 0;
            }
            if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                c == 'r' || c == 't') {
                f.state = State::kChars;
                if (f.key) {
                    const char b = unescaped(c);
                    hash_key(std::string_view(&b, 1));
                }
                return 1;
            }
            return 0;
        case State::kHex: {
            if (!is_hex(c)) {
                return 0;
            }
            // Surrogates come in pairs, \uD800-\uDBFF then \uDC00-\uDFFF (strict parsers
            // refuse a lone one): decided by the first two digits, so no dead end is entered.
            const int digit = 4 - f.hex_left;
            const auto lower = static_cast<unsigned char>(c | 0x20);
            if (digit == 0) {
                f.surrogate = lower == 'd';
                if (f.want_low && !f.surrogate) {
                    return 0;
                }
            } else if (digit == 1 && f.surrogate) {
                const bool low = lower >= 'c' && lower <= 'f';
                const bool high = lower >= '8' && lower <= 'b';
                if (f.want_low ? !low : low) {
                    return 0;
                }
                f.surrogate = high;  // Now: a high surrogate, wanting its low half next.
                f.want_low = false;
            }
            f.candidate = f.candidate * 16 + (is_digit(c) ? c - '0' : lower - 'a' + 10);
            if (--f.hex_left == 0) {
                f.state = State::kChars;
                f.want_low = f.surrogate;
                f.surrogate = false;
                if (f.key) {
                    hash_key_unit(f);
                }
            }
            return 1;
        }
        default:
            return 0;
    }
}

namespace {

// Whether the interval from `lo` to `hi` (each end open or not) meets the node's range.
bool meets(const JsonSchema::Node& n, double lo, bool lo_open, double hi, bool hi_open) {
    const double l = std::max(lo, n.lo);
    const bool l_open = (lo == l && lo_open) || (n.lo == l && n.lo_open);
    const double h = std::min(hi, n.hi);
    const bool h_open = (hi == h && hi_open) || (n.hi == h && n.hi_open);
    return l < h || (l == h && !l_open && !h_open);
}

}  // namespace

bool JsonPrefix::number_reachable(const Frame& f) const {
    const JsonSchema::Node& n = schema_->node(f.node);
    if (!n.bounded()) {
        return true;
    }
    // Magnitudes [p, q) the prefix can still become, as one interval per count of integer
    // digits still to come; a negative number's are mirrored.
    auto fits = [&](double p, double q) {
        return f.negative ? meets(n, -q, true, -p, false) : meets(n, p, false, q, true);
    };
    if (f.pos == JsonSchema::kBoundedDigits &&
        (f.state == State::kInteger || f.state == State::kFraction)) {
        return number_in_range(f);  // No digit can come: the number must end as it is.
    }
    // Each value the prefix can still become is m / 10^e for a whole m: its digits so far
    // followed by `left` more (fewer are the same values with zeros after them), e the fraction
    // digits among them. A range narrower than that grid (a minimum of 9.999999999999995 and a
    // maximum of 10) must meet one of its points, not just the interval the prefix spans, or
    // the prefix could never end.
    const double inf = std::numeric_limits<double>::infinity();
    const int left = JsonSchema::kBoundedDigits - f.pos;
    const bool integer = f.kind == Kind::kInteger;
    const double first = f.digits * std::pow(10.0, left);
    const double last = (f.digits + 1) * std::pow(10.0, left) - 1;
    switch (f.state) {
        case State::kMinus:
            return fits(0, inf);
        case State::kZero:
            return integer ? n.grid_meets(f.negative, 0, 0, 0)
                           : n.grid_meets(f.negative, 0, std::pow(10.0, left) - 1, left);
        case State::kInteger: {
            // `more` of the digits left go before the point, the rest after it.
            for (int more = 0; more <= left; ++more) {
                const bool met = integer
                                     ? n.grid_meets(f.negative, f.digits * std::pow(10.0, more),
                                                    (f.digits + 1) * std::pow(10.0, more) - 1, 0)
                                     : n.grid_meets(f.negative, first, last, left - more);
                if (met) {
                    return true;
                }
            }
            return false;
        }
        case State::kDot:
        case State::kFraction:
            return n.grid_meets(f.negative, first, last, f.count + left);
        default:
            return false;
    }
}

bool JsonPrefix::number_in_range(const Frame& f) const {
    const JsonSchema::Node& n = schema_->node(f.node);
    if (!n.bounded()) {
        return true;
    }
    double value = f.digits / std::pow(10.0, f.count);
    value = f.negative ? -value : value;
    return meets(n, value, false, value, false);
}

int JsonPrefix::step_number(Frame& f, unsigned char c) {
    const bool integer = f.kind == Kind::kInteger;
    // A bounded number has no exponent and at most kBoundedDigits digits (json_schema.h).
    const bool bounded = schema_->node(f.node).bounded();
    auto digit = [&]() {
        if (bounded && f.pos == JsonSchema::kBoundedDigits) {
            return 0;
        }
        f.digits = f.digits * 10 + (c - '0');
        ++f.pos;
        if (f.state == State::kDot || f.state == State::kFraction) {
            ++f.count;
        }
        return 1;
    };
    switch (f.state) {
        case State::kMinus:
            if (!is_digit(c)) {
                return 0;
            }
            f.state = c == '0' ? State::kZero : State::kInteger;
            return digit() == 1 && number_reachable(f) ? 1 : 0;
        case State::kZero:
        case State::kInteger:
        case State::kFraction:
            if (is_digit(c) && f.state != State::kZero) {
                return digit() == 1 && number_reachable(f) ? 1 : 0;
            }
            if (c == '.' && f.state != State::kFraction && !integer &&
                !(bounded && f.pos == JsonSchema::kBoundedDigits)) {
                f.state = State::kDot;
                return number_reachable(f) ? 1 : 0;
            }
            if ((c == 'e' || c == 'E') && !integer && !bounded) {
                f.state = State::kExponent;
                return 1;
            }
            // The number ended: `c` is what follows it.
            return number_in_range(f) ? -1 : 0;
        case State::kDot:
            if (!is_digit(c)) {
                return 0;
            }
            if (digit() == 0) {
                return 0;
            }
            f.state = State::kFraction;
            return number_reachable(f) ? 1 : 0;
        case State::kExponent:
            if (c == '+' || c == '-') {
                f.state = State::kExponentSign;
                return 1;
            }
            [[fallthrough]];
        case State::kExponentSign:
            if (is_digit(c)) {
                f.state = State::kExponentDigits;
                f.candidate = c == '0' ? 0 : 1;
                return 1;
            }
            return 0;
        case State::kExponentDigits:
            if (!is_digit(c)) {
                return -1;
            }
            // Leading zeros are free; the others stop at kMaxExponentDigits.
            if (f.candidate > 0 || c != '0') {
                if (f.candidate == kMaxExponentDigits) {
                    return 0;
                }
                ++f.candidate;
            }
            return 1;
        default:
            return 0;
    }
}

int JsonPrefix::step_literal(Frame& f, unsigned char c) {
    // The literals are sorted (json_schema.h), so those that begin with the f.pos bytes written
    // are a range, [f.candidate, f.count), and those of them that go on with `c` a range within
    // it: a binary search a byte, however many values an enum lists. In a range a literal of
    // f.pos bytes, if any, comes first (the prefix of all the others).
    const std::vector<std::string>& literals = schema_->node(f.node).literals;
    const auto pos = static_cast<size_t>(f.pos);
    auto byte_at = [pos](const std::string& l) {
        return l.size() > pos ? static_cast<int>(static_cast<unsigned char>(l[pos])) : -1;
    };
    const auto begin = literals.begin() + f.candidate;
    const auto end = literals.begin() + f.count;
    const int want = c;
    const auto lo =
        std::partition_point(begin, end, [&](const std::string& l) { return byte_at(l) < want; });
    const auto hi =
        std::partition_point(lo, end, [&](const std::string& l) { return byte_at(l) == want; });
    if (lo == hi) {
        // No candidate takes `c`: the value ended before it if one is complete (a number such as
        // 1 among 1 and 12).
        return byte_at(*begin) < 0 ? -1 : 0;
    }
    // Only values whose own containers fit below kMaxDepth, with those around this one (depth_
    // less this value's slot): a deep value near the limit would make a reply nest past what
    // every JSON reader here takes. Looked through only that near the limit.
    const JsonSchema::Node& n = schema_->node(f.node);
    if (depth_ - 1 + n.max_literal_depth > kMaxDepth) {
        const auto first = static_cast<size_t>(lo - literals.begin());
        const auto last = static_cast<size_t>(hi - literals.begin());
        bool fits = false;
        for (size_t i = first; i < last && !fits; ++i) {
            fits = depth_ - 1 + n.literal_depths[i] <= kMaxDepth;
        }
        if (!fits) {
            return 0;
        }
    }
    f.candidate = static_cast<int32_t>(lo - literals.begin());
    f.count = static_cast<int32_t>(hi - literals.begin());
    ++f.pos;
    // Complete, and no other candidate goes on: the value ends here.
    if (hi - lo == 1 && lo->size() == pos + 1) {
        --depth_;
    }
    return 1;
}

}  // namespace edge::engine::sampling
