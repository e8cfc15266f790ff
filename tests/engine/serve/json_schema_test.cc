// JsonSchema and JsonPrefix under a schema (response_format json_schema): what compiles and what
// is refused with which message; documents in the schema's order are taken and others refused at
// the byte that rules them out; and random walks through the automaton (a random byte among
// those it takes, each step) never reach a dead end, and every document they complete is valid
// by a checker written here from the JSON Schema specification over the raw schema document (not
// the compiled graph), after Boost.JSON parses it. The same walks through GLM-4.5's argument pairs
// (ArgumentPairs), read back by its tool-call parser, then checked.

#include "engine/sampling/json_schema.h"

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include "common/json_text.h"
#include "engine/chat/tool_call_parser.h"
#include "engine/sampling/json_prefix.h"
#include "tests/engine/serve/json_walk.h"

namespace edge::engine::sampling {
namespace {

namespace json = boost::json;

// As a request's response_format is read (parse_json: its depth, decimals to the nearest double).
std::shared_ptr<const JsonSchema> compiled(const std::string& text) {
    std::error_code ec;
    const json::value doc = parse_json(text, ec);
    REQUIRE_MESSAGE(!ec, ec.message());
    auto s = JsonSchema::compile(doc);
    REQUIRE_MESSAGE(s.ok(), s.status().to_string());
    return *s;
}

// The byte at which `text` stops being the beginning of a valid document, or text.size().
size_t refused_at(const JsonSchema& schema, const std::string& text) {
    JsonPrefix p(schema);
    for (size_t i = 0; i < text.size(); ++i) {
        if (!p.feed(text.substr(i, 1))) {
            return i;
        }
    }
    return text.size();
}

// `text` is taken byte by byte, and complete at its last byte, not before.
void check_complete_at_end(const JsonSchema& schema, const std::string& text) {
    JsonPrefix p(schema);
    for (size_t i = 0; i < text.size(); ++i) {
        CHECK_FALSE(p.complete());
        REQUIRE(p.feed(text.substr(i, 1)));
    }
    CHECK(p.complete());
}

// --- An independent checker: JSON Schema's rules for the subset, on the raw documents. ---

bool same_value(const json::value& a, const json::value& b) {
    if (a.is_number() && b.is_number()) {
        return a.to_number<double>() == b.to_number<double>();
    }
    if (a.is_array() && b.is_array()) {
        const json::array& x = a.get_array();
        const json::array& y = b.get_array();
        if (x.size() != y.size()) {
            return false;
        }
        for (size_t i = 0; i < x.size(); ++i) {
            if (!same_value(x[i], y[i])) {
                return false;
            }
        }
        return true;
    }
    if (a.is_object() && b.is_object()) {
        if (a.get_object().size() != b.get_object().size()) {
            return false;
        }
        for (const auto& [k, v] : a.get_object()) {
            const json::value* w = b.get_object().if_contains(k);
            if (w == nullptr || !same_value(v, *w)) {
                return false;
            }
        }
        return true;
    }
    return a == b;
}

bool is_type(const json::value& v, std::string_view type) {
    if (type == "integer") {
        return v.is_int64() || v.is_uint64() ||
               (v.is_double() &&
                v.get_double() == static_cast<double>(static_cast<int64_t>(v.get_double())));
    }
    return (type == "number" && v.is_number()) || (type == "string" && v.is_string()) ||
           (type == "boolean" && v.is_bool()) || (type == "null" && v.is_null()) ||
           (type == "array" && v.is_array()) || (type == "object" && v.is_object());
}

int64_t code_points(std::string_view s) {
    int64_t n = 0;
    for (char c : s) {
        n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    }
    return n;
}

bool valid(const json::value& doc, const json::value& schema, const json::value& v) {
    if (schema.is_bool()) {
        return schema.get_bool();
    }
    const json::object& s = schema.get_object();
    if (const json::value* ref = s.if_contains("$ref")) {
        const std::string_view pointer = std::string_view(ref->get_string()).substr(1);
        boost::system::error_code ec;
        const json::value* target = doc.find_pointer(pointer, ec);
        return target != nullptr && valid(doc, *target, v);
    }
    if (const json::value* all = s.if_contains("allOf")) {
        for (const json::value& sub : all->get_array()) {
            if (!valid(doc, sub, v)) {
                return false;
            }
        }
    }
    if (const json::value* any = s.if_contains("anyOf")) {
        bool one = false;
        for (const json::value& sub : any->get_array()) {
            one = one || valid(doc, sub, v);
        }
        if (!one) {
            return false;
        }
    }
    if (const json::value* one_of = s.if_contains("oneOf")) {
        int matches = 0;
        for (const json::value& sub : one_of->get_array()) {
            matches += valid(doc, sub, v) ? 1 : 0;
        }
        if (matches != 1) {
            return false;
        }
    }
    if (const json::value* values = s.if_contains("enum")) {
        bool found = false;
        for (const json::value& e : values->get_array()) {
            found = found || same_value(e, v);
        }
        if (!found) {
            return false;
        }
    }
    if (const json::value* c = s.if_contains("const"); c != nullptr && !same_value(*c, v)) {
        return false;
    }
    if (const json::value* t = s.if_contains("type")) {
        bool typed = false;
        if (t->is_string()) {
            typed = is_type(v, t->get_string());
        } else {
            for (const json::value& e : t->get_array()) {
                typed = typed || is_type(v, e.get_string());
            }
        }
        if (!typed) {
            return false;
        }
    }
    if (v.is_object()) {
        const json::object& o = v.get_object();
        const json::value* props = s.if_contains("properties");
        if (const json::value* req = s.if_contains("required")) {
            for (const json::value& name : req->get_array()) {
                if (!o.contains(name.get_string())) {
                    return false;
                }
            }
        }
        for (const auto& [k, e] : o) {
            const json::value* sub =
                props != nullptr ? props->get_object().if_contains(k) : nullptr;
            if (sub == nullptr) {
                sub = s.if_contains("additionalProperties");
            }
            if (sub != nullptr && !valid(doc, *sub, e)) {
                return false;
            }
        }
    }
    if (v.is_array()) {
        const json::array& a = v.get_array();
        if (const json::value* n = s.if_contains("minItems");
            n && a.size() < n->to_number<size_t>()) {
            return false;
        }
        if (const json::value* n = s.if_contains("maxItems");
            n && a.size() > n->to_number<size_t>()) {
            return false;
        }
        if (const json::value* items = s.if_contains("items")) {
            for (const json::value& e : a) {
                if (!valid(doc, *items, e)) {
                    return false;
                }
            }
        }
    }
    if (v.is_number()) {
        const double x = v.to_number<double>();
        auto bound = [&](std::string_view key) -> const json::value* {
            const json::value* b = s.if_contains(key);
            return b != nullptr && b->is_number() ? b : nullptr;
        };
        auto flag = [&](std::string_view key) {
            const json::value* b = s.if_contains(key);
            return b != nullptr && b->is_bool() && b->get_bool();
        };
        if (const json::value* b = bound("minimum");
            b &&
            (flag("exclusiveMinimum") ? x <= b->to_number<double>() : x < b->to_number<double>())) {
            return false;
        }
        if (const json::value* b = bound("maximum");
            b &&
            (flag("exclusiveMaximum") ? x >= b->to_number<double>() : x > b->to_number<double>())) {
            return false;
        }
        if (const json::value* b = bound("exclusiveMinimum"); b && x <= b->to_number<double>()) {
            return false;
        }
        if (const json::value* b = bound("exclusiveMaximum"); b && x >= b->to_number<double>()) {
            return false;
        }
    }
    if (v.is_string()) {
        const int64_t n = code_points(v.get_string());
        if (const json::value* m = s.if_contains("minLength"); m && n < m->to_number<int64_t>()) {
            return false;
        }
        if (const json::value* m = s.if_contains("maxLength"); m && n > m->to_number<int64_t>()) {
            return false;
        }
    }
    return true;
}

const char* const kPerson = R"({
  "$defs": {
    "Pet": {"type": "object",
            "properties": {"kind": {"enum": ["cat", "dog", "cat-like"]},
                           "age": {"type": "integer"}},
            "required": ["kind"], "additionalProperties": false}
  },
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 8, "description": "who"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
             "minItems": 1, "maxItems": 3},
    "score": {"type": "number"},
    "ok": {"type": "boolean"},
    "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
    "level": {"const": 3},
    "note": {"type": ["string", "null"], "format": "date"},
    "say \"hi\"/é": {"type": "null"}
  },
  "required": ["name", "tags", "pet"],
  "additionalProperties": false
})";

