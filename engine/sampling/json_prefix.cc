#include "engine/sampling/json_prefix.h"

namespace edge::engine::sampling {
namespace {

constexpr std::string_view kLiterals[] = {"true", "false", "null"};

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

bool JsonPrefix::feed(std::string_view bytes) {
    JsonPrefix next = *this;
    for (char ch : bytes) {
        const auto c = static_cast<unsigned char>(ch);
        if (!next.count_space(c) || !next.step(c)) {
            return false;
        }
    }
    *this = next;
    return true;
}

bool JsonPrefix::push(bool object) {
    if (depth_ == kMaxDepth) {
        return false;
    }
    object_[static_cast<size_t>(depth_++)] = object;
    state_ = object ? State::kObjectFirst : State::kArrayFirst;
    return true;
}

bool JsonPrefix::utf8_lead(unsigned char c) {
    // Well-formed UTF-8 only (Unicode table 3-7): no overlong forms, surrogates or code points
    // past U+10FFFF, as a strict JSON parser reads it.
    utf8_lo_ = 0x80;
    utf8_hi_ = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        utf8_left_ = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        utf8_left_ = 2;
        utf8_lo_ = c == 0xE0 ? 0xA0 : 0x80;
        utf8_hi_ = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        utf8_left_ = 3;
        utf8_lo_ = c == 0xF0 ? 0x90 : 0x80;
        utf8_hi_ = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        return false;
    }
    return true;
}

void JsonPrefix::end_value() { state_ = depth_ == 0 ? State::kDone : State::kNext; }

bool JsonPrefix::value_start(unsigned char c) {
    switch (c) {
        case '{':
            return push(true);
        case '[':
            return push(false);
        case '"':
            state_ = State::kString;
            key_ = false;
            return true;
        case '-':
            state_ = State::kMinus;
            return true;
        case '0':
            state_ = State::kZero;
            return true;
        case 't':
        case 'f':
        case 'n':
            state_ = State::kLiteral;
            literal_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
            literal_at_ = 1;
            return true;
        default:
            if (is_digit(c)) {
                state_ = State::kInteger;
                return true;
            }
            return false;
    }
}

bool JsonPrefix::count_space(unsigned char c) {
    // Whitespace between tokens, in runs of at most kMaxSpaces: a model that likes whitespace
    // better than anything else could otherwise fill max_tokens with it, valid JSON all the way.
    if (state_ == State::kString || state_ == State::kEscape || state_ == State::kHex) {
        return true;
    }
    if (!is_space(c)) {
        spaces_ = 0;
        return true;
    }
    if (spaces_ == kMaxSpaces || state_ == State::kStart) {
        return false;
    }
    ++spaces_;
    return true;
}

bool JsonPrefix::step(unsigned char c) {
    switch (state_) {
        case State::kStart:
            return c == '{' && push(true);
        case State::kValue:
            return is_space(c) || value_start(c);
        case State::kArrayFirst:
            if (is_space(c)) {
                return true;
            }
            if (c == ']') {
                --depth_;
                end_value();
                return true;
            }
            return value_start(c);
        case State::kObjectFirst:
        case State::kKey:
            if (is_space(c)) {
                return true;
            }
            if (c == '}' && state_ == State::kObjectFirst) {
                --depth_;
                end_value();
                return true;
            }
            if (c == '"') {
                state_ = State::kString;
                key_ = true;
                return true;
            }
            return false;
        case State::kColon:
            if (is_space(c)) {
                return true;
            }
            if (c == ':') {
                state_ = State::kValue;
                return true;
            }
            return false;
        case State::kNext: {
            if (is_space(c)) {
                return true;
            }
            const bool object = object_[static_cast<size_t>(depth_ - 1)];
            if (c == ',') {
                state_ = object ? State::kKey : State::kValue;
                return true;
            }
            if (c == (object ? '}' : ']')) {
                --depth_;
                end_value();
                return true;
            }
            return false;
        }
        case State::kString:
            if (utf8_left_ > 0) {
                // A continuation byte of a UTF-8 character, in the range its lead allows.
                if (c < utf8_lo_ || c > utf8_hi_) {
                    return false;
                }
                --utf8_left_;
                utf8_lo_ = 0x80;
                utf8_hi_ = 0xBF;
                return true;
            }
            if (want_low_ && c != '\\') {
                return false;  // A high surrogate escape must be followed by a low one.
            }
            if (c == '"') {
                if (key_) {
                    state_ = State::kColon;
                } else {
                    end_value();
                }
                return true;
            }
            if (c == '\\') {
                state_ = State::kEscape;
                return true;
            }
            if (c >= 0x80) {
                return utf8_lead(c);
            }
            return c >= 0x20;  // Control characters must be escaped.
        case State::kEscape:
            if (c == 'u') {
                state_ = State::kHex;
                hex_left_ = 4;
                return true;
            }
            if (want_low_) {
                return false;
            }
            if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                c == 'r' || c == 't') {
                state_ = State::kString;
                return true;
            }
            return false;
        case State::kHex: {
            if (!is_hex(c)) {
                return false;
            }
            // Surrogates come in pairs, \uD800-\uDBFF then \uDC00-\uDFFF (strict parsers
            // refuse a lone one): decided by the first two digits, so no dead end is entered.
            const int digit = 4 - hex_left_;
            const auto lower = static_cast<unsigned char>(c | 0x20);
            if (digit == 0) {
                surrogate_ = lower == 'd';
                if (want_low_ && !surrogate_) {
                    return false;
                }
            } else if (digit == 1 && surrogate_) {
                const bool low = lower >= 'c' && lower <= 'f';
                const bool high = lower >= '8' && lower <= 'b';
                if (want_low_ ? !low : low) {
                    return false;
                }
                surrogate_ = high;  // Now: a high surrogate, wanting its low half next.
                if (want_low_) {
                    want_low_ = false;
                }
            }
            if (--hex_left_ == 0) {
                state_ = State::kString;
                want_low_ = surrogate_;
                surrogate_ = false;
            }
            return true;
        }
        case State::kMinus:
            if (c == '0') {
                state_ = State::kZero;
                return true;
            }
            if (is_digit(c)) {
                state_ = State::kInteger;
                return true;
            }
            return false;
        case State::kZero:
        case State::kInteger:
        case State::kFraction:
            if (is_digit(c) && state_ != State::kZero) {
                return true;
            }
            if (c == '.' && state_ != State::kFraction) {
                state_ = State::kDot;
                return true;
            }
            if (c == 'e' || c == 'E') {
                state_ = State::kExponent;
                return true;
            }
            // The number ended: `c` is what follows it (a number is never the top value here).
            end_value();
            return step(c);
        case State::kDot:
            if (is_digit(c)) {
                state_ = State::kFraction;
                return true;
            }
            return false;
        case State::kExponent:
            if (c == '+' || c == '-') {
                state_ = State::kExponentSign;
                return true;
            }
            [[fallthrough]];
        case State::kExponentSign:
            if (is_digit(c)) {
                state_ = State::kExponentDigits;
                return true;
            }
            return false;
        case State::kExponentDigits:
            if (is_digit(c)) {
                return true;
            }
            end_value();
            return step(c);
        case State::kLiteral: {
            const std::string_view word = kLiterals[literal_];
            if (c != static_cast<unsigned char>(word[literal_at_])) {
                return false;
            }
            if (++literal_at_ == word.size()) {
                end_value();
            }
            return true;
        }
        case State::kDone:
            return is_space(c);
    }
    return false;
}

}  // namespace edge::engine::sampling
