#include "engine/sampling/json_schema.h"

#include <algorithm>
#include <array>
#include <boost/json.hpp>
#include <cmath>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "common/json_text.h"
#include "engine/sampling/json_schema_internal.h"

namespace edge::engine::sampling {

namespace json = boost::json;

namespace {

// Keywords that assert what a byte-by-byte walk does not enforce: refused rather than ignored,
// so a reply is never taken to meet a constraint it was not held to.
constexpr std::array<std::string_view, 21> kRefused = {
    "pattern",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "unevaluatedProperties",
    "unevaluatedItems",
    "prefixItems",
    "contains",
    "minContains",
    "maxContains",
    "multipleOf",
    "not",
    "if",
    "then",
    "else",
    "$dynamicRef",
    "$recursiveRef",
};

// Keywords that say nothing about which documents are valid (OpenAPI's `discriminator`, which
// Pydantic writes beside a oneOf, only names the property that tells its alternatives apart).
constexpr std::array<std::string_view, 15> kAnnotations = {
    "title",      "description", "default",   "examples", "$comment",
    "deprecated", "readOnly",    "writeOnly", "$schema",  "$id",
    "$defs",      "definitions", "format",    "$anchor",  "discriminator",
};

bool is_annotation(std::string_view key) {
    return std::find(kAnnotations.begin(), kAnnotations.end(), key) != kAnnotations.end();
}

// A JSON pointer's reference token for `key` (RFC 6901: '~' as ~0, '/' as ~1).
std::string pointer_token(std::string_view key) {
    std::string out;
    for (char c : key) {
        if (c == '~') {
            out += "~0";
        } else if (c == '/') {
            out += "~1";
        } else {
            out += c;
        }
    }
    return out;
}

}  // namespace

Status fail(const std::string& where, const std::string& what) {
    // A pointer through long property names is cut: the error goes back to the client.
    constexpr size_t kShown = 256;
    const std::string shown = where.size() > kShown ? where.substr(0, kShown) + "..." : where;
    return invalid_argument_error("schema at '#" + shown + "': " + what);
}

class SchemaCompiler {
  public:
    explicit SchemaCompiler(const json::value& doc) : doc_(doc) {}

    Result<std::shared_ptr<const JsonSchema>> run() {
        auto s = std::make_shared<JsonSchema>();
        s_ = s.get();
        matcher_.emplace(*s_);
        s_->any_string_ = add(JsonSchema::Kind::kString, "");
        EDGE_ASSIGN_OR_RETURN(const int32_t root, compile(doc_, "", 0));
        GraphFinisher graph(s_, one_of_);
        EDGE_RETURN_IF_ERROR(graph.finish());
        // The root is an object (through $refs, one-element allOfs and one-alternative anyOfs).
        const JsonSchema::Node& r = s_->node(root);
        int32_t object = root;
        if (r.kind == JsonSchema::Kind::kUnion) {
            object = r.alternatives.size() == 1 ? r.alternatives[0] : -1;
        }
        if (object < 0 || s_->node(object).kind != JsonSchema::Kind::kObject) {
            return invalid_argument_error(
                "schema: the root must be an object schema ({\"type\": \"object\", ...}), as "
                "OpenAI's structured outputs require");
        }
        if (s_->node(object).min_depth > static_cast<int32_t>(kMaxJsonDepth)) {
            return fail(s_->node(object).where,
                        "every value nests containers more than " + std::to_string(kMaxJsonDepth) +
                            " deep, past what a reply may: its 'required' properties and "
                            "'minItems' lead on through '#" +
                            graph.recursion(object) +
                            "' without end; make the recursion optional (leave it out of "
                            "'required', or allow minItems 0)");
        }
        s_->root_ = object;
        return std::shared_ptr<const JsonSchema>(std::move(s));
    }

  private:
    using Kind = JsonSchema::Kind;

    int32_t add(Kind kind, std::string where) {
        JsonSchema::Node n;
        n.kind = kind;
        n.where = std::move(where);
        s_->nodes_.push_back(std::move(n));
        return static_cast<int32_t>(s_->nodes_.size() - 1);
    }
    JsonSchema::Node& at(int32_t i) { return s_->nodes_[static_cast<size_t>(i)]; }