const char* const kTree = R"({
  "$defs": {"node": {"type": "object",
                     "properties": {"v": {"type": "integer"},
                                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                             "maxItems": 2}},
                     "required": ["v"]}},
  "$ref": "#/$defs/node"
})";

const char* const kDict = R"({"type": "object", "additionalProperties": {"type": "integer"}})";

const char* const kLiterals = R"({"type": "object", "properties": {"n": {"enum":
    [1, 12, 1.5, "1", null, [1, 2], {"a": 1}, true]}}, "required": ["n"]})";

// enum and const beside the keywords that narrow them: only the values those allow are written.
const char* const kEnumSiblings = R"({"type": "object", "properties": {
    "s": {"type": "string", "enum": ["toolong", "ok", "abc", "x", "ab"], "maxLength": 3,
          "minLength": 2},
    "i": {"type": "integer", "enum": [1, 50, 7, -3, 10], "maximum": 10, "minimum": 0},
    "n": {"type": ["number", "null"], "enum": [0.5, 2, "x", null], "exclusiveMaximum": 1},
    "a": {"type": "array", "enum": [[1], [1, 2, 3], [], ["a"], [2, 3]], "minItems": 1,
          "maxItems": 2, "items": {"type": "integer"}},
    "o": {"type": "object", "enum": [{"k": 1}, {"j": 2}, {"k": "s"}],
          "properties": {"k": {"type": "integer"}}, "required": ["k"]},
    "c": {"type": "string", "const": "abcd", "maxLength": 4}},
  "required": ["s", "i", "n", "a", "o", "c"]})";

const char* const kAnyValues = R"({"type": "object", "properties": {"x": {}, "y": true,
    "z": {"type": "array", "items": false}}, "required": ["x", "y", "z"]})";

// Alternatives that begin alike: objects told apart by a discriminator (oneOf, as Pydantic
// writes it) or by which properties they take (anyOf), strings by length, integers by range.
const char* const kUnions = R"({"type": "object", "properties": {
    "shapes": {"type": "array", "maxItems": 3, "items": {
        "oneOf": [
          {"type": "object", "properties": {"kind": {"const": "circle"},
                                            "r": {"type": "number", "minimum": 0}},
           "required": ["kind", "r"], "additionalProperties": false},
          {"type": "object", "properties": {"w": {"type": "integer"},
                                            "kind": {"enum": ["rect", "square"]},
                                            "h": {"type": "integer"}},
           "required": ["kind", "w"]},
          {"$ref": "#/$defs/tri"}],
        "discriminator": {"propertyName": "kind"}}},
    "id": {"anyOf": [{"type": "string", "maxLength": 2},
                     {"type": "string", "minLength": 4, "maxLength": 5},
                     {"type": "integer", "maximum": 9}, {"type": "integer", "minimum": 100}]},
    "v": {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                     "required": ["a"]},
                    {"type": "object", "properties": {"a": {"type": "integer"},
                                                      "b": {"type": "string"}},
                     "required": ["b"]}]}},
  "required": ["shapes", "id", "v"],
  "$defs": {"tri": {"type": "object", "properties": {"kind": {"const": "tri"},
                                                     "sides": {"type": "array", "minItems": 3,
                                                               "maxItems": 3}},
                    "required": ["kind"]}}
})";

const char* const kBounds = R"({"type": "object", "properties": {
    "age": {"type": "integer", "minimum": 18, "maximum": 120},
    "p": {"type": "number", "minimum": 0, "maximum": 1},
    "t": {"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": 0},
    "d4": {"type": "integer", "minimum": 0, "exclusiveMinimum": true, "maximum": 3},
    "big": {"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991},
    "free": {"type": "number"},
    "untyped": {"minimum": 5, "maximum": 10},
    "above": {"exclusiveMinimum": -1},
    "enum": {"enum": [3, 7, "7", 12], "maximum": 10, "minimum": 5}},
  "required": ["age", "p", "t", "d4", "big"]})";

TEST_CASE("json schema: bounds without a type are numbers in range") {
    const auto untyped = compiled(
        R"({"type":"object","properties":{"a":{"minimum":5,"maximum":10}},"required":["a"]})");
    CHECK(refused_at(*untyped, R"({"a":-3})") == 5);
    CHECK(refused_at(*untyped, R"({"a":"x"})") == 5);
    CHECK(refused_at(*untyped, R"({"a":11})") == 6);
    check_complete_at_end(*untyped, R"({"a":7.5})");
    const auto open =
        compiled(R"({"type":"object","properties":{"a":{"exclusiveMaximum":0}},"required":["a"]})");
    CHECK(refused_at(*open, R"({"a":0})") == 5);
    check_complete_at_end(*open, R"({"a":-0.5})");
}

TEST_CASE("json schema: bounds at the edge of the digits a bounded number is written in") {
    const auto edges = compiled(R"({"type":"object","properties":{
        "tiny": {"type":"number","exclusiveMinimum":0,"maximum":1e-14},
        "huge": {"type":"integer","minimum":999999999999999},
        "low": {"type":"integer","minimum":-1e20,"maximum":-999999999999999}}})");
    check_complete_at_end(*edges, R"({"tiny":0.00000000000001})");
    check_complete_at_end(*edges, R"({"huge":999999999999999})");
    check_complete_at_end(*edges, R"({"low":-999999999999999})");
    CHECK(refused_at(*edges, R"({"tiny":0.000000000000001})") == 23);
    // A range narrower than the last digit's step: from 9.999999999999995 to 10, only 10 can be
    // written in 15 digits; 9.9999999999999 spans the range but no digit left ends inside it
    // (it stopped the reply there: a dead end, answered 500). Likewise just past an exclusive
    // bound, and below zero.
    const auto narrow = compiled(R"({"type":"object","properties":{
        "x": {"type":"number","minimum":9.999999999999995,"maximum":10},
        "y": {"type":"number","exclusiveMinimum":0.99999999999999,"maximum":1},
        "z": {"type":"number","minimum":-10,"maximum":-9.999999999999995}},
        "required":["x","y","z"]})");
    CHECK(refused_at(*narrow, R"({"x":9)") == 5);
    CHECK(refused_at(*narrow, R"({"x":1,"y":)") == 6);  // 1 is below the minimum.
    check_complete_at_end(*narrow, R"({"x":10,"y":1,"z":-10})");
    // 0.x has at most 14 fraction digits ("0." counts its zero), none above the bound.
    CHECK(refused_at(*narrow, R"({"x":10,"y":0)") == 12);
    CHECK(refused_at(*narrow, R"({"x":10,"y":1,"z":-9)") == 19);
}

