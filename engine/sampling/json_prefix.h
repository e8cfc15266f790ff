#pragma once

// JsonPrefix follows a JSON text byte by byte and says whether what it has seen is still the
// beginning of a document valid under a JsonSchema (by default any JSON object, as OpenAI's
// `json_object` response format answers), and whether the document is complete. The sampler
// asks it, token by token, which candidates keep the output valid (response_format json_object
// and json_schema).
//
// A pushdown automaton over bytes: a stack of frames, one per open container and one for the
// value being written (at most kMaxDepth containers). Strings with their escapes (\uXXXX: four
// hex digits, surrogates in pairs; raw control characters refused; other characters in
// well-formed UTF-8, which a token may split), numbers in JSON's grammar (no leading zeros, a
// digit after '.' and after an exponent), literals, and the schema's constraints: property
// names in the schema's order, required ones not skipped, item counts, string lengths in code
// points, enum values, string formats (string_format.h: such a string has no escape); in an
// object whose keys are free (no listed properties), no key written
// twice (keys compared as the strings they decode to: "\u0061" is "a"). Every prefix it takes
// can still be completed, so a sampler that keeps to it never finds no token left. The document
// starts at once (no whitespace before it); elsewhere whitespace is allowed where JSON allows it:
// under a compiled schema one space at a time, for any object (json_object) runs of at most
// kMaxSpaces bytes. A prefix may be given a tail: text that must follow the document exactly (the
// end of a forced tool call whose arguments the document is), with no whitespace before it; the
// text is complete once the tail is written. Instead of one schema it may be given heads
// (JsonHead): the text then starts with one of their texts, exactly, and the document after it
// follows that head's schema.
//
// A document may be written as GLM-4.5's argument pairs instead of JSON (ArgumentPairs):
// "<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n" per property, then the tail (the call's
// end, "</tool_call>"). The prefix follows the pairs and feeds the JSON they stand for to the
// automaton below: a key's bytes escaped into a property name, a raw value's into a string, any
// other value's as they are (JSON text); the object opens at the first marker and closes where
// the tail begins. Text inside a key or value that may be the start of its closing marker is
// taken while either reading of it (the marker, or text) can still go on.
//
// Where the alternatives of an anyOf may begin with the same byte (objects told apart by a
// property, strings of different lengths, numbers of different ranges), each that takes the
// value's first byte is a reading of its own: the prefix follows them side by side, drops those
// the bytes rule out, and merges those that come to the same state (after the value ends, say).
// The text is taken while one reading takes it, and complete when one is. Readings are usually
// few and short-lived (a discriminating property decides at its value), and no union of a
// compiled schema opens more than kMaxReadings at its first byte (JsonSchema refuses one that
// would). Past them (unions inside readings still open may add up) the later ones are dropped
// (readings that come to the same state within one call's bytes are merged only after them, so
// copies of one may fill the count for a while), which narrows what may be written but never
// leads to a dead end.
//
// The keys an object whose keys are free has taken are held as 64-bit hashes of their decoded
// text, in a list that copies share (nodes are never changed once linked): a key is refused at
// the closing quote that would make it one already written (any prefix of another key still
// goes on), so a key given twice never is; a new key whose hash happens to equal one of the
// others' (a chance of 2^-64 a pair) is refused too, which narrows what may be written but,
// the key's text being free to go on, never leads to a dead end. Listed properties need no
// such list: each is written at most once, in the schema's order.
//
// Threading: a value type; copies are independent (accepts() tries bytes on a scratch copy,
// which copies only the frames in use and borrows the keys list of the prefix it was made of).
// The schema, heads and tail must outlive the prefix and its copies.

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/json_text.h"
#include "engine/sampling/json_schema.h"

namespace edge::engine::sampling {

class JsonPrefix {
public:
    static constexpr int kMaxDepth = static_cast<int>(kMaxJsonDepth);  // Containers.
    static constexpr int kMaxSpaces = 32;
    static constexpr size_t kMaxReadings = JsonSchema::kMaxReadings;
    // An exponent's digits after its leading zeros: below 10^9, inside the int that JSON parsers
    // keep it in (Boost.JSON refuses one past INT_MAX as "exponent overflow").
    static constexpr int32_t kMaxExponentDigits = 9;

