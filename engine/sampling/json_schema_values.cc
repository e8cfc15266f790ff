// The values of enum and const held to the keywords beside them: their canonical JSON text (the
// one spelling JsonPrefix lets a model write) and ValueMatcher, which tells whether a value is
// valid under a node compiled so far (json_schema_internal.h).

#include <algorithm>
#include <array>
#include <boost/json.hpp>
#include <charconv>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling/json_schema_internal.h"
#include "engine/sampling/string_format.h"

namespace edge::engine::sampling {

namespace json = boost::json;

namespace {

// JSON Schema's type name of a value ("integer" for integral numbers).
bool has_type(const json::value& v, std::string_view type) {
    switch (v.kind()) {
        case json::kind::null:
            return type == "null";
        case json::kind::bool_:
            return type == "boolean";
        case json::kind::int64:
        case json::kind::uint64:
            return type == "integer" || type == "number";
        case json::kind::double_:
            return type == "number" ||
                   (type == "integer" && std::floor(v.get_double()) == v.get_double());
        case json::kind::string:
            return type == "string";
        case json::kind::array:
            return type == "array";
        case json::kind::object:
            return type == "object";
    }
    return false;
}

// A number as write_canonical() writes it.
void write_number(const json::value& v, Numbers numbers, std::string* out) {
    if (numbers != Numbers::kDoubles && v.is_int64()) {
        *out += std::to_string(v.get_int64());
        return;
    }
    if (numbers != Numbers::kDoubles && v.is_uint64()) {
        *out += std::to_string(v.get_uint64());
        return;
    }
    double d = v.to_number<double>();
    // Doubles and integers are one value where the double is whole: 1e19 and
    // 10000000000000000000 (a uint64), -0.0 and 0. A double of this range converts exactly.
    if (numbers == Numbers::kExact && std::trunc(d) == d && d >= -0x1p63 && d < 0x1p64) {
        *out += d < 0x1p63 ? std::to_string(static_cast<int64_t>(d))
                           : std::to_string(static_cast<uint64_t>(d));
        return;
    }
    if (numbers != Numbers::kShortest && d == 0) {
        d = 0;  // -0 is 0.
    }
    // Boost.JSON reads a number past a double's range (1e99999) as infinite; to_chars would
    // write "inf", which is no JSON. 1e999 reads back as the same infinity.
    if (std::isinf(d)) {
        *out += d < 0 ? "-1e999" : "1e999";
        return;
    }
    std::array<char, 32> buf{};
    const auto r = std::to_chars(buf.data(), buf.data() + buf.size(), d);
    *out += std::string_view(buf.data(), static_cast<size_t>(r.ptr - buf.data()));
}

}  // namespace

std::string value_key(const json::value& v, Numbers numbers) {
    std::string key;
    write_canonical(v, &key, SIZE_MAX, numbers);
    return key;
}

void write_canonical(const json::value& v, std::string* out, size_t cap, Numbers numbers) {
    if (out->size() > cap) {
        return;
    }
    switch (v.kind()) {
        case json::kind::null:
            *out += "null";
            return;
        case json::kind::bool_:
            *out += v.get_bool() ? "true" : "false";
            return;
        case json::kind::int64:
        case json::kind::uint64:
        case json::kind::double_:
            write_number(v, numbers, out);
            return;
        case json::kind::string:
            // Escaped and quoted, the text is no shorter than the string (out->size() <= cap
            // here).
            if (v.get_string().size() > cap - out->size()) {
                out->resize(cap + 1);
                return;
            }
            *out += json::serialize(v.get_string());
            return;
        case json::kind::array: {
            *out += '[';
            bool first = true;
            for (const json::value& e : v.get_array()) {
                if (out->size() > cap) {
                    return;
                }
                if (!first) {
                    *out += ',';
                }
                first = false;
                write_canonical(e, out, cap, numbers);
            }
            *out += ']';
            return;
        }
        case json::kind::object: {
            // The model writes members in their order (kShortest); values are equal in any
            // order, so texts that compare them take members sorted by key.
            const json::object& o = v.get_object();
            std::vector<const json::key_value_pair*> sorted;
            if (numbers != Numbers::kShortest) {
                for (const json::key_value_pair& m : o) {
                    sorted.push_back(&m);
                }
                std::sort(sorted.begin(), sorted.end(),
                          [](const json::key_value_pair* a, const json::key_value_pair* b) {
                              return a->key() < b->key();
                          });
            }
            *out += '{';
            for (size_t i = 0; i < o.size(); ++i) {
                const json::key_value_pair* m = sorted.empty() ? &o.begin()[i] : sorted[i];
                if (out->size() > cap) {
                    return;
                }
                if (i > 0) {
                    *out += ',';
                }
                if (m->key().size() > cap - std::min(cap, out->size())) {
                    out->resize(cap + 1);
                    return;
                }
                *out += json::serialize(m->key());
                *out += ':';
                write_canonical(m->value(), out, cap, numbers);
            }
            *out += '}';
            return;
        }
    }
}

std::unordered_map<std::string_view, const JsonSchema::Property*> by_key(
    const JsonSchema::Node& n) {
    std::unordered_map<std::string_view, const JsonSchema::Property*> out;
    for (const JsonSchema::Property& p : n.properties) {
        out.emplace(p.key, &p);
    }
    return out;
}

bool ValueMatcher::matches(const json::value& v, int32_t node, int depth) {
    if (depth == 0) {
        narrowed_ = false;
    }
    // Each anyOf level tries every alternative: a deep enum value under nested unions costs
    // alternatives^depth calls, and a value of megabytes is read again by each. The steps
    // for a schema's enum/const values are bounded (compile_literals refuses it once they
    // run out) rather than held by one request for hours.
    if (depth > 4 * kMaxNesting || !spend_matching(1)) {
        return false;
    }
    const JsonSchema::Node& n = at(node);
    const bool matched = matches_node(v, n, depth);
    narrowed_ = narrowed_ || (!matched && !n.exact);
    return matched;
}

bool ValueMatcher::matches_node(const json::value& v, const JsonSchema::Node& n, int depth) {
    switch (n.kind) {
        case Kind::kUnion:
            return std::any_of(n.alternatives.begin(), n.alternatives.end(),
                               [&](int32_t alt) { return matches(v, alt, depth + 1); });
        case Kind::kObject: {
            if (!v.is_object()) {
                return false;
            }
            // Each key and property is looked at once, and counts as a step: a value of
            // thousands of keys against as many properties is work by the key.
            const json::object& o = v.get_object();
            if (!spend_matching(o.size() + n.properties.size())) {
                return false;
            }
            const std::unordered_map<std::string_view, const JsonSchema::Property*> listed =
                by_key(n);
            size_t required = 0;  // Required properties among the value's keys.
            for (const auto& [k, e] : o) {
                const std::string quoted = json::serialize(json::string_view(k));
                if (!spend_matching(quoted.size())) {
                    return false;
                }
                auto p = listed.find(std::string_view(quoted).substr(1, quoted.size() - 2));
                const int32_t sub = p != listed.end()      ? p->second->node
                                    : n.properties.empty() ? n.additional
                                                           : -1;
                if (sub < 0) {
                    // Keys besides the listed properties are never written, whatever
                    // additionalProperties allows.
                    narrowed_ = narrowed_ || !n.properties.empty();
                    return false;
                }
                if (!matches(e, sub, depth + 1)) {
                    return false;
                }
                required += p != listed.end() && p->second->required ? 1 : 0;
            }
            // An object's keys differ, so each required property was counted once.
            return required == static_cast<size_t>(std::count_if(
                                   n.properties.begin(), n.properties.end(),
                                   [](const JsonSchema::Property& q) { return q.required; }));
        }
        case Kind::kArray: {
            if (!v.is_array()) {
                return false;
            }
            const json::array& a = v.get_array();
            const auto size = static_cast<int64_t>(a.size());
            return size >= n.min && size <= n.max &&
                   std::all_of(a.begin(), a.end(), [&](const json::value& e) {
                       return matches(e, n.items, depth + 1);
                   });
        }
        case Kind::kString: {
            if (!v.is_string() || !spend_matching(v.get_string().size())) {
                return false;
            }
            int64_t length = 0;  // Code points: the bytes that do not continue a character.
            for (const char c : v.get_string()) {
                length += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
            }
            return length >= n.min && length <= n.max &&
                   format_matches(n.format, v.get_string(), n.max);
        }
        case Kind::kNumber:
        case Kind::kInteger: {
            if (!has_type(v, n.kind == Kind::kInteger ? "integer" : "number")) {
                return false;
            }
            const double x = v.to_number<double>();
            return (n.lo_open ? x > n.lo : x >= n.lo) && (n.hi_open ? x < n.hi : x <= n.hi);
        }
        case Kind::kLiterals: {
            // No literal is longer than kMaxLiteralBytes: a longer value is not one.
            std::string text;
            write_canonical(v, &text, JsonSchema::kMaxLiteralBytes);
            if (!spend_matching(text.size() + n.literals.size())) {
                return false;
            }
            if (std::find(n.literals.begin(), n.literals.end(), text) != n.literals.end()) {
                return true;
            }
            // Texts are compared, not values: a number spelled otherwise (0 and -0), or an
            // object with its keys in another order, may be the same value.
            narrowed_ = narrowed_ || v.is_number() || v.is_array() || v.is_object();
            return false;
        }
    }
    return false;
}

// Counts `steps` of matches() (a call, a key or property looked at, a literal compared, a
// byte read); false once they are past kMaxMatchSteps.
bool ValueMatcher::spend_matching(size_t steps) {
    match_steps_ += static_cast<int64_t>(steps);
    return match_steps_ <= kMaxMatchSteps;
}

}  // namespace edge::engine::sampling
