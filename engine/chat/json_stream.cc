#include "engine/chat/json_stream.h"

#include <boost/json/string.hpp>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string_view>

#include "common/fnv1a.h"
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

// A key as error() shows it: JSON-quoted, cut at `max` bytes (at a UTF-8 character's start)
// with "..." after the quote when longer.
std::string shown_key(std::string_view key, size_t max) {
    const bool cut = key.size() > max;
    if (cut) {
        size_t n = max;
        while (n > 0 && (static_cast<unsigned char>(key[n]) & 0xc0) == 0x80) {
            --n;
        }
        key = key.substr(0, n);
    }
    return json_text(boost::json::string(key)) + (cut ? "..." : "");
}

// A key as a step of a path: .name when it is an identifier, else ["..."].
std::string path_step(std::string_view key, size_t max) {
    const bool plain =
        !key.empty() && key.size() <= max && !is_digit(key[0]) &&
        std::all_of(key.begin(), key.end(), [](char c) {
            return c == '_' || is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
        });
    return plain ? "." + std::string(key) : "[" + shown_key(key, max) + "]";
}

}  // namespace

JsonStream::Result JsonStream::fail(std::string_view why) {
    if (state_ != State::kInvalid) {
        error_ = "byte " + std::to_string(offset_) + ": ";
        if (!why.empty()) {
            error_ += why;
        } else if (byte_ >= 0x20 && byte_ < 0x7f) {
            error_ += std::string("unexpected '") + static_cast<char>(byte_) + "'";
        } else {
            static constexpr char kHex[] = "0123456789abcdef";
            error_ += std::string("unexpected byte 0x") + kHex[byte_ >> 4] + kHex[byte_ & 0xf];
        }
    }
    state_ = State::kInvalid;
    return Result::kInvalid;
}

std::string JsonStream::path() const {
    std::string path = "$";
    for (size_t i = 0; i + 1 < frames_.size(); ++i) {
        const Frame& f = frames_[i];
        path += f.open == '[' ? "[" + std::to_string(f.items - 1) + "]"
                              : path_step(f.key, kShownKeyBytes);
    }
    return path;
}

JsonStream::Result JsonStream::end_key() {
    Frame& object = frames_.back();
    if (!object.keys.insert(fnv1a(key_buf_)).second) {
        repeated_key_ = true;
        return fail("the key " + shown_key(key_buf_, kShownKeyBytes) +
                    " is given twice in the object at " + path());
    }
    object.key.assign(key_buf_, 0, kShownKeyBytes + 1);
    if (frames_.size() == 1) {
        top_key_ = key_buf_;
    }
    return Result::kOk;
}

JsonStream::Result JsonStream::value_ended() {
    if (frames_.empty()) {
        state_ = State::kDone;
        return Result::kDone;
    }
    state_ = State::kCommaOrClose;
    return Result::kOk;
}

JsonStream::Result JsonStream::start_value(char c) {
    if ((c == '{' || c == '[') && frames_.size() >= max_depth_) {
        // Deeper than the server reads back (a client sending these arguments in its history
        // would get a 400) or writes.
        return fail("more than " + std::to_string(max_depth_) + " nested arrays and objects");
    }
    switch (c) {
        case '{':
            frames_.emplace_back('{');
            state_ = State::kKeyOrClose;
            return Result::kOk;
        case '[':
            frames_.emplace_back('[');
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
    byte_ = static_cast<unsigned char>(c);
    const Result r = step(c);
    ++offset_;
    return r;
}

JsonStream::Result JsonStream::step(char c) {
    switch (state_) {
        case State::kInvalid:
            return Result::kInvalid;
        case State::kDone:
            return is_space(c) ? Result::kOk : fail("text after the value");
        case State::kValue:
            if (is_space(c)) {
                return Result::kOk;
            }
            if (c == ']' && !frames_.empty() && frames_.back().open == '[') {
                // Only valid right after '[' (an empty array); a value after ',' is required.
                // The comma path enters kValue via kCommaOrClose, which sets token_ to ",".
                if (token_ == ",") {
                    return fail();
                }
                frames_.pop_back();
                return value_ended();
            }
            if (!frames_.empty() && frames_.back().open == '[') {
                ++frames_.back().items;
            }
            token_.clear();
            return start_value(c);
        case State::kKeyOrClose:
        case State::kKey:
            if (is_space(c)) {
                return Result::kOk;
            }
            if (c == '}' && state_ == State::kKeyOrClose) {
                frames_.pop_back();
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
                if (frames_.back().open == '{') {
                    state_ = State::kKey;
                } else {
                    token_.assign(1, ',');  // Not = ",": a GCC 12 -Wrestrict false alarm.
                    state_ = State::kValue;
                }
                return Result::kOk;
            }
            if ((c == '}' && frames_.back().open == '{') ||
                (c == ']' && frames_.back().open == '[')) {
                frames_.pop_back();
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
                    state_ = State::kColon;
                    return end_key();
                }
                return value_ended();
            }
            if (string_is_key_) {
                key_buf_ += c;
            }
            return Result::kOk;
        case State::kEscape:
            if (low_surrogate_due_ && c != 'u') {
                return fail();
            }
            if (std::strchr("\"\\/bfnrt", c) != nullptr && c != '\0') {
                if (string_is_key_) {
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
                } else if (string_is_key_) {
                    append_utf8(key_buf_,
                                unicode_ >= 0xdc00 && unicode_ <= 0xdfff
                                    ? 0x10000 + ((high_half_ - 0xd800) << 10) + (unicode_ - 0xdc00)
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
                    return fail("a number longer than 4096 bytes");
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
                    return is_space(c) ? Result::kOk : fail("text after the value");
                }
                return step(c);
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
