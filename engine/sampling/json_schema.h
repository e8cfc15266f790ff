#pragma once

// JsonSchema is a JSON Schema compiled for constrained decoding: a graph of nodes that JsonPrefix
// walks byte by byte, so that only text which can still become a document valid under the
// schema is sampled (OpenAI's response_format json_schema; json_object is the schema of any
// object, any_object()).
//
// The subset is the one structured outputs are written in (OpenAI's strict mode, Pydantic and
// Zod): `type` (one or a list), `properties`, `required`, `additionalProperties`, `items`,
// `minItems`/`maxItems`, `minLength`/`maxLength`, `minimum`/`maximum` and their exclusive forms,
// `enum`, `const`, `anyOf`/`oneOf`, a one-element `allOf`, and local `$ref`s ("#/$defs/Name",
// "#/definitions/Name", "#"), recursive ones included, and on strings `format` for the values
// StringFormat enforces (date, time, date-time, uuid, ipv4, duration, email, hostname, ipv6; a
// string then has no escape, and lengths that would cut its values short are refused).
// Annotations (title, description, default, examples, other `format` values, ...) are ignored,
// as the specification says of keywords it does not know.
// Beside `enum` or `const` the other keywords hold each value: those they refuse are left out.
// Keywords that assert something this compiler cannot enforce byte by byte (pattern, multipleOf,
// uniqueItems, not, if, ...) are refused, so a reply never claims a constraint it was not held
// to. The root must be an object, as OpenAI's is.
//
// What is generated is a subset of what the schema accepts, chosen so that the walk never
// reaches a dead end: no whitespace but a single space between tokens (compact()), an object's
// properties come in the schema's order (optional ones may be
// left out; other keys only when the schema lists no properties), and keys and enum values in
// their canonical JSON encoding (Boost.JSON's serialization). The alternatives of anyOf may
// begin alike (JsonPrefix follows each as a reading of its own, at most kMaxReadings at once: a
// union more of whose alternatives may begin with one byte is refused, and its constants are
// merged into one enum); those of oneOf must be shown apart when compiled, since a value valid
// under two would be invalid: by type, by ranges of value, length or item count, by enum values
// (numbers compared as values), or as objects by a property one requires whose values the
// other's same property cannot take (a discriminator, as Pydantic and Zod write). A node
// narrower than its schema (a type taken from the keywords, Node::exact) is shown apart only
// from nodes of its own type.
//
// Threading: immutable after compile(); shared between sequences through the shared_ptr.

#include <bitset>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/sampling/property_index.h"
#include "engine/sampling/string_format.h"

namespace boost::json {
class value;
}  // namespace boost::json

