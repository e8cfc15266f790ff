// JsonStream: JSON text checked byte by byte as a model writes it, refused at the first byte that
// cannot lead to valid JSON, and at the closing quote of a key its object already has.

#include "engine/chat/json_stream.h"

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <string>

#include "common/json_text.h"

namespace edge::engine::chat {
namespace {

// s fed whole: the stream took it and the value ended.
bool valid(const std::string& s) {
    JsonStream j;
    for (char c : s) {
        if (j.feed(c) == JsonStream::Result::kInvalid) {
            return false;
        }
    }
    return j.done();
}

// The first byte of s the stream refuses (s.size() when none).
size_t refused_at(const std::string& s) {
    JsonStream j;
    for (size_t i = 0; i < s.size(); ++i) {
        if (j.feed(s[i]) == JsonStream::Result::kInvalid) {
            return i;
        }
    }
    return s.size();
}

// The stream's error() once s is fed ("" when it took s).
std::string error_of(const std::string& s) {
    JsonStream j;
    for (char c : s) {
        static_cast<void>(j.feed(c));
    }
    return j.error();
}

TEST_CASE("tool calls: JSON stream validator") {
    CHECK(valid("{\"a\": [1, -2.5e+3, true, false, null, \"\\u00e9\\n\"], \"b\": {}}"));
    CHECK(valid("[]"));
    CHECK_FALSE(valid("{\"a\": 01}"));
    // A number is a valid prefix at every byte: "1-" is refused at its '-', not when it ends.
    CHECK(refused_at("[1-2]") == 2);
    CHECK(refused_at("[01]") == 2);
    CHECK(refused_at("[1.e5]") == 3);
    CHECK(refused_at("[1e+-5]") == 4);
    CHECK(refused_at("[-]") == 2);
    CHECK(refused_at("[1.]") == 3);
    CHECK(refused_at("[-0.5e-3, 10E2, 0]") == 18);
    CHECK_FALSE(valid("[1,]"));
    CHECK_FALSE(valid("{\"a\" 1}"));
    CHECK_FALSE(valid("{\"a\": \"\\x\"}"));
    CHECK_FALSE(valid("{\"a\": 1} x"));
    // Surrogate escapes come in pairs, as Boost.JSON reads them back; refused at the first byte
    // that rules the pair out.
    for (const std::string s : {"[\"\\uD83D\\uDE00\"]", "[\"\\udbff\\udfff\"]",
                                "[\"\\ud7ff\\ue000\"]", "{\"\\ud800\\udc00\": 1}"}) {
        INFO(s);
        CHECK(valid(s));
        CHECK_NOTHROW(boost::json::parse(s));
    }
    for (const std::string s : {"[\"\\ud800\"]", "[\"\\udfff\"]", "[\"\\ud800\\ud800\"]",
                                "[\"\\ud800\\n\"]", "[\"\\ud800a\"]", "{\"\\ud800\": 1}"}) {
        INFO(s);
        CHECK_FALSE(valid(s));
        CHECK_THROWS(boost::json::parse(s));
    }
    CHECK(refused_at("[\"\\ud800\"]") == 8);
    CHECK(refused_at("[\"\\udc00\"]") == 5);
    CHECK(refused_at("[\"\\ud800\\u0041\"]") == 10);
    CHECK(refused_at("[\"\\ud800\\ud800\"]") == 11);
    CHECK(refused_at("[\"\\ud800\\n\"]") == 9);
    CHECK_FALSE(valid("{\"a\": 1"));
    // Containers nest at most 64 deep, as the server reads JSON back (a deeper call's arguments
    // in a client's history would be a 400).
    auto nested = [](size_t depth) {
        return "{\"a\": " + std::string(depth - 1, '[') + std::string(depth - 1, ']') + "}";
    };
    CHECK(valid(nested(kMaxJsonDepth)));
    CHECK_FALSE(valid(nested(kMaxJsonDepth + 1)));
}

TEST_CASE("tool calls: JSON stream refuses a key given twice in one object, at any depth") {
    // Refused at the closing quote of the second key, before a byte of its value: a client
    // would read {"a": 1, "a": 2} as either value, or refuse it.
    for (const std::string s :
         {R"({"a": 1, "a": 2})", R"({"x": {"a": 1, "a": 2}})",
          R"({"x": {"y": {"a": 1, "b": [], "a": 2}}})", R"([{"x": [0, {"a": 1, "a": 2}]}])"}) {
        INFO(s);
        CHECK(refused_at(s) == s.rfind("\"a\"") + 2);
    }
    // Keys are compared as they decode: escapes, and surrogate pairs as their code point.
    for (const std::string s :
         {R"({"x": {"a": 1, "\u0061": 2}})", R"({"x": {"y": {"\u0061": 1, "a": 2}}})",
          "{\"x\": {\"\\ud83d\\ude00\": 1, \"\xf0\x9f\x98\x80\": 2}}",
          R"({"x": {"y": {"a\nb": 1, "a\u000Ab": 2}}})", R"({"x": {"\/": 1, "/": 2}})"}) {
        INFO(s);
        CHECK(refused_at(s) == s.rfind("\": 2"));
    }
    // Each object has its own keys: siblings, nested objects and an object after another closed
    // may reuse them; keys that decode differently are different.
    for (const std::string s :
         {R"([{"a": 1}, {"a": 2}])", R"({"x": {"a": 1}, "y": {"a": 1}})",
          R"({"a": {"a": {"a": 1}}, "b": [{"a": 1, "b": 2}, {"b": 1, "a": 2}]})",
          R"({"x": {"argume\nts": 1, "arguments": 2, "a": 3, "A": 4, "\u00e9": 5}})"}) {
        INFO(s);
        CHECK(valid(s));
    }
    // The error names the key, the object's path and the byte.
    std::string s = R"({"x": [0, {"y": {"b": 1, "b": 2}}]})";
    CHECK(error_of(s) == "byte " + std::to_string(s.rfind("\"b\"") + 2) +
                             ": the key \"b\" is given twice in the object at $.x[1].y");
    s = R"({"a b": {"c": 1, "\u0063": 2}})";
    CHECK(error_of(s) == "byte 24: the key \"c\" is given twice in the object at $[\"a b\"]");
    const std::string long_key(40, 'k');
    s = "{\"" + long_key + "\": {\"c\": 1, \"c\": 2}}";
    CHECK(error_of(s).ends_with("at $[\"" + std::string(32, 'k') + "\"...]"));
    // The stream stays refused; repeated_key() tells a key given twice from other errors.
    JsonStream j;
    for (char c : std::string(R"({"a": {"b": 1, "b")")) {
        static_cast<void>(j.feed(c));
    }
    CHECK(j.invalid());
    CHECK(j.repeated_key());
    CHECK(j.feed(':') == JsonStream::Result::kInvalid);
    JsonStream bad;
    for (char c : std::string(R"({"a": x)")) {
        static_cast<void>(bad.feed(c));
    }
    CHECK_FALSE(bad.repeated_key());
    CHECK(bad.error() == "byte 6: unexpected 'x'");
}

TEST_CASE("tool calls: JSON stream keeps the keys of open objects only") {
    // Many keys in one object are taken (each a hash, checked in constant time); those of an
    // object that closed are let go, so its siblings may use them again.
    std::string object = "{";
    for (int i = 0; i < 100000; ++i) {
        object += (i == 0 ? "\"k" : ", \"k") + std::to_string(i) + "\": " + std::to_string(i);
    }
    object += "}";
    CHECK(valid("[" + object + ", " + object + "]"));
    const std::string twice = "[" + object + ", {\"k0\": 0, \"k0\"";
    CHECK(refused_at(twice) == twice.size() - 1);
}

TEST_CASE("tool calls: JSON stream nested too deep stays refused") {
    // Refused at the 65th open bracket, and every byte after it is too: a stream is refused
    // for good (it took the next ']' as closing the 64th, and went on).
    JsonStream j;
    const std::string deep(kMaxJsonDepth + 1, '[');
    for (char c : deep) {
        static_cast<void>(j.feed(c));
    }
    CHECK(j.invalid());
    CHECK(j.error() == "byte 64: more than 64 nested arrays and objects");
    CHECK(j.feed(']') == JsonStream::Result::kInvalid);
}

}  // namespace
}  // namespace edge::engine::chat