    // Any JSON object (response_format json_object).
    JsonPrefix() : JsonPrefix(*JsonSchema::any_object()) {}
    explicit JsonPrefix(const JsonSchema& schema, std::string_view tail = {})
        : schema_(&schema), tail_(tail) {}
    // One of `heads` (not empty), its document, then `tail`.
    JsonPrefix(std::span<const JsonHead> heads, std::string_view tail)
        : heads_(heads), tail_(tail) {}
    // The text `reply` holds (a schema or heads): its schema's or its heads' (the trigger is the
    // caller's).
    explicit JsonPrefix(const JsonReply& reply)
        : schema_(reply.schema.get()),
          heads_(reply.heads),
          tail_(reply.tail),
          next_(reply.schema == nullptr ? std::string_view(reply.next) : std::string_view()),
          next_at_(reply.next_at),
          pairs_(reply.schema != nullptr ? reply.pairs.get() : nullptr) {}
    JsonPrefix(const JsonPrefix& other) : keys_(other.keys_) { copy_state(other); }
    JsonPrefix& operator=(const JsonPrefix& other);
    // Out of line: the keys list's release inlined into every vector of readings kept those
    // from being inlined themselves (a call for each empty one, per token asked about).
    ~JsonPrefix();

    // Takes `bytes`; false, and the prefix unchanged, when they would make the text anything
    // but the beginning of a valid document.
    bool feed(std::string_view bytes);
    // Whether `bytes` could be fed.
    bool accepts(std::string_view bytes) const { return some_reading_takes(bytes, false); }
    // Whether a marker (a special token) spelling `bytes` could be fed: only where the text is
    // not the document's (in no reading): a head, the tail, or, in argument pairs, their markers
    // and the newlines between them; never a key's or a value's text.
    bool accepts_marker(std::string_view bytes) const { return some_reading_takes(bytes, true); }
    // The document is closed (its top-level object): only the tail may follow. (Readings agree
    // on where the document and its containers open and close: JSON's grammar is unambiguous.)
    bool closed() const { return started_ && depth_ == 0; }
    // The text is complete: the document closed and the tail written, in some reading.
    bool complete() const;

  private:
    enum class State : uint8_t {
        // Containers.
        kFirst,  // After '{' or '[': a key / value, or the closing bracket.
        kKey,    // After ',' in an object: a key.
        kInKey,  // In a listed property's name.
        kColon,  // After a key.
        kValue,  // A value is due (after ':', or ',' in an array).
        kNext,   // After a value: ',' or the closing bracket.
        // Strings.
        kChars,   // Between the quotes.
        kEscape,  // After '\'.
        kHex,     // In \uXXXX, hex_left digits to go.
        // Numbers.
        kMinus,
        kZero,            // A leading 0.
        kInteger,         // Integer digits.
        kDot,             // After '.'.
        kFraction,        // Fraction digits.
        kExponent,        // After 'e' or 'E'.
        kExponentSign,    // After the exponent's sign.
        kExponentDigits,  // Exponent digits.
        // Literals (enum values, true, false, null).
        kLiteral,
    };
    // Plain data, so that a copy of the prefix (accepts() makes one per candidate token) touches
    // only the frames in use; push() sets every field.
    struct Frame {
        int32_t node;           // A non-union node of the schema.
        JsonSchema::Kind kind;  // The node's.
        State state;
        // Object: the index of the last property written (-1: none yet). Array: items so far.
        // String: characters so far. Number: fraction digits so far.
        int32_t count;
        // kLiteral: the first candidate still matching, and the bytes of it matched (the
        // candidates are [candidate, count)). kInKey: the listed names that begin with the key's
        // `pos` bytes so far, [candidate, format_state) in the object's Node::by_name order.
        // Number: the exponent's digits after its leading zeros, and the digits before the
        // exponent.
        int32_t candidate;
        int32_t pos;
        // String with a format (JsonSchema::Node::format): the format's state (string_format.h).
        // (kInKey: the end of the candidates, a field objects have no other use for; one more
        // would make the frame 48 bytes rather than 40, copied per token asked about.)
        int32_t format_state;
        // Number: its digits as a whole number (the value is that over 10^count), its sign.
        double digits;
        bool negative;
        // Strings: continuation bytes still due, the next in [utf8_lo, utf8_hi]; \u escapes.
        int8_t utf8_left;
        uint8_t utf8_lo;
        uint8_t utf8_hi;
        int8_t hex_left;
        bool surrogate;  // kHex: the escape so far is a high surrogate's.
        bool want_low;   // The next escape must be a low surrogate's.
        // String: a key of an object whose keys are free; its decoded text is hashed into
        // key_hash_ as it comes, in kHex its \u escape's code unit so far in `candidate`, and
        // a high surrogate's, until its low half comes, in `pos`.
        bool key;

