// Tool-call parsers on recorded outputs of each format, fed whole, byte by byte, and split at
// every byte boundary (and every pair of boundaries): the content and the reassembled calls are
// the same every time; names are never partial; streamed arguments are always a valid JSON
// prefix; malformed calls come back as content.

#include "engine/chat/tool_call_parser.h"

#include <doctest/doctest.h>

#include <map>

#include <boost/json.hpp>

#include "common/json_text.h"
#include "engine/chat/json_stream.h"

namespace edge::engine::chat {
namespace {

struct Call {
    std::string id;
    std::string name;
    std::string arguments;
    bool operator==(const Call&) const = default;
};

struct Outcome {
    std::string content;
    std::vector<Call> calls;
    bool malformed = false;
    bool operator==(const Outcome&) const = default;
};

// Feeds the pieces, then finish(); checks the streaming invariants on the way.
Outcome run(ToolCallFormat format, const std::vector<std::string>& pieces,
            const std::vector<ToolSpec>& tools = {}) {
    auto parser = create_tool_call_parser(format, "call_", tools);
    std::map<int32_t, Call> calls;
    std::map<int32_t, JsonStream> streams;
    std::vector<int32_t> abandoned;
    int32_t headers = 0;
    Outcome o;
    auto apply = [&](const ParsedDelta& d) {
        o.content += d.content;
        for (int32_t a : d.abandoned_calls) {
            // Only a call whose header went out in an earlier delta is named as given up.
            CHECK(calls.count(a) == 1);
        }
        for (const ToolCallDelta& t : d.tool_calls) {
            Call& c = calls[t.index];
            if (!t.name.empty()) {
                CHECK(c.name.empty());  // The name comes once, whole.
                CHECK(t.index == headers++);  // Indexes count up from 0 with no gap.
                c.name = t.name;
                c.id = t.id;
            } else {
                CHECK_FALSE(c.name.empty());  // Arguments never precede the name.
            }
            c.arguments += t.arguments;
            for (char ch : t.arguments) {
                CHECK(streams[t.index].feed(ch) != JsonStream::Result::kInvalid);
            }
        }
        abandoned.insert(abandoned.end(), d.abandoned_calls.begin(), d.abandoned_calls.end());
    };
    for (const std::string& p : pieces) {
        apply(parser->feed(p));
    }
    apply(parser->finish());
    for (int32_t a : abandoned) {
        calls.erase(a);
    }
    for (auto& [index, c] : calls) {
        o.calls.push_back(c);
    }
    o.malformed = parser->malformed();
    CHECK(parser->completed_calls() == static_cast<int32_t>(o.calls.size()));
    return o;
}

// The same outcome for every way of cutting `text`.
Outcome check_all_splits(ToolCallFormat format, const std::string& text,
                         const std::vector<ToolSpec>& tools = {}) {
    const Outcome whole = run(format, {text}, tools);
    std::vector<std::string> bytes;
    for (char c : text) {
        bytes.emplace_back(1, c);
    }
    CHECK(run(format, bytes, tools) == whole);
    for (size_t i = 0; i <= text.size(); ++i) {
        INFO("split at " << i);
        CHECK(run(format, {text.substr(0, i), text.substr(i)}, tools) == whole);
    }
    for (size_t i = 0; i <= text.size(); i += 3) {
        for (size_t j = i; j <= text.size(); ++j) {
            INFO("split at " << i << " and " << j);
            REQUIRE(run(format, {text.substr(0, i), text.substr(i, j - i), text.substr(j)},
                        tools) == whole);
        }
    }
    return whole;
}

void check_json(const std::string& text, const std::string& expected) {
    CHECK(boost::json::parse(text) == boost::json::parse(expected));
}

TEST_CASE("tool calls: Qwen3 (Hermes) format") {
    const std::string text =
        "Let me check the weather.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris \\\"FR\\\"\", \"days\": 3, \"units\": [\"c\", null]}}\n</tool_call>\n"
        "<tool_call>\n{\"arguments\": {}, \"name\": \"get_time\"}\n</tool_call>";
    const Outcome o = check_all_splits(ToolCallFormat::kHermes, text);
    // The newline between the calls is not content (the one before the first is).
    CHECK(o.content == "Let me check the weather.\n");
    REQUIRE(o.calls.size() == 2);
    CHECK(o.calls[0].name == "get_weather");
    CHECK(o.calls[0].id == "call_0");
    check_json(o.calls[0].arguments,
               "{\"city\": \"Paris \\\"FR\\\"\", \"days\": 3, \"units\": [\"c\", null]}");
    CHECK(o.calls[1].name == "get_time");
    CHECK(o.calls[1].id == "call_1");
    check_json(o.calls[1].arguments, "{}");
    CHECK_FALSE(o.malformed);
}

TEST_CASE("tool calls: whitespace alone after a call is dropped, text after it kept whole") {
    const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    // Between calls, and after the last: a client sending the message back would otherwise
    // prompt the model with newlines it never wrote as an answer.
    Outcome o = check_all_splits(ToolCallFormat::kHermes, call + "\n\n" + call + " \n");
    CHECK(o.content.empty());
    CHECK(o.calls.size() == 2);
    // Text after a call is content, with the whitespace before it.
    o = check_all_splits(ToolCallFormat::kHermes, call + "\n\nDone.\n");
    CHECK(o.content == "\n\nDone.\n");
    // Whitespace before a call that turns out malformed is content with the call's text.
    o = check_all_splits(ToolCallFormat::kHermes, call + "\n<tool_call>\n{\"nam");
    CHECK(o.malformed);
    CHECK(o.calls.size() == 1);
    CHECK(o.content == "\n<tool_call>\n{\"nam");
}

TEST_CASE("tool calls: GLM-4.5 format") {
    const std::string text =
        "I'll look that up.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris, "
        "\"FR\"</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts"
        "</arg_key>\n<arg_value>{\"hourly\": true}</arg_value>\n</tool_call><tool_call>now\n"
        "</tool_call>";
    SUBCASE("without tool schemas, JSON-looking values are read as JSON") {
        const Outcome o = check_all_splits(ToolCallFormat::kGlm45, text);
        CHECK(o.content == "I'll look that up.");
        REQUIRE(o.calls.size() == 2);
        CHECK(o.calls[0].name == "get_weather");
        check_json(o.calls[0].arguments,
                   "{\"city\": \"Paris, \\\"FR\\\"\", \"days\": 3, \"opts\": {\"hourly\": true}}");
        CHECK(o.calls[1].name == "now");
        check_json(o.calls[1].arguments, "{}");
    }
    SUBCASE("arguments declared as strings stay strings") {
        std::vector<ToolSpec> tools = {
            {"get_weather", "",
             "{\"type\": \"object\", \"properties\": {\"days\": {\"type\": "
             "\"string\"}}}"}};
        const Outcome o = run(ToolCallFormat::kGlm45, {text}, tools);
        REQUIRE(o.calls.size() == 2);
        check_json(o.calls[0].arguments,
                   "{\"city\": \"Paris, \\\"FR\\\"\", \"days\": \"3\", \"opts\": {\"hourly\": "
                   "true}}");
    }
}

TEST_CASE("tool calls: GLM-4.5 end tags found at any split, after near misses inside values") {
    // The search for an end tag resumes where the last feed's stopped: a tag begun at the end
    // of one piece and finished in the next, and prefixes of it inside the value, must not be
    // skipped or taken.
    const std::string value = "a </arg_valu b <</arg_value c </arg_key " + std::string(300, 'x');
    const std::string text = "<tool_call>f\n<arg_key>k </arg_ke</arg_key>\n<arg_value>" + value +
                             "</arg_value>\n</tool_call>";
    const Outcome o = check_all_splits(ToolCallFormat::kGlm45, text);
    REQUIRE(o.calls.size() == 1);
    CHECK_FALSE(o.malformed);
    check_json(o.calls[0].arguments,
               boost::json::serialize(boost::json::object{{"k </arg_ke", value}}));
}

TEST_CASE("tool calls: GLM-4.5 numbers come back spelled as Python writes them, not 5E-1") {
    const Outcome o = run(ToolCallFormat::kGlm45,
                          {"<tool_call>f\n<arg_key>t</arg_key>\n<arg_value>0.5</arg_value>\n"
                           "<arg_key>n</arg_key>\n<arg_value>[1.0, 2e-7, 3]</arg_value>\n"
                           "</tool_call>"});
    REQUIRE(o.calls.size() == 1);
    CHECK(o.calls[0].arguments.find("0.5") != std::string::npos);
    CHECK(o.calls[0].arguments.find("[1.0,2e-07,3]") != std::string::npos);
    CHECK(o.calls[0].arguments.find('E') == std::string::npos);
}

TEST_CASE("tool calls: GLM-4.5 numbers past a double's range come back as the model wrote them") {
    const Outcome o = run(ToolCallFormat::kGlm45,
                          {"<tool_call>f\n<arg_key>big</arg_key>\n<arg_value> [1E3510, 2.5]\n"
                           "</arg_value>\n</tool_call>"});
    REQUIRE(o.calls.size() == 1);
    CHECK(o.calls[0].arguments == "{\"big\": [1E3510, 2.5]}");  // Not null.
}

TEST_CASE("tool calls: Kimi K2 format") {
    const std::string text =
        "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        "<|tool_call_argument_begin|>{\"city\": \"Beijing\", \"n\": [1, 2.5e3]}"
        "<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}"
        "<|tool_call_end|><|tool_calls_section_end|>";
    const Outcome o = check_all_splits(ToolCallFormat::kKimiK2, text);
    CHECK(o.content == "Checking.");
    REQUIRE(o.calls.size() == 2);
    CHECK(o.calls[0].id == "functions.get_weather:0");
    CHECK(o.calls[0].name == "get_weather");
    check_json(o.calls[0].arguments, "{\"city\": \"Beijing\", \"n\": [1, 2.5e3]}");
    CHECK(o.calls[1].id == "functions.get_time:1");
    CHECK(o.calls[1].name == "get_time");
}

TEST_CASE("tool calls: Kimi K2 ids with whitespace around them") {
    // vLLM's pattern allows whitespace either side of the id: it is not part of the id or name.
    const std::string text =
        "<|tool_calls_section_begin|><|tool_call_begin|>\n functions.get_weather:0 \n"
        "<|tool_call_argument_begin|>{\"city\": \"Beijing\"}<|tool_call_end|>"
        "<|tool_calls_section_end|>";
    const Outcome o = check_all_splits(ToolCallFormat::kKimiK2, text);
    CHECK_FALSE(o.malformed);
    CHECK(o.content.empty());
    REQUIRE(o.calls.size() == 1);
    CHECK(o.calls[0].id == "functions.get_weather:0");
    CHECK(o.calls[0].name == "get_weather");
    check_json(o.calls[0].arguments, "{\"city\": \"Beijing\"}");
}

TEST_CASE("tool calls: DeepSeek-V3 format") {
    const std::string text =
        "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        "```json\n{\"city\": \"Beijing\", \"n\": [1, 2.5e3]}\n```<｜tool▁call▁end｜>\n"
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>";
    const Outcome o = check_all_splits(ToolCallFormat::kDeepSeekV3, text);
    CHECK(o.content == "Checking.");
    REQUIRE(o.calls.size() == 2);
    CHECK(o.calls[0].id == "call_0");
    CHECK(o.calls[0].name == "get_weather");
    check_json(o.calls[0].arguments, "{\"city\": \"Beijing\", \"n\": [1, 2.5e3]}");
    CHECK(o.calls[1].id == "call_1");
    CHECK(o.calls[1].name == "get_time");
    check_json(o.calls[1].arguments, "{}");
    CHECK_FALSE(o.malformed);
}

TEST_CASE("tool calls: DeepSeek-V3 calls without <｜tool▁calls▁begin｜>, as its template writes") {
    // The template writes each call of a conversation after the first as "\n", the call, then
    // <｜tool▁calls▁end｜>, with no <｜tool▁calls▁begin｜>: a model that copies that form is
    // calling a tool. Each text is fed whole, byte by byte and split at every boundary.
    const std::string f =
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Beijing\"}"
        "\n```<｜tool▁call▁end｜>";
    const std::string g =
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>";
    const std::string section_f = "<｜tool▁calls▁begin｜>" + f + "<｜tool▁calls▁end｜>";
    struct Case {
        std::string text;
        std::string content;
        std::vector<std::string> names;
    };
    const std::vector<std::string> fg = {"get_weather", "get_time"};
    for (const Case& c : {
             // The template's history form.
             Case{"Checking.\n" + f + "<｜tool▁calls▁end｜>", "Checking.\n", {"get_weather"}},
             Case{f, "", {"get_weather"}},
             Case{f + "\n", "", {"get_weather"}},
             Case{f + "\n" + g, "", fg},
             Case{f + g + "<｜tool▁calls▁end｜>", "", fg},
             // Text after the call is content, as after a section's end.
             Case{f + "\nDone.", "\nDone.", {"get_weather"}},
             Case{f + "<｜tool▁calls▁end｜> Done.", " Done.", {"get_weather"}},
             // A marker-like text after the call that is neither marker.
             Case{f + "\n<｜tool▁output▁begin｜>", "\n<｜tool▁output▁begin｜>", {"get_weather"}},
             // The first call in a section, a later one bare (the model copying its history).
             Case{section_f + "\n" + g + "<｜tool▁calls▁end｜>", "", fg},
             Case{"a" + f + "b" + section_f, "ab", {"get_weather", "get_weather"}},
         }) {
        INFO(c.text);
        const Outcome o = check_all_splits(ToolCallFormat::kDeepSeekV3, c.text);
        CHECK_FALSE(o.malformed);
        CHECK(o.content == c.content);
        REQUIRE(o.calls.size() == c.names.size());
        for (size_t i = 0; i < c.names.size(); ++i) {
            CHECK(o.calls[i].id == "call_" + std::to_string(i));
            CHECK(o.calls[i].name == c.names[i]);
            check_json(o.calls[i].arguments,
                       c.names[i] == "get_time" ? "{}" : "{\"city\": \"Beijing\"}");
        }
    }
    // Text that mentions the marker, with no call's head after it, stays content and is not a
    // malformed call.
    for (const std::string text :
         {"Write <｜tool▁call▁begin｜> to start a call.", "<｜tool▁call▁begin｜>functional code",
          "<｜tool▁call▁begin｜>function and <｜tool▁sep｜>", "ends with <｜tool▁call▁begin｜>x"}) {
        INFO(text);
        const Outcome o = check_all_splits(ToolCallFormat::kDeepSeekV3, text);
        CHECK_FALSE(o.malformed);
        CHECK(o.calls.empty());
        CHECK(o.content == text);
    }
    // A bare call that goes wrong after its head is malformed, as in a section.
    const std::string unfenced =
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{\"a\": 1}<｜tool▁call▁end｜>";
    const Outcome bad = check_all_splits(ToolCallFormat::kDeepSeekV3, unfenced);
    CHECK(bad.malformed);
    CHECK(bad.calls.empty());
    CHECK(bad.content == unfenced);
    // V3.1's template always opens the section: its parser takes no bare call.
    const std::string v3_1 = "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>";
    const Outcome o = check_all_splits(ToolCallFormat::kDeepSeekV31, v3_1);
    CHECK_FALSE(o.malformed);
    CHECK(o.calls.empty());
    CHECK(o.content == v3_1);
}

TEST_CASE("tool calls: DeepSeek-V3.1 format") {
    const std::string text =
        "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        "{\"city\": \"Beijing\", \"n\": [1, 2.5e3]}<｜tool▁call▁end｜>"
        "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    const Outcome o = check_all_splits(ToolCallFormat::kDeepSeekV31, text);
    CHECK(o.content == "Checking.");
    REQUIRE(o.calls.size() == 2);
    CHECK(o.calls[0].name == "get_weather");
    check_json(o.calls[0].arguments, "{\"city\": \"Beijing\", \"n\": [1, 2.5e3]}");
    CHECK(o.calls[1].name == "get_time");
    check_json(o.calls[1].arguments, "{}");
    CHECK_FALSE(o.malformed);
    // V3's "function" + fenced form is not V3.1's: after the "name" function, no JSON object.
    const std::string v3 =
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    const Outcome wrong = check_all_splits(ToolCallFormat::kDeepSeekV31, v3);
    CHECK(wrong.malformed);
    CHECK(wrong.calls.empty());
    CHECK(wrong.content == v3);
    CHECK(*tool_call_format_from_name("deepseek_v3_1") == ToolCallFormat::kDeepSeekV31);
    CHECK(tool_call_format_name(ToolCallFormat::kDeepSeekV31) == "deepseek_v3_1");
}

TEST_CASE("tool calls: a section the output ends without closing keeps its calls") {
    // DeepSeek-V3's template writes a conversation's first call without <｜tool▁calls▁end｜>, and
    // the model copies it: the end of the output after a whole call closes the section (vLLM's
    // parsers take it so), whitespace after the call included.
    struct Case {
        ToolCallFormat format;
        std::string text;
        std::string name;
    };
    for (const Case& c :
         {Case{ToolCallFormat::kKimiK2,
               "x<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
               "<|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|>",
               "f"},
          Case{ToolCallFormat::kKimiK2,
               "x<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
               "<|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|>\n",
               "f"},
          Case{ToolCallFormat::kDeepSeekV3,
               "x<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
               "{\"a\": 1}\n```<｜tool▁call▁end｜>",
               "f"},
          Case{ToolCallFormat::kDeepSeekV31,
               "x<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}"
               "<｜tool▁call▁end｜>\n",
               "f"}}) {
        INFO(c.text);
        const Outcome o = check_all_splits(c.format, c.text);
        CHECK_FALSE(o.malformed);
        CHECK(o.content == "x");
        REQUIRE(o.calls.size() == 1);
        CHECK(o.calls[0].name == c.name);
        check_json(o.calls[0].arguments, "{\"a\": 1}");
    }
    // A section with no whole call, or a call cut before its end marker, stays malformed.
    for (const std::string text :
         {"<|tool_calls_section_begin|>", "<|tool_calls_section_begin|><|tool_call_begin|>",
          "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
          "<|tool_call_argument_begin|>{}"}) {
        INFO(text);
        const Outcome o = check_all_splits(ToolCallFormat::kKimiK2, text);
        CHECK(o.malformed);
        CHECK(o.calls.empty());
        CHECK(o.content == text);
    }
}

TEST_CASE("tool calls: plain text and marker look-alikes pass through") {
    for (auto f : {ToolCallFormat::kHermes, ToolCallFormat::kGlm45, ToolCallFormat::kKimiK2,
                   ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31}) {
        const std::string text = "a < b, <tool and <|tool_calls are not markers <｜tool <";
        const Outcome o = check_all_splits(f, text);
        CHECK(o.content == text);
        CHECK(o.calls.empty());
        CHECK_FALSE(o.malformed);
    }
}

TEST_CASE("tool calls: malformed calls come back as content") {
    SUBCASE("Hermes: invalid JSON") {
        const std::string text =
            "x<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": tru}}\n</tool_call>y";
        const Outcome o = check_all_splits(ToolCallFormat::kHermes, text);
        CHECK(o.malformed);
        CHECK(o.calls.empty());
        CHECK(o.content == text);
    }
    SUBCASE("Hermes: an unpaired surrogate escape in the arguments") {
        // Boost.JSON refuses it: a client sending the call back in its history would get a 400.
        for (const std::string value :
             {"\\ud800", "\\udc00", "\\ud800x", "\\ud800\\n", "\\ud800\\ud800", "\\udbff\\u0041"}) {
            INFO(value);
            const std::string text = "x<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"" +
                                     value + "\"}}\n</tool_call>y";
            const Outcome o = check_all_splits(ToolCallFormat::kHermes, text);
            CHECK(o.malformed);
            CHECK(o.calls.empty());
            CHECK(o.content == text);
        }
        // A pair is one character: the call stands.
        const Outcome o = check_all_splits(
            ToolCallFormat::kHermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"\\ud83d\\ude00\"}}</tool_call>");
        CHECK_FALSE(o.malformed);
        REQUIRE(o.calls.size() == 1);
        check_json(o.calls[0].arguments, "{\"a\": \"\\ud83d\\ude00\"}");
    }
    SUBCASE("Hermes: output ends inside a call") {
        const std::string text = "x<tool_call>\n{\"name\": \"f\", \"argu";
        const Outcome o = check_all_splits(ToolCallFormat::kHermes, text);
        CHECK(o.malformed);
        CHECK(o.content == text);
    }
    SUBCASE("Hermes: a good call survives a bad one after it") {
        const std::string text =
            "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call><tool_call>{\"nam";
        const Outcome o = check_all_splits(ToolCallFormat::kHermes, text);
        CHECK(o.malformed);
        REQUIRE(o.calls.size() == 1);
        CHECK(o.calls[0].name == "g");
        CHECK(o.content == "<tool_call>{\"nam");
    }
    SUBCASE("Hermes: a second \"arguments\" or \"name\" key, or any other key") {
        // Streaming both values would give the client two objects back to back as the
        // arguments (or a second header); another key ("parameters"), taken as a call without
        // arguments, ran the tool with {} and dropped the model's. The call is given up instead.
        for (const std::string call :
             {"{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"arguments\": {\"b\": 2}}",
              "{\"arguments\": {\"a\": 1}, \"arguments\": {}, \"name\": \"f\"}",
              "{\"name\": \"f\", \"arguments\": {}, \"name\": \"g\"}",
              "{\"name\": \"f\", \"name\": \"g\", \"arguments\": {}}",
              "{\"name\": \"delete_files\", \"parameters\": {\"path\": \"/tmp/x\"}}",
              "{\"name\": \"f\", \"arguments\": {}, \"id\": 1}"}) {
            INFO(call);
            const std::string text = "x<tool_call>" + call + "</tool_call>y";
            const Outcome o = check_all_splits(ToolCallFormat::kHermes, text);
            CHECK(o.malformed);
            CHECK(o.calls.empty());
            CHECK(o.content == text);
        }
    }
    SUBCASE("Hermes: keys are compared as JSON reads them, escapes decoded") {
        // "argu\u006dents" is a second "arguments" key, so the call is malformed.
        const std::string twice =
            "<tool_call>{\"name\": \"f\", \"arguments\": {}, \"argu\\u006dents\": "
            "{\"b\": 2}}</tool_call>";
        const Outcome o = check_all_splits(ToolCallFormat::kHermes, twice);
        CHECK(o.malformed);
        CHECK(o.calls.empty());
        CHECK(o.content == twice);
        // "argume\nts" is not "arguments": a key the call may not have.
        const Outcome other =
            check_all_splits(ToolCallFormat::kHermes,
                             "<tool_call>{\"name\": \"f\", \"argume\\nts\": {\"b\": 2}}"
                             "</tool_call>");
        CHECK(other.malformed);
        CHECK(other.calls.empty());
        // Escapes that spell "arguments" are that key.
        const Outcome spelled =
            check_all_splits(ToolCallFormat::kHermes,
                             "<tool_call>{\"name\": \"f\", \"argu\\u006dents\": {\"b\": 2}}"
                             "</tool_call>");
        CHECK_FALSE(spelled.malformed);
        REQUIRE(spelled.calls.size() == 1);
        CHECK(spelled.calls[0].arguments == "{\"b\": 2}");
    }
    SUBCASE("Hermes: a bad call, then a good one") {
        // Whether the bad call's header went out before it broke depends on the split: if not,
        // it is not named as abandoned and the good call is index 0; its id is the same either
        // way.
        const std::string bad = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": tru}}";
        const Outcome o = check_all_splits(
            ToolCallFormat::kHermes,
            bad + "</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>");
        CHECK(o.malformed);
        REQUIRE(o.calls.size() == 1);
        CHECK(o.calls[0].name == "g");
        CHECK(o.calls[0].id == "call_1");
        CHECK(o.content == bad + "</tool_call>");
    }
    SUBCASE("GLM-4.5: missing <arg_value>") {
        const std::string text = "<tool_call>f\n<arg_key>a</arg_key>oops</tool_call>";
        const Outcome o = check_all_splits(ToolCallFormat::kGlm45, text);
        CHECK(o.malformed);
        CHECK(o.calls.empty());
        CHECK(o.content == text);
    }
    SUBCASE("GLM-4.5: an argument given twice") {
        // Its pairs stream out as one object: {"a": 1, "a": 2} is not arguments a client can
        // read one way. The call is given up, as Hermes's with a key given twice.
        const std::string bad =
            "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n<arg_key>b</arg_key>"
            "\n<arg_value>x</arg_value>\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n"
            "</tool_call>";
        const std::string good =
            "<tool_call>g\n<arg_key>a</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
        const Outcome o = check_all_splits(ToolCallFormat::kGlm45, bad + good);
        CHECK(o.malformed);
        REQUIRE(o.calls.size() == 1);
        CHECK(o.calls[0].name == "g");
        check_json(o.calls[0].arguments, "{\"a\": 3}");
        CHECK(o.content == bad);
    }
    SUBCASE("Hermes: an argument given twice, escapes decoded") {
        // As GLM-4.5's: the arguments stream out as they are, {"a": 1, "a": 2} included.
        const std::string good =
            "<tool_call>{\"name\": \"g\", \"arguments\": {\"a\": 3}}</tool_call>";
        for (const std::string args :
             {"{\"a\": 1, \"b\": 2, \"a\": 2}", "{\"a\": 1, \"\\u0061\": [2]}",
              "{\"\xf0\x9f\x98\x80\": 1, \"\\ud83d\\ude00\": 2}"}) {
            INFO(args);
            const std::string bad =
                "<tool_call>{\"name\": \"f\", \"arguments\": " + args + "}</tool_call>";
            const Outcome o = check_all_splits(ToolCallFormat::kHermes, bad + good);
            CHECK(o.malformed);
            REQUIRE(o.calls.size() == 1);
            CHECK(o.calls[0].name == "g");
            check_json(o.calls[0].arguments, "{\"a\": 3}");
            CHECK(o.content == bad);
        }
        // A nested object's keys are its own.
        const std::string args = "{\"a\": {\"a\": 1, \"b\": {\"a\": 2}}, \"b\": [{\"a\": 3}]}";
        const Outcome o = check_all_splits(
            ToolCallFormat::kHermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": " + args + "}</tool_call>");
        CHECK_FALSE(o.malformed);
        REQUIRE(o.calls.size() == 1);
        CHECK(o.calls[0].arguments == args);
    }
    SUBCASE("Kimi K2: bad JSON, then text") {
        const std::string text =
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
            "<|tool_call_argument_begin|>{\"a\": }<|tool_call_end|><|tool_calls_section_end|>";
        const Outcome o = check_all_splits(ToolCallFormat::kKimiK2, text);
        CHECK(o.malformed);
        CHECK(o.calls.empty());
        CHECK(o.content == text);
    }
    SUBCASE("DeepSeek-V3: arguments without their fence") {
        const std::string text =
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{\"a\": 1}"
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        const Outcome o = check_all_splits(ToolCallFormat::kDeepSeekV3, text);
        CHECK(o.malformed);
        CHECK(o.calls.empty());
        CHECK(o.content == text);
    }
    SUBCASE("DeepSeek-V3: a good call survives output ending inside the next") {
        const std::string text =
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{}\n```"
            "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>h\n```json\n{\"a";
        const Outcome o = check_all_splits(ToolCallFormat::kDeepSeekV3, text);
        CHECK(o.malformed);
        REQUIRE(o.calls.size() == 1);
        CHECK(o.calls[0].name == "g");
        CHECK(o.content == "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>h\n```json\n{\"a");
    }
}

// Arguments as (key, value as JSON text) pairs; keys need no escapes.
using Pairs = std::vector<std::pair<std::string, std::string>>;

std::string json_object(const Pairs& pairs) {
    std::string object = "{";
    for (const auto& [key, value] : pairs) {
        object += (object.size() > 1 ? ", \"" : "\"") + key + "\": " + value;
    }
    return object + "}";
}

// A call of `format` to `name` with `pairs` as its arguments, written as the format writes them;
// the first call of its section.
std::string call_text(ToolCallFormat format, const std::string& name, const Pairs& pairs) {
    const std::string object = json_object(pairs);
    std::string glm;
    for (const auto& [key, value] : pairs) {
        glm += "<arg_key>" + key + "</arg_key>\n<arg_value>" + value + "</arg_value>\n";
    }
    switch (format) {
        case ToolCallFormat::kHermes:
            return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + object +
                   "}\n</tool_call>";
        case ToolCallFormat::kGlm45:
            return "<tool_call>" + name + "\n" + glm + "</tool_call>";
        case ToolCallFormat::kKimiK2:
            return "<|tool_calls_section_begin|><|tool_call_begin|>functions." + name +
                   ":0<|tool_call_argument_begin|>" + object +
                   "<|tool_call_end|><|tool_calls_section_end|>";
        case ToolCallFormat::kDeepSeekV3:
            return "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name +
                   "\n```json\n" + object + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        case ToolCallFormat::kDeepSeekV31:
            return "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>" +
                   object + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    }
    return "";
}

TEST_CASE("tool calls: a key given twice in a nested object makes the call malformed") {
    // In every format that streams JSON arguments (GLM-4.5's values that are JSON too): a
    // client reads {"x": {"a": 1, "a": 2}} as either value, or refuses it (Boost.JSON, reading a
    // GLM-4.5 value, kept the last). The call is given up as one with an argument given twice.
    const Pairs good_args = {{"a", "3"}};
    for (const ToolCallFormat format :
         {ToolCallFormat::kHermes, ToolCallFormat::kGlm45, ToolCallFormat::kKimiK2,
          ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31}) {
        INFO(tool_call_format_name(format));
        for (const Pairs& args : std::vector<Pairs>{
                 {{"p", "1"}, {"x", R"({"a": 1, "b": 2, "a": 3})"}},
                 {{"x", R"({"y": {"a": 1, "a": [2]}, "z": 0})"}},
                 {{"x", R"([{"y": {"a": 1}}, {"y": {"a": 1, "\u0061": 2}}])"}},
                 {{"x", "{\"y\": {\"\\ud83d\\ude00\": 1, \"\xf0\x9f\x98\x80\": 2}}"}}}) {
            INFO(args.back().second);
            const std::string bad = call_text(format, "f", args);
            const Outcome o = check_all_splits(format, bad + call_text(format, "g", good_args));
            CHECK(o.malformed);
            CHECK(o.content == bad);
            CHECK(o.calls.size() == 1);
            if (!o.calls.empty()) {  // Not REQUIRE: every format is tried.
                CHECK(o.calls.back().name == "g");
                check_json(o.calls.back().arguments, "{\"a\": 3}");
            }
        }
        // Each object has its own keys: siblings and nested objects may reuse them.
        for (const Pairs& args : std::vector<Pairs>{
                 {{"x", R"({"a": 1})"}, {"y", R"({"a": 1})"}},
                 {{"a", R"([{"a": 1}, {"a": 2}])"}, {"b", R"({"a": {"a": {"a": 1}}})"}}}) {
            INFO(args.back().second);
            const Outcome o = check_all_splits(format, call_text(format, "f", args));
            CHECK_FALSE(o.malformed);
            CHECK(o.calls.size() == 1);
            if (!o.calls.empty()) {
                check_json(o.calls[0].arguments, json_object(args));
            }
        }
    }
}

TEST_CASE("tool calls: GLM-4.5 values nest one level less than kMaxJsonDepth, as arguments") {
    // The pairs become one arguments object around the values: a value nesting kMaxJsonDepth
    // containers would make arguments one level deeper than the server reads back (parse_json,
    // when a client sends the call in its history). The deepest value that fits is kept as JSON;
    // one level more gives the call up, naming the argument.
    const auto nested = [](size_t arrays) {
        return std::string(arrays, '[') + "1" + std::string(arrays, ']');
    };
    const Pairs fits = {{"v", nested(kMaxJsonDepth - 1)}};
    const Outcome o = run(ToolCallFormat::kGlm45, {call_text(ToolCallFormat::kGlm45, "f", fits)});
    CHECK_FALSE(o.malformed);
    REQUIRE(o.calls.size() == 1);
    std::error_code ec;
    const boost::json::value back = parse_json(o.calls[0].arguments, ec);
    REQUIRE_FALSE(ec);
    CHECK(back == parse_json(json_object(fits), ec));

    const Pairs deep = {{"v", nested(kMaxJsonDepth)}};
    const std::string bad = call_text(ToolCallFormat::kGlm45, "f", deep);
    const std::string good = call_text(ToolCallFormat::kGlm45, "g", {{"a", "3"}});
    const Outcome refused = run(ToolCallFormat::kGlm45, {bad + good});
    CHECK(refused.malformed);
    CHECK(refused.content == bad);
    REQUIRE(refused.calls.size() == 1);
    CHECK(refused.calls[0].name == "g");
    auto parser = create_tool_call_parser(ToolCallFormat::kGlm45, "call_", {});
    static_cast<void>(parser->feed(bad));
    static_cast<void>(parser->finish());
    CHECK(parser->completed_calls() == 0);
    CHECK_MESSAGE(parser->malformed_reason().find("\"v\" nests more than " +
                                                  std::to_string(kMaxJsonDepth - 1)) !=
                      std::string::npos,
                  parser->malformed_reason());
    // A value declared a string is text, however it looks.
    const std::vector<ToolSpec> tools = {
        {"f", "", R"({"type": "object", "properties": {"v": {"type": "string"}}})"}};
    const Outcome text = run(ToolCallFormat::kGlm45, {bad}, tools);
    REQUIRE(text.calls.size() == 1);
    const boost::json::value as_text = parse_json(text.calls[0].arguments, ec);
    REQUIRE(as_text.is_object());
    CHECK(as_text.as_object().at("v") == boost::json::value(nested(kMaxJsonDepth)));
}

TEST_CASE("tool calls: arguments nest as deep as the server reads back, in every format") {
    // Hermes wraps the arguments in its call object: its stream counted that level, so arguments
    // JsonPrefix wrote kMaxJsonDepth deep (as the server reads back) were given up as malformed.
    const auto nested = [](size_t arrays) {
        return std::string(arrays, '[') + "1" + std::string(arrays, ']');
    };
    for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kKimiK2,
                                  ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31}) {
        CAPTURE(std::string(tool_call_format_name(format)));
        const Pairs deepest = {{"v", nested(kMaxJsonDepth - 1)}};  // The arguments: 64 deep.
        const Outcome o = check_all_splits(format, call_text(format, "f", deepest));
        CHECK_FALSE(o.malformed);
        REQUIRE(o.calls.size() == 1);
        std::error_code ec;  // parse_json reads as deep as the server does (Boost's default: 32).
        const boost::json::value back = parse_json(o.calls[0].arguments, ec);
        REQUIRE_FALSE(ec);
        CHECK(back == parse_json(json_object(deepest), ec));
        const Pairs deeper = {{"v", nested(kMaxJsonDepth)}};
        CHECK(run(format, {call_text(format, "f", deeper)}).malformed);
    }
}

TEST_CASE("tool calls: format names") {
    CHECK(*tool_call_format_from_name("qwen3") == ToolCallFormat::kHermes);
    CHECK(*tool_call_format_from_name("glm4_5") == ToolCallFormat::kGlm45);
    CHECK(*tool_call_format_from_name("kimi_k2") == ToolCallFormat::kKimiK2);
    CHECK(*tool_call_format_from_name("deepseek_v3") == ToolCallFormat::kDeepSeekV3);
    CHECK_FALSE(tool_call_format_from_name("xml").ok());
    CHECK(tool_call_format_name(ToolCallFormat::kKimiK2) == "kimi_k2");
    CHECK(tool_call_format_name(ToolCallFormat::kDeepSeekV3) == "deepseek_v3");
}

}  // namespace
}  // namespace edge::engine::chat
