// PropertyIndex, and JsonPrefix's keys of listed properties through it: against a reference
// that looks through every name for each byte (the way JsonPrefix matched keys before the
// index), over random objects whose names share prefixes, hold escapes and non-ASCII
// characters, whose properties are required or not and nest too deep to fit near the nesting
// limit, under each form of additionalProperties; and the free keys of objects without listed
// properties (a key again, in another escape, is refused) against a reference of their own.

#include "engine/sampling/property_index.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <boost/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/json_text.h"
#include "engine/sampling/json_prefix.h"
#include "engine/sampling/json_schema.h"

namespace edge::engine::sampling {
namespace {

namespace json = boost::json;

// A name's canonical bytes in a key (JsonSchema::Property::key).
std::string escaped(const std::string& name) {
    const std::string quoted = json::serialize(json::string_view(name));
    return quoted.substr(1, quoted.size() - 2);
}

TEST_CASE("property index: narrow, exact and any_between against a scan of the names") {
    const std::vector<std::string> keys = {"b", "ab", "a", "", "abc", "ac", "\xc3\xa9", "abd"};
    std::vector<std::string_view> views(keys.begin(), keys.end());
    const std::vector<int32_t> depths = {0, 3, 1, 0, 0, 2, 0, 0};
    const PropertyIndex index(views, depths);
    CHECK(index.size() == 8);
    CHECK(index.deepest() == 3);
    // "a", "ab", "abc", "abd", "ac" begin with 'a'; of them "a" is exactly the byte.
    const PropertyIndex::Range a = index.narrow(index.all(), 0, 'a');
    CHECK(a.end - a.begin == 5);
    CHECK(index.exact(a, 1) == 2);
    const PropertyIndex::Range ab = index.narrow(a, 1, 'b');
    CHECK(ab.end - ab.begin == 3);
    CHECK(index.exact(ab, 2) == 1);
    CHECK(index.narrow(ab, 2, 'e').empty());
    CHECK(index.exact(index.all(), 0) == 3);  // "".
    // A byte >= 0x80 sorts after ASCII.
    CHECK(index.narrow(index.all(), 0, 0xC3).end == index.size());
    // "ab" (1), "abc" (4), "abd" (7) by index window.
    CHECK(index.any_between(ab, 0, 1));
    CHECK_FALSE(index.any_between(ab, 1, 3));
    CHECK(index.any_between(ab, 1, 4));
    CHECK(index.any_between(ab, 6, 7));
    CHECK_FALSE(index.any_between(ab, 7, 7));
    CHECK(PropertyIndex().all().empty());
}

TEST_CASE("property index: any_between over many names is a scan's answer") {
    std::mt19937 rng(20261206);
    for (int round = 0; round < 40; ++round) {
        const size_t n = 1 + rng() % 700;
        std::vector<std::string> keys;
        for (size_t i = 0; i < n; ++i) {
            keys.push_back(std::to_string(rng() % 100000) + "_" + std::to_string(i));
        }
        std::vector<std::string_view> views(keys.begin(), keys.end());
        const PropertyIndex index(views, std::vector<int32_t>(n, 0));
        for (int q = 0; q < 200; ++q) {
            const auto begin = static_cast<int32_t>(rng() % n);
            const auto end = begin + static_cast<int32_t>(rng() % (n - begin + 1));
            const auto after = static_cast<int32_t>(rng() % (n + 1)) - 1;
            const auto last = after + static_cast<int32_t>(rng() % (n - after));
            bool scan = false;
            for (int32_t at = begin; at < end; ++at) {
                scan = scan || (index.property(at) > after && index.property(at) <= last);
            }
            CAPTURE(n);
            CAPTURE(begin);
            CAPTURE(end);
            CAPTURE(after);
            CAPTURE(last);
            REQUIRE(index.any_between({begin, end}, after, last) == scan);
        }
    }
}

// A listed object under test: its names (escaped), required flags and each value's nesting
// (0: an integer; k: k objects one inside another, each requiring the next).
struct Listed {
    std::vector<std::string> keys;
    std::vector<bool> required;
    std::vector<int> nesting;

