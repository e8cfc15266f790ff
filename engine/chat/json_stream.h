#pragma once

// JsonStream checks JSON text byte by byte as a model writes it, so a parser can pass argument
// text on as soon as it is known to be a valid prefix of one JSON value, and knows the moment the
// value ends. It also reports the keys of the outermost object (for Hermes-style calls whose
// "arguments" value is streamed out of a larger object). Numbers are checked against the JSON
// grammar byte by byte; strings must be valid escapes, surrogates paired (UTF-8 is the
// tokenizer's business).
//
// A key given twice in one object, at any depth, is refused at its closing quote, so that no
// byte of it streams on: {"a": 1, "a": 2} is read as either value or refused, depending on the
// reader. Keys are compared as the strings they decode to ("\u0061" is "a", a surrogate pair is
// its code point), by a 64-bit hash, as sampling::JsonPrefix compares them (same hash: what it
// lets a model write, this takes); two different keys of one object whose hashes are equal (a
// chance of 2^-64 a pair) are refused too. Memory: at most kMaxJsonDepth containers open, one
// hash per key of the objects open now (an object's go when it closes; a set entry costs a few
// dozen bytes, a key at least five bytes of text), the decoded text of the key being read, and
// the first kShownKeyBytes of the key each open object is in (for error()): it grows with the
// text read, by a bounded factor, and not with nesting past the depth limit.
//
// Threading: a value type; one owner.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/json_text.h"

namespace edge::engine::chat {

class JsonStream {
  public:
    enum class Result {
        kOk,       // The byte continues a valid prefix.
        kDone,     // The byte ended the value (the last byte of it).
        kInvalid,  // The byte cannot continue valid JSON; the stream stays invalid.
    };

    // `max_depth`: containers that may be open at once. kMaxJsonDepth, what the server reads back,
    // unless the text is read back as a part: a Hermes call object holds its arguments one level
    // down, so their kMaxJsonDepth levels make kMaxJsonDepth + 1.
    explicit JsonStream(size_t max_depth = kMaxJsonDepth) : max_depth_(max_depth) {}

    // Feeds one byte. Whitespace before the value is accepted; after kDone, only whitespace.
    Result feed(char c);

    bool done() const { return state_ == State::kDone; }
    bool invalid() const { return state_ == State::kInvalid; }
    // Why the stream is invalid ("" while it is not): the refused byte's offset (counted from 0
    // over every byte fed) and what was wrong, e.g. `byte 17: the key "b" is given twice in the
    // object at $.a[1]`.
    const std::string& error() const { return error_; }
    // The stream is invalid because a key was given twice in one object (the text may be
    // otherwise valid JSON, which lenient readers take).
    bool repeated_key() const { return repeated_key_; }
    // Containers open now (0 outside any, 1 inside the outermost object or array).
    size_t depth() const { return frames_.size(); }
    // At depth 1 of an object: the key whose value is being read or was just read, its escapes
    // decoded ("\ud83d\ude00" is the UTF-8 of U+1F600).
    const std::string& top_key() const { return top_key_; }
    // True when the next non-space byte starts a value at depth 1 (after "key":).
    bool expecting_top_value() const { return frames_.size() == 1 && state_ == State::kValue; }
    // True right after a value at depth 1 ended (before the ',' or the closing bracket).
    bool at_top_value_end() const { return frames_.size() == 1 && state_ == State::kCommaOrClose; }

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
    // An open object or array.
    struct Frame {
        explicit Frame(char bracket) : open(bracket) {}
        char open;  // '{' or '['.
        // An object: the hashes of its keys so far (common/fnv1a.h); the last one's first
        // kShownKeyBytes + 1 bytes, decoded, to name the path in an error.
        std::unordered_set<uint64_t> keys;
        std::string key;
        size_t items = 0;  // An array: values begun in it so far.
    };
    // Bytes of a key shown in error(); a longer one is cut (and its frame holds no more).
    static constexpr size_t kShownKeyBytes = 32;

    Result step(char c);
    Result value_ended();
    Result fail(std::string_view why = {});
    Result start_value(char c);
    // The key just read (key_buf_) into the object on top; kInvalid when it has it already.
    Result end_key();
    // Where the object on top is, from the outermost value ("$", "$.a[1]", "$[\"a b\"]").
    std::string path() const;

    State state_ = State::kValue;
    size_t max_depth_;
    std::vector<Frame> frames_;
    size_t offset_ = 0;  // Bytes fed before the one being read.
    uint8_t byte_ = 0;   // The one being read.
    std::string error_;
    bool repeated_key_ = false;
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
    std::string key_buf_;  // The key being read, decoded.
    std::string top_key_;
};

}  // namespace edge::engine::chat
