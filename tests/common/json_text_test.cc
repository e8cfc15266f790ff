#include "common/json_text.h"

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cmath>
#include <limits>
#include <system_error>

namespace edge {
namespace {

std::string python_text(const boost::json::value& v) {
    std::string out;
    append_json(v, JsonStyle::kPython, &out);
    return out;
}

TEST_CASE("json text: numbers as Python's json.dumps writes them") {
    // Expected: python3 -c 'import json; print(json.dumps(v, ensure_ascii=False))'.
    const auto v = boost::json::parse(
        R"({"a": 0.5, "b": 1.0, "c": 1e20, "d": 1e-5, "e": 123.456, "f": 1e16, "g": 1e15,)"
        R"( "h": -0.0, "i": 3, "j": 0.0001, "k": 1.5e-7, "l": 2.5e300, "m": 0.30000000000000004,)"
        R"( "n": [-2.5, -1e-10], "s": "é\n"})");
    CHECK(python_text(v) ==
          R"({"a": 0.5, "b": 1.0, "c": 1e+20, "d": 1e-05, "e": 123.456, "f": 1e+16, )"
          R"("g": 1000000000000000.0, "h": -0.0, "i": 3, "j": 0.0001, "k": 1.5e-07, )"
          R"("l": 2.5e+300, "m": 0.30000000000000004, "n": [-2.5, -1e-10], "s": "é\n"})");
}

TEST_CASE("json text: the compact form has no spaces, and what it writes parses back equal") {
    const auto v = boost::json::parse(
        R"({"logprob": -0.25, "ids": [1, 18446744073709551615, -9223372036854775808],)"
        R"( "x": {"t": true, "f": false, "n": null, "e": []}, "big": 1.7976931348623157e308,)"
        R"( "tiny": 5e-324, "s": "q\"b\\s\u0001\t\u001f\u007fé😀"})");
    const std::string text = json_text(v);
    CHECK(text ==
          "{\"logprob\":-0.25,\"ids\":[1,18446744073709551615,-9223372036854775808],"
          "\"x\":{\"t\":true,\"f\":false,\"n\":null,\"e\":[]},\"big\":1.7976931348623157e+308,"
          "\"tiny\":5e-324,\"s\":\"q\\\"b\\\\s\\u0001\\t\\u001f\x7f"
          "é😀\"}");
    CHECK(boost::json::parse(text) == v);
    CHECK(json_text(boost::json::value(1.0)) == "1.0");
    CHECK(json_text(boost::json::object{}) == "{}");
}

TEST_CASE("json text: NaN and infinities are null on the wire and spelled as Python otherwise") {
    boost::json::array a{std::numeric_limits<double>::quiet_NaN(),
                         std::numeric_limits<double>::infinity(),
                         -std::numeric_limits<double>::infinity()};
    CHECK(json_text(a) == "[null,null,null]");
    CHECK(python_text(a) == "[NaN, Infinity, -Infinity]");
}

TEST_CASE("json text: a JSON object read for a named file, or a status saying where it is not") {
    auto ok = parse_json_object(R"({"a": [1, 2]})", "f.json");
    REQUIRE(ok.ok());
    CHECK(ok->at("a").as_array().size() == 2);
    auto bad = parse_json_object("{\n  \"a\": 1,,\n}", "f.json", StatusCode::kDataLoss);
    CHECK(bad.status().code() == StatusCode::kDataLoss);
    CHECK(bad.status().message() == "f.json: not valid JSON at line 2, column 10: syntax error");
    auto array = parse_json_object("[1]", "f.json");
    CHECK(array.status().code() == StatusCode::kInvalidArgument);
    CHECK(array.status().message() == "f.json: not a JSON object");
    // No name: the caller adds its own context.
    CHECK(parse_json_object("7", "").status().message() == "not a JSON object");
    const std::string deep = std::string(kMaxJsonDepth + 1, '[');
    CHECK(parse_json_object(deep, "d").status().message().find(
              "(more than 64 nested arrays and objects)") != std::string::npos);
}

TEST_CASE("json text: decimals read as the nearest double, as a C++ literal or Python reads them") {
    // Boost 1.81's own parser reads the first two one unit in the last place off
    // (1.3806489999999998e-23, 2.5000000000000003e-25).
    std::error_code ec;
    const boost::json::value v = parse_json(
        R"([1.380649e-23, 2.5e-25, 123456789012345678901234567890, -0.0, 1e99999, -1e99999,)"
        R"( 1e-400, 9007199254740993, 18446744073709551616, 0.1, 5e-324, 1E5])",
        ec);
    REQUIRE_FALSE(ec);
    const boost::json::array& a = v.as_array();
    REQUIRE(a.size() == 12);
    CHECK(a[0].as_double() == 1.380649e-23);
    CHECK(a[1].as_double() == 2.5e-25);
    CHECK(a[2].as_double() == 123456789012345678901234567890.0);
    CHECK(a[3].as_double() == 0.0);
    CHECK(std::signbit(a[3].as_double()));
    // Past a double's range: infinite, or zero, as before.
    CHECK(a[4].as_double() == std::numeric_limits<double>::infinity());
    CHECK(a[5].as_double() == -std::numeric_limits<double>::infinity());
    CHECK(a[6].as_double() == 0.0);
    CHECK(a[7].as_int64() == 9007199254740993);  // Integers stay integers.
    CHECK(a[8].as_double() == 18446744073709551616.0);
    CHECK(a[9].as_double() == 0.1);
    CHECK(a[10].as_double() == 5e-324);
    CHECK(a[11].as_double() == 1e5);
    CHECK(json_text(a[0]) == "1.380649e-23");
    // Every other event still builds the value Boost's parser builds.
    const std::string text =
        R"({"a": [true, false, null, "s\u00e9", {"k": []}], "b": -7, "c": 0.5, "a2": {}})";
    CHECK(parse_json(text, ec) == boost::json::parse(text));
    CHECK_FALSE(ec);
    parse_json("[1] x", ec);
    CHECK(ec == boost::json::error::extra_data);
    parse_json("[1.5", ec);
    CHECK(ec);
}

}  // namespace
}  // namespace edge