TEST_CASE("json schema: numbers stay within minimum and maximum, digit by digit") {
    const auto bounds = compiled(kBounds);
    const json::value doc = json::parse(kBounds);
    for (const std::string text :
         {R"({"age":18,"p":0.3,"t":-2.4999,"d4":3,"big":-123456789012345})",
          R"({"age":120,"p":1.000,"t":-0.0001,"d4":1,"big":0,"free":-1.5e-300})",
          R"({"age":99,"p":-0.0,"t":-2,"d4":2,"big":999999999999999})"}) {
        CAPTURE(text);
        CHECK(valid(doc, doc, json::parse(text)));
        CHECK(refused_at(*bounds, text) == text.size());
    }
    const std::string head = R"({"age":20,"p":0.5,"t":-1,"d4":1,"big":)";
    const std::vector<std::pair<std::string, size_t>> invalid = {
        {R"({"age":17})", 8},  // 17 and every longer number is out of range.
        {R"({"age":121})", 9},
        {R"({"age":0})", 7},
        {R"({"age":-1})", 7},
        {R"({"age":18.5})", 9},  // An integer.
        {R"({"age":1,)", 8},     // 1 is not in range (10 to 19 would be).
        {R"({"age":18,"p":1.5})", 16},
        {R"({"age":18,"p":-0.1})", 17},
        {R"({"age":18,"p":1e0})", 15},  // No exponent with bounds.
        {R"({"age":18,"p":0,"t":0})", 20},
        {R"({"age":18,"p":0,"t":-2.5})", 23},
        {R"({"age":18,"p":0,"t":-3})", 21},
        {R"({"age":18,"p":0,"t":-1,"d4":0})", 28},
        {R"({"age":18,"p":0,"t":-1,"d4":4})", 28},
        {head + "1234567890123456}", head.size() + 15},  // At most 15 digits.
    };
    for (const auto& [text, at] : invalid) {
        CAPTURE(text);
        CHECK(refused_at(*bounds, text) == at);
    }
}

TEST_CASE(
    "json schema: documents in the schema's order are taken, others refused where they "
    "go wrong") {
    const auto person = compiled(kPerson);
    const std::vector<std::string> valid_docs = {
        R"({"name":"Bo","tags":["a"],"pet":null})",
        R"({ "name" : "Bo" , "tags" : [ "a" , "bcd" ] , "pet" : { "kind" : "cat" } })",
        R"({"name":"Ünïcødé!","tags":["a","\u00e9\"","\ud83d\ude00"],"score":-1.5e3,)"
        R"("ok":false,"pet":{"kind":"cat-like","age":-7},"level":3,"note":null,)"
        R"("say \"hi\"/é":null})",
        R"({"name":"x","tags":["a"],"pet":{"kind":"dog","age":0},"note":"2026-12-03"})",
    };
    const json::value person_doc = json::parse(kPerson);
    for (const std::string& text : valid_docs) {
        CAPTURE(text);
        CHECK(valid(person_doc, person_doc, json::parse(text)));
        check_complete_at_end(*person, text);
    }
    const std::vector<std::pair<std::string, size_t>> invalid = {
        {R"({"tags":["a"]})", 2},                          // "name" is required, and comes first.
        {R"({"name":"","tags":["a"]})", 9},                // minLength 1.
        {R"({"name":"123456789"})", 17},                   // maxLength 8.
        {R"({"name":"a","tags":[]})", 20},                 // minItems 1.
        {R"({"name":"a","tags":["a","b","c","d"]})", 31},  // maxItems 3.
        {R"({"name":"a","tags":["abcd"]})", 24},           // The items' maxLength 3.
        {R"({"name":"a","tags":["a"],"pet":{"kind":"cow"}})", 41},
        {R"({"name":"a","tags":["a"],"pet":{"kind":"cat","age":1.5}})", 52},  // An integer.
        {R"({"name":"a","tags":["a"],"pet":{"kind":"cat","age":01}})", 52},
        {R"({"name":"a","tags":["a"],"pet":null,"level":4})", 44},
        {R"({"name":"a","tags":["a"]})", 24},             // "pet" is required.
        {R"({"name":"a","pet":null,"tags":["x"]})", 13},  // "tags" cannot be skipped.
        {R"({"name":"a","tags":["a"],"pet":null,"extra":1})", 37},
        {R"({"name":"a","tags":["a"],"pet":null,"ok":true})", 37},  // Out of order.
        {R"({"name":"a","tags":["a"],"pet":"cat"})", 31},           // Neither object nor null.
        {R"({"name":"a","tags":["a"],"pet":{"age":1,"kind":"cat"}})", 33},
        {R"({"name":"a","tags":["a"],"pet":null,"note":1})", 43},
        {R"({"name":"a","tags":["a"],"pet":null,"say \"hi\"/e":null})", 48},
        {R"({"name":"a","tags":["a"],"pet":null}})", 36},          // Ends at the object.
        {R"({"name":"a",  "tags":["a"],"pet":null})", 13},         // One space at a time,
        {"{\"name\":\"a\",\n\"tags\":[\"a\"],\"pet\":null}", 12},  // and no other.
    };
    for (const auto& [text, at] : invalid) {
        CAPTURE(text);
        CHECK(refused_at(*person, text) == at);
    }

    const auto tree = compiled(kTree);
    const std::string nested = R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})";
    CHECK(refused_at(*tree, nested) == nested.size());
    CHECK(refused_at(*tree, R"({"v":1,"kids":[{"v":2},{"v":3},{"v":4}]})") == 30);  // maxItems.
    CHECK(refused_at(*tree, R"({"kids":[]})") == 2);

    const auto dict = compiled(kDict);
    CHECK(refused_at(*dict, R"({"any key":1,"k\n":-20,"other key":3})") == 37);
    CHECK(refused_at(*dict, R"({"any key":1,"k\n":-20,"any key":3})") == 31);  // A key again.
    CHECK(refused_at(*dict, R"({"a":"b"})") == 5);

    const auto literals = compiled(kLiterals);
    for (const std::string n : {"1", "12", "1.5", "\"1\"", "null", "[1,2]", "{\"a\":1}", "true"}) {
        const std::string text = R"({"n":)" + n + "}";
        CAPTURE(text);
        CHECK(refused_at(*literals, text) == text.size());
    }
    CHECK(refused_at(*literals, R"({"n":2})") == 5);
    CHECK(refused_at(*literals, R"({"n":13})") == 6);
    CHECK(refused_at(*literals, R"({"n":[1, 2]})") == 8);  // Only the canonical spelling.
    CHECK(refused_at(*literals, R"({"n":"2"})") == 6);

    const auto any_values = compiled(kAnyValues);
    const std::string any_doc = R"({"x":[1,{"k":"v"}],"y":"s","z":[]})";
    CHECK(refused_at(*any_values, any_doc) == any_doc.size());
    CHECK(refused_at(*any_values, R"({"x":1,"y":2,"z":[1]})") == 18);  // items false.
}

TEST_CASE("json schema: enum and const values are held to the keywords beside them") {
    const auto strings =
        compiled(R"({"type":"object","properties":{"a":{"type":"string","enum":["toolong","ok"],)"
                 R"("maxLength":3}},"required":["a"]})");
    CHECK(refused_at(*strings, R"({"a":"toolong"})") == 6);
    check_complete_at_end(*strings, R"({"a":"ok"})");
    const auto integers =
        compiled(R"({"type":"object","properties":{"a":{"type":"integer","enum":[1,50],)"
                 R"("maximum":10}},"required":["a"]})");
    CHECK(refused_at(*integers, R"({"a":50})") == 5);
    check_complete_at_end(*integers, R"({"a":1})");
    const auto objects = compiled(kEnumSiblings);
    CHECK(refused_at(*objects, R"({"s":"x")") == 6);
    CHECK(refused_at(*objects, R"({"s":"ok","i":-3)") == 14);
    check_complete_at_end(*objects,
                          R"({"s":"abc","i":10,"n":null,"a":[2,3],"o":{"k":1},"c":"abcd"})");
    CHECK(refused_at(*objects, R"({"s":"ab","i":7,"n":2)") == 20);
    CHECK(refused_at(*objects, R"({"s":"ab","i":7,"n":0.5,"a":[])") == 29);
    CHECK(refused_at(*objects, R"({"s":"ab","i":7,"n":0.5,"a":[1],"o":{"j")") == 38);
}