    // Any JSON value: a union of an object and an array of any values, a string, a number and
    // the literals (built once; its containers refer back to it).
    int32_t any() {
        if (any_ >= 0) {
            return any_;
        }
        any_ = add(Kind::kUnion, "");
        const int32_t object = add(Kind::kObject, "");
        at(object).additional = any_;
        const int32_t array = add(Kind::kArray, "");
        at(array).items = any_;
        const int32_t string = add(Kind::kString, "");
        const int32_t number = add(Kind::kNumber, "");
        const int32_t literals = add(Kind::kLiterals, "");
        at(literals).literals = {"true", "false", "null"};
        at(any_).alternatives = {object, array, string, number, literals};
        return any_;
    }

    // A non-negative integer keyword (minItems, maxLength, ...).
    static Result<int64_t> count(const json::value& v, const std::string& where,
                                 std::string_view key) {
        if (v.is_int64() && v.get_int64() >= 0) {
            return v.get_int64();
        }
        if (v.is_uint64()) {
            return static_cast<int64_t>(std::min<uint64_t>(v.get_uint64(), INT64_MAX));
        }
        if (v.is_double() && v.get_double() >= 0 && std::floor(v.get_double()) == v.get_double()) {
            return static_cast<int64_t>(std::min(v.get_double(), 9.2e18));
        }
        return fail(where, "'" + std::string(key) + "' must be a non-negative integer");
    }

    // Reads `min_key`/`max_key` into the node's bounds.
    Status bounds(const json::object& o, const std::string& where, int32_t node,
                  std::string_view min_key, std::string_view max_key) {
        if (const json::value* v = o.if_contains(min_key)) {
            EDGE_ASSIGN_OR_RETURN(at(node).min, count(*v, where, min_key));
        }
        if (const json::value* v = o.if_contains(max_key)) {
            EDGE_ASSIGN_OR_RETURN(at(node).max, count(*v, where, max_key));
        }
        if (at(node).min > at(node).max) {
            return fail(where, "'" + std::string(min_key) + "' is larger than '" +
                                   std::string(max_key) + "': nothing is valid");
        }
        return ok_status();
    }

    // Only annotations may stand beside `keyword` (a $ref, a one-element allOf, anyOf).
    static Status alone(const json::object& o, const std::string& where, std::string_view keyword) {
        for (const auto& [k, value] : o) {
            // An enforced format is a constraint, not an annotation.
            const bool constraint = k == "format" && value.is_string() &&
                                    string_format(value.get_string()) != StringFormat::kNone;
            if (k != keyword && (!is_annotation(k) || constraint)) {
                return fail(where, "'" + std::string(k) + "' beside '" + std::string(keyword) +
                                       "' is not supported (put it inside)");
            }
        }
        return ok_status();
    }

