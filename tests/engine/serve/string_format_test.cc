// StringFormat under JsonPrefix (a schema's string `format`): valid values of each format are
// taken byte by byte, the closing quote only where a whole value is written; invalid ones are
// refused at the byte that rules them out; random walks never reach a dead end, and what they
// write is valid by checkers written here from the formats' specifications (std::chrono's
// calendar, inet_pton, Ajv's regular expressions), maxLength kept. And how `format` compiles:
// beside enum, lengths, $ref, without a type.

#include "engine/sampling/string_format.h"

#include <arpa/inet.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "engine/sampling/json_prefix.h"
#include "engine/sampling/json_schema.h"
#include "tests/engine/serve/json_walk.h"

namespace edge::engine::sampling {
namespace {

namespace json = boost::json;

// {"v": a string of `format`}, with `extra` keywords beside it.
std::shared_ptr<const JsonSchema> formatted(const std::string& format,
                                            const std::string& extra = "") {
    auto s = JsonSchema::compile(
        json::parse(R"({"type":"object","properties":{"v":{"type":"string","format":")" + format +
                    "\"" + extra + R"(}},"required":["v"],"additionalProperties":false})"));
    REQUIRE_MESSAGE(s.ok(), s.status().to_string());
    return *s;
}

const std::string kOpen = R"({"v":")";

// --- Checkers from the specifications, independent of string_format.cc. ---

bool full_match(const std::string& text, const char* pattern) {
    return std::regex_match(text, std::regex(pattern, std::regex::ECMAScript | std::regex::icase));
}

bool valid_date(const std::string& text) {
    std::smatch m;
    static const std::regex kDate(R"(^(\d{4})-(\d{2})-(\d{2})$)");
    if (!std::regex_match(text, m, kDate)) {
        return false;
    }
    const std::chrono::year_month_day ymd{std::chrono::year(std::stoi(m[1])),
                                          std::chrono::month(std::stoul(m[2])),
                                          std::chrono::day(std::stoul(m[3]))};
    return ymd.ok();
}

bool valid_time(const std::string& text) {
    std::smatch m;
    static const std::regex kTime(R"(^(\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-](\d\d):(\d\d))$)",
                                  std::regex::ECMAScript | std::regex::icase);
    if (!std::regex_match(text, m, kTime)) {
        return false;
    }
    const bool offset_ok = !m[6].matched || (std::stoi(m[6]) <= 23 && std::stoi(m[7]) <= 59);
    return std::stoi(m[1]) <= 23 && std::stoi(m[2]) <= 59 && std::stoi(m[3]) <= 60 && offset_ok;
}

bool valid_value(StringFormat format, const std::string& text) {
    unsigned char address[16];
    switch (format) {
        case StringFormat::kDate:
            return valid_date(text);
        case StringFormat::kTime:
            return valid_time(text);
        case StringFormat::kDateTime: {
            const size_t t = text.find_first_of("Tt");
            return t != std::string::npos && valid_date(text.substr(0, t)) &&
                   valid_time(text.substr(t + 1));
        }
        case StringFormat::kUuid:
            return full_match(text, "^[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}$");
        case StringFormat::kIpv4:
            return inet_pton(AF_INET, text.c_str(), address) == 1;
        case StringFormat::kIpv6:
            return inet_pton(AF_INET6, text.c_str(), address) == 1 &&
                   text.find('.') == std::string::npos;
        case StringFormat::kDuration:
            return full_match(
                text, R"(^P(?!$)((\d+Y)?(\d+M)?(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+S)?)?|(\d+W)?)$)");
        case StringFormat::kHostname:
            return text.size() <= 253 &&
                   full_match(
                       text,
                       R"(^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$)");
        case StringFormat::kEmail: {
            const size_t at = text.find('@');
            if (at == std::string::npos || at > 64 || text.size() > 254) {
                return false;
            }
            const std::string local = text.substr(0, at);
            const std::string domain = text.substr(at + 1);
            return full_match(
                       local,
                       R"(^[a-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*$)") &&
                   domain.find('.') != std::string::npos &&
                   valid_value(StringFormat::kHostname, domain);
        }
        case StringFormat::kNone:
            break;
    }
    return true;
}