namespace edge::engine::sampling {

class JsonSchema {
  public:
    enum class Kind : uint8_t {
        kObject,
        kArray,
        kString,
        kNumber,
        kInteger,   // A number without fraction or exponent.
        kLiterals,  // One of a fixed list of JSON texts (enum, const, true/false, null).
        kUnion,     // One of `alternatives`.
    };
    // Digits of a bounded number: its value, an integer over a power of ten, is then exact in a
    // double (so 0.3 is the same double as a bound of 0.3).
    static constexpr int kBoundedDigits = 15;
    // An enum's values and their canonical texts' bytes, at most: a request must not buy a
    // schema that is slow to compile and to match (an enum of 300000 strings took 22 s a token
    // when a sampler tried the whole vocabulary). A thousand choices are past what a model is
    // asked to pick among in practice (OpenAI's strict mode allows 500 values, 15000 bytes).
    static constexpr size_t kMaxLiterals = 1024;
    static constexpr size_t kMaxLiteralBytes = 64 * 1024;
    // Work a request's schema may buy on the I/O thread that compiles it, and on the engine's
    // threads that walk it each token; each limit is refused with the part of the schema that
    // reached it, and each is far above what real schemas use (OpenAI's strict mode allows 5000
    // properties in all, 10 levels of nesting).
    // Parts: nodes plus listed properties (a property whose schema is a $ref adds no node, yet
    // is compiled and looked through).
    static constexpr size_t kMaxParts = 8192;
    // Properties one object lists: JsonPrefix narrows those a key may still be, byte by byte,
    // for every token a sampler asks about (by_name: a binary search a byte; when it looked
    // through them all, 8000 took 80 ms a pass over the vocabulary, 1024 about 17).
    static constexpr size_t kMaxObjectProperties = 1024;
    // Bytes of the JSON pointers built for the schema's parts (each node keeps its own, for
    // errors): long property names nested deep cost their length at every part below them (a
    // 1 MB name over 2000 properties took 10 s and 2 GB).
    static constexpr size_t kMaxPathBytes = 2 * 1024 * 1024;
    // Alternatives gathered into unions as they are flattened, in all: a $ref to a union holds
    // all of its alternatives, so a union of 256 referred to from thousands of places cost
    // 256 per $ref (7000 of them took 380 ms), and each pass of the compiler over the graph
    // looks through them.
    static constexpr size_t kMaxFlattenedAlternatives = 16 * 1024;
    // Readings JsonPrefix follows at once (json_prefix.h). A union more of whose alternatives
    // may begin with one byte is refused, rather than its later alternatives never written;
    // unions inside the alternatives open theirs later, usually once the outer ones are told
    // apart, and are not counted with them.
    static constexpr size_t kMaxReadings = 16;
    struct Property {
        std::string key;  // The name as a JSON string's contents (escaped, without quotes).
        int32_t node = -1;
        bool required = false;
    };
    struct Node {
        Kind kind = Kind::kUnion;
        std::string where;  // JSON pointer into the schema document, for errors.
        // kObject: the properties in schema order; with none, any key whose value follows
        // `additional` (-1: no key at all).
        std::vector<Property> properties;
        int32_t additional = -1;
        // kObject: for each i in [0, n], the first required property at index >= i (n: none).
        std::vector<int32_t> next_required;
        // kObject: `properties` by name, for JsonPrefix to narrow a key's candidates byte by byte.
        PropertyIndex by_name;
        int32_t items = -1;  // kArray: the items' node.
        // kArray: item count; kString: characters (code points).
        int64_t min = 0;
        int64_t max = INT64_MAX;
        // kString: the format its values are held to (kNone: any string within the lengths).
        StringFormat format = StringFormat::kNone;
        // kNumber / kInteger: minimum and maximum (infinite: none), each inclusive unless its
        // flag says exclusive; an integer's are whole and inclusive. With either finite a number
        // is written without an exponent and with at most kBoundedDigits digits, so that the
        // values a prefix can still reach are an interval to check against them.
        double lo = -std::numeric_limits<double>::infinity();
        double hi = std::numeric_limits<double>::infinity();
        bool lo_open = false;
        bool hi_open = false;
        bool bounded() const { return std::isfinite(lo) || std::isfinite(hi); }
        // Whether some m / 10^e, m a whole number from `first` to `last` (negated when
        // `negative`), lies in [lo, hi]: the values a bounded number can still be written as,
        // each digit left a step of that grid, computed as JsonPrefix computes a value.
        bool grid_meets(bool negative, double first, double last, int e) const;
        // kLiterals: canonical JSON texts, sorted bytewise without duplicates (those that begin
        // with the bytes written so far are then a range, which JsonPrefix narrows by binary
        // search), at most kMaxLiterals of at most kMaxLiteralBytes in all.
        std::vector<std::string> literals;
        // kLiterals: the containers each of `literals` nests (its arrays and objects, one level
        // each), in the same order: a value begins only where it fits below kMaxJsonDepth.
        std::vector<int32_t> literal_depths;
        int32_t max_literal_depth = 0;  // The largest of literal_depths.
        // kUnion: the non-union nodes it stands for (nested unions flattened).
        std::vector<int32_t> alternatives;
        std::bitset<256> first;  // The bytes a value of this node can begin with.
        // Whether the node's values are all those its schema accepts. False where compile()
        // narrows them for writing: a type taken from the keywords (JSON Schema's minLength
        // accepts every non-string too), or enum values left out by such a narrowing. For oneOf
        // such a node may share a value with a node of another type, and such literals with
        // any node.
        bool exact = true;
        // The fewest containers, one inside another, that a value of this node opens: 0 for a
        // string, number or literal, 1 plus the most its required properties (an array with
        // minItems: its items) need for a container. Past kMaxJsonDepth no value fits in what
        // JsonPrefix may nest, and JsonPrefix begins a value only where it fits, so that what it
        // begins can be completed.
        int32_t min_depth = 0;
    };

