// JsonPrefix: every prefix of a valid JSON object is taken, byte by byte and in pieces, and the
// object is complete exactly at its end; texts that are not an object's beginning are refused
// at the first byte that makes them so, leaving the prefix as it was. Each valid text is also
// checked with Boost.JSON, an independent parser. GLM-4.5's argument pairs: what is taken and
// where the rest is refused, read back by GLM-4.5's tool-call parser.

#include "engine/sampling/json_prefix.h"

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "common/json_text.h"
#include "engine/chat/tool_call_parser.h"

namespace edge::engine::sampling {
namespace {

// The byte at which `text` stops being an object's beginning, or text.size().
size_t refused_at(const std::string& text) {
    JsonPrefix p;
    for (size_t i = 0; i < text.size(); ++i) {
        if (!p.feed(text.substr(i, 1))) {
            return i;
        }
    }
    return text.size();
}

TEST_CASE("json prefix: valid objects are taken byte by byte and complete at their end") {
    const std::vector<std::string> valid = {
        "{}",
        "{ \n}",
        R"({"a":1})",
        R"({"a": -0.5e+10, "b": [1, 2.25, -3E2, 0], "c": {"d": null}})",
        R"({"s": "caf\u00e9 \"q\" \\ \/ \b\f\n\r\t", "t": true, "f": false})",
        R"({"empty": [], "nested": [[[{}]]], "u": "\u00e9 é 日本"})",
        R"({"k":0,"k2":10,"k3":1.0e-3})",
        R"({"big":-1.0e-000000000999999999,"e":1E+0})",  // Nine digits past leading zeros.
        R"({"pair":"\ud83d\ude00","bmp":"\ud7ff\ue000"})",
    };
    for (const std::string& text : valid) {
        CAPTURE(text);
        CHECK_NOTHROW(boost::json::parse(text));
        JsonPrefix p;
        for (size_t i = 0; i < text.size(); ++i) {
            CHECK_FALSE(p.complete());
            REQUIRE(p.feed(text.substr(i, 1)));
        }
        CHECK(p.complete());
        CHECK(p.feed(" \n"));  // Whitespace after the object,
        CHECK_FALSE(p.feed("x"));  // nothing else.
        // In pieces of three bytes: the same.
        JsonPrefix q;
        for (size_t i = 0; i < text.size(); i += 3) {
            REQUIRE(q.feed(text.substr(i, 3)));
        }
        CHECK(q.complete());
    }
}

TEST_CASE("json prefix: other texts are refused at the first byte that rules them out") {
    const std::vector<std::pair<std::string, size_t>> invalid = {
        {"[1]", 0},               // Not an object at the top.
        {" {}", 0},               // Nor whitespace first: the object starts at once.
        {"\"s\"", 0},
        {"x", 0},
        {"{a:1}", 1},             // Keys are strings.
        {R"({"a" 1})", 5},        // A colon is due.
        {R"({"a":01})", 6},       // No leading zeros.
        {R"({"a":1.})", 7},       // A digit after the dot.
        {R"({"a":1e})", 7},       // And after the exponent,
        // which has at most nine digits past its leading zeros.
        {R"({"a":-1.0e-0666666666666})", 21},
        {R"({"a":-})", 6},
        {R"({"a":tru})", 8},
        {R"({"a":nul})", 8},
        {R"({"a":1,})", 7},       // No trailing comma.
        {R"({"a":[1,]})", 8},
        {R"({"a":[1}})", 7},      // Brackets match.
        {R"({"a":"\x"})", 7},     // Escapes.
        {R"({"a":"\u12g4"})", 10},
        {"{\"a\":\"\x01\"}", 6},  // Raw control characters.
        {"{\"a\":\"line\nbreak\"}", 10},
        {R"({"a":1}})", 7},       // Nothing after the object.
        {"{\"a\xd1\":1}", 4},     // UTF-8: a lead byte then no continuation,
        {"{\"\xc0\x80\":1}", 2},  // an overlong form,
        {"{\"\xed\xa0\x80\":1}", 3},  // a surrogate,
        {"{\"\xf4\x90\x80\x80\":1}", 3},  // past U+10FFFF,
        {"{\"\xbf\":1}", 2},     // a continuation byte alone.
        {R"({"\ude00":1})", 5},   // Surrogate escapes: a low one alone,
        {R"({"\ud83d":1})", 8},   // a high one not followed by a low one,
        {R"({"\ud83d\n":1})", 9},
        {R"({"\ud83d\u0041":1})", 10},
        {R"({} {})", 3},
    };
    for (const auto& [text, at] : invalid) {
        CAPTURE(text);
        CHECK(refused_at(text) == at);
    }
    // A refused piece leaves the prefix as it was.
    JsonPrefix p;
    REQUIRE(p.feed(R"({"a":)"));
    CHECK_FALSE(p.feed("1}x"));
    CHECK(p.accepts("1}"));
    CHECK(p.feed("[true]}"));
    CHECK(p.complete());
}