    Result<int32_t> compile(const json::value& v, const std::string& where, int depth) {
        if (depth > kMaxNesting) {
            return fail(where, "the schema is nested deeper than " + std::to_string(kMaxNesting));
        }
        EDGE_RETURN_IF_ERROR(check_parts(where));
        // Every compile() builds its pointer, a $ref to a part compiled already included.
        path_bytes_ += where.size();
        if (path_bytes_ > JsonSchema::kMaxPathBytes) {
            return fail(where, "the JSON pointers to the schema's parts come to over " +
                                   std::to_string(JsonSchema::kMaxPathBytes) +
                                   " bytes (property names this long, nested this deep or "
                                   "under this many parts); shorten the names or simplify "
                                   "the schema");
        }
        if (v.is_bool()) {
            if (v.get_bool()) {
                return any();
            }
            return fail(where, "the schema false matches nothing");
        }
        if (!v.is_object()) {
            return fail(where, "a schema must be an object or a boolean");
        }
        const json::object& o = v.get_object();
        for (const auto& [k, value] : o) {
            if (std::find(kRefused.begin(), kRefused.end(), k) != kRefused.end() ||
                (k == "uniqueItems" && !(value.is_bool() && !value.get_bool()))) {
                return fail(where, "'" + std::string(k) +
                                       "' is not supported (constrained decoding cannot hold a "
                                       "reply to it; remove it or check the reply yourself)");
            }
        }
        if (const json::value* ref = o.if_contains("$ref")) {
            EDGE_RETURN_IF_ERROR(alone(o, where, "$ref"));
            if (!ref->is_string()) {
                return fail(where, "'$ref' must be a string");
            }
            return compile_ref(std::string(ref->get_string()), where, depth);
        }
        if (const json::value* all = o.if_contains("allOf")) {
            EDGE_RETURN_IF_ERROR(alone(o, where, "allOf"));
            if (!all->is_array() || all->get_array().size() != 1) {
                return fail(where, "'allOf' is supported with exactly one schema");
            }
            return compile(all->get_array()[0], where + "/allOf/0", depth + 1);
        }
        for (std::string_view key : {"anyOf", "oneOf"}) {
            if (const json::value* any_of = o.if_contains(key)) {
                // oneOf's alternatives are shown apart in finish(): then at most one of them
                // matches any value, and oneOf is anyOf.
                EDGE_RETURN_IF_ERROR(alone(o, where, key));
                if (!any_of->is_array() || any_of->get_array().empty()) {
                    return fail(where, "'" + std::string(key) + "' must be a non-empty array");
                }
                std::vector<int32_t> alternatives;
                const json::array& list = any_of->get_array();
                for (size_t i = 0; i < list.size(); ++i) {
                    EDGE_ASSIGN_OR_RETURN(
                        const int32_t alt,
                        compile(list[i], where + "/" + std::string(key) + "/" + std::to_string(i),
                                depth + 1));
                    alternatives.push_back(alt);
                }
                const int32_t node = add(Kind::kUnion, where);
                if (key == "oneOf") {
                    one_of_.emplace_back(node, alternatives);
                }
                at(node).alternatives = std::move(alternatives);
                return node;
            }
        }
        return compile_typed(o, where, depth);
    }

    Status check_parts(const std::string& where) const {
        if (s_->nodes_.size() + properties_ > JsonSchema::kMaxParts) {
            return fail(where, "the schema has more than " + std::to_string(JsonSchema::kMaxParts) +
                                   " parts (schemas and listed properties)");
        }
        return ok_status();
    }

    Result<int32_t> compile_ref(const std::string& ref, const std::string& where, int depth) {
        if (auto it = refs_.find(ref); it != refs_.end()) {
            return it->second;
        }
        if (ref.empty() || ref[0] != '#') {
            return fail(where, "'$ref' '" + ref +
                                   "' is not supported: only references inside the schema "
                                   "('#/$defs/Name') are");
        }
        boost::system::error_code ec;
        const json::value* target = doc_.find_pointer(std::string_view(ref).substr(1), ec);
        if (target == nullptr) {
            return fail(where, "'$ref' '" + ref + "' points at nothing in the schema");
        }
        // A one-alternative union stands for the reference, so a schema may refer to itself.
        const int32_t node = add(Kind::kUnion, ref.substr(1));
        refs_[ref] = node;
        EDGE_ASSIGN_OR_RETURN(const int32_t body, compile(*target, ref.substr(1), depth + 1));
        at(node).alternatives = {body};
        return node;
    }