    // Compiles a schema document; kInvalidArgument naming the keyword and its JSON pointer when
    // it is malformed, unsupported, contradictory (minItems > maxItems, an empty enum, ...), or
    // cannot be written as JsonPrefix writes (every value nesting deeper than kMaxJsonDepth, a
    // range of numbers without one of kBoundedDigits digits), or its root is not an object, or
    // when it is past one of the limits above. Its work grows linearly with the document within
    // them: a schema as large as a request body compiles in tens of milliseconds at most.
    static Result<std::shared_ptr<const JsonSchema>> compile(const boost::json::value& schema);
    // The schema {"type": "object"}: any JSON object (response_format json_object).
    static const std::shared_ptr<const JsonSchema>& any_object();

    const Node& node(int32_t i) const { return nodes_[static_cast<size_t>(i)]; }
    // Between tokens, at most one space (a compiled schema) rather than runs of whitespace
    // (any_object(), json_object's long-standing rule): a model fond of whitespace spends its
    // tokens on the document instead.
    bool compact() const { return compact_; }
    int32_t root() const { return root_; }
    // A string of any characters (keys of an object without listed properties).
    int32_t any_string() const { return any_string_; }

  private:
    friend class SchemaCompiler;
    friend class GraphFinisher;
    std::vector<Node> nodes_;
    int32_t root_ = -1;
    int32_t any_string_ = -1;
    bool compact_ = true;
};

// How GLM-4.5 writes a call's arguments: key/value pairs instead of a JSON object,
// "<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n" per argument, each v JSON text, or the raw
// text of a string for the keys listed here (the parameters declared strings, which its parser
// keeps as text: engine/chat/glm45_parser.cc). The document a schema holds is the object the
// parser reads them as, {"k": v, ...}; JsonPrefix follows the pairs and holds that object.
struct ArgumentPairs {
    std::vector<std::string> raw_keys;  // Sorted, no duplicates.
};

// One of several ways a constrained reply may begin: text written exactly, then a document under
// `schema` (JsonReply::heads: a call forced to one of several tools, each head naming a tool),
// written as JSON, or as `pairs` when set. A head's text is not empty, and no head's is a prefix
// of another's.
struct JsonHead {
    std::string text;
    std::shared_ptr<const JsonSchema> schema;
    std::shared_ptr<const ArgumentPairs> pairs = nullptr;
    // Where in `text` the model writes a number of its own, 1 to kMaxHeadDigits digits (Kimi K2's
    // call index: "functions.f:3"); -1: none.
    int32_t number_at = -1;
    static constexpr int kMaxHeadDigits = 6;
};

// What a reply is held to (SamplingParams::json): only tokens that keep the output the beginning
// of a valid text are chosen. Nothing set: free text.
struct JsonReply {
    // A document valid under it (response_format: JsonSchema::any_object() for json_object, or
    // json_schema's; a call forced to one strict tool: its parameters). The reply ends when the
    // document closes (and the tail is written).
    std::shared_ptr<const JsonSchema> schema;
    // With a schema: its document is written as these pairs rather than as JSON (a call forced to
    // one strict tool of GLM-4.5). Null: JSON.
    std::shared_ptr<const ArgumentPairs> pairs;
    // Instead of a schema: the reply starts with one of these heads' texts, then a document under
    // that head's schema (a call forced to one of several tools, each head the call's start
    // naming one).
    std::vector<JsonHead> heads;
    // Text the reply writes after the document, exactly, before it ends (the end of a forced tool
    // call whose arguments the document is, e.g. "}\n</tool_call>"). The model's markers (special
    // tokens) may spell it, and a head, as well as plain text; never the document.
    std::string tail;
    // With heads: the tail's first next_at bytes end a call, and `next` written there instead of
    // the tail's rest begins another call, held as the first (one of the heads, its document,
    // the tail): the calls of one section (Kimi K2's and DeepSeek's, whose tail closes the
    // section). Empty: one call.
    size_t next_at = 0;
    std::string next;
    // With heads: they hold the reply from where it writes this text (a call's opening, which
    // the model writes on its own: tool_choice "auto") until the tail is written. Empty: from the
    // start.
    std::string trigger;
    // With a trigger: the reply starts held all the same (its first call's opening is forced:
    // tool_choice "required").
    bool held_at_start = false;
    // With a trigger: after the tail the reply goes on unconstrained, and the next trigger holds
    // it again (parallel_tool_calls). Otherwise the reply ends with the tail.
    bool again = false;

    // Whether the reply is held from its first token.
    bool from_start() const {
        return schema != nullptr || (!heads.empty() && (trigger.empty() || held_at_start));
    }
};

}  // namespace edge::engine::sampling
