#include "engine/chat/json_stream.h"

#include <cctype>
#include <cstring>
#include <string_view>

#include "common/json_text.h"

namespace edge::engine::chat {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Where a number is in the RFC 8259 grammar, one byte at a time: each byte either continues
// a valid prefix or does not, so what streams out is always the start of a number.
enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp, kNone };

Num number_next(Num at, char c) {
    const bool digit = c >= '0' && c <= '9';
    switch (at) {
        case Num::kMinus:
            return c == '0' ? Num::kZero : digit ? Num::kInt : Num::kNone;
        case Num::kZero:
        case Num::kInt:
            if (digit) {
                return at == Num::kInt ? Num::kInt : Num::kNone;  // No leading zeros.
            }
            return c == '.' ? Num::kDot : (c == 'e' || c == 'E') ? Num::kE : Num::kNone;
        case Num::kDot:
            return digit ? Num::kFrac : Num::kNone;
        case Num::kFrac:
            return digit ? Num::kFrac : (c == 'e' || c == 'E') ? Num::kE : Num::kNone;
        case Num::kE:
            return digit ? Num::kExp : (c == '+' || c == '-') ? Num::kESign : Num::kNone;
        case Num::kESign:
        case Num::kExp:
            return digit ? Num::kExp : Num::kNone;
        case Num::kNone:
            break;
    }
    return Num::kNone;
}