    // `values`: whether `enum`/`const` are read (false: the keywords beside them, which hold
    // each value).
    Result<int32_t> compile_typed(const json::object& o, const std::string& where, int depth,
                                  bool values = true) {
        std::vector<std::string> types;
        if (const json::value* t = o.if_contains("type")) {
            if (t->is_string()) {
                types.emplace_back(t->get_string());
            } else if (t->is_array() && !t->get_array().empty()) {
                for (const json::value& e : t->get_array()) {
                    if (!e.is_string()) {
                        return fail(where, "'type' must be a string or an array of strings");
                    }
                    types.emplace_back(e.get_string());
                }
            } else {
                return fail(where, "'type' must be a string or a non-empty array of strings");
            }
            for (const std::string& type : types) {
                static constexpr std::array<std::string_view, 7> kTypes = {
                    "object", "array", "string", "number", "integer", "boolean", "null"};
                if (std::find(kTypes.begin(), kTypes.end(), type) == kTypes.end()) {
                    return fail(where, "unknown type '" + type + "'");
                }
            }
        }
        const json::value* enum_values = values ? o.if_contains("enum") : nullptr;
        const json::value* const_value = values ? o.if_contains("const") : nullptr;
        if (enum_values != nullptr || const_value != nullptr) {
            // The keywords beside enum/const hold each value too (a maxLength, a maximum):
            // compiled as a schema of their own, only the values valid under it are kept. (Read
            // in place: a copy of them cost their size at each level of nested enums.)
            EDGE_ASSIGN_OR_RETURN(const int32_t allowed, compile_typed(o, where, depth, false));
            return compile_literals(where, allowed, enum_values, const_value);
        }
        // A type taken from the keywords: the node is narrower than the schema (exact).
        const bool guessed = types.empty();
        if (types.empty()) {
            // No type: what the keywords imply, else any value.
            if (o.contains("properties") || o.contains("required") ||
                o.contains("additionalProperties")) {
                types = {"object"};
            } else if (o.contains("items") || o.contains("minItems") || o.contains("maxItems")) {
                types = {"array"};
            } else if (o.contains("minLength") || o.contains("maxLength") || o.contains("format")) {
                // `format` says nothing of other types, but a formatted value is meant to be a
                // string; without a type it would be any value, the format unenforced.
                types = {"string"};
            } else if (o.contains("minimum") || o.contains("maximum") ||
                       o.contains("exclusiveMinimum") || o.contains("exclusiveMaximum")) {
                // Numbers in range: what the bounds imply (they say nothing of other types,
                // which are left out, as the keywords above leave out all but theirs).
                types = {"number"};
            } else {
                return any();
            }
        }
        // "number" already takes every integer.
        if (std::find(types.begin(), types.end(), "number") != types.end()) {
            std::erase(types, "integer");
        }
        std::vector<int32_t> alternatives;
        for (const std::string& type : types) {
            EDGE_ASSIGN_OR_RETURN(const int32_t node, compile_type(o, where, type, depth));
            at(node).exact = !guessed;
            alternatives.push_back(node);
        }
        if (alternatives.size() == 1) {
            return alternatives[0];
        }
        const int32_t node = add(Kind::kUnion, where);
        at(node).alternatives = std::move(alternatives);
        return node;
    }

    Result<int32_t> compile_type(const json::object& o, const std::string& where,
                                 const std::string& type, int depth) {
        if (type == "object") {
            return compile_object(o, where, depth);
        }
        if (type == "array") {
            const int32_t node = add(Kind::kArray, where);
            EDGE_RETURN_IF_ERROR(bounds(o, where, node, "minItems", "maxItems"));
            const json::value* items = o.if_contains("items");
            if (items != nullptr && items->is_array()) {
                return fail(where, "'items' as an array (a tuple) is not supported");
            }
            if (items != nullptr && items->is_bool() && !items->get_bool()) {
                if (at(node).min > 0) {
                    return fail(where, "'items' false with 'minItems' above 0: nothing is valid");
                }
                at(node).max = 0;
                at(node).items = any();
                return node;
            }
            int32_t item = -1;
            if (items != nullptr) {
                EDGE_ASSIGN_OR_RETURN(item, compile(*items, where + "/items", depth + 1));
            } else {
                item = any();
            }
            at(node).items = item;
            return node;
        }
        if (type == "string") {
            const int32_t node = add(Kind::kString, where);
            EDGE_RETURN_IF_ERROR(bounds(o, where, node, "minLength", "maxLength"));
            EDGE_RETURN_IF_ERROR(string_format_of(o, where, &at(node)));
            return node;
        }
        if (type == "boolean" || type == "null") {
            const int32_t node = add(Kind::kLiterals, where);
            at(node).literals = type == "null" ? std::vector<std::string>{"null"}
                                               : std::vector<std::string>{"true", "false"};
            return node;
        }
        const int32_t node = add(type == "number" ? Kind::kNumber : Kind::kInteger, where);
        EDGE_RETURN_IF_ERROR(numeric_bounds(o, where, &at(node)));
        return node;
    }