TEST_CASE("json schema: alternatives that begin alike are followed side by side") {
    const auto unions = compiled(kUnions);
    const json::value doc = json::parse(kUnions);
    const std::string v = R"(,"v":{"a":1}})";
    const std::vector<std::string> valid_docs = {
        R"({"shapes":[],"id":"ab")" + v,
        R"({"shapes":[{"kind":"circle","r":0.5}],"id":"abcd")" + v,
        R"({"shapes":[{"w":2,"kind":"square"},{"kind":"tri"},{"w":1,"kind":"rect","h":2}],)"
        R"("id":7)" +
            v,
        R"({"shapes":[],"id":100,"v":{"a":1,"b":"x"}})",
        R"({"shapes":[],"id":12345,"v":{"b":"x"}})",
        R"({"shapes":[{"kind":"tri","sides":[1,2,3]}],"id":"","v":{"a":-3}})",
    };
    for (const std::string& text : valid_docs) {
        CAPTURE(text);
        CHECK(valid(doc, doc, json::parse(text)));
        check_complete_at_end(*unions, text);
    }
    const std::vector<std::pair<std::string, size_t>> invalid = {
        {R"({"shapes":[{"kind":"circle","w":1}]})", 29},     // A circle has "r", not "w".
        {R"({"shapes":[{"kind":"circle"}]})", 27},           // and it is required.
        {R"({"shapes":[{"kind":"oval"}]})", 20},             // No alternative has "oval".
        {R"({"shapes":[{"w":1,"kind":"tri"}]})", 26},        // Only rect and square begin with w.
        {R"({"shapes":[{"kind":"rect","w":1}]})", 20},       // Rect's "w" is required, and first,
        {R"({"shapes":[{"w":1,"h":2}]})", 19},               // and its "kind" before "h".
        {R"({"shapes":[{"kind":"tri","sides":[1]}]})", 35},  // minItems 3.
        {R"({"shapes":[],"id":"abc"})", 22},                 // Neither at most 2 nor 4 to 5.
        {R"({"shapes":[],"id":"abcdef"})", 24},
        {R"({"shapes":[],"id":10})", 20},                     // Neither at most 9 nor 100 up.
        {R"({"shapes":[],"id":99,)", 20},                     // 99 could still become 990.
        {R"({"shapes":[],"id":1,"v":{}})", 25},               // a or b is required,
        {R"({"shapes":[],"id":1,"v":{"b":"x","a":1}})", 32},  // in each one's order.
    };
    for (const auto& [text, at] : invalid) {
        CAPTURE(text);
        CHECK(refused_at(*unions, text) == at);
    }
    // Readings that come to the same state are merged: an array of a thousand items, each
    // opening two readings, is followed by two at a time, not 2^1000.
    const auto strings = compiled(R"({"type":"object","properties":{"a":{"type":"array",)"
                                  R"("items":{"anyOf":[{"type":"string","maxLength":3},)"
                                  R"({"type":"string","minLength":2}]}}}})");
    std::string many = R"({"a":[)";
    for (int i = 0; i < 1000; ++i) {
        many += i == 0 ? "\"ab\"" : ",\"ab\"";
    }
    many += "]}";
    JsonPrefix p(*strings);
    REQUIRE(p.feed(many));
    CHECK(p.complete());
}

// An object of one property `key`, required, whose value is "a<tag>".
std::string tagged(int tag, const std::string& key = "t") {
    return R"({"type":"object","properties":{")" + key + R"(":{"const":"a)" + std::to_string(tag) +
           R"("}},"required":[")" + key + R"("],"additionalProperties":false})";
}

std::string any_of(const std::vector<std::string>& alternatives) {
    std::string text = R"({"anyOf":[)";
    for (size_t i = 0; i < alternatives.size(); ++i) {
        text += (i == 0 ? "" : ",") + alternatives[i];
    }
    return text + "]}";
}

// {"v": `value`}, required.
std::string holding(const std::string& value) {
    return R"({"type":"object","properties":{"v":)" + value +
           R"(},"required":["v"],"additionalProperties":false})";
}

TEST_CASE("json schema: unions that may need more readings than are followed are refused") {
    // Each alternative that may begin with a byte opens a reading of its own there: past
    // kMaxReadings (16) the later ones were dropped, and their values could never be written.
    // Such unions are refused; as many as are followed compile, and each is written.
    std::vector<std::string> objects;
    for (int i = 0; i < 20; ++i) {
        objects.push_back(tagged(i));
    }
    auto twenty = JsonSchema::compile(json::parse(holding(any_of(objects))));
    REQUIRE_FALSE(twenty.ok());
    CHECK(twenty.status().message() ==
          "schema at '#/properties/v': more than 16 of the union's alternatives may begin with "
          "'{', and at most 16 are followed at once: tell them apart by type, use enum or const "
          "for constants, or use fewer alternatives");
    objects.resize(16);
    const auto sixteen = compiled(holding(any_of(objects)));
    for (int i = 0; i < 16; ++i) {
        check_complete_at_end(*sixteen, R"({"v":{"t":"a)" + std::to_string(i) + R"("}})");
    }
    // Unions inside the alternatives are not counted with them: two objects told apart by
    // their one property, each holding a union of 9 objects, are one reading by the time the
    // inner union opens, and each of the 18 is written.
    std::vector<std::string> inside;
    for (int i = 0; i < 9; ++i) {
        inside.push_back(tagged(i));
    }
    std::vector<std::string> outside;
    for (const char* key : {"x", "y"}) {
        outside.push_back(tagged(0, key));
        outside.back().replace(outside.back().find(R"({"const":"a0"})"), 14, any_of(inside));
    }
    const auto nested = compiled(holding(any_of(outside)));
    for (const char* key : {"x", "y"}) {
        for (int i = 0; i < 9; ++i) {
            check_complete_at_end(*nested, std::string(R"({"v":{")") + key + R"(":{"t":"a)" +
                                               std::to_string(i) + R"("}}})");
        }
    }
    // Nor recursively: a tree as Pydantic writes a discriminated union of its two node types.
    const auto tree = compiled(
        R"({"$defs":{"Branch":{"type":"object","properties":{"kind":{"const":"branch"},)"
        R"("children":{"type":"array","items":{"oneOf":[{"$ref":"#/$defs/Branch"},)"
        R"({"$ref":"#/$defs/Leaf"}],"discriminator":{"propertyName":"kind"}}}},)"
        R"("required":["kind","children"],"additionalProperties":false},)"
        R"("Leaf":{"type":"object","properties":{"kind":{"const":"leaf"},)"
        R"("value":{"type":"integer"}},"required":["kind","value"],)"
        R"("additionalProperties":false}},"type":"object",)"
        R"("properties":{"root":{"$ref":"#/$defs/Branch"}},"required":["root"],)"
        R"("additionalProperties":false})");
    check_complete_at_end(*tree, R"({"root":{"kind":"branch","children":[{"kind":"branch",)"
                                 R"("children":[{"kind":"leaf","value":1}]},)"
                                 R"({"kind":"leaf","value":2}]}})");
    // Constants are one reading however many: an anyOf of 40 is an enum of 40.
    std::vector<std::string> constants;
    for (int i = 0; i < 40; ++i) {
        constants.push_back(R"({"const":"a)" + std::to_string(i) + R"("})");
    }
    constants.emplace_back(R"({"type":"string","maxLength":1})");
    const auto forty = compiled(holding(any_of(constants)));
    for (const int i : {0, 16, 39}) {
        CAPTURE(i);
        check_complete_at_end(*forty, R"({"v":"a)" + std::to_string(i) + R"("})");
    }
    check_complete_at_end(*forty, R"({"v":"b"})");
    CHECK(refused_at(*forty, R"({"v":"a40"})") == 8);
}

// An anyOf of `count` integer ranges, the i-th from `first` + 10 i to 9 more.
std::string integer_ranges(int count, int first) {
    std::vector<std::string> ranges;
    for (int i = 0; i < count; ++i) {
        ranges.push_back(R"({"type":"integer","minimum":)" + std::to_string(first + 10 * i) +
                         R"(,"maximum":)" + std::to_string(first + 10 * i + 9) + "}");
    }
    return any_of(ranges);
}