// Whether a number may end here.
bool number_complete(Num at) {
    return at == Num::kZero || at == Num::kInt || at == Num::kFrac || at == Num::kExp;
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// A code point (a surrogate pair already joined) as UTF-8.
void append_utf8(std::string& out, uint32_t u) {
    if (u < 0x80) {
        out += static_cast<char>(u);
    } else if (u < 0x800) {
        out += static_cast<char>(0xc0 | (u >> 6));
        out += static_cast<char>(0x80 | (u & 0x3f));
    } else if (u < 0x10000) {
        out += static_cast<char>(0xe0 | (u >> 12));
        out += static_cast<char>(0x80 | ((u >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (u & 0x3f));
    } else {
        out += static_cast<char>(0xf0 | (u >> 18));
        out += static_cast<char>(0x80 | ((u >> 12) & 0x3f));
        out += static_cast<char>(0x80 | ((u >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (u & 0x3f));
    }
}

}  // namespace

JsonStream::Result JsonStream::value_ended() {
    if (stack_.empty()) {
        state_ = State::kDone;
        return Result::kDone;
    }
    state_ = State::kCommaOrClose;
    return Result::kOk;
}

JsonStream::Result JsonStream::start_value(char c) {
    if ((c == '{' || c == '[') && stack_.size() >= kMaxJsonDepth) {
        // Deeper than the server reads back (a client sending these arguments in its history
        // would get a 400) or writes.
        return Result::kInvalid;
    }
    switch (c) {
        case '{':
            stack_.push_back('{');
            state_ = State::kKeyOrClose;
            return Result::kOk;
        case '[':
            stack_.push_back('[');
            state_ = State::kValue;
            // An empty array closes at once: handled by kValue seeing ']'.
            return Result::kOk;
        case '"':
            string_is_key_ = false;
            state_ = State::kString;
            return Result::kOk;
        case 't':
            literal_ = "true";
            break;
        case 'f':
            literal_ = "false";
            break;
        case 'n':
            literal_ = "null";
            break;
        default:
            if (c == '-' || is_digit(c)) {
                number_ =
                    static_cast<uint8_t>(c == '-' ? Num::kMinus : number_next(Num::kMinus, c));
                number_bytes_ = 1;
                state_ = State::kNumber;
                return Result::kOk;
            }
            return fail();
    }
    token_.assign(1, c);
    state_ = State::kLiteral;
    return Result::kOk;
}

JsonStream::Result JsonStream::feed(char c) {
    switch (state_) {
        case State::kInvalid:
            return Result::kInvalid;
        case State::kDone:
            return is_space(c) ? Result::kOk : fail();
        case State::kValue:
            if (is_space(c)) {
                return Result::kOk;
            }
            if (c == ']' && !stack_.empty() && stack_.back() == '[') {
                // Only valid right after '[' (an empty array); a value after ',' is required.
                // The comma path enters kValue via kCommaOrClose, which sets token_ to ",".
                if (token_ == ",") {
                    return fail();
                }
                stack_.pop_back();
                return value_ended();
            }
            token_.clear();
            return start_value(c);
        case State::kKeyOrClose:
        case State::kKey:
            if (is_space(c)) {
                return Result::kOk;
            }
            if (c == '}' && state_ == State::kKeyOrClose) {
                stack_.pop_back();
                return value_ended();
            }
            if (c != '"') {
                return fail();
            }
            string_is_key_ = true;
            key_buf_.clear();
            state_ = State::kString;
            return Result::kOk;
        case State::kColon:
            if (is_space(c)) {
                return Result::kOk;
            }
            if (c != ':') {
                return fail();
            }
            token_.clear();
            state_ = State::kValue;
            return Result::kOk;
        case State::kCommaOrClose:
            if (is_space(c)) {
                return Result::kOk;
            }
            if (c == ',') {
                if (stack_.back() == '{') {
                    state_ = State::kKey;
                } else {
                    token_.assign(1, ',');  // Not = ",": a GCC 12 -Wrestrict false alarm.
                    state_ = State::kValue;
                }
                return Result::kOk;
            }
            if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '[')) {
                stack_.pop_back();
                return value_ended();
            }
            return fail();
        case State::kString:
            if (low_surrogate_due_ && c != '\\') {
                return fail();
            }
            if (c == '\\') {
                state_ = State::kEscape;
                return Result::kOk;
            }
            if (static_cast<unsigned char>(c) < 0x20) {
                return fail();
            }
            if (c == '"') {
                if (string_is_key_) {
                    if (stack_.size() == 1) {
                        top_key_ = key_buf_;
                    }
                    state_ = State::kColon;
                    return Result::kOk;
                }
                return value_ended();
            }
            if (string_is_key_ && stack_.size() == 1) {
                key_buf_ += c;
            }
            return Result::kOk;
        case State::kEscape:
            if (low_surrogate_due_ && c != 'u') {
                return fail();
            }
            if (std::strchr("\"\\/bfnrt", c) != nullptr && c != '\0') {
                if (string_is_key_ && stack_.size() == 1) {
                    // Decoded, as a JSON reader sees the key: "argume\nts" is not "arguments".
                    static constexpr std::string_view kFrom = "\"\\/bfnrt";
                    static constexpr std::string_view kTo = "\"\\/\b\f\n\r\t";
                    key_buf_ += kTo[kFrom.find(c)];
                }
                state_ = State::kString;
                return Result::kOk;
            }
            if (c == 'u') {
                unicode_left_ = 4;
                unicode_ = 0;
                state_ = State::kUnicode;
                return Result::kOk;
            }
            return fail();
        case State::kUnicode: {
            if (!std::isxdigit(static_cast<unsigned char>(c))) {
                return fail();
            }
            const int digit = is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
            unicode_ = unicode_ * 16 + static_cast<uint32_t>(digit);
            --unicode_left_;
            // The first two digits decide whether the code unit is a surrogate half; refused
            // there, so that no byte that cannot lead to valid JSON is accepted.
            if (unicode_left_ == 3 && low_surrogate_due_ && unicode_ != 0xd) {
                return fail();
            }
            if (unicode_left_ == 2) {
                const bool high = unicode_ >= 0xd8 && unicode_ <= 0xdb;
                const bool low = unicode_ >= 0xdc && unicode_ <= 0xdf;
                if (low != low_surrogate_due_) {
                    return fail();  // A lone low half, or a high half not followed by a low one.
                }
                low_surrogate_due_ = high;
            }
            if (unicode_left_ == 0) {
                if (unicode_ >= 0xd800 && unicode_ <= 0xdbff) {
                    high_half_ = unicode_;  // Its low half follows (checked above).
                } else if (string_is_key_ && stack_.size() == 1) {
                    append_utf8(key_buf_, unicode_ >= 0xdc00 && unicode_ <= 0xdfff
                                              ? 0x10000 + ((high_half_ - 0xd800) << 10) +
                                                    (unicode_ - 0xdc00)
                                              : unicode_);
                }
                state_ = State::kString;
            }
            return Result::kOk;
        }
        case State::kNumber:
            if (const Num next = number_next(static_cast<Num>(number_), c); next != Num::kNone) {
                number_ = static_cast<uint8_t>(next);
                if (++number_bytes_ > 4096) {
                    return fail();
                }
                return Result::kOk;
            }
            if (!number_complete(static_cast<Num>(number_))) {
                return fail();  // "1-", "01", "1.", "1e": no byte could have made it a number.
            }
            {
                Result r = value_ended();
                if (r == Result::kDone) {
                    // The number ended one byte early; this byte must be trailing space.
                    return is_space(c) ? Result::kOk : fail();
                }
                return feed(c);
            }
        case State::kLiteral: {
            const size_t at = token_.size();
            if (literal_[at] != c) {
                return fail();
            }
            token_ += c;
            if (literal_[at + 1] == '\0') {
                return value_ended();
            }
            return Result::kOk;
        }
    }
    return fail();
}

}  // namespace edge::engine::chat
