#pragma once

// JsonStream checks JSON text byte by byte as a model writes it, so a parser can pass argument
// text on as soon as it is known to be a valid prefix of one JSON value, and knows the moment the
// value ends. It also reports the keys of the outermost object (for Hermes-style calls whose
// "arguments" value is streamed out of a larger object). Numbers are checked against the JSON
// grammar byte by byte; strings must be valid escapes, surrogates paired (UTF-8 is the
// tokenizer's business).
//
// Threading: a value type; one owner.

#include <cstdint>
#include <string>
#include <vector>

namespace edge::engine::chat {

class JsonStream {
  public:
    enum class Result {
        kOk,       // The byte continues a valid prefix.
        kDone,     // The byte ended the value (the last byte of it).
        kInvalid,  // The byte cannot continue valid JSON; the stream stays invalid.
    };

    // Feeds one byte. Whitespace before the value is accepted; after kDone, only whitespace.
    Result feed(char c);

    bool done() const { return state_ == State::kDone; }
    bool invalid() const { return state_ == State::kInvalid; }
    // Containers open now (0 outside any, 1 inside the outermost object or array).
    size_t depth() const { return stack_.size(); }
    // At depth 1 of an object: the key whose value is being read or was just read, its escapes
    // decoded ("\ud83d\ude00" is the UTF-8 of U+1F600).
    const std::string& top_key() const { return top_key_; }
    // True when the next non-space byte starts a value at depth 1 (after "key":).
    bool expecting_top_value() const { return stack_.size() == 1 && state_ == State::kValue; }
    // True right after a value at depth 1 ended (before the ',' or the closing bracket).
    bool at_top_value_end() const { return stack_.size() == 1 && state_ == State::kCommaOrClose; }

  private:
    enum class State {
        kValue,       // Expecting a value.
        kKeyOrClose,  // After '{'.
        kKey,         // After ',' in an object.
        kColon,
        kCommaOrClose,
        kString,
        kEscape,
        kUnicode,
        kNumber,
        kLiteral,
        kDone,
        kInvalid,
    };
    Result value_ended();
    Result fail() {
        state_ = State::kInvalid;
        return Result::kInvalid;
    }
    Result start_value(char c);

    State state_ = State::kValue;
    std::vector<char> stack_;  // '{' or '['.
    bool string_is_key_ = false;
    int unicode_left_ = 0;
    uint32_t unicode_ = 0;  // The \u escape's code unit read so far.
    // A high surrogate escape was read: only a low surrogate escape may follow it. Boost.JSON,
    // which reads the call back from a client's history, refuses a surrogate that is not paired.
    bool low_surrogate_due_ = false;
    uint32_t high_half_ = 0;  // The high surrogate's code unit, while its low half is due.
    std::string token_;     // Literal being read.
    uint8_t number_ = 0;    // Where a number being read is in its grammar (json_stream.cc).
    size_t number_bytes_ = 0;
    const char* literal_ = nullptr;
    std::string key_buf_;
    std::string top_key_;
};

}  // namespace edge::engine::chat
