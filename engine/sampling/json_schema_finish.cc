// The passes over a schema's nodes once compile() has built them all (json_schema_internal.h):
// first bytes, unions flattened to the values they stand for, each node's min_depth and each
// object's by_name, and oneOf's alternatives shown apart.

#include <algorithm>
#include <array>
#include <bitset>
#include <boost/json.hpp>
#include <string>
#include <string_view>
#include <unordered_set>

#include "common/json_text.h"
#include "engine/sampling/json_schema_internal.h"

namespace edge::engine::sampling {

namespace {

constexpr size_t kMaxAlternatives = 256;

// The containers a canonical JSON text nests (its deepest run of open arrays and objects,
// outside strings).
int32_t nesting(std::string_view text) {
    int32_t depth = 0;
    int32_t deepest = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') {
                ++i;
            } else if (c == '"') {
                in_string = false;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            deepest = std::max(deepest, ++depth);
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    return deepest;
}

// Sorted for JsonPrefix's binary search (json_schema.h), equal values such as 1 and 1.0 one
// text, and each one's nesting and first byte.
void finish_literals(JsonSchema::Node& n) {
    std::sort(n.literals.begin(), n.literals.end());
    n.literals.erase(std::unique(n.literals.begin(), n.literals.end()), n.literals.end());
    n.literal_depths.clear();
    n.max_literal_depth = 0;
    for (const std::string& l : n.literals) {
        const int32_t d = nesting(l);
        n.literal_depths.push_back(d);
        n.max_literal_depth = std::max(n.max_literal_depth, d);
        n.first.set(static_cast<unsigned char>(l[0]));
    }
}

// The bytes a value of a number node may begin with: '-' where its range holds a negative value
// or zero (-0 is 0, and JsonPrefix takes "-0" under a minimum of 0), and the leading digits of
// the values in it, as any spelling writes them (a literal's 1e-07 begins with '1'). Never
// fewer than JsonPrefix takes, which writes only values in the range: JsonPrefix begins a
// number only at these, and apart() shows nodes apart that begin apart. Bounds other than a
// minimum of 0 are taken as inclusive, which can only add bytes (a union then refused, or a
// oneOf, that need not be).
std::bitset<256> number_first(const JsonSchema::Node& n) {
    std::bitset<256> first;
    if (n.lo < 0 || (n.lo == 0 && !n.lo_open)) {
        first.set('-');
    }
    auto holds = [&](double from, double to) { return n.lo <= to && from <= n.hi; };
    // Between 0 and 1 a double may be written either way (0.5, 1e-07), so any digit may lead
    // (an integer's only value there is 0); from 10^16, past what a bounded number's 15 digits
    // reach, the decades are not looked through.
    const bool any_digit = n.hi >= 1e16 ||
                           (n.kind == JsonSchema::Kind::kNumber && n.lo < 1 && n.hi > 0);
    if (holds(0, 1)) {
        first.set('0');
    }
    for (int d = 1; d <= 9; ++d) {
        bool leads = any_digit;
        for (double unit = 1; !leads && unit <= 1e15; unit *= 10) {
            leads = holds(d * unit, (d + 1) * unit);
        }
        first.set(static_cast<size_t>('0' + d), leads);
    }
    return first;
}

}  // namespace

Status GraphFinisher::finish() {
    for (JsonSchema::Node& n : s_->nodes_) {
        switch (n.kind) {
            case Kind::kObject:
                n.first.set('{');
                break;
            case Kind::kArray:
                n.first.set('[');
                break;
            case Kind::kString:
                n.first.set('"');
                break;
            case Kind::kNumber:
            case Kind::kInteger:
                n.first = number_first(n);
                break;
            case Kind::kLiterals:
                finish_literals(n);
                break;
            case Kind::kUnion:
                break;
        }
    }
    flattened_.assign(s_->nodes_.size(), 0);
    for (size_t i = 0; i < s_->nodes_.size(); ++i) {
        if (at(static_cast<int32_t>(i)).kind == Kind::kUnion) {
            EDGE_RETURN_IF_ERROR(flatten(static_cast<int32_t>(i), 0));
        }
    }
    EDGE_RETURN_IF_ERROR(nest());
    index_properties();
    for (const auto& [node, alternatives] : one_of_) {
        for (size_t a = 0; a < alternatives.size(); ++a) {
            for (size_t b = a + 1; b < alternatives.size(); ++b) {
                if (!apart(alternatives[a], alternatives[b], 0)) {
                    if (comparisons_ > kMaxComparisons) {
                        return fail(at(node).where,
                                    "'oneOf' has too many alternatives to show apart (over " +
                                        std::to_string(kMaxComparisons) +
                                        " comparisons of them, their properties and "
                                        "values); use anyOf, or enum for constants");
                    }
                    return fail(at(node).where,
                                "the alternatives at '#" + at(alternatives[a]).where + "' and '#" +
                                    at(alternatives[b]).where +
                                    "' of 'oneOf' may both match one value, which oneOf "
                                    "refuses: tell them apart (by type; by a property both "
                                    "list, one requires, and whose const or enum values "
                                    "differ; by ranges) or use anyOf");
                }
            }
        }
    }
    // A union more of whose alternatives may begin with one byte than JsonPrefix follows at
    // once: those past kMaxReadings would be dropped there and never written. Readings that
    // unions inside the alternatives open later are not counted: by then the text has usually
    // told the alternatives apart (a discriminator, the first property), and a recursive schema
    // would count without end.
    constexpr size_t kMost = JsonSchema::kMaxReadings;
    for (size_t i = 0; i < s_->nodes_.size(); ++i) {
        const JsonSchema::Node& n = at(static_cast<int32_t>(i));
        if (n.kind != Kind::kUnion) {
            continue;
        }
        if (const auto [alike, byte] = most_alike(n.alternatives); alike > kMost) {
            return fail(n.where, "more than " + std::to_string(kMost) +
                                     " of the union's alternatives may begin with '" +
                                     std::string(1, static_cast<char>(byte)) + "', and at most " +
                                     std::to_string(kMost) +
                                     " are followed at once: tell them apart by type, use enum "
                                     "or const for constants, or use fewer alternatives");
        }
    }
    return ok_status();
}

// Each object's by_name (json_schema.h), once min_depth is known.
void GraphFinisher::index_properties() {
    std::vector<std::string_view> keys;
    std::vector<int32_t> depths;
    for (JsonSchema::Node& n : s_->nodes_) {
        keys.clear();
        depths.clear();
        for (const JsonSchema::Property& p : n.properties) {
            keys.emplace_back(p.key);
            depths.push_back(at(p.node).min_depth);
        }
        n.by_name = PropertyIndex(keys, depths);
    }
}

// Each node's min_depth (json_schema.h), to a fixpoint: required properties, minItems and
// $refs may lead back to the node. Values only fall, from kMaxJsonDepth + 1 (none fits), and
// the longest chain of them that matters is short, so it ends after a few dozen passes. A
// root whose values nest deeper than a reply may is refused: no reply could be completed.
Status GraphFinisher::nest() {
    constexpr auto kTooDeep = static_cast<int32_t>(kMaxJsonDepth) + 1;
    for (JsonSchema::Node& n : s_->nodes_) {
        const bool container = n.kind == Kind::kObject || n.kind == Kind::kArray;
        n.min_depth = container || n.kind == Kind::kUnion ? kTooDeep : least_depth(n);
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (JsonSchema::Node& n : s_->nodes_) {
            const int32_t d = least_depth(n);
            if (d < n.min_depth) {
                n.min_depth = d;
                changed = true;
            }
        }
    }
    return ok_status();
}

std::string GraphFinisher::recursion(int32_t node) {
    std::vector<int32_t> seen;
    int32_t i = node;
    while (i >= 0 && std::find(seen.begin(), seen.end(), i) == seen.end()) {
        seen.push_back(i);
        const JsonSchema::Node& n = at(i);
        int32_t next = -1;
        auto deeper = [&](int32_t candidate, bool least) {
            if (next < 0 || (least ? at(candidate).min_depth < at(next).min_depth
                                   : at(candidate).min_depth > at(next).min_depth)) {
                next = candidate;
            }
        };
        if (n.kind == Kind::kObject) {
            for (const JsonSchema::Property& p : n.properties) {
                if (p.required) {
                    deeper(p.node, false);
                }
            }
        } else if (n.kind == Kind::kArray && n.min > 0) {
            next = n.items;
        } else if (n.kind == Kind::kUnion) {
            for (const int32_t alt : n.alternatives) {
                deeper(alt, true);
            }
        }
        i = next;
    }
    return at(i >= 0 ? i : node).where;
}

// A node's min_depth from those of the nodes it holds.
int32_t GraphFinisher::least_depth(const JsonSchema::Node& n) {
    constexpr auto kTooDeep = static_cast<int32_t>(kMaxJsonDepth) + 1;
    int32_t d = 0;
    switch (n.kind) {
        case Kind::kObject:
            for (const JsonSchema::Property& p : n.properties) {
                if (p.required) {
                    d = std::max(d, at(p.node).min_depth);
                }
            }
            return std::min(d + 1, kTooDeep);
        case Kind::kArray:
            return n.min == 0 ? 1 : std::min(at(n.items).min_depth + 1, kTooDeep);
        case Kind::kUnion:
            d = kTooDeep;
            for (const int32_t alt : n.alternatives) {
                d = std::min(d, at(alt).min_depth);
            }
            return d;
        case Kind::kLiterals:
            return n.literal_depths.empty() ? 0
                                            : std::min(*std::min_element(n.literal_depths.begin(),
                                                                         n.literal_depths.end()),
                                                       kTooDeep);
        default:
            return 0;
    }
}

// The non-union nodes `node` stands for (after flatten()); a view into the schema or `node`.
std::span<const int32_t> GraphFinisher::leaves(const int32_t& node) {
    const JsonSchema::Node& n = at(node);
    return n.kind == Kind::kUnion ? std::span<const int32_t>(n.alternatives)
                                  : std::span<const int32_t>(&node, 1);
}

// Whether no value is valid under both `a` and `b` (unions, as flatten() left them). A
// sufficient test: false may only mean "not shown". Discriminators sit near the top of the
// alternatives, so the search into properties stops a few levels down.
bool GraphFinisher::apart(int32_t a, int32_t b, int depth) {
    if (depth > 4 || a == b) {
        return false;
    }
    for (const int32_t x : leaves(a)) {
        for (const int32_t y : leaves(b)) {
            if (!leaves_apart(x, y, depth)) {
                return false;
            }
        }
    }
    return true;
}

bool GraphFinisher::leaves_apart(int32_t a, int32_t b, int depth) {
    // Pairs are compared at most kMaxComparisons times in all: a request's schema must not
    // buy seconds of work with thousands of alternatives.
    if (++comparisons_ > kMaxComparisons) {
        return false;
    }
    const JsonSchema::Node& x = at(a);
    const JsonSchema::Node& y = at(b);
    const bool x_number = x.kind == Kind::kNumber || x.kind == Kind::kInteger;
    const bool y_number = y.kind == Kind::kNumber || y.kind == Kind::kInteger;
    // A node whose type was guessed from its keywords writes only that type, while its schema
    // takes every value of the other types too: against another kind it may match what the
    // other writes. Against its own kind the node is its schema, unless it is literals some of
    // whose values were left out (those may be of any type).
    const bool same_kind = x.kind == y.kind || (x_number && y_number);
    if ((!x.exact || !y.exact) && (!same_kind || x.kind == Kind::kLiterals)) {
        return false;
    }
    // Literals are compared as values below: -0 and 0 begin apart.
    if ((x.first & y.first).none() && !(x.kind == Kind::kLiterals && y.kind == Kind::kLiterals)) {
        return true;
    }
    auto counts_apart = [&] { return x.max < y.min || y.max < x.min; };
    auto numbers_apart = [&] {
        return x.hi < y.lo || y.hi < x.lo || (x.hi == y.lo && (x.hi_open || y.lo_open)) ||
               (y.hi == x.lo && (y.hi_open || x.lo_open));
    };
    if (x_number && y_number) {
        return numbers_apart();
    }
    if (x.kind != y.kind) {
        return false;
    }
    switch (x.kind) {
        case Kind::kString:
        case Kind::kArray:
            return counts_apart();
        case Kind::kLiterals: {
            // Values are compared by their texts with numbers read as values (value_key()),
            // which differ for different values; literals holding objects are not compared
            // (ValueKeys). Each literal counts against the comparisons: a oneOf of large enums
            // is work by the value, not by the pair.
            comparisons_ += static_cast<int64_t>(x.literals.size() + y.literals.size());
            if (comparisons_ > kMaxComparisons) {
                return false;
            }
            const ValueKeys& xs = value_keys(a);
            const ValueKeys& ys = value_keys(b);
            if (xs.not_compared || ys.not_compared) {
                return false;
            }
            // Both sorted: one pass over the two.
            for (size_t i = 0, j = 0; i < xs.keys.size() && j < ys.keys.size();) {
                const int order = xs.keys[i].compare(ys.keys[j]);
                if (order == 0) {
                    return false;
                }
                (order < 0 ? i : j) += 1;
            }
            return true;
        }
        case Kind::kObject:
            // A property one requires, whose values the other's same property cannot take.
            return object_apart(x, y, depth) || object_apart(y, x, depth);
        default:
            return false;
    }
}

const GraphFinisher::ValueKeys& GraphFinisher::value_keys(int32_t node) {
    auto [it, added] = value_keys_.try_emplace(node);
    if (added) {
        for (const std::string& l : at(node).literals) {
            // Each literal is write_canonical()'s text of a value in the request, which nests
            // no deeper than the request's depth: it parses at that depth. Were it not to, its
            // own text would be no key (0 and -0 differ there), so the node is not compared.
            std::error_code ec;
            const boost::json::value v = parse_json(l, ec);
            it->second.not_compared = it->second.not_compared || ec ||
                                      l.find('{') != std::string::npos;
            if (it->second.not_compared) {
                break;
            }
            it->second.keys.push_back(value_key(v, Numbers::kDoubles));
        }
        std::sort(it->second.keys.begin(), it->second.keys.end());
    }
    return it->second;
}

bool GraphFinisher::object_apart(const JsonSchema::Node& x, const JsonSchema::Node& y, int depth) {
    // Each property counts against the comparisons: a pair of objects of a thousand
    // properties is work by the property.
    comparisons_ += static_cast<int64_t>(x.properties.size() + y.properties.size());
    if (comparisons_ > kMaxComparisons) {
        return false;
    }
    const std::unordered_map<std::string_view, const JsonSchema::Property*> other = by_key(y);
    for (const JsonSchema::Property& p : x.properties) {
        if (!p.required) {
            continue;
        }
        auto q = other.find(p.key);
        if (q != other.end() && apart(p.node, q->second->node, depth + 1)) {
            return true;
        }
    }
    return false;
}

// Replaces a union's alternatives by the non-union nodes it stands for (its inner unions
// first, each once), at most kMaxAlternatives: JsonPrefix looks through them at each value
// the union begins, for each token a sampler asks about.
Status GraphFinisher::flatten(int32_t node, int depth) {
    if (flattened_[static_cast<size_t>(node)] == 2) {
        return ok_status();
    }
    if (flattened_[static_cast<size_t>(node)] == 1) {
        return fail(at(node).where,
                    "the schema is its own alternative (a $ref or anyOf that "
                    "leads back to itself before any value)");
    }
    if (depth > 4 * kMaxNesting) {
        return fail(at(node).where, "$refs and anyOfs are chained too deep");
    }
    flattened_[static_cast<size_t>(node)] = 1;
    std::vector<int32_t> leaves;
    // Nodes already taken: a $ref to one union repeated many times (cached, it adds no
    // node) is merged once, and a leaf is looked up, not searched for.
    std::unordered_set<int32_t> taken;
    std::bitset<256> first;
    auto add = [&](int32_t leaf) {
        if (taken.insert(leaf).second) {
            first |= at(leaf).first;
            leaves.push_back(leaf);
        }
    };
    for (size_t a = 0; a < at(node).alternatives.size(); ++a) {
        const int32_t alt = at(node).alternatives[a];
        if (at(alt).kind != Kind::kUnion) {
            add(alt);
            continue;
        }
        if (!taken.insert(alt).second) {
            continue;  // This union's leaves are in already.
        }
        EDGE_RETURN_IF_ERROR(flatten(alt, depth + 1));
        gathered_ += at(alt).alternatives.size();
        if (gathered_ > JsonSchema::kMaxFlattenedAlternatives) {
            return fail(at(node).where,
                        "the schema's unions gather over " +
                            std::to_string(JsonSchema::kMaxFlattenedAlternatives) +
                            " alternatives in all (each $ref to a union, and each anyOf "
                            "or oneOf holding one, gathers all of its alternatives); refer "
                            "to large unions from fewer places");
        }
        for (const int32_t leaf : at(alt).alternatives) {
            add(leaf);
        }
    }
    // More alternatives that may begin with one byte than JsonPrefix follows at once: their
    // constants are one reading as one enum (a union still past kMaxReadings is refused once
    // oneOf is checked, in finish()).
    if (most_alike(leaves).first > JsonSchema::kMaxReadings) {
        merge_literals(node, &leaves);
    }
    if (leaves.size() > kMaxAlternatives) {
        return fail(at(node).where, "the union has " + std::to_string(leaves.size()) +
                                        " alternatives (anyOf, oneOf, type lists and $refs "
                                        "flattened); at most " +
                                        std::to_string(kMaxAlternatives) + " are supported");
    }
    at(node).alternatives = std::move(leaves);
    at(node).first = first;
    flattened_[static_cast<size_t>(node)] = 2;
    return ok_status();
}

// A union's literal leaves as one node (an anyOf of consts is an enum): JsonPrefix follows
// its values as one reading, where each literal node would begin one of its own. Only for a
// union past kMaxReadings alike (flatten()), which would else be refused. Left apart where the
// values come to more than an enum may hold, or the copies made so far to over kMaxMergedBytes
// (enums referred to from many unions are copied into each).
void GraphFinisher::merge_literals(int32_t node, std::vector<int32_t>* leaves) {
    size_t count = 0;
    size_t values = 0;
    size_t bytes = 0;
    for (const int32_t leaf : *leaves) {
        const JsonSchema::Node& n = at(leaf);
        if (n.kind != Kind::kLiterals) {
            continue;
        }
        ++count;
        values += n.literals.size();
        if (values > JsonSchema::kMaxLiterals) {
            return;  // Before their bytes are counted: a few enums of many values.
        }
        for (const std::string& l : n.literals) {
            bytes += l.size();
        }
    }
    const size_t cost = bytes + values * sizeof(std::string);
    if (count < 2 || bytes > JsonSchema::kMaxLiteralBytes ||
        merged_bytes_ + cost > kMaxMergedBytes) {
        return;
    }
    merged_bytes_ += cost;
    JsonSchema::Node merged;
    merged.kind = Kind::kLiterals;
    merged.where = at(node).where;
    const auto index = static_cast<int32_t>(s_->nodes_.size());
    std::vector<int32_t> kept;
    for (const int32_t leaf : *leaves) {
        const JsonSchema::Node& n = at(leaf);
        if (n.kind != Kind::kLiterals) {
            kept.push_back(leaf);
            continue;
        }
        if (merged.literals.empty()) {
            kept.push_back(index);  // Where the first of them was.
        }
        merged.literals.insert(merged.literals.end(), n.literals.begin(), n.literals.end());
        merged.exact = merged.exact && n.exact;
    }
    finish_literals(merged);
    s_->nodes_.push_back(std::move(merged));
    flattened_.push_back(2);
    *leaves = std::move(kept);
}

// The most of `leaves` that may begin with one byte, and that byte: JsonPrefix opens a reading
// for each of them there.
std::pair<size_t, unsigned char> GraphFinisher::most_alike(const std::vector<int32_t>& leaves) {
    std::array<size_t, 256> begin{};
    std::pair<size_t, unsigned char> most{0, 0};
    for (const int32_t leaf : leaves) {
        const std::bitset<256>& first = at(leaf).first;
        for (size_t c = 0; c < first.size(); ++c) {
            if (first.test(c) && ++begin[c] > most.first) {
                most = {begin[c], static_cast<unsigned char>(c)};
            }
        }
    }
    return most;
}

}  // namespace edge::engine::sampling