TEST_CASE("json prefix: a tail follows the closed document exactly, then nothing") {
    // As after a forced tool call's arguments: "}\n</tool_call>" closes the call.
    const std::string tail = "}\n</tool_call>";
    JsonPrefix p(*JsonSchema::any_object(), tail);
    REQUIRE(p.feed(R"({"a": [1, "}"])"));
    CHECK_FALSE(p.closed());
    REQUIRE(p.feed("}"));
    CHECK(p.closed());
    CHECK_FALSE(p.complete());
    CHECK_FALSE(p.accepts(" "));   // No whitespace before the tail,
    CHECK_FALSE(p.accepts("}}"));  // nor anything but it.
    CHECK_FALSE(p.accepts(tail + " "));
    CHECK(p.accepts(tail));
    // A token may end the document and begin the tail; its bytes one by one, the same.
    JsonPrefix q(*JsonSchema::any_object(), tail);
    REQUIRE(q.feed("{\"a\": 1}}\n</tool"));
    CHECK_FALSE(q.complete());
    for (char c : std::string_view("_call>")) {
        CHECK_FALSE(q.complete());
        REQUIRE(q.feed(std::string_view(&c, 1)));
    }
    CHECK(q.complete());
    CHECK_FALSE(q.accepts(">"));
    CHECK_FALSE(q.accepts("\n"));
    // The first-byte check of a whole vocabulary agrees with the prefix in the tail.
    JsonPrefix r(*JsonSchema::any_object(), tail);
    REQUIRE(r.feed("{}"));
    JsonTokenCheck check(r);
    CHECK(check("}\n"));
    CHECK(check("}"));
    CHECK_FALSE(check("},"));
    CHECK_FALSE(check("\n"));
}