    // A string's `format`, where StringFormat enforces it; the lengths beside it must not cut
    // any of its values short (email and hostname keep to a lower maxLength as they go).
    static Status string_format_of(const json::object& o, const std::string& where,
                                   JsonSchema::Node* n) {
        const json::value* v = o.if_contains("format");
        if (v == nullptr) {
            return ok_status();
        }
        if (!v->is_string()) {
            return fail(where, "'format' must be a string");
        }
        n->format = string_format(v->get_string());
        if (n->format == StringFormat::kNone) {
            return ok_status();  // Not one enforced here: an annotation.
        }
        const FormatLengths lengths = format_lengths(n->format);
        const bool grows =
            n->format == StringFormat::kEmail || n->format == StringFormat::kHostname;
        if (n->min > lengths.min || n->max < (grows ? lengths.min : lengths.max)) {
            const std::string name(v->get_string());
            return fail(where, "'minLength'/'maxLength' beside 'format' '" + name +
                                   "' is supported only when it holds every value of the "
                                   "format (minLength at most " +
                                   std::to_string(lengths.min) + ", maxLength at least " +
                                   std::to_string(grows ? lengths.min : lengths.max) + ")");
        }
        return ok_status();
    }

    // minimum, maximum, and exclusiveMinimum / exclusiveMaximum as numbers (draft 6 on) or as
    // flags on the other two (draft 4).
    static Status numeric_bounds(const json::object& o, const std::string& where,
                                 JsonSchema::Node* n) {
        auto number = [&](std::string_view key, double* out) -> Status {
            const json::value* v = o.if_contains(key);
            if (v == nullptr || v->is_bool()) {
                return ok_status();
            }
            if (!v->is_number()) {
                return fail(where, "'" + std::string(key) + "' must be a number");
            }
            *out = v->to_number<double>();
            return ok_status();
        };
        auto flag = [&](std::string_view key) {
            const json::value* v = o.if_contains(key);
            return v != nullptr && v->is_bool() && v->get_bool();
        };
        double exclusive_lo = -std::numeric_limits<double>::infinity();
        double exclusive_hi = std::numeric_limits<double>::infinity();
        EDGE_RETURN_IF_ERROR(number("minimum", &n->lo));
        EDGE_RETURN_IF_ERROR(number("maximum", &n->hi));
        EDGE_RETURN_IF_ERROR(number("exclusiveMinimum", &exclusive_lo));
        EDGE_RETURN_IF_ERROR(number("exclusiveMaximum", &exclusive_hi));
        n->lo_open = flag("exclusiveMinimum");
        n->hi_open = flag("exclusiveMaximum");
        if (exclusive_lo >= n->lo) {
            n->lo = exclusive_lo;
            n->lo_open = true;
        }
        if (exclusive_hi <= n->hi) {
            n->hi = exclusive_hi;
            n->hi_open = true;
        }
        if (n->kind == Kind::kInteger) {
            // The whole numbers in range, inclusive.
            const double lo = std::ceil(n->lo);
            const double hi = std::floor(n->hi);
            n->lo = lo == n->lo && n->lo_open ? lo + 1 : lo;
            n->hi = hi == n->hi && n->hi_open ? hi - 1 : hi;
            n->lo_open = false;
            n->hi_open = false;
        }
        // A minimum past a double's range (1e999, read as infinite) leaves no number, as does
        // such a negative maximum: JSON writes no infinity. Were it let through, lo == hi would
        // be no bound (bounded() false) and any number written.
        constexpr double kInf = std::numeric_limits<double>::infinity();
        if (n->lo > n->hi || (n->lo == n->hi && (n->lo_open || n->hi_open)) || n->lo == kInf ||
            n->hi == -kInf) {
            return fail(where, "no number lies between its minimum and maximum");
        }
        if (n->bounded() && !writable(*n)) {
            return fail(where, "no number between its minimum and maximum can be written in " +
                                   std::to_string(JsonSchema::kBoundedDigits) +
                                   " digits without an exponent, as a bounded number is");
        }
        return ok_status();
    }

