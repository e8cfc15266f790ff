#pragma once

// JsonPrefix follows a JSON text byte by byte and says whether what it has seen is still the
// beginning of a JSON object (RFC 8259 with an object at the top, as OpenAI's `json_object`
// response format answers) and whether the object is complete. The sampler asks it, token by
// token, which candidates keep the output valid (response_format json_object).
//
// A pushdown automaton over bytes: containers on a stack (at most kMaxDepth deep), strings with
// their escapes (\uXXXX: four hex digits; raw control characters refused; other characters in
// well-formed UTF-8, which a token may split), numbers in JSON's grammar (no leading zeros, a digit after '.'
// and after an exponent), the literals true, false and null. The object starts at once (no
// whitespace before it); elsewhere whitespace is allowed where JSON allows it, in runs of at most
// kMaxSpaces bytes (also after the object).
//
// Threading: a value type; copies are independent (accepts() tries bytes on a copy).

#include <array>
#include <cstdint>
#include <string_view>

namespace edge::engine::sampling {

class JsonPrefix {
public:
    static constexpr int kMaxDepth = 64;
    static constexpr int kMaxSpaces = 32;

    // Takes `bytes`; false, and the prefix unchanged, when they would make the text anything
    // but the beginning of an object.
    bool feed(std::string_view bytes);
    // Whether `bytes` could be fed.
    bool accepts(std::string_view bytes) const {
        JsonPrefix copy = *this;
        return copy.feed(bytes);
    }
    // The top-level object is closed.
    bool complete() const { return state_ == State::kDone; }

private:
    enum class State : uint8_t {
        kStart,          // Before the object: whitespace, then '{'.
        kValue,          // A value is due (after ':' or ',' in an array).
        kArrayFirst,     // After '[': a value or ']'.
        kObjectFirst,    // After '{': a key or '}'.
        kKey,            // After ',' in an object: a key.
        kColon,          // After a key.
        kNext,           // After a value in a container: ',' or its closing bracket.
        kString,         // Inside a string (key_ says which kind).
        kEscape,         // After '\' in a string.
        kHex,            // In \uXXXX, hex_left digits to go.
        kMinus,          // A number's '-'.
        kZero,           // A number's leading 0.
        kInteger,        // A number's integer digits.
        kDot,            // After '.'.
        kFraction,       // Fraction digits.
        kExponent,       // After 'e' or 'E'.
        kExponentSign,   // After the exponent's sign.
        kExponentDigits, // Exponent digits.
        kLiteral,        // Inside true, false or null.
        kDone,           // The object is closed: whitespace only.
    };

    // False for whitespace past a run's limit (or before the object).
    bool count_space(unsigned char c);
    bool step(unsigned char c);
    // A string's byte >= 0x80 that starts a UTF-8 character; false when none can.
    bool utf8_lead(unsigned char c);
    bool value_start(unsigned char c);
    bool push(bool object);
    void end_value();

    State state_ = State::kStart;
    bool key_ = false;  // kString: the string is an object key.
    int8_t hex_left_ = 0;
    int8_t utf8_left_ = 0;  // kString: continuation bytes still due, the next in [lo, hi].
    uint8_t utf8_lo_ = 0x80;
    uint8_t utf8_hi_ = 0xBF;
    bool surrogate_ = false;  // kHex: the escape so far is a high surrogate's.
    bool want_low_ = false;   // The next escape must be a low surrogate's.
    uint8_t literal_ = 0;  // kLiteral: which of true, false, null.
    uint8_t literal_at_ = 0;
    int depth_ = 0;
    int spaces_ = 0;  // Whitespace bytes in a row, outside strings.
    std::array<bool, kMaxDepth> object_{};  // By depth: an object (true) or an array.
};

}  // namespace edge::engine::sampling