TEST_CASE("json schema: a number begins only with the bytes its range allows") {
    // 17 ranges of non-negative integers: none begins with '-', and at most 9 (10 to 19, 100
    // to 109, ...) with one digit. They were counted as 17 that may begin with '-' and refused.
    const std::string text = holding(integer_ranges(17, 10));
    const auto ranges = compiled(text);
    for (const char* value : {"10", "15", "99", "100", "175", "179"}) {
        CAPTURE(value);
        check_complete_at_end(*ranges, R"({"v":)" + std::string(value) + "}");
    }
    CHECK(refused_at(*ranges, R"({"v":-1})") == 5);
    CHECK(refused_at(*ranges, R"({"v":180})") == 7);
    const json::value doc = json::parse(text);
    std::mt19937 rng(20261207);
    for (int walk = 0; walk < 50; ++walk) {
        const std::optional<std::string> out = random_walk(JsonPrefix(*ranges), rng);
        REQUIRE(out.has_value());
        CAPTURE(*out);
        CHECK(valid(doc, doc, json::parse(*out)));
    }
    // 17 ranges of negative integers all may begin with '-': refused there.
    auto negative = JsonSchema::compile(json::parse(holding(integer_ranges(17, -179))));
    REQUIRE_FALSE(negative.ok());
    CHECK(negative.status().message().find("may begin with '-'") != std::string::npos);
    // So do ranges from 0: -0 is 0, and JsonPrefix writes it.
    std::vector<std::string> from_zero;
    for (int i = 1; i <= 17; ++i) {
        from_zero.push_back(R"({"type":"integer","minimum":0,"maximum":)" + std::to_string(i) +
                            "}");
    }
    auto zero = JsonSchema::compile(json::parse(holding(any_of(from_zero))));
    REQUIRE_FALSE(zero.ok());
    CHECK(zero.status().message().find("may begin with '-'") != std::string::npos);
    from_zero.resize(2);
    check_complete_at_end(*compiled(holding(any_of(from_zero))), R"({"v":-0})");
    // Past an exclusive minimum of 0 no number begins with '-'.
    const auto positive = compiled(holding(R"({"type":"number","exclusiveMinimum":0})"));
    CHECK(refused_at(*positive, R"({"v":-0})") == 5);
    check_complete_at_end(*positive, R"({"v":0.5})");
}

TEST_CASE("json schema: const beside enum is one of its values as a value") {
    // 0 is -0.0 and 1e19 is 10000000000000000000 (their texts differ); const is written.
    for (const auto& [keywords, value] : std::vector<std::pair<std::string, std::string>>{
             {R"("const":0,"enum":[-0.0])", "0"},
             {R"("const":-0.0,"enum":[1,0])", "-0"},
             {R"("const":1,"enum":[1.0])", "1"},
             {R"("const":10000000000000000000,"enum":[1e19])", "10000000000000000000"},
             {R"("const":[0,"-0"],"enum":[[-0.0e5,"-0"]])", R"([0,"-0"])"},
             // Objects are equal with their members in any order.
             {R"("const":{"a":1,"b":2},"enum":[{"b":2,"a":1}])", R"({"a":1,"b":2})"},
         }) {
        CAPTURE(keywords);
        check_complete_at_end(*compiled(holding("{" + keywords + "}")), R"({"v":)" + value + "}");
    }
    // Only values surely equal: 10000000000000000001 is no double, and not 1e19 (as Python's
    // integers are compared), though one double stands for both.
    for (const std::string keywords :
         {R"("const":10000000000000000001,"enum":[1e19])", R"("const":"0","enum":[0])",
          R"("const":1.5,"enum":[1,2])"}) {
        CAPTURE(keywords);
        auto s = JsonSchema::compile(json::parse(holding("{" + keywords + "}")));
        REQUIRE_FALSE(s.ok());
        CHECK(s.status().message().find("'const' is not one of the values of 'enum'") !=
              std::string::npos);
    }
}

TEST_CASE("json schema: a decimal constant is written as the schema spells it") {
    // Boost 1.81's parser alone read these one unit in the last place off, and the value written
    // back (1.3806489999999998e-23) was another number than the schema's.
    const auto constants = compiled(holding(R"({"enum":[1.380649e-23,2.5e-25,0.1]})"));
    check_complete_at_end(*constants, R"({"v":1.380649e-23})");
    check_complete_at_end(*constants, R"({"v":2.5e-25})");
    CHECK(refused_at(*constants, R"({"v":1.3806489999999998e-23})") == 12);
}

TEST_CASE("json schema: enum values past a double's range are written as JSON") {
    // Boost.JSON reads 1e99999 as infinite, which was written "inf": no JSON.
    const auto huge = compiled(holding(R"({"enum":[1e99999,-1e99999]})"));
    check_complete_at_end(*huge, R"({"v":1e999})");
    check_complete_at_end(*huge, R"({"v":-1e999})");
    CHECK(refused_at(*huge, R"({"v":i)") == 5);
    // One such value, so oneOf cannot show it apart from itself; the two signs are apart.
    const std::string same = R"({"oneOf":[{"const":1e99999},{"const":1e400}]})";
    CHECK_FALSE(JsonSchema::compile(json::parse(holding(same))).ok());
    compiled(holding(R"({"oneOf":[{"const":1e99999},{"const":-1e99999}]})"));
}

TEST_CASE("json schema: oneOf of constants is shown apart by value, strings by their text") {
    // Strings whose text holds numbers or escapes are compared as strings, not numbers.
    for (const char* alternatives :
         {R"({"const":"-0"},{"const":"0"})", R"({"const":"a\"-0"},{"const":"a\"0"})",
          R"({"const":"\u0001 1"},{"const":"\u0001 1.0"})", R"({"const":[1,"1"]},{"const":[1,1]})",
          R"({"const":1.5},{"const":15e-2})"}) {
        CAPTURE(alternatives);
        compiled(holding(R"({"oneOf":[)" + std::string(alternatives) + "]}"));
    }
}

TEST_CASE("json schema: oneOf alternatives of one type taken from their keywords are told apart") {
    // {"minLength": 3} takes every value that is not a string, but only strings are written
    // for it, and a string of 3 is no value of {"maxLength": 2}: apart. Against an integer
    // (a type of its own) the guessed string is not (the refusals' table).
    const auto lengths = compiled(holding(R"({"oneOf":[{"minLength":3},{"maxLength":2}]})"));
    check_complete_at_end(*lengths, R"({"v":"ab"})");
    check_complete_at_end(*lengths, R"({"v":"abc"})");
    const auto shapes = compiled(holding(
        R"({"oneOf":[{"properties":{"kind":{"const":"a"},"x":{"type":"integer"}},)"
        R"("required":["kind","x"]},{"properties":{"kind":{"const":"b"},)"
        R"("y":{"type":"string"}},"required":["kind","y"]}]})"));
    check_complete_at_end(*shapes, R"({"v":{"kind":"b","y":"z"}})");
}