    // The first required property at index >= i (size(): none).
    int next_required(int i) const {
        for (int j = i; j < static_cast<int>(keys.size()); ++j) {
            if (required[static_cast<size_t>(j)]) {
                return j;
            }
        }
        return static_cast<int>(keys.size());
    }
    // The properties a key may be after property `count`, at `depth` containers open: in
    // order, none past a required one, and only those whose values fit.
    std::vector<int> candidates(int count, int depth) const {
        const int last = std::min(next_required(count + 1), static_cast<int>(keys.size()) - 1);
        std::vector<int> out;
        for (int j = count + 1; j <= last; ++j) {
            if (depth + nesting[static_cast<size_t>(j)] <= static_cast<int>(kMaxJsonDepth)) {
                out.push_back(j);
            }
        }
        return out;
    }
    // The reference: whether `text`, written where a key is due (it begins with the quote),
    // is taken, looking through every candidate's name for each byte.
    bool takes(int count, int depth, const std::string& text) const {
        const std::vector<int> from = candidates(count, depth);
        if (text.empty() || text[0] != '"' || from.empty()) {
            return text.empty();
        }
        for (size_t i = 1; i < text.size(); ++i) {
            const std::string so_far = text.substr(1, i - 1);
            const bool goes_on = std::any_of(from.begin(), from.end(), [&](int j) {
                const std::string& k = keys[static_cast<size_t>(j)];
                return k.size() > so_far.size() && k.compare(0, so_far.size(), so_far) == 0 &&
                       k[so_far.size()] == text[i];
            });
            if (goes_on) {
                continue;
            }
            const bool ends = text[i] == '"' && std::any_of(from.begin(), from.end(), [&](int j) {
                                  return keys[static_cast<size_t>(j)] == so_far;
                              });
            // Then a space at most on each side of the colon (no token holds a value's bytes).
            const std::string rest = text.substr(i + 1);
            return ends && (rest.empty() || rest == " " || rest == ":" || rest == " :" ||
                            rest == ": " || rest == " : ");
        }
        return true;
    }
};

// Pieces of names: shared prefixes, characters written escaped, multi-byte UTF-8.
const std::vector<std::string> kPieces = {"a",  "b",  "ab", "aa",   "A", "\xc3\xa9", "\xe6\x97\xa5",
                                          "\"", "\\", "\n", "\x01", "/", "\x7f"};
// Bytes a token may hold beside names' bytes: escapes of what names hold, a quote and colon.
const std::vector<std::string> kExtras = {"\\u0061", "\\u0041", "\\\"", "\\\\", "\\n",
                                          "\\u0001", "\\/",     "\"",   "\":",  ":",
                                          "c",       "\xc3",    " ",    "\\"};

std::string value_text(int nesting) {
    std::string v;
    for (int i = 0; i < nesting; ++i) {
        v += R"({"c":)";
    }
    v += "0";
    return v + std::string(static_cast<size_t>(nesting), '}');
}

// A random token to ask about where a key is due: a quote, then part of a name (perhaps past
// its end, perhaps closed) or random pieces.
std::string random_token(const Listed& o, std::mt19937& rng) {
    std::string t = "\"";
    if (!o.keys.empty() && rng() % 3 != 0) {
        const std::string& k = o.keys[rng() % o.keys.size()];
        t += k.substr(0, rng() % (k.size() + 1));
    }
    for (size_t i = rng() % 3; i > 0; --i) {
        const bool extra = rng() % 2 == 0;
        t += extra ? kExtras[rng() % kExtras.size()] : escaped(kPieces[rng() % kPieces.size()]);
    }
    return t;
}

TEST_CASE("json prefix: keys of listed properties are taken as a scan of every name takes them") {
    std::mt19937 rng(20261205);
    size_t asked = 0;
    size_t taken = 0;
    for (int round = 0; round < 300; ++round) {
        CAPTURE(round);
        // The object under test: names from pieces (distinct), some required (their values
        // integers, so the object always fits), others' values nesting up to 8 deep.
        Listed o;
        json::object props;
        const size_t n = round % 10 == 0 ? 200 + rng() % 300 : 1 + rng() % 40;
        std::vector<std::string> names;
        for (size_t i = 0; i < n; ++i) {
            std::string name;
            for (size_t p = rng() % 5; p > 0; --p) {
                name += kPieces[rng() % kPieces.size()];
            }
            if (std::find(names.begin(), names.end(), name) == names.end()) {
                names.push_back(name);
            }
        }
        json::array required;
        for (const std::string& name : names) {
            const bool req = rng() % 6 == 0;
            const int nesting = req || rng() % 2 == 0 ? 0 : 1 + static_cast<int>(rng() % 8);
            o.keys.push_back(escaped(name));
            o.required.push_back(req);
            o.nesting.push_back(nesting);
            props[name] = nesting == 0
                              ? json::value{{"type", "integer"}}
                              : json::value{{"$ref", "#/$defs/C" + std::to_string(nesting)}};
            if (req) {
                required.emplace_back(name);
            }
        }
        json::object tested{{"type", "object"}, {"properties", props}, {"required", required}};
        switch (rng() % 4) {
            case 0:
                break;
            case 1:
                tested["additionalProperties"] = true;
                break;
            case 2:
                tested["additionalProperties"] = false;
                break;
            default:
                tested["additionalProperties"] = json::object{{"type", "string"}};
        }
        // C<k>: k objects one inside another; the root: "w" is the root again, "t" the object.
        json::object defs{{"T", tested}};
        for (int k = 1; k <= 8; ++k) {
            const json::value inner =
                k == 1 ? json::value{{"type", "integer"}}
                       : json::value{{"$ref", "#/$defs/C" + std::to_string(k - 1)}};
            defs["C" + std::to_string(k)] = json::object{
                {"type", "object"}, {"properties", {{"c", inner}}}, {"required", {"c"}}};
        }
        const json::value schema =
            json::object{{"type", "object"},
                         {"$defs", defs},
                         {"properties", {{"w", {{"$ref", "#"}}}, {"t", {{"$ref", "#/$defs/T"}}}}}};
        auto compiled = JsonSchema::compile(schema);
        REQUIRE_MESSAGE(compiled.ok(), compiled.status().to_string());
        // The object under test opens at depth 2, 3, or near the limit.
        static constexpr int kWrappers[] = {0, 1, 50, 55, 57, 59, 61};
        const int wrappers = kWrappers[rng() % std::size(kWrappers)];
        const int depth = wrappers + 2;
        std::string text;
        for (int i = 0; i < wrappers; ++i) {
            text += R"({"w":)";
        }
        text += R"({"t":{)";
        JsonPrefix prefix(**compiled);
        REQUIRE(prefix.feed(text));
        // Properties written one after another, each key asked about before it is written.
        for (int count = -1;;) {
            for (int q = 0; q < 60; ++q) {
                const std::string token = random_token(o, rng);
                CAPTURE(text);
                CAPTURE(token);
                const bool expected = o.takes(count, depth, token);
                REQUIRE(prefix.accepts(token) == expected);
                // The same bytes in two feeds: the key's state kept between them.
                const size_t cut = rng() % (token.size() + 1);
                JsonPrefix split = prefix;
                if (split.feed(token.substr(0, cut))) {
                    REQUIRE(split.accepts(token.substr(cut)) == expected);
                } else {
                    REQUIRE_FALSE(expected);
                }
                ++asked;
                taken += expected ? 1 : 0;
            }
            const std::vector<int> from = o.candidates(count, depth);
            if (from.empty()) {  // Right after '{': no property fits (none is required).
                REQUIRE(prefix.feed("}"));
                break;
            }
            count = from[rng() % from.size()];
            const std::string key = "\"" + o.keys[static_cast<size_t>(count)] + "\":";
            const std::string value = value_text(o.nesting[static_cast<size_t>(count)]);
            REQUIRE(prefix.feed(key + value));
            text += key + value;
            const bool closable = o.next_required(count + 1) == static_cast<int>(o.keys.size());
            if (o.candidates(count, depth).empty() || (closable && rng() % 4 == 0)) {
                REQUIRE(closable);
                REQUIRE(prefix.feed("}"));
                break;
            }
            REQUIRE(prefix.feed(","));
            text += ",";
        }
    }
    // Both answers came up often.
    CHECK(taken > asked / 10);
    CHECK(asked - taken > asked / 10);
}

TEST_CASE("json prefix: free keys are taken once each, compared as the text they decode to") {
    // Names from "a", "b", "é", each written raw or as an escape; additionalProperties true or a
    // schema (the keys' rule is the same).
    const std::vector<std::vector<std::string>> forms = {
        {"a", "\\u0061"}, {"b", "\\u0062"}, {"\xc3\xa9", "\\u00e9", "\\u00E9"}};
    std::mt19937 rng(20261207);
    for (int round = 0; round < 200; ++round) {
        CAPTURE(round);
        json::object o{{"type", "object"}};
        if (rng() % 2 == 0) {
            o["additionalProperties"] = json::object{{"type", "integer"}};
        }
        auto compiled = JsonSchema::compile(o);
        REQUIRE(compiled.ok());
        JsonPrefix prefix(**compiled);
        REQUIRE(prefix.feed("{"));
        std::vector<std::string> written;  // Decoded.
        for (int keys = 0; keys < 6; ++keys) {
            std::string raw;
            std::string decoded;
            for (size_t len = rng() % 3; len > 0; --len) {
                const size_t c = rng() % forms.size();
                raw += forms[c][rng() % forms[c].size()];
                decoded += forms[c][0];
            }
            const bool again = std::find(written.begin(), written.end(), decoded) != written.end();
            CAPTURE(raw);
            CHECK(prefix.accepts("\"" + raw));
            CHECK(prefix.accepts("\"" + raw + "\":") == !again);
            if (!again) {
                REQUIRE(prefix.feed("\"" + raw + "\":1,"));
                written.push_back(decoded);
            }
        }
    }
}

}  // namespace
}  // namespace edge::engine::sampling