        bool operator==(const Frame&) const = default;
    };

    // Where argument pairs are (ArgumentPairs), around the JSON document they stand for.
    enum class Pairs : uint8_t {
        kBetween,    // "<arg_key>" or the tail next; lit_ bytes of it written.
        kKeyOpen,    // In "<arg_key>".
        kKey,        // A key's text; lit_ bytes of "</arg_key>" pending (text or the marker).
        kValueOpen,  // In "\n<arg_value>".
        kValue,      // A value's text; lit_ bytes of "</arg_value>" pending.
        kNewline,    // The "\n" after "</arg_value>".
        kDone,       // The tail began: the document is closed.
    };

    // A key written in the object whose frame is `depth`: the newest first, an object's keys
    // after those of the objects inside it. Immutable once linked (copies share it); the last
    // reference to a long list unlinks it in a loop rather than node by node recursively.
    struct WrittenKey {
        uint64_t hash;  // Of the key's decoded text (UTF-8).
        int32_t depth;
        std::shared_ptr<const WrittenKey> next;
        ~WrittenKey();
    };

    // A copy to try bytes on that does not outlive this prefix: it borrows this one's keys list
    // rather than sharing its ownership (a reference count taken and dropped for every token the
    // sampler asks about).
    // It is of this one reading alone: the others (others_) are not copied.
    struct Borrow {};
    JsonPrefix(const JsonPrefix& other, Borrow /*unused*/);
    JsonPrefix scratch() const { return JsonPrefix(*this, Borrow{}); }
    // Everything but the keys list (and, without `with_others`, the other readings).
    void copy_state(const JsonPrefix& other, bool with_others = true);
    // Whether this reading or one of others_ takes `bytes` (as a marker's: markers_only_). Each
    // is tried alone on a scratch copy, and the first that takes them ends the search: a copy
    // of every reading per token asked about, then compared pairwise with the others, made a
    // pass over the vocabulary 86 times one reading's at 16 readings (bench_sampler).
    bool some_reading_takes(std::string_view bytes, bool markers_only) const;
    // feed() in place: on false the prefix is left part-way (feed() works on a copy).
    bool take(std::string_view bytes);
    // take() for this reading alone (others_ empty); the readings it forks on the way, each fed
    // the rest of `bytes`, are added to `forks`.
    bool read(std::string_view bytes, std::vector<JsonPrefix>* forks);
    // The same state (the readings aside).
    bool same_reading(const JsonPrefix& other) const;
    // A byte of the head, before the document.
    bool step_head(unsigned char c);
    // A byte after the document: the tail's, or the next call's (next_).
    bool step_tail(unsigned char c);
    bool step(unsigned char c);
    // A byte of the JSON text (what the document is written as, or what pairs stand for).
    bool step_json(unsigned char c);
    // A byte of argument pairs.
    bool step_pairs(unsigned char c);
    // A key's or value's byte, or the start of its closing marker.
    bool step_pair_text(unsigned char c);
    // Key or value text (not a marker) into the document.
    bool pair_text(std::string_view bytes);
    // The key or value can end here (its closing marker), and ends it.
    bool can_end_pair_text() const;
    bool end_pair_text();
    // JSON bytes into the document; whether a copy would take them.
    bool json(std::string_view bytes);
    bool json_accepts(std::string_view bytes) const {
        JsonPrefix copy = scratch();
        return copy.json(bytes);
    }
    // The frame on top takes `c`: 1 taken, 0 refused, -1 the frame's value ended just before
    // `c` (a number or literal), so the frame below must take it.
    int step_object(Frame& f, unsigned char c);
    int step_array(Frame& f, unsigned char c);
    int step_string(Frame& f, unsigned char c);
    int step_number(Frame& f, unsigned char c);
    int step_literal(Frame& f, unsigned char c);
    // A bounded number: whether some value in range can still be written after the frame's
    // prefix, and whether the value so far is in range.
    bool number_reachable(const Frame& f) const;
    bool number_in_range(const Frame& f) const;
    // Starts a value of `node` with its first byte `c`; for a union, this reading follows the
    // first alternative that takes `c` and forks one for each other.
    bool begin_value(int32_t node, unsigned char c);
    // Starts a value of non-union `node`.
    bool begin_leaf(int32_t node, unsigned char c);
    bool push(int32_t node, State state, bool container);
    // Whitespace `c` outside tokens, within the schema's limit.
    bool space(unsigned char c);
    // A string's byte >= 0x80 that starts a UTF-8 character; false when none can.
    static bool utf8_lead(Frame& f, unsigned char c);
    // A key's decoded bytes into key_hash_; a code point from a \u escape, as its UTF-8.
    void hash_key(std::string_view bytes);
    void hash_key_code_point(uint32_t cp);
    // The key frame `f` (on top) takes the code unit of its \u escape just completed.
    void hash_key_unit(Frame& f);
    // The key being written (key_hash_) closes: false when the object (the frame below it) has
    // taken it already; otherwise the object takes it.
    bool end_key();
    // The object on top closes: its frame and its keys go.
    void end_object();
    bool same_keys(const JsonPrefix& other) const;

