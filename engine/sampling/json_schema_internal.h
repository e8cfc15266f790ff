#pragma once

// The parts of JsonSchema::compile() (json_schema.cc) that live in files of their own, for its
// use only: the values of enum and const held to the keywords beside them (ValueMatcher,
// json_schema_values.cc) and the passes over the nodes once they are compiled (GraphFinisher,
// json_schema_finish.cc).
//
// Threading: each object serves one compile(), on its thread.

#include <boost/json/fwd.hpp>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/sampling/json_schema.h"

namespace edge::engine::sampling {

// How deep a schema's keywords may nest (compile()); the walks through $refs and unions
// (ValueMatcher::matches(), GraphFinisher::flatten()) stop at four times as deep.
constexpr int kMaxNesting = 128;

// kInvalidArgument naming the part of the schema at `where` (a JSON pointer).
Status fail(const std::string& where, const std::string& what);

// How write_canonical() writes a number.
enum class Numbers : uint8_t {
    // In its shortest form, as Boost.JSON read it (an integer's digits, a double's shortest
    // text): the spelling the walk lets the model write.
    kShortest,
    // As the double it reads as, zero without its sign: 1, 1.0 and 1e0 are one text, 0 and -0
    // one. Integers past 2^53 that one double stands for are one too: values that may be equal
    // (as a validator reading numbers as doubles, JavaScript's, takes them).
    kDoubles,
    // Whole values in the int64/uint64 range (doubles among them) as their digits, others as
    // their double, zero without its sign: one text only for values that are surely equal.
    kExact,
};

// A JSON text of `v` with no whitespace, numbers as `numbers` says: kShortest, objects' members
// in their order, the one spelling of an enum value or a key that the walk lets the model write;
// the others, members sorted by key. An infinite double (a schema's 1e99999) is written 1e999, a
// JSON number that reads back as it. Past `cap` bytes of `out` it stops, `out` then longer than
// cap but not the text (a value of megabytes compared with literals).
void write_canonical(const boost::json::value& v, std::string* out, size_t cap = SIZE_MAX,
                     Numbers numbers = Numbers::kShortest);

// `v`'s text with numbers as `numbers` says (kDoubles or kExact), objects' members sorted by
// key: texts that compare values ({"a":1,"b":2} is {"b":2,"a":1}).
std::string value_key(const boost::json::value& v, Numbers numbers);

// An object node's properties by key (escaped, as Property::key).
std::unordered_map<std::string_view, const JsonSchema::Property*> by_key(const JsonSchema::Node& n);

// Whether enum/const values are valid under the nodes compiled so far (compile_literals() keeps
// the values the keywords beside them hold), in at most kMaxMatchSteps steps for the schema.
class ValueMatcher {
  public:
    // matches() steps for the enum/const values of the whole schema (compile_literals()): its
    // calls, the keys and properties, literals and bytes they look at.
    static constexpr int64_t kMaxMatchSteps = int64_t{1} << 20;

    // `schema`: the one being compiled, which outlives the matcher.
    explicit ValueMatcher(const JsonSchema& schema) : s_(&schema) {}

    // Whether `v` is valid under `node` (as compiled so far: a $ref still being compiled
    // matches nothing). Where the compiled graph is narrower than the schema (an object's keys
    // besides its listed properties, objects among enum values in another key order), so is
    // this: a value it refuses is left out, never one it takes wrongly let in.
    bool matches(const boost::json::value& v, int32_t node, int depth);
    // Whether the last matches() from depth 0 that answered false refused the value somewhere
    // the graph is narrower than the schema (a node not exact, a key besides the listed
    // properties, a literal compared by its text): the value may be valid all the same.
    bool narrowed() const { return narrowed_; }
    // Whether matches() ran past kMaxMatchSteps (its answers since are false).
    bool exhausted() const { return match_steps_ > kMaxMatchSteps; }

  private:
    using Kind = JsonSchema::Kind;

    const JsonSchema::Node& at(int32_t i) const { return s_->node(i); }
    bool matches_node(const boost::json::value& v, const JsonSchema::Node& n, int depth);
    bool spend_matching(size_t steps);

    const JsonSchema* s_;
    int64_t match_steps_ = 0;
    bool narrowed_ = false;
};

// Completes the nodes compile() built (JsonSchema is its friend).
class GraphFinisher {
  public:
    // `one_of`: each oneOf's union node and its alternatives as written. Both outlive the
    // finisher.
    GraphFinisher(JsonSchema* schema,
                  const std::vector<std::pair<int32_t, std::vector<int32_t>>>& one_of)
        : s_(schema), one_of_(one_of) {}

    // First bytes, unions flattened to the values they stand for, and oneOf's alternatives shown
    // apart.
    Status finish();
    // Where a value of `node` that nests too deep leads back to: the first node met twice
    // following, from it, what needs the most nesting (a required property, an array's items, a
    // union's least deep alternative).
    std::string recursion(int32_t node);

  private:
    using Kind = JsonSchema::Kind;

    JsonSchema::Node& at(int32_t i) { return s_->nodes_[static_cast<size_t>(i)]; }
    void index_properties();
    Status nest();
    int32_t least_depth(const JsonSchema::Node& n);
    std::span<const int32_t> leaves(const int32_t& node);
    bool apart(int32_t a, int32_t b, int depth);
    bool leaves_apart(int32_t a, int32_t b, int depth);
    bool object_apart(const JsonSchema::Node& x, const JsonSchema::Node& y, int depth);
    Status flatten(int32_t node, int depth);
    void merge_literals(int32_t node, std::vector<int32_t>* leaves);
    std::pair<size_t, unsigned char> most_alike(const std::vector<int32_t>& leaves);
    // A literal node's values as apart() compares them: sorted, numbers read as values.
    struct ValueKeys {
        std::vector<std::string> keys;
        // Set where a literal holds an object (or a '{' in a string), which oneOf has not
        // needed to compare, or did not parse (no key): the node is shown apart by no value.
        bool not_compared = false;
    };
    const ValueKeys& value_keys(int32_t node);

    JsonSchema* s_;
    const std::vector<std::pair<int32_t, std::vector<int32_t>>>& one_of_;
    std::vector<uint8_t> flattened_;  // finish(): by node, 0 not yet, 1 under way, 2 done.
    // Alternatives gathered from inner unions so far, a budget of compile() (json_schema.h).
    size_t gathered_ = 0;
    static constexpr int64_t kMaxComparisons = int64_t{1} << 18;
    int64_t comparisons_ = 0;  // leaves_apart() calls and literals compared so far.
    std::unordered_map<int32_t, ValueKeys> value_keys_;  // value_keys(), by node.
    // The literals merge_literals() has copied, with their strings' own size: a budget, so that
    // a schema does not buy megabytes of copies with a few bytes of $refs.
    static constexpr size_t kMaxMergedBytes = 16 * JsonSchema::kMaxLiteralBytes;
    size_t merged_bytes_ = 0;
};

}  // namespace edge::engine::sampling
