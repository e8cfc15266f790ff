#include "engine/chat/json_stream.h"

#include <cctype>
#include <cstring>
#include <string_view>

#include "common/json_text.h"

namespace edge::engine::chat {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// One \u escape's code unit as UTF-8. A surrogate pair's halves are encoded one by one (not
// combined): the key only has to compare equal to the plain names a parser looks for, and a
// key with a surrogate in it is none of them.
void append_utf8(std::string& out, uint32_t u) {
    if (u < 0x80) {
        out += static_cast<char>(u);
    } else if (u < 0x800) {
        out += static_cast<char>(0xc0 | (u >> 6));
        out += static_cast<char>(0x80 | (u & 0x3f));
    } else {
        out += static_cast<char>(0xe0 | (u >> 12));
        out += static_cast<char>(0x80 | ((u >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (u & 0x3f));
    }
}

}  // namespace

bool is_json_number(const std::string& s) {
    size_t i = 0;
    if (i < s.size() && s[i] == '-') {
        ++i;
    }
    if (i >= s.size()) {
        return false;
    }
    if (s[i] == '0') {
        ++i;
    } else if (is_digit(s[i])) {
        while (i < s.size() && is_digit(s[i])) {
            ++i;
        }
    } else {
        return false;
    }
    if (i < s.size() && s[i] == '.') {
        ++i;
        if (i >= s.size() || !is_digit(s[i])) {
            return false;
        }
        while (i < s.size() && is_digit(s[i])) {
            ++i;
        }
    }
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        ++i;
        if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
            ++i;
        }
        if (i >= s.size() || !is_digit(s[i])) {
            return false;
        }
        while (i < s.size() && is_digit(s[i])) {
            ++i;
        }
    }
    return i == s.size();
}

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
                token_.assign(1, c);
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
            if (--unicode_left_ == 0) {
                if (string_is_key_ && stack_.size() == 1) {
                    append_utf8(key_buf_, unicode_);
                }
                state_ = State::kString;
            }
            return Result::kOk;
        }
        case State::kNumber:
            if (is_digit(c) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
                token_ += c;
                if (token_.size() > 4096) {
                    return fail();
                }
                return Result::kOk;
            }
            if (!is_json_number(token_)) {
                return fail();
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