TEST_CASE("json schema: what cannot be followed is refused, naming the keyword and its place") {
    // Past Boost.JSON's default depth of 32, within a request's.
    const std::string open(33, '['), close(33, ']');
    const std::vector<std::pair<std::string, std::string>> cases = {
        {R"({"type":"object","properties":{"a":{"type":"string","pattern":"x"}}})",
         "schema at '#/properties/a': 'pattern' is not supported"},
        {R"({"type":"object","properties":{"a":{"type":"integer","multipleOf":2}}})",
         "'multipleOf' is not supported"},
        {R"({"type":"object","properties":{"a":{"type":"integer","minimum":1.5,"maximum":1.9}}})",
         "schema at '#/properties/a': no number lies between its minimum and maximum"},
        {R"({"type":"object","properties":{"a":{"type":"number","minimum":1,)"
         R"("exclusiveMaximum":1}}})",
         "no number lies between its minimum and maximum"},
        // A bound past a double's range is infinite: no number lies beyond it.
        {R"({"type":"object","properties":{"a":{"type":"integer","minimum":1e999}}})",
         "schema at '#/properties/a': no number lies between its minimum and maximum"},
        {R"({"type":"object","properties":{"a":{"type":"integer","maximum":-1e999}}})",
         "no number lies between its minimum and maximum"},
        {R"({"type":"object","properties":{"a":{"type":"number","minimum":1e999}}})",
         "no number lies between its minimum and maximum"},
        {R"({"type":"object","properties":{"a":{"minimum":1e999,"maximum":1e999}}})",
         "no number lies between its minimum and maximum"},
        {R"({"type":"object","properties":{"a":{"type":"integer","minimum":1e16}}})",
         "schema at '#/properties/a': no number between its minimum and maximum can be written "
         "in 15 digits"},
        {R"({"type":"object","properties":{"a":{"maximum":-1e15}}})",
         "schema at '#/properties/a': no number between its minimum and maximum can be written"},
        {R"({"type":"object","properties":{"a":{"type":"number","minimum":1e-20,)"
         R"("maximum":1e-15}}})",
         "no number between its minimum and maximum can be written"},
        {R"({"type":"object","properties":{"a":{"type":"number",)"
         R"("minimum":0.1234567890123456,"maximum":0.1234567890123459}}})",
         "no number between its minimum and maximum can be written"},
        {R"({"type":"object","properties":{"x":{"$ref":"#"}},"required":["x"]})",
         "schema at '#': every value nests containers more than 64 deep, past what a reply may: "
         "its 'required' properties and 'minItems' lead on through '#'"},
        {R"({"type":"object","properties":{"t":{"$ref":"#/$defs/t"}},"required":["t"],)"
         R"("$defs":{"t":{"type":"array","minItems":1,"items":{"$ref":"#/$defs/t"}}}})",
         "lead on through '#/$defs/t' without end"},
        {R"({"type":"object","properties":{"a":{"type":"number","minimum":"1"}}})",
         "'minimum' must be a number"},
        {R"({"type":"object","properties":{"a":{"type":"array","uniqueItems":true}}})",
         "'uniqueItems' is not supported"},
        {R"({"type":"object","properties":{"a":{"oneOf":[{"type":"string"},{"enum":["x"]}]}}})",
         "schema at '#/properties/a': the alternatives at '#/properties/a/oneOf/0' and "
         "'#/properties/a/oneOf/1' of 'oneOf' may both match one value"},
        {R"({"type":"object","properties":{"a":{"oneOf":[)"
         R"({"properties":{"k":{"const":1}},"required":["k"]},)"
         R"({"properties":{"k":{"enum":[2,1]}}}]}}})",
         "'#/properties/a/oneOf/0' and '#/properties/a/oneOf/1' of 'oneOf' may both match"},
        {R"({"type":"object","properties":{"a":{"oneOf":[)"
         R"({"type":"integer","minimum":0,"maximum":10},{"type":"number","minimum":10}]}}})",
         "of 'oneOf' may both match one value"},
        // A type taken from the keywords is narrower than the schema: {"minLength": 1} takes 5
        // too, and {"enum": ["a", 5], "maxLength": 3} keeps 5, which maxLength does not refuse.
        {R"({"type":"object","properties":{"v":{"oneOf":[{"minLength":1},)"
         R"({"type":"integer","minimum":0,"maximum":9}]}},"required":["v"],)"
         R"("additionalProperties":false})",
         "of 'oneOf' may both match one value"},
        {R"({"oneOf":[{"enum":["a",5],"maxLength":3},{"const":5}]})",
         "of 'oneOf' may both match one value"},
        // Numbers are compared as values, not as their texts.
        {R"({"oneOf":[{"const":0},{"const":-0.0}]})", "of 'oneOf' may both match one value"},
        {R"({"oneOf":[{"const":10000000000000000000},{"const":1e19}]})",
         "of 'oneOf' may both match one value"},
        {R"({"oneOf":[{"const":[0,1]},{"enum":[[-0.0,1],3]}]})",
         "of 'oneOf' may both match one value"},
        {R"({"oneOf":[{"const":1},{"enum":[1e0,2]}]})", "of 'oneOf' may both match one value"},
        {R"({"oneOf":[{"const":-0.0e5},{"const":0}]})", "of 'oneOf' may both match one value"},
        // So too nested deeper than Boost.JSON's default depth.
        {holding(R"({"oneOf":[{"const":)" + open + "0" + close + R"(},{"const":)" + open +
                 "-0.0" + close + "}]}"),
         "of 'oneOf' may both match one value"},
        {holding(R"({"oneOf":[{"const":)" + open + "10000000000000000000" + close +
                 R"(},{"const":)" + open + "1e19" + close + "}]}"),
         "of 'oneOf' may both match one value"},
        {holding(R"({"oneOf":[{"enum":[)" + open + "0" + close + R"(,5]},{"enum":[)" + open +
                 "-0.0" + close + "]}]}"),
         "of 'oneOf' may both match one value"},
        // Integers past 2^53 that one double stands for may be one value (to a validator that
        // reads doubles), and so are 30-digit integers Boost.JSON reads as one double.
        {R"({"oneOf":[{"const":9007199254740993},{"const":9007199254740992}]})",
         "of 'oneOf' may both match one value"},
        {R"({"oneOf":[{"const":123456789012345678901234567890},)"
         R"({"const":123456789012345678901234567891}]})",
         "of 'oneOf' may both match one value"},
        // A number's first bytes include every spelling of its values: 1e-07 begins with '1'
        // and lies in [0, 1e-6]; -0.0 begins with '-' and lies in [0, 5].
        {R"({"oneOf":[{"const":1e-7},{"type":"number","minimum":0,"maximum":1e-6}]})",
         "of 'oneOf' may both match one value"},
        {R"({"oneOf":[{"const":-0.0},{"type":"integer","minimum":0,"maximum":5}]})",
         "of 'oneOf' may both match one value"},
        {R"({"type":"object","required":["b"],"properties":{"a":{}}})",
         "required property \"b\" is not among 'properties'"},
        {R"({"type":"object","properties":{"a":{"$ref":"#/$defs/missing"}}})",
         "'$ref' '#/$defs/missing' points at nothing"},
        {R"({"type":"object","properties":{"a":{"$ref":"https://example.com/s.json"}}})",
         "only references inside the schema"},
        {R"({"type":"object","properties":{"a":{"type":"array","minItems":3,"maxItems":2}}})",
         "'minItems' is larger than 'maxItems'"},
        {R"({"type":"object","properties":{"a":{"enum":[]}}})", "'enum' must be a non-empty array"},
        {R"({"type":"object","properties":{"a":{"type":"string","enum":[1]}}})",
         "no value of 'enum'/'const' is valid under the keywords beside it"},
        {R"({"type":"object","properties":{"a":{"type":"string","enum":["long"],"maxLength":3}}})",
         "schema at '#/properties/a': no value of 'enum'/'const' is valid under the keywords"},
        {R"({"type":"object","properties":{"a":{"const":[1,2],"maxItems":1}}})",
         "schema at '#/properties/a': no value of 'enum'/'const' is valid under the keywords"},
        {R"({"$defs":{"x":{"$ref":"#/$defs/x"}},"type":"object",)"
         R"("properties":{"a":{"$ref":"#/$defs/x"}}})",
         "its own alternative"},
        {R"({"type":"object","properties":{"a":{"type":"thing"}}})", "unknown type 'thing'"},
        {R"({"type":"string"})", "the root must be an object"},
        {R"({"anyOf":[{"type":"object"},{"type":"null"}]})", "the root must be an object"},
        {R"({"type":"object","properties":{"a":false}})", "the schema false matches nothing"},
        {R"({"type":"object","properties":{"a":{"type":"string","minLength":-1}}})",
         "'minLength' must be a non-negative integer"},
        {R"({"type":"object","properties":{"a":{"allOf":[{"type":"string"},{"maxLength":3}]}}})",
         "'allOf' is supported with exactly one schema"},
        {R"({"type":"object","properties":{"a":{"$ref":"#","maxLength":3}}})",
         "'maxLength' beside '$ref' is not supported"},
        {R"({"type":"object","properties":{"a":{"type":"array","items":[{}]}}})",
         "'items' as an array (a tuple) is not supported"},
        {R"({"type":"object","properties":{"a":3}})", "a schema must be an object or a boolean"},
        {R"({"type":"object","properties":{"a/b~":{"not":{}}}})",
         "schema at '#/properties/a~1b~0': 'not' is not supported"},
    };
    for (const auto& [schema, message] : cases) {
        CAPTURE(schema);
        // Parsed as a request is, to its depth.
        auto s = JsonSchema::compile(json::parse(schema, {}, json_parse_options()));
        REQUIRE_FALSE(s.ok());
        CHECK(s.status().code() == StatusCode::kInvalidArgument);
        CAPTURE(s.status().message());
        CHECK(s.status().message().find(message) != std::string::npos);
    }
    // Alternatives shared many times over are flattened once each: 2^50 paths, at once.
    std::string doubling = R"({"type":"object","properties":{"a":{"$ref":"#/$defs/d50"}},)"
                           R"("$defs":{"d0":{"type":"integer"})";
    for (int i = 1; i <= 50; ++i) {
        const std::string prev = "\"#/$defs/d" + std::to_string(i - 1) + "\"";
        doubling += ",\"d" + std::to_string(i) + "\":{\"anyOf\":[{\"$ref\":" + prev +
                    "},{\"$ref\":" + prev + "}]}";
    }
    doubling += "}}";
    const auto shared = compiled(doubling);
    CHECK(refused_at(*shared, R"({"a":-12})") == 9);
    CHECK(refused_at(*shared, R"({"a":"s"})") == 5);
    // A union of more alternatives than a value's start may look through is refused.
    std::string wide = R"({"type":"object","properties":{"a":{"anyOf":[)";
    for (int i = 0; i < 300; ++i) {
        wide += (i == 0 ? "" : ",") + std::string(R"({"type":"string","maxLength":)") +
                std::to_string(i) + "}";
    }
    wide += "]}}}";
    auto too_wide = JsonSchema::compile(json::parse(wide));
    REQUIRE_FALSE(too_wide.ok());
    CHECK(too_wide.status().message().find("the union has 300 alternatives") != std::string::npos);
    // A oneOf whose alternatives take too many comparisons to show apart is refused: 80 objects,
    // each requiring "k" from 80 constants of its own (one enum), are 3160 pairs of 160
    // comparisons each.
    std::string constants = R"({"type":"object","properties":{"a":{"oneOf":[)";
    for (int i = 0; i < 80; ++i) {
        constants +=
            std::string(i == 0 ? "" : ",") +
            R"({"type":"object","required":["k"],"properties":{"k":{"anyOf":[)";
        for (int j = 0; j < 80; ++j) {
            constants += (j == 0 ? "" : ",") + std::string(R"({"const":)") +
                         std::to_string(i * 100 + j) + "}";
        }
        constants += "]}}}";
    }
    constants += "]}}}";
    auto many = JsonSchema::compile(json::parse(constants));
    REQUIRE_FALSE(many.ok());
    CAPTURE(many.status().message());
    CHECK(many.status().message().find("'oneOf' has too many alternatives to show apart") !=
          std::string::npos);
    // An enum of more values, or more bytes, than a token's check may look through is refused
    // (300000 strings took 22 s a token to match); a full one still compiles.
    auto enum_of = [](size_t values, size_t length) {
        std::string text = R"({"type":"object","properties":{"a":{"enum":[)";
        for (size_t i = 0; i < values; ++i) {
            std::string value = std::to_string(i);
            value.insert(0, length - std::min(length, value.size()), 'x');
            text += (i == 0 ? "\"" : ",\"") + value + "\"";
        }
        return text + "]}}}";
    };
    for (const auto& [values, length, message] :
         {std::tuple<size_t, size_t, std::string>{300000, 8,
                                                  "'enum' has 300000 values; at most "
                                                  "1024 are supported"},
          {1025, 1, "'enum' has 1025 values"},
          {1000, 100, "the values of 'enum'/'const' come to over 65536 bytes"}}) {
        auto big = JsonSchema::compile(json::parse(enum_of(values, length)));
        REQUIRE_FALSE(big.ok());
        CAPTURE(big.status().message());
        CHECK(big.status().message().find("schema at '#/properties/a': " + message) !=
              std::string::npos);
    }
    // An enum value nested deep under unions of unions: checking it against the schema beside
    // it tries every alternative at every level (4^15 calls took 11 s, blocking the I/O thread
    // that compiles schemas); refused once the steps run out, at once.
    std::string nested = "\"x\"";  // Not an array: every alternative fails at the bottom.
    for (int i = 0; i < 15; ++i) {
        nested = "[" + nested + "]";
    }
    const std::string recursive =
        R"({"$defs":{"A":{"anyOf":[)" +
        std::string(R"({"type":"array","items":{"$ref":"#/$defs/A"}},)") +
        R"({"type":"array","items":{"$ref":"#/$defs/A"}},)" +
        R"({"type":"array","items":{"$ref":"#/$defs/A"}},)" +
        R"({"type":"array","items":{"$ref":"#/$defs/A"}}]}},)" +
        R"("type":"object","properties":{"a":{"type":"array","items":{"$ref":"#/$defs/A"},)" +
        R"("enum":[)" + nested + R"(,[]]}},"required":["a"]})";
    auto costly = JsonSchema::compile(json::parse(recursive));
    REQUIRE_FALSE(costly.ok());
    CHECK(costly.status().message().find("checking the values of 'enum'/'const' against the "
                                         "keywords beside them takes over") != std::string::npos);
    CHECK(costly.status().message().find("schema at '#/properties/a'") != std::string::npos);
    // A oneOf of large enums costs by the value: 250 disjoint enums of 1024 values took 13 s to
    // show apart pair by pair; 100 are refused at once.
    std::string enums = R"({"type":"object","properties":{"a":{"oneOf":[)";
    for (int i = 0; i < 100; ++i) {
        enums += std::string(i == 0 ? "" : ",") + R"({"enum":[)";
        for (int j = 0; j < 1024; ++j) {
            enums += (j == 0 ? "" : ",") + std::to_string(i * 1024 + j);
        }
        enums += "]}";
    }
    enums += "]}}}";
    auto large = JsonSchema::compile(json::parse(enums));
    REQUIRE_FALSE(large.ok());
    CAPTURE(large.status().message());
    CHECK(large.status().message().find("'oneOf' has too many alternatives to show apart") !=
          std::string::npos);
    // const beside enum: the value must be one of the enum's.
    auto outside = JsonSchema::compile(json::parse(
        R"({"type":"object","properties":{"a":{"const":"c","enum":["a","b"]}},"required":["a"]})"));
    REQUIRE_FALSE(outside.ok());
    CHECK(outside.status().message().find("'const' is not one of the values of 'enum'") !=
          std::string::npos);
    const auto inside = compiled(
        R"({"type":"object","properties":{"a":{"const":"b","enum":["a","b"]}},"required":["a"]})");
    check_complete_at_end(*inside, R"({"a":"b"})");
    CHECK(refused_at(*inside, R"({"a":"a"})") == 6);
    const auto full = compiled(enum_of(JsonSchema::kMaxLiterals, 60));
    check_complete_at_end(*full, R"({"a":")" + std::string(57, 'x') + R"(100"})");
    check_complete_at_end(*full, R"({"a":")" + std::string(56, 'x') + R"(1023"})");
    CHECK(refused_at(*full, R"({"a":")" + std::string(56, 'x') + R"(1024"})") == 65);
    CHECK(refused_at(*full, R"({"a":")" + std::string(57, 'x') + R"(10"})") == 65);
    // Nesting past the limit is refused, not recursed into without end.
    std::string deep = R"({"type":"object","properties":{"a":)";
    for (int i = 0; i < 200; ++i) {
        deep += R"({"type":"array","items":)";
    }
    deep += "{}" + std::string(200, '}') + "}}";
    boost::json::parse_options deep_ok;
    deep_ok.max_depth = 1000;
    auto s = JsonSchema::compile(json::parse(deep, {}, deep_ok));
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().message().find("nested deeper than") != std::string::npos);
}