    // Whether a number in the node's range has a form JsonPrefix writes when bounded: m / 10^f
    // with |m| below 10^kBoundedDigits and f below kBoundedDigits ("0." counts its zero), f = 0
    // for an integer; its value computed as JsonPrefix computes it. Otherwise the value could be
    // begun and never ended (a minimum of 1e16).
    static bool writable(const JsonSchema::Node& n) {
        const double most = std::pow(10.0, JsonSchema::kBoundedDigits) - 1;
        const int fractions = n.kind == Kind::kInteger ? 0 : JsonSchema::kBoundedDigits - 1;
        for (int f = 0; f <= fractions; ++f) {
            if (n.grid_meets(false, 0, most, f) || n.grid_meets(true, 0, most, f)) {
                return true;
            }
        }
        return false;
    }

    Result<int32_t> compile_object(const json::object& o, const std::string& where, int depth) {
        std::vector<JsonSchema::Property> properties;
        // Each property by its name as written, for `required` to be looked up, not searched.
        std::unordered_map<std::string_view, size_t> listed;
        if (const json::value* props = o.if_contains("properties")) {
            if (!props->is_object()) {
                return fail(where, "'properties' must be an object");
            }
            const json::object& list = props->get_object();
            if (list.size() > JsonSchema::kMaxObjectProperties) {
                return fail(where, "'properties' lists " + std::to_string(list.size()) +
                                       " properties; at most " +
                                       std::to_string(JsonSchema::kMaxObjectProperties) +
                                       " are supported in one object");
            }
            properties_ += list.size();
            EDGE_RETURN_IF_ERROR(check_parts(where));
            for (const auto& [k, sub] : list) {
                JsonSchema::Property p;
                const std::string quoted = json::serialize(json::string_view(k));
                p.key = quoted.substr(1, quoted.size() - 2);
                EDGE_ASSIGN_OR_RETURN(
                    p.node, compile(sub, where + "/properties/" + pointer_token(k), depth + 1));
                listed.emplace(std::string_view(k), properties.size());
                properties.push_back(std::move(p));
            }
        }
        if (const json::value* req = o.if_contains("required")) {
            if (!req->is_array()) {
                return fail(where, "'required' must be an array of property names");
            }
            for (const json::value& name : req->get_array()) {
                if (!name.is_string()) {
                    return fail(where, "'required' must be an array of property names");
                }
                auto it = listed.find(std::string_view(name.get_string()));
                if (it == listed.end()) {
                    return fail(where, "required property " + json::serialize(name.get_string()) +
                                           " is not among 'properties' (list it there)");
                }
                properties[it->second].required = true;
            }
        }
        // Without listed properties any key may come, its value as additionalProperties says;
        // with them, only those are written (what additionalProperties allows besides them is
        // never needed).
        int32_t additional = -1;
        const json::value* extra = o.if_contains("additionalProperties");
        if (properties.empty() && !(extra != nullptr && extra->is_bool() && !extra->get_bool())) {
            if (extra == nullptr || extra->is_bool()) {
                additional = any();
            } else {
                EDGE_ASSIGN_OR_RETURN(additional,
                                      compile(*extra, where + "/additionalProperties", depth + 1));
            }
        } else if (extra != nullptr && !extra->is_bool() && !extra->is_object()) {
            return fail(where, "'additionalProperties' must be a boolean or a schema");
        }
        const int32_t node = add(Kind::kObject, where);
        JsonSchema::Node& n = at(node);
        n.additional = additional;
        n.next_required.assign(properties.size() + 1, static_cast<int32_t>(properties.size()));
        for (size_t i = properties.size(); i-- > 0;) {
            n.next_required[i] =
                properties[i].required ? static_cast<int32_t>(i) : n.next_required[i + 1];
        }
        n.properties = std::move(properties);
        return node;
    }