    const JsonSchema* schema_ = nullptr;  // With heads: null until one is written.
    std::span<const JsonHead> heads_;
    size_t head_ = 0;      // The first head still matching.
    size_t head_pos_ = 0;  // Bytes of it written.
    int8_t head_digits_ = 0;  // Digits of its number (JsonHead::number_at) written.
    std::string_view tail_;
    size_t tail_pos_ = 0;  // Bytes after the document written.
    // JsonReply::next, from next_at_ on an alternative to the tail's rest; which of the two the
    // bytes after the document still match.
    std::string_view next_;
    size_t next_at_ = 0;
    bool tail_alive_ = true;
    bool next_alive_ = true;
    bool started_ = false;
    int depth_ = 0;   // Frames in use.
    int spaces_ = 0;  // Whitespace bytes in a row, outside strings.
    // Containers, plus the string, number or literal being written.
    std::array<Frame, kMaxDepth + 1> frames_;  // The first depth_ are in use.
    // The keys written in the open objects whose keys are free. In a scratch() copy (and the
    // copies made of it while it is used) it may begin with a pointer that owns nothing, into
    // the list of the prefix the copy was made of.
    std::shared_ptr<const WrittenKey> keys_;
    // The key being written (a Frame::key string on top): an FNV-1a hash of its decoded bytes
    // so far; 0 otherwise.
    uint64_t key_hash_ = 0;
    // The other readings of the text, each without others of its own (usually none).
    std::vector<JsonPrefix> others_;
    // Argument pairs (null: the document is JSON) and where in them the text is: the marker
    // bytes written or pending (lit_), pairs finished, and while in a key, the raw keys
    // [raw_lo_, raw_hi_) that begin with its key_len_ bytes; raw_value_: the value is raw text.
    const ArgumentPairs* pairs_ = nullptr;
    Pairs pair_ = Pairs::kBetween;
    uint8_t lit_ = 0;
    bool raw_value_ = false;
    int32_t pairs_done_ = 0;
    int32_t raw_lo_ = 0;
    int32_t raw_hi_ = 0;
    int32_t key_len_ = 0;
    // accepts_marker(): bytes may not be the document's text.
    bool markers_only_ = false;
    // During read(): where begin_value puts the readings it forks.
    std::vector<JsonPrefix>* forks_ = nullptr;
};

// Asks a JsonPrefix about one token after another, as a sampler's filter does (the prefix must
// not change meanwhile): whether the token's bytes can come next. A token whose first byte
// cannot is refused without a walk; when a sampler asks about the whole vocabulary the document
// is usually where few bytes may come (a key, a number), so most tokens are.
class JsonTokenCheck {
  public:
    explicit JsonTokenCheck(const JsonPrefix& prefix) : prefix_(&prefix) {}
    bool operator()(std::string_view bytes) {
        if (bytes.empty()) {
            return false;
        }
        uint8_t& first = first_[static_cast<unsigned char>(bytes[0])];
        if (first == 0) {
            first = prefix_->accepts(bytes.substr(0, 1)) ? 1 : 2;
        }
        return first == 1 && (bytes.size() == 1 || prefix_->accepts(bytes));
    }

  private:
    const JsonPrefix* prefix_;
    std::array<uint8_t, 256> first_{};  // By first byte: 0 not asked, 1 may come, 2 may not.
};

}  // namespace edge::engine::sampling