TEST_CASE("json schema: values nest no deeper than a reply may, and what begins can end") {
    // Required objects 64 deep, the root's among them, are what a reply may nest; 65 are not.
    auto chain = [](int depth) {
        std::string text;
        for (int i = 1; i < depth; ++i) {
            text += R"({"type":"object","required":["a"],"properties":{"a":)";
        }
        text += R"({"type":"object"})" + std::string(2 * static_cast<size_t>(depth - 1), '}');
        return text;
    };
    boost::json::parse_options deep_ok;
    deep_ok.max_depth = 1000;
    auto deepest = JsonSchema::compile(json::parse(chain(64), {}, deep_ok));
    REQUIRE_MESSAGE(deepest.ok(), deepest.status().to_string());
    std::string doc;
    for (int i = 1; i < 64; ++i) {
        doc += R"({"a":)";
    }
    doc += "{}" + std::string(63, '}');
    check_complete_at_end(**deepest, doc);
    auto too_deep = JsonSchema::compile(json::parse(chain(65), {}, deep_ok));
    REQUIRE_FALSE(too_deep.ok());
    CHECK(too_deep.status().message().find("more than 64 deep") != std::string::npos);
    // Optional recursion: near the limit a property whose value needs more nesting than is left
    // is not begun (its key is refused), and random walks from there never reach a dead end.
    const char* const recursive = R"({"type":"object","properties":{
        "n": {"$ref":"#"},
        "p": {"type":"array","minItems":1,"items":{"type":"array","minItems":1,
                                                   "items":{"type":"integer"}}},
        "s": {"type":"string"}}})";
    const auto schema = compiled(recursive);
    std::string prefix;
    for (int i = 0; i < 62; ++i) {
        prefix += R"({"n":)";
    }
    CHECK(refused_at(*schema, prefix + R"({"p")") == prefix.size() + 2);
    CHECK(refused_at(*schema, prefix + R"({"n":{"n")") == prefix.size() + 7);
    CHECK(refused_at(*schema, prefix + R"({"n":{"s":"x"}})") == prefix.size() + 15);
    JsonPrefix p(*schema);
    REQUIRE(p.feed(prefix + "{"));
    const json::value doc_schema = json::parse(recursive);
    std::mt19937 rng(20261205);
    for (int walk = 0; walk < 100; ++walk) {
        const std::optional<std::string> out = random_walk(p, rng);
        if (out) {
            CAPTURE(*out);
            boost::system::error_code ec;
            boost::json::parse_options options;
            options.max_depth = 100;
            const json::value parsed = json::parse(prefix + "{" + *out, ec, {}, options);
            REQUIRE_FALSE(ec);
            CHECK(valid(doc_schema, doc_schema, parsed));
        }
    }
}