    Result<int32_t> compile_literals(const std::string& where, int32_t allowed,
                                     const json::value* enum_values,
                                     const json::value* const_value) {
        std::vector<const json::value*> values;
        if (const_value != nullptr) {
            if (enum_values != nullptr) {
                // Both hold: the value must be one of the enum's too, compared as values (0 is
                // -0.0, 1 is 1.0, members in any order), and only where surely equal, since
                // const's is written.
                const std::string key = value_key(*const_value, Numbers::kExact);
                const bool listed =
                    enum_values->is_array() &&
                    std::any_of(enum_values->get_array().begin(), enum_values->get_array().end(),
                                [&](const json::value& e) {
                                    return value_key(e, Numbers::kExact) == key;
                                });
                if (!listed) {
                    return fail(where,
                                "'const' is not one of the values of 'enum' beside it: "
                                "nothing is valid");
                }
            }
            values.push_back(const_value);
        } else if (!enum_values->is_array() || enum_values->get_array().empty()) {
            return fail(where, "'enum' must be a non-empty array");
        } else {
            for (const json::value& e : enum_values->get_array()) {
                values.push_back(&e);
            }
        }
        if (values.size() > JsonSchema::kMaxLiterals) {
            return fail(where, "'enum' has " + std::to_string(values.size()) + " values; at most " +
                                   std::to_string(JsonSchema::kMaxLiterals) + " are supported");
        }
        const int32_t node = add(Kind::kLiterals, where);
        size_t bytes = 0;
        for (const json::value* value : values) {
            // A value the keywords beside enum/const refuse (its type, length, range, ...) is
            // not valid.
            const bool valid = matcher_->matches(*value, allowed, 0);
            // A value refused where the graph is narrower than the schema may be valid: the
            // node then holds fewer values than the schema accepts.
            at(node).exact = at(node).exact && (valid || !matcher_->narrowed());
            if (matcher_->exhausted()) {
                return fail(where,
                            "checking the values of 'enum'/'const' against the keywords "
                            "beside them takes over " +
                                std::to_string(ValueMatcher::kMaxMatchSteps) +
                                " steps in all (values nested deep under anyOf, very many "
                                "or very long values); simplify the schema");
            }
            if (!valid) {
                continue;
            }
            std::string text;
            write_canonical(*value, &text);
            bytes += text.size();
            if (bytes > JsonSchema::kMaxLiteralBytes) {
                return fail(where, "the values of 'enum'/'const' come to over " +
                                       std::to_string(JsonSchema::kMaxLiteralBytes) +
                                       " bytes as JSON; at most that many are supported");
            }
            at(node).literals.push_back(std::move(text));
        }
        if (at(node).literals.empty()) {
            return fail(where,
                        "no value of 'enum'/'const' is valid under the keywords beside it ('type', "
                        "'maxLength', 'maximum', ...): nothing is valid");
        }
        return node;
    }

    const json::value& doc_;
    JsonSchema* s_ = nullptr;
    std::map<std::string, int32_t> refs_;
    int32_t any_ = -1;
    // Budgets of compile() (json_schema.h): properties listed so far (parts beside the nodes)
    // and bytes of the JSON pointers built (GraphFinisher counts the alternatives gathered).
    size_t properties_ = 0;
    size_t path_bytes_ = 0;
    std::optional<ValueMatcher> matcher_;  // compile_literals()'s, for the whole schema (run()).
    // Each oneOf's union node and its alternatives as written (finish() shows them apart).
    std::vector<std::pair<int32_t, std::vector<int32_t>>> one_of_;
};

// Values grow with m (or shrink, negated), so the m in range are one run: its first is found
// from the near bound, one either side for the rounding of bound * 10^e, or is `first` itself.
bool JsonSchema::Node::grid_meets(bool negative, double first, double last, int e) const {
    const double unit = std::pow(10.0, e);
    auto in_range = [&](double m) {
        const double x = m / unit;
        const double v = negative ? -x : x;
        return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    };
    const double near = negative ? -hi : lo;
    const double m = std::isfinite(near) ? std::max(first, std::ceil(near * unit)) : first;
    for (const double c : {m - 1, m, m + 1}) {
        if (c >= first && c <= last && in_range(c)) {
            return true;
        }
    }
    return false;
}

Result<std::shared_ptr<const JsonSchema>> JsonSchema::compile(const json::value& schema) {
    return SchemaCompiler(schema).run();
}

const std::shared_ptr<const JsonSchema>& JsonSchema::any_object() {
    static const std::shared_ptr<const JsonSchema> schema = [] {
        auto s =
            std::const_pointer_cast<JsonSchema>(*compile(json::parse(R"({"type": "object"})")));
        s->compact_ = false;
        return std::shared_ptr<const JsonSchema>(std::move(s));
    }();
    return schema;
}

}  // namespace edge::engine::sampling