struct Case {
    const char* name;
    StringFormat format;
    std::vector<std::string> valid;
    // An invalid value and the byte of it that is refused.
    std::vector<std::pair<std::string, size_t>> invalid;
    // Values a validator takes that are not written (string_format.h), and where refused.
    std::vector<std::pair<std::string, size_t>> narrowed = {};
};

const std::vector<Case>& cases() {
    static const std::vector<Case> kCases = {
        {"date",
         StringFormat::kDate,
         {"2026-12-05", "0001-01-01", "2024-02-29", "2000-02-29", "1999-12-31", "2026-04-30"},
         {{"next tuesday", 0},
          {"2026-13-01", 6},
          {"2026-00-01", 6},
          {"2026-12-32", 9},
          {"2026-12-00", 9},
          {"2026-04-31", 9},
          {"2026-02-30", 8},
          {"2026-02-29", 9},
          {"1900-02-29", 9},
          {"26-12-05", 2},
          {"2026/12/05", 4},
          {"2026-1-5", 6},
          {"2026-12-05T", 10},
          {"2026-12-\\u0030", 8}},
         // RFC 3339 has a year 0000; Python's date does not (string_format.h).
         {{"0000-01-01", 3}}},
        {"time",
         StringFormat::kTime,
         {"00:00:00Z", "23:59:59Z", "12:30:00.5+01:00", "08:15:42.123456789-23:59",
          "10:00:00+00:00"},
         {{"24:00:00Z", 1},
          {"12:60:00Z", 3},
          {"12:00:00", 8},
          {"12:00:00.Z", 9},
          {"12:00:00+24:00", 10},
          {"12:00:00+01", 11},
          {"12:00:00+0100", 11},
          {"12:00:00Z1", 9},
          {"1:00:00Z", 1}},
         {{"12:00:60Z", 6}, {"12:00:00.1234567890Z", 18}, {"12:00:00z", 8}}},
        {"date-time",
         StringFormat::kDateTime,
         {"2026-12-05T10:00:00Z", "2024-02-29T23:59:59.999+05:30"},
         {{"2026-12-05 10:00:00Z", 10}, {"2026-12-05T10:00Z", 16}, {"2026-12-05", 10}},
         {{"2026-12-05t10:00:00Z", 10}, {"0000-12-05T10:00:00Z", 3}}},
        {"uuid",
         StringFormat::kUuid,
         {"123e4567-e89b-12d3-a456-426614174000", "00000000-0000-0000-0000-000000000000",
          "ABCDEF01-2345-6789-ABCD-EF0123456789"},
         {{"123e4567e89b12d3a456426614174000", 8},
          {"123e4567-e89b-12d3-a456-42661417400g", 35},
          {"123e4567-e89b-12d3-a456-4266141740000", 36},
          {"{123e4567-e89b-12d3-a456-426614174000}", 0}}},
        {"ipv4",
         StringFormat::kIpv4,
         {"0.0.0.0", "255.255.255.255", "192.168.1.10", "10.0.100.9"},
         {{"256.0.0.1", 2},
          {"01.2.3.4", 1},
          {"1.2.3", 5},
          {"1.2.3.4.5", 7},
          {"1..2.3", 2},
          {"1.2.3.1000", 9},
          {".1.2.3", 0}}},
        {"duration",
         StringFormat::kDuration,
         {"P1D", "P1Y", "P1Y2M3D", "P2M3DT4H", "PT1H", "PT10M5S", "P3W", "P1DT2H3M4S", "PT0S"},
         {{"P", 1},
          {"PT", 2},
          {"1D", 0},
          {"P1D2M", 3},
          {"P1W2D", 3},
          {"P1DT", 4},
          {"PD", 1},
          {"P1.5D", 2}},
         {{"P1Y2D", 4}, {"PT1H2S", 5}, {"P1234567890D", 10}}},
        {"email",
         StringFormat::kEmail,
         {"a@b.co", "first.last+tag@example.com", "x_y%z-w@mail.example.org", "a@b.c"},
         {{"a@b", 3},
          {"@b.co", 0},
          {".a@b.co", 0},
          {"a..b@c.d", 2},
          {"a.@b.co", 2},
          {"a@-b.co", 2},
          {"a@b-.co", 4},
          {"a@b..co", 4},
          {"a@b.co.", 7},
          {"a b@c.d", 1},
          {"a@b@c.d", 3},
          {"\"a\"@b.co", 0}}},
        {"hostname",
         StringFormat::kHostname,
         {"localhost", "example.com", "a-b.c-d.e", "1.2.3.4", "xn--bcher-kva.example"},
         {{"-a.com", 0},
          {"a-.com", 2},
          {"a..com", 2},
          {"a.com.", 6},
          {"a_b.com", 1},
          {std::string(64, 'a'), 63},
          {"", 0}}},
        {"ipv6",
         StringFormat::kIpv6,
         {"::", "::1", "1::", "2001:db8::8a2e:370:7334", "fe80:0:0:0:0:0:0:1",
          "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "ABCD:ef01::"},
         {{":1", 1},
          {":::", 2},
          {"1::2::3", 5},
          {"1:2:3:4:5:6:7:8:9", 15},
          {"1:2:3:4:5:6:7:8::", 15},
          {"12345::", 4},
          {"1:2:3:4:5:6:7", 13},
          {"1::2:3:4:5:6:7:8", 14},
          {"::ffff:1.2.3.4", 8},
          {"g::", 0}}},
    };
    return kCases;
}

TEST_CASE("string format: valid values are taken, the closing quote only where one is whole") {
    for (const Case& c : cases()) {
        CAPTURE(c.name);
        CHECK(string_format(c.name) == c.format);
        const auto schema = formatted(c.name);
        for (const std::string& value : c.valid) {
            CAPTURE(value);
            REQUIRE(valid_value(c.format, value));
            JsonPrefix p(*schema);
            REQUIRE(p.feed(kOpen));
            for (size_t i = 0; i < value.size(); ++i) {
                // The quote exactly where the characters so far are a value themselves.
                CHECK(p.accepts("\"") == valid_value(c.format, value.substr(0, i)));
                REQUIRE(p.feed(value.substr(i, 1)));
            }
            CHECK(p.feed("\"}"));
            CHECK(p.complete());
            CHECK(format_matches(c.format, value, INT64_MAX));
        }
    }
}

TEST_CASE("string format: invalid values are refused at the byte that rules them out") {
    for (const Case& c : cases()) {
        CAPTURE(c.name);
        const auto schema = formatted(c.name);
        std::vector<std::pair<std::string, size_t>> refused = c.invalid;
        refused.insert(refused.end(), c.narrowed.begin(), c.narrowed.end());
        for (const auto& [value, at] : refused) {
            CAPTURE(value);
            const bool narrowed = std::find(c.narrowed.begin(), c.narrowed.end(),
                                            std::make_pair(value, at)) != c.narrowed.end();
            CHECK(valid_value(c.format, value) == narrowed);
            CHECK_FALSE(format_matches(c.format, value, INT64_MAX));
            JsonPrefix p(*schema);
            REQUIRE(p.feed(kOpen));
            // With its closing quote: a value cut short is refused there.
            const std::string text = value + "\"";
            size_t stop = text.size();
            for (size_t i = 0; i < text.size(); ++i) {
                if (!p.feed(text.substr(i, 1))) {
                    stop = i;
                    break;
                }
            }
            CHECK(stop == at);
        }
    }
}

TEST_CASE("string format: random walks never reach a dead end and write valid values") {
    std::mt19937 rng(20261205);
    for (const Case& c : cases()) {
        // maxLength where a format's values may be longer: email and hostname keep to it.
        for (const std::string& extra : {std::string(), std::string(R"(,"maxLength":9)")}) {
            const bool bounded = !extra.empty();
            if (bounded && c.format != StringFormat::kEmail &&
                c.format != StringFormat::kHostname) {
                continue;
            }
            CAPTURE(c.name);
            CAPTURE(extra);
            const auto schema = formatted(c.name, extra);
            JsonPrefix start(*schema);
            REQUIRE(start.feed(kOpen));
            int completed = 0;
            for (int walk = 0; walk < 300; ++walk) {
                const std::optional<std::string> out = random_walk(start, rng);
                REQUIRE(out);
                ++completed;
                const json::value doc = json::parse(kOpen + *out);
                const std::string value(doc.at("v").get_string());
                CAPTURE(value);
                CHECK(valid_value(c.format, value));
                CHECK(value.size() <= (bounded ? 9 : 254));
            }
            CHECK(completed == 300);
        }
    }
}

TEST_CASE("string format: how format compiles beside other keywords") {
    auto error_of = [](const std::string& schema) {
        auto s = JsonSchema::compile(json::parse(schema));
        REQUIRE_FALSE(s.ok());
        return s.status().message();
    };
    auto wrap = [](const std::string& v) {
        return R"({"type":"object","properties":{"v":)" + v + R"(},"required":["v"]})";
    };
    // Beside enum: only the values that are the format's are kept; none is an error.
    const auto schema = JsonSchema::compile(json::parse(wrap(
        R"({"type":"string","format":"date","enum":["2026-12-05","tomorrow","2026-02-30"]})")));
    REQUIRE(schema.ok());
    JsonPrefix p(**schema);
    CHECK(p.feed(R"({"v":"2026-12-05"})"));
    CHECK_FALSE(JsonPrefix(**schema).feed(R"({"v":"t)"));
    CHECK_FALSE(JsonPrefix(**schema).feed(R"({"v":"2026-02-)"));
    CHECK(error_of(wrap(R"({"type":"string","format":"uuid","enum":["x"]})"))
              .find("no value of 'enum'/'const' is valid") != std::string::npos);
    // Lengths that would cut values short, or ask for longer ones, are refused, naming both.
    const std::string short_date =
        error_of(wrap(R"({"type":"string","format":"date","maxLength":9})"));
    CHECK(short_date.find("#/properties/v") != std::string::npos);
    CHECK(short_date.find("'format' 'date'") != std::string::npos);
    CHECK(short_date.find("maxLength at least 10") != std::string::npos);
    CHECK(error_of(wrap(R"({"type":"string","format":"ipv4","minLength":8})"))
              .find("minLength at most 7") != std::string::npos);
    CHECK(error_of(wrap(R"({"type":"string","format":"email","maxLength":4})"))
              .find("maxLength at least 5") != std::string::npos);
    CHECK(
        JsonSchema::compile(
            json::parse(wrap(R"({"type":"string","format":"date","maxLength":10,"minLength":10})")))
            .ok());
    CHECK(error_of(wrap(R"({"type":"string","format":7})")).find("'format' must be a string") !=
          std::string::npos);
    // An enforced format beside $ref would be ignored there: refused.
    CHECK(error_of(R"({"$defs":{"s":{"type":"string"}},"type":"object","properties":{"v":)"
                   R"({"$ref":"#/$defs/s","format":"date"}}})")
              .find("'format' beside '$ref'") != std::string::npos);
    // Without a type, a format means a string; an unknown format is an annotation.
    const auto untyped = JsonSchema::compile(json::parse(wrap(R"({"format":"ipv4"})")));
    REQUIRE(untyped.ok());
    CHECK_FALSE(JsonPrefix(**untyped).feed(R"({"v":1)"));
    CHECK_FALSE(JsonPrefix(**untyped).feed(R"({"v":"x)"));
    CHECK(JsonPrefix(**untyped).feed(R"({"v":"1.2.3.4"})"));
    const auto unknown =
        JsonSchema::compile(json::parse(wrap(R"({"type":"string","format":"color"})")));
    REQUIRE(unknown.ok());
    CHECK(JsonPrefix(**unknown).feed(R"({"v":"red \"ish\""})"));
    // On other types a format is an annotation; on a string it holds.
    const auto nullable =
        JsonSchema::compile(json::parse(wrap(R"({"type":["string","null"],"format":"date"})")));
    REQUIRE(nullable.ok());
    CHECK(JsonPrefix(**nullable).feed(R"({"v":null})"));
    CHECK_FALSE(JsonPrefix(**nullable).feed(R"({"v":"x)"));
}

}  // namespace
}  // namespace edge::engine::sampling