TEST_CASE("json schema: an enum or const value's own nesting counts toward the depth") {
    // A 28-deep const under a recursive object: written inside 35 of those objects it nests 64
    // containers, the most a reply may (JsonStream and the tool-call readers refuse deeper);
    // one object further in it would nest 65, so its key is not begun there, and the object goes
    // on without it.
    std::string deep = "0";
    for (int i = 0; i < 28; ++i) {
        deep = "[" + deep + "]";
    }
    const auto schema =
        compiled(R"({"type":"object","properties":{"c":{"const":)" + deep +
                 R"(},"n":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},)" + R"("required":["n"]})");
    auto inside = [](int objects) {
        std::string text;
        for (int i = 0; i < objects; ++i) {
            text += R"({"n":)";
        }
        return text + R"({"c":)";
    };
    CHECK(refused_at(*schema, inside(35) + deep) == inside(35).size() + deep.size());
    CHECK(refused_at(*schema, inside(36) + deep) == inside(36).size() - 3);  // At the key.
    std::string skipped = inside(36);
    skipped.replace(skipped.size() - 3, 1, "n");  // {"n": in its place: c is optional.
    CHECK(refused_at(*schema, skipped + "null") == skipped.size() + 4);
    // Among an enum's values, those that fit are still written there; the deep one is not.
    const auto either =
        compiled(R"({"type":"object","properties":{"c":{"enum":[0,)" + deep +
                 R"(]},"n":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},)" + R"("required":["n"]})");
    CHECK(refused_at(*either, inside(36) + deep) == inside(36).size());
    CHECK(refused_at(*either, inside(36) + "0,") == inside(36).size() + 2);
    CHECK(refused_at(*either, inside(35) + deep + ",") == inside(35).size() + deep.size() + 1);
}

TEST_CASE("json schema: random walks never reach a dead end, and what they complete is valid") {
    std::mt19937 rng(20261203);
    int completed_total = 0;
    for (const char* text :
         {kPerson, kTree, kDict, kLiterals, kEnumSiblings, kAnyValues, kUnions, kBounds}) {
        CAPTURE(text);
        const json::value doc = json::parse(text);
        const auto schema = compiled(text);
        int completed = 0;
        for (int walk = 0; walk < 150; ++walk) {
            const std::optional<std::string> out = random_walk(JsonPrefix(*schema), rng);
            if (!out) {
                continue;
            }
            ++completed;
            CAPTURE(*out);
            boost::system::error_code ec;
            const json::value parsed = json::parse(*out, ec);
            REQUIRE_FALSE(ec);
            CHECK(valid(doc, doc, parsed));
        }
        CHECK(completed > 100);
        completed_total += completed;
    }
    MESSAGE("completed walks: " << completed_total);
}

TEST_CASE(
    "json schema: random walks through argument pairs end in calls whose arguments are valid") {
    // As a forced GLM-4.5 call to a strict tool "f": bytes, or a whole marker half the time one
    // may come; the call read by GLM-4.5's parser, its arguments by the checker.
    std::mt19937 rng(20261204);
    const std::vector<std::string> markers = {"<arg_key>", "</arg_key>\n", "\n<arg_value>",
                                              "</arg_value>\n", "</tool_call>"};
    int completed_total = 0;
    for (const char* text :
         {kPerson, kTree, kDict, kLiterals, kEnumSiblings, kAnyValues, kUnions, kBounds}) {
        CAPTURE(text);
        const json::value doc = json::parse(text);
        ToolSpec tool{"f", "", text, compiled(text)};
        JsonReply reply;
        reply.schema = tool.strict_schema;
        reply.pairs = std::make_shared<const ArgumentPairs>(
            ArgumentPairs{chat::glm45_string_arguments(tool)});
        reply.tail = chat::forced_call_tail(chat::ToolCallFormat::kGlm45);
        int completed = 0;
        for (int walk = 0; walk < 150; ++walk) {
            const std::optional<std::string> out = random_walk(JsonPrefix(reply), rng, markers);
            if (!out) {
                continue;
            }
            ++completed;
            CAPTURE(*out);
            auto parser =
                chat::create_tool_call_parser(chat::ToolCallFormat::kGlm45, "call_", {tool});
            chat::ParsedDelta d =
                parser->feed(chat::forced_call_prefix(chat::ToolCallFormat::kGlm45, "f") + *out);
            parser->finish();
            REQUIRE(parser->completed_calls() == 1);
            std::string args;
            for (const chat::ToolCallDelta& c : d.tool_calls) {
                args += c.arguments;
            }
            CAPTURE(args);
            boost::system::error_code ec;
            const json::value parsed = json::parse(args, ec);
            REQUIRE_FALSE(ec);
            CHECK(valid(doc, doc, parsed));
        }
        CHECK(completed > 100);
        completed_total += completed;
    }
    MESSAGE("completed walks: " << completed_total);
}

}  // namespace
}  // namespace edge::engine::sampling