TEST_CASE("json prefix: one of several heads, then the document under that head's schema") {
    auto small = JsonSchema::compile(boost::json::parse(
        R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],)"
        R"("additionalProperties":false})"));
    REQUIRE(small.ok());
    // As a forced call's start naming one of three tools (Qwen's format), two of them strict.
    const std::vector<JsonHead> heads = {
        {R"({"name": "f", "arguments": )", *small},
        {R"({"name": "fg", "arguments": )", JsonSchema::any_object()},
        {R"({"name": "g", "arguments": )", *small},
    };
    const std::string tail = "}\n</tool_call>";
    JsonPrefix p(heads, tail);
    CHECK_FALSE(p.accepts("{}"));  // A head first.
    CHECK_FALSE(p.accepts(R"({"name": "h")"));
    CHECK(p.accepts(R"({"name": "f)"));
    // "fg" (any object) and "f" (strict) part at the byte after "f".
    JsonPrefix fg = p;
    REQUIRE(fg.feed(R"({"name": "fg", "arguments": )"));
    CHECK(fg.feed(R"({"anything": [1]})"));
    CHECK(fg.feed(tail));
    CHECK(fg.complete());
    JsonPrefix f = p;
    REQUIRE(f.feed(R"({"name": "f", "arg)"));
    REQUIRE(f.feed(R"(uments": )"));
    CHECK_FALSE(f.accepts(R"({"anything")"));
    CHECK_FALSE(f.accepts(" {"));  // The document starts at once after its head.
    CHECK(f.feed(R"({"n": 4})"));
    CHECK(f.closed());
    CHECK(f.feed(tail));
    CHECK(f.complete());
    // Byte by byte, the same.
    JsonPrefix g(heads, tail);
    for (char c : std::string(R"({"name": "g", "arguments": {"n":-2})") + tail) {
        CHECK_FALSE(g.complete());
        REQUIRE(g.feed(std::string_view(&c, 1)));
    }
    CHECK(g.complete());
}

TEST_CASE("json prefix: whitespace comes in runs of at most kMaxSpaces, strings aside") {
    JsonPrefix p;
    REQUIRE(p.feed("{"));
    CHECK(p.feed(std::string(JsonPrefix::kMaxSpaces, ' ')));
    CHECK_FALSE(p.feed("\n"));
    REQUIRE(p.feed("\"a\":1,"));
    CHECK(p.feed(std::string(JsonPrefix::kMaxSpaces, '\t')));  // A new run.
    CHECK(p.feed("\"" + std::string(100, ' ') + "\":2}"));   // Inside a string: any.
    CHECK(p.complete());
}

TEST_CASE("json prefix: nesting deeper than kMaxDepth is refused") {
    std::string deep = "{\"a\":";
    for (int i = 1; i < JsonPrefix::kMaxDepth; ++i) {
        deep += "[";
    }
    JsonPrefix p;
    REQUIRE(p.feed(deep));
    CHECK_FALSE(p.feed("["));
    CHECK(p.feed("1"));
    // The deepest object it writes reads back wherever the server reads JSON (Boost.JSON's own
    // default depth, 32, would refuse it).
    const std::string closing(JsonPrefix::kMaxDepth - 1, ']');
    REQUIRE(p.feed(closing + "}"));
    CHECK(p.complete());
    std::error_code ec;
    CHECK(parse_json(deep + "1" + closing + "}", ec).is_object());
    CHECK_FALSE(ec);
}

TEST_CASE("json prefix: an object whose keys are free takes each key once") {
    // Refused at the closing quote that would repeat a key, compared as JSON reads them.
    const std::vector<std::pair<std::string, size_t>> twice = {
        {R"({"a":1,"a")", 9},
        {R"({"a":1,"b":2,"a")", 15},
        {R"({"":1,"")", 7},
        {R"({"a":1,"\u0061")", 14},                   // Escapes decoded,
        {R"({"\u0061bc":1,"ab\u0063")", 23},          // the hashed text the same however split,
        {R"({"é":1,"\u00e9")", 15},                   // to UTF-8,
        {R"({"\u00E9":1,"é")", 15},
        {"{\"\xf0\x9f\x98\x80\":1,\"\\ud83d\\ude00\"", 23},  // a surrogate pair as one character,
        {R"({"\n\/\"":1,"\u000a/\u0022")", 26},
        {R"({"x":{"a":{}},"x")", 16},                 // after the objects inside,
        {R"({"l":[{"a":1,"a")", 15},                  // in an array's object.
    };
    for (const auto& [text, at] : twice) {
        CAPTURE(text);
        CHECK(refused_at(text) == at);
    }
    // A key that may still become a new one goes on.
    JsonPrefix p;
    REQUIRE(p.feed(R"({"a":1,"ab":2,)"));
    CHECK_FALSE(p.accepts(R"("a")"));
    CHECK_FALSE(p.accepts(R"("ab":)"));
    CHECK(p.accepts(R"("a)"));
    CHECK(p.accepts(R"("abc")"));
    CHECK(p.accepts(R"("b")"));
    CHECK(p.accepts(R"("A")"));
    REQUIRE(p.feed(R"("a)"));
    CHECK_FALSE(p.accepts(R"(")"));
    CHECK_FALSE(p.accepts(R"(\u0062")"));  // "ab" again,
    CHECK(p.accepts(R"(\u0062)"));          // which may go on.
    CHECK(p.accepts(R"(\u0062c")"));
    JsonTokenCheck check(p);
    CHECK_FALSE(check(R"(":)"));
    CHECK(check(R"(c":)"));
    CHECK(p.feed(R"(c":3})"));
    CHECK(p.complete());
    // Each object has keys of its own: nested ones, and each of an array's.
    const std::vector<std::string> valid = {
        R"({"a":{"a":1,"b":{"a":2}},"b":[{"a":1},{"a":2,"b":{}}],"c":{"a":{"a":{}}}})",
        R"({"x":{"a":1},"a":2,"y":[{"x":1}],"z":{"x":{"y":1},"y":2}})",
    };
    for (const std::string& text : valid) {
        CAPTURE(text);
        CHECK(refused_at(text) == text.size());
    }
}

TEST_CASE("json prefix: accepts() asks each reading, the later ones too, as feed() would") {
    // An anyOf of 16 strings that differ in their maxLength (1..16): each reading follows one.
    // Bytes only the longest string's reading takes are accepted; accepts() and feed() agree on
    // every length, and accepts() leaves the readings as they were.
    std::string text = R"({"type":"object","properties":{"v":{"anyOf":[)";
    for (int i = 1; i <= 16; ++i) {
        text += (i == 1 ? "" : ",") + std::string(R"({"type":"string","maxLength":)") +
                std::to_string(i) + "}";
    }
    text += R"(]}},"required":["v"],"additionalProperties":false})";
    auto schema = JsonSchema::compile(boost::json::parse(text));
    REQUIRE(schema.ok());
    JsonPrefix p(**schema);
    REQUIRE(p.feed(R"({"v":")"));
    for (size_t n = 0; n <= 18; ++n) {
        CAPTURE(n);
        const std::string chars(n, 'a');
        const std::string closed = chars + "\"}";
        JsonPrefix fed = p;
        CHECK(p.accepts(chars) == (n <= 16));
        CHECK(p.accepts(chars) == fed.feed(chars));
        CHECK(p.accepts(closed) == (n <= 16));
        fed = p;
        CHECK(p.accepts(closed) == fed.feed(closed));
    }
    REQUIRE(p.feed(std::string(15, 'a')));  // Two readings left: maxLength 15 and 16.
    CHECK(p.accepts("a\"}"));
    CHECK(p.accepts("\"}"));
    CHECK_FALSE(p.accepts("aa"));
    REQUIRE(p.feed("a"));
    CHECK_FALSE(p.accepts("a"));
    CHECK(p.accepts("\"}"));
}

TEST_CASE("json prefix: keys once under a schema, in argument pairs and in each reading") {
    auto compile = [](const char* text) {
        auto s = JsonSchema::compile(boost::json::parse(text));
        REQUIRE(s.ok());
        return *s;
    };
    auto refused = [](const JsonReply& reply, const std::string& text) {
        JsonPrefix p(reply);
        for (size_t i = 0; i < text.size(); ++i) {
            if (!p.feed(text.substr(i, 1))) {
                return i;
            }
        }
        return text.size();
    };
    JsonReply reply;
    // additionalProperties: free keys; listed properties: each once, in order.
    reply.schema = compile(R"({"type":"object","additionalProperties":{"type":"integer"}})");
    CHECK(refused(reply, R"({"a":1,"a")") == 9);
    CHECK(refused(reply, R"({"a":1,"b":2})") == 13);
    reply.schema = compile(R"({"type":"object","properties":{"a":{"type":"integer"},)"
                           R"("b":{"type":"integer"}}})");
    CHECK(refused(reply, R"({"a":1,"a")") == 8);
    CHECK(refused(reply, R"({"b":1,"a")") == 6);  // Nothing after the last.
    // Readings of an anyOf, both objects of free keys while their values are integers, hold the
    // keys each.
    reply.schema =
        compile(R"({"type":"object","properties":{"v":{"anyOf":[)"
                R"({"type":"object","additionalProperties":{"type":"integer"}},)"
                R"({"type":"object","additionalProperties":{"type":"number"}}]}}})");
    CHECK(refused(reply, R"({"v":{"a":1,"a")") == 14);
    CHECK(refused(reply, R"({"v":{"a":1,"b":2,"a")") == 20);
    CHECK(refused(reply, R"({"v":{"a":1,"b":2.5,"a")") == 22);
    CHECK(refused(reply, R"({"v":{"a":1,"b":2.5,"c":3}})") == 27);
    // Argument pairs of any object (a forced GLM-4.5 call to a tool without a strict schema):
    // a key again is refused at its closing marker, which may still be the key's text.
    reply.schema = JsonSchema::any_object();
    reply.pairs = std::make_shared<const ArgumentPairs>();
    reply.tail = chat::forced_call_tail(chat::ToolCallFormat::kGlm45);
    const std::string a = "<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n";
    CHECK(refused(reply, a + "<arg_key>a</arg_key>") == a.size() + 19);
    JsonPrefix p(reply);
    REQUIRE(p.feed(a + "<arg_key>a"));
    CHECK_FALSE(p.accepts_marker("</arg_key>"));
    CHECK(p.accepts("</arg_"));
    CHECK(p.feed("</arg_</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"));
    CHECK(p.complete());
}

TEST_CASE(
    "json prefix: a section of calls: after a call's end, another call or the section's end") {
    // DeepSeek-V3's calls, two tools; Kimi K2's heads carry a number the model writes.
    auto small = JsonSchema::compile(boost::json::parse(
        R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})"));
    REQUIRE(small.ok());
    for (const chat::ToolCallFormat format :
         {chat::ToolCallFormat::kDeepSeekV3, chat::ToolCallFormat::kDeepSeekV31,
          chat::ToolCallFormat::kKimiK2}) {
        CAPTURE(chat::tool_call_format_name(format));
        JsonReply reply;
        for (const char* name : {"f", "g"}) {
            const chat::CallHead h = chat::held_call_head(format, name);
            reply.heads.push_back({h.text, *small, nullptr, h.number_at});
        }
        reply.tail = chat::forced_call_tail(format);
        const chat::NextCall next = chat::next_call_in_section(format);
        REQUIRE_FALSE(next.text.empty());
        reply.next_at = next.at;
        reply.next = next.text;
        // What the model writes for a call to `name` (Kimi K2: its index `index`).
        auto call = [&](const char* name, const char* index) {
            std::string h = chat::held_call_head(format, name).text;
            const int32_t at = chat::held_call_head(format, name).number_at;
            if (at >= 0) {
                h.insert(static_cast<size_t>(at), index);
            }
            return h + R"({"n": 1})";
        };
        const std::string end = reply.tail.substr(0, reply.next_at);
        const std::string text = call("f", "0") + end + reply.next + call("g", "1") + end +
                                 reply.next + call("f", "20") + reply.tail;
        JsonPrefix p(reply);
        for (size_t i = 0; i < text.size(); ++i) {
            CHECK_FALSE(p.complete());
            REQUIRE(p.feed(text.substr(i, 1)));
        }
        CHECK(p.complete());
        CHECK_FALSE(p.accepts(reply.next));  // The section has ended.
        // After a call's end: neither text nor a head without the next call's start.
        JsonPrefix q(reply);
        REQUIRE(q.feed(call("f", "0") + end));
        CHECK_FALSE(q.complete());
        CHECK_FALSE(q.accepts(call("g", "1")));
        CHECK_FALSE(q.accepts("x"));
        CHECK(q.accepts(reply.tail.substr(reply.next_at)));
        CHECK(q.accepts(reply.next + call("g", "1")));
        if (format == chat::ToolCallFormat::kKimiK2) {
            CHECK_FALSE(q.accepts(reply.next + call("g", "")));         // A number is due.
            CHECK_FALSE(q.accepts(reply.next + call("g", "1234567")));  // At most 6 digits.
        }
        // Without `next`: one call, and the tail whole.
        reply.next.clear();
        JsonPrefix one(reply);
        REQUIRE(one.feed(call("f", "0") + end));
        CHECK_FALSE(one.accepts(next.text));
        CHECK(one.feed(reply.tail.substr(reply.next_at)));
        CHECK(one.complete());
    }
}

// --- GLM-4.5's argument pairs (ArgumentPairs). ---

const char* const kWeather = R"({"type": "object", "properties": {
    "city": {"type": "string", "minLength": 1, "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "unit": {"type": "string", "enum": ["c", "f"]},
    "hours": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
  "required": ["city", "days"], "additionalProperties": false})";

// A forced GLM-4.5 call to `weather` (kWeather, strict): its pairs, then "</tool_call>".
struct WeatherCall {
    WeatherCall() {
        tool.name = "weather";
        tool.parameters_json = kWeather;
        auto compiled = JsonSchema::compile(boost::json::parse(kWeather));
        REQUIRE(compiled.ok());
        tool.strict_schema = *compiled;
        reply.schema = tool.strict_schema;
        reply.pairs = std::make_shared<const ArgumentPairs>(
            ArgumentPairs{chat::glm45_string_arguments(tool)});
        reply.tail = chat::forced_call_tail(chat::ToolCallFormat::kGlm45);
    }
    // The byte at which `text` is refused, or text.size().
    size_t refused_at(const std::string& text) const {
        JsonPrefix p(reply);
        for (size_t i = 0; i < text.size(); ++i) {
            if (!p.feed(text.substr(i, 1))) {
                return i;
            }
        }
        return text.size();
    }
    // The arguments GLM-4.5's parser reads from the call `text` completes.
    boost::json::value read(const std::string& text) const {
        auto parser = chat::create_tool_call_parser(chat::ToolCallFormat::kGlm45, "call_", {tool});
        chat::ParsedDelta d =
            parser->feed(chat::forced_call_prefix(chat::ToolCallFormat::kGlm45, tool.name) + text);
        chat::ParsedDelta end = parser->finish();
        CHECK(d.content.empty());
        CHECK(end.content.empty());
        CHECK(parser->completed_calls() == 1);
        std::string args;
        for (const chat::ToolCallDelta& c : d.tool_calls) {
            args += c.arguments;
        }
        return boost::json::parse(args);
    }

    ToolSpec tool;
    JsonReply reply;
};

TEST_CASE("json prefix: argument pairs are held as the object they stand for") {
    WeatherCall w;
    CHECK(w.reply.pairs->raw_keys == std::vector<std::string>{"city", "unit"});
    struct Case {
        std::string text;
        const char* object;  // What the parser reads.
    };
    const std::vector<Case> valid = {
        {"<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
         "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
         R"({"city": "Paris", "days": 3})"},
        // Raw text: quotes, backslashes, newlines, '<' and a marker's beginning are text.
        {"<arg_key>city</arg_key>\n<arg_value>a\"b\\\n<</arg_</arg_value>\n"
         "<arg_key>days</arg_key>\n<arg_value>14</arg_value>\n"
         "<arg_key>unit</arg_key>\n<arg_value>f</arg_value>\n"
         "<arg_key>hours</arg_key>\n<arg_value>[1, -2]</arg_value>\n</tool_call>",
         R"({"city": "a\"b\\\n<</arg_", "days": 14, "unit": "f", "hours": [1, -2]})"},
        {"<arg_key>city</arg_key>\n<arg_value>日本</arg_value>\n"
         "<arg_key>days</arg_key>\n<arg_value>1</arg_value>\n"
         "<arg_key>hours</arg_key>\n<arg_value>[]</arg_value>\n</tool_call>",
         R"({"city": "日本", "days": 1, "hours": []})"},
    };
    for (const Case& c : valid) {
        CAPTURE(c.text);
        JsonPrefix p(w.reply);
        for (size_t i = 0; i < c.text.size(); ++i) {
            CHECK_FALSE(p.complete());
            REQUIRE(p.feed(c.text.substr(i, 1)));
        }
        CHECK(p.complete());
        CHECK_FALSE(p.accepts("\n"));  // Nothing after the tail.
        JsonPrefix q(w.reply);
        for (size_t i = 0; i < c.text.size(); i += 5) {
            REQUIRE(q.feed(c.text.substr(i, 5)));
        }
        CHECK(q.complete());
        CHECK(w.read(c.text) == boost::json::parse(c.object));
    }

    const std::string city = "<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n";
    const std::vector<std::pair<std::string, size_t>> invalid = {
        {"</tool_call>", 1},                         // "city" and "days" are required.
        {"<arg_key>days</arg_key>", 9},              // Listed order: "city" first.
        {"<arg_key>town</arg_key>", 9},              // Not a parameter.
        {"<arg_key>city</arg_key><arg_value>", 23},  // The template's newline first.
        {"<arg_key>city</arg_key>\n<arg_value></arg_value>", 46},             // minLength 1.
        {"<arg_key>city</arg_key>\n<arg_value>abcdefghijklm", 47},            // maxLength 12.
        {city + "<arg_key>days</arg_key>\n<arg_value>15", city.size() + 36},  // maximum 14.
        {city + "<arg_key>days</arg_key>\n<arg_value>\"3\"",
         city.size() + 35},  // JSON: an integer.
        {city + "<arg_key>days</arg_key>\n<arg_value>0</arg_value>", city.size() + 35},
        {city + "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call> ",
         city.size() + 61},
        {city + "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>unit</arg_key>\n"
                "<arg_value>k",
         city.size() + 84},  // Not in the enum.
        {city + "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>hours</arg_key>\n"
                "<arg_value>[1,</arg_value>",
         city.size() + 88},  // An unfinished array.
        {city + "<arg_key>days</arg_key>\n<arg_value>2</arg_value><arg_key>", city.size() + 48},
    };
    for (const auto& [text, at] : invalid) {
        CAPTURE(text);
        CHECK(w.refused_at(text) == at);
    }
}

TEST_CASE("json prefix: markers may spell argument pairs' markers and the tail, never their text") {
    WeatherCall w;
    JsonPrefix p(w.reply);
    CHECK(p.accepts_marker("<arg_key>"));
    CHECK_FALSE(p.accepts_marker("</tool_call>"));  // Required parameters first.
    CHECK_FALSE(p.accepts_marker("<|user|>"));
    REQUIRE(p.feed("<arg_key>"));
    CHECK_FALSE(p.accepts_marker("</arg_key>"));  // No parameter has an empty name.
    REQUIRE(p.feed("city"));
    CHECK(p.accepts_marker("</arg_key>"));
    REQUIRE(p.feed("</arg_key>\n"));
    CHECK(p.accepts_marker("<arg_value>"));
    REQUIRE(p.feed("<arg_value>"));
    CHECK_FALSE(p.accepts_marker("<arg_key>"));     // Text here, not a marker.
    CHECK_FALSE(p.accepts_marker("</arg_value>"));  // minLength 1.
    CHECK(p.accepts("<arg_key>"));                  // As text, it is a city's name.
    REQUIRE(p.feed("Rome"));
    CHECK(p.accepts_marker("</arg_value>"));
    CHECK_FALSE(p.accepts_marker("<|user|>"));
    REQUIRE(p.feed("</arg_value>\n<arg_key>days</arg_key>\n<arg_value>7</arg_value>\n"));
    CHECK(p.accepts_marker("</tool_call>"));
    CHECK(p.accepts_marker("<arg_key>"));
    REQUIRE(p.feed("</tool_call>"));
    CHECK(p.complete());
    CHECK_FALSE(p.accepts_marker("<|user|>"));
}

TEST_CASE("json prefix: heads with argument pairs: each tool's own strings are raw") {
    // Two tools whose "q" is a string in one and a JSON value in the other.
    auto schema = [](const char* text) {
        auto s = JsonSchema::compile(boost::json::parse(text));
        REQUIRE(s.ok());
        return *s;
    };
    ToolSpec f{"f", "",
               R"({"type":"object","properties":{"q":{"type":"string"}},"required":["q"]})",
               nullptr};
    ToolSpec g{"g", "",
               R"({"type":"object","properties":{"q":{"type":"integer"}},"required":["q"]})",
               nullptr};
    f.strict_schema = schema(f.parameters_json.c_str());
    g.strict_schema = schema(g.parameters_json.c_str());
    JsonReply reply;
    const std::string opening = chat::forced_call_prefix(chat::ToolCallFormat::kGlm45, "");
    for (const ToolSpec* t : {&f, &g}) {
        reply.heads.push_back(
            {chat::forced_call_prefix(chat::ToolCallFormat::kGlm45, t->name).substr(opening.size()),
             t->strict_schema,
             std::make_shared<const ArgumentPairs>(
                 ArgumentPairs{chat::glm45_string_arguments(*t)})});
    }
    reply.tail = chat::forced_call_tail(chat::ToolCallFormat::kGlm45);
    const std::string pair = "<arg_key>q</arg_key>\n<arg_value>";
    JsonPrefix p(reply);
    JsonPrefix pf = p;
    REQUIRE(pf.feed("f\n" + pair));
    CHECK(pf.feed("12 apples</arg_value>\n</tool_call>"));
    CHECK(pf.complete());
    JsonPrefix pg = p;
    REQUIRE(pg.feed("g\n" + pair));
    CHECK_FALSE(pg.accepts("12 apples"));
    CHECK(pg.feed("12</arg_value>\n</tool_call>"));
    CHECK(pg.complete());
    CHECK_FALSE(p.accepts("h\n"));
}

}  // namespace
}  // namespace edge::engine::sampling
