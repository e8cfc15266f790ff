#include "engine/sampling/json_prefix.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/fnv1a.h"

namespace edge::engine::sampling {
namespace {

using Kind = JsonSchema::Kind;

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
// A character that stands for itself in a JSON string.
bool is_plain(unsigned char c) { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\'; }
bool is_hex(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// The markers of argument pairs (ArgumentPairs).
constexpr std::string_view kKeyOpen = "<arg_key>";
constexpr std::string_view kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "\n<arg_value>";
constexpr std::string_view kValueClose = "</arg_value>";

// Byte `c` of a string's text as JSON writes it between the quotes (in `buf` when not a
// constant).
std::string_view json_escaped(unsigned char c, char (&buf)[6]) {
    switch (c) {
        case '"':
            return "\\\"";
        case '\\':
            return "\\\\";
        case '\n':
            return "\\n";
        case '\r':
            return "\\r";
        case '\t':
            return "\\t";
        default:
            break;
    }
    if (c >= 0x20) {
        buf[0] = static_cast<char>(c);
        return {buf, 1};
    }
    static constexpr char kHexDigits[] = "0123456789abcdef";
    buf[0] = '\\';
    buf[1] = 'u';
    buf[2] = '0';
    buf[3] = '0';
    buf[4] = kHexDigits[c >> 4];
    buf[5] = kHexDigits[c & 15];
    return {buf, 6};
}

// The byte a one-character escape (after '\\') stands for.
char unescaped(unsigned char c) {
    switch (c) {
        case 'b':
            return '\b';
        case 'f':
            return '\f';
        case 'n':
            return '\n';
        case 'r':
            return '\r';
        case 't':
            return '\t';
        default:
            return static_cast<char>(c);  // '"', '\\', '/'.
    }
}

}  // namespace

JsonPrefix::WrittenKey::~WrittenKey() {
    std::shared_ptr<const WrittenKey> rest = std::move(next);
    // Each node this loop is the last owner of goes with its link already taken from it (nodes
    // are made non-const by make_shared: only their users see them const).
    while (rest != nullptr && rest.use_count() == 1) {
        rest = std::move(const_cast<WrittenKey&>(*rest).next);
    }
}

JsonPrefix::JsonPrefix(const JsonPrefix& other, Borrow /*unused*/)
    // Aliasing an empty pointer: copied without a reference count; `other` holds the list
    // meanwhile.
    : keys_(std::shared_ptr<const WrittenKey>(), other.keys_.get()) {
    copy_state(other);
}

JsonPrefix::~JsonPrefix() = default;

JsonPrefix& JsonPrefix::operator=(const JsonPrefix& other) {
    if (this != &other) {
        copy_state(other);
        keys_ = other.keys_;
    }
    return *this;
}

void JsonPrefix::copy_state(const JsonPrefix& other) {
    schema_ = other.schema_;
    heads_ = other.heads_;
    head_ = other.head_;
    head_pos_ = other.head_pos_;
    head_digits_ = other.head_digits_;
    tail_ = other.tail_;
    tail_pos_ = other.tail_pos_;
    next_ = other.next_;
    next_at_ = other.next_at_;
    tail_alive_ = other.tail_alive_;
    next_alive_ = other.next_alive_;
    started_ = other.started_;
    depth_ = other.depth_;
    spaces_ = other.spaces_;
    std::copy_n(other.frames_.begin(), depth_, frames_.begin());
    others_ = other.others_;
    pairs_ = other.pairs_;
    pair_ = other.pair_;
    lit_ = other.lit_;
    raw_value_ = other.raw_value_;
    pairs_done_ = other.pairs_done_;
    raw_lo_ = other.raw_lo_;
    raw_hi_ = other.raw_hi_;
    key_len_ = other.key_len_;
    markers_only_ = other.markers_only_;
    key_hash_ = other.key_hash_;
}

bool JsonPrefix::complete() const {
    auto done = [](const JsonPrefix& r) {
        return r.closed() && r.tail_alive_ && r.tail_pos_ == r.tail_.size();
    };
    return done(*this) || std::any_of(others_.begin(), others_.end(), done);
}

bool JsonPrefix::same_reading(const JsonPrefix& other) const {
    return schema_ == other.schema_ && head_ == other.head_ && head_pos_ == other.head_pos_ &&
           head_digits_ == other.head_digits_ && tail_pos_ == other.tail_pos_ &&
           tail_alive_ == other.tail_alive_ && next_alive_ == other.next_alive_ &&
           started_ == other.started_ && depth_ == other.depth_ && spaces_ == other.spaces_ &&
           pairs_ == other.pairs_ && pair_ == other.pair_ && lit_ == other.lit_ &&
           raw_value_ == other.raw_value_ && pairs_done_ == other.pairs_done_ &&
           raw_lo_ == other.raw_lo_ && raw_hi_ == other.raw_hi_ && key_len_ == other.key_len_ &&
           key_hash_ == other.key_hash_ &&
           std::equal(frames_.begin(), frames_.begin() + depth_, other.frames_.begin()) &&
           same_keys(other);
}

bool JsonPrefix::same_keys(const JsonPrefix& other) const {
    const WrittenKey* a = keys_.get();
    const WrittenKey* b = other.keys_.get();
    while (a != b) {
        if (a == nullptr || b == nullptr || a->hash != b->hash || a->depth != b->depth) {
            return false;
        }
        a = a->next.get();
        b = b->next.get();
    }
    return true;
}

void JsonPrefix::hash_key(std::string_view bytes) {
    for (const char b : bytes) {
        key_hash_ = fnv1a_step(key_hash_, static_cast<unsigned char>(b));
    }
}

void JsonPrefix::hash_key_code_point(uint32_t cp) {
    char utf8[4];
    size_t n = 0;
    if (cp < 0x80) {
        utf8[n++] = static_cast<char>(cp);
    } else if (cp < 0x800) {
        utf8[n++] = static_cast<char>(0xC0 | (cp >> 6));
        utf8[n++] = static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        utf8[n++] = static_cast<char>(0xE0 | (cp >> 12));
        utf8[n++] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        utf8[n++] = static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        utf8[n++] = static_cast<char>(0xF0 | (cp >> 18));
        utf8[n++] = static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        utf8[n++] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        utf8[n++] = static_cast<char>(0x80 | (cp & 0x3F));
    }
    hash_key(std::string_view(utf8, n));
}

void JsonPrefix::hash_key_unit(Frame& f) {
    // step_string has checked the pairing: a low surrogate comes right after its high one.
    const auto unit = static_cast<uint32_t>(f.candidate);
    if (unit >= 0xD800 && unit <= 0xDBFF) {
        f.pos = f.candidate;
    } else if (unit >= 0xDC00 && unit <= 0xDFFF) {
        hash_key_code_point(0x10000 + ((static_cast<uint32_t>(f.pos) - 0xD800) << 10) +
                            (unit - 0xDC00));
        f.pos = 0;
    } else {
        hash_key_code_point(unit);
    }
}

bool JsonPrefix::end_key() {
    // The key's frame is on top, its object's below it. The list holds the keys of the open
    // objects only (end_object() drops those of one that closes), innermost first.
    const int32_t object = depth_ - 2;
    for (const WrittenKey* k = keys_.get(); k != nullptr && k->depth >= object; k = k->next.get()) {
        if (k->hash == key_hash_) {
            return false;
        }
    }
    keys_ = std::make_shared<WrittenKey>(key_hash_, object, std::move(keys_));
    key_hash_ = 0;
    return true;
}

void JsonPrefix::end_object() {
    --depth_;
    while (keys_ != nullptr && keys_->depth >= depth_) {
        keys_ = keys_->next;
    }
}

bool JsonPrefix::feed(std::string_view bytes) {
    JsonPrefix next = *this;
    if (!next.take(bytes)) {
        return false;
    }
    *this = next;
    return true;
}

bool JsonPrefix::take(std::string_view bytes) {
    // Every reading takes the bytes; those that do, and those forked on the way, are the
    // readings after them.
    std::vector<JsonPrefix> readings;
    const std::vector<JsonPrefix> others = std::move(others_);
    others_.clear();
    const bool taken = read(bytes, &readings);
    for (const JsonPrefix& other : others) {
        JsonPrefix r = other;
        if (r.read(bytes, &readings)) {
            readings.push_back(r);
        }
    }
    if (readings.empty()) {
        return taken;
    }
    if (!taken) {
        *this = readings.front();
        readings.erase(readings.begin());
    }
    for (const JsonPrefix& r : readings) {
        const bool seen =
            same_reading(r) || std::any_of(others_.begin(), others_.end(),
                                           [&](const JsonPrefix& o) { return o.same_reading(r); });
        if (!seen && others_.size() + 1 < kMaxReadings) {
            others_.push_back(r);
        }
    }
    return true;
}

bool JsonPrefix::read(std::string_view bytes, std::vector<JsonPrefix>* forks) {
    size_t i = 0;
    while (i < bytes.size()) {
        // In argument pairs: a value's text, none of its closing marker pending (its raw text,
        // or a string inside its JSON, takes plain characters as they are, '<' aside).
        const bool text = pairs_ == nullptr || (pair_ == Pairs::kValue && lit_ == 0);
        if (depth_ > 0 && text && !markers_only_) {
            // Plain ASCII characters inside a string, most of what is asked about, in one go
            // (spaces_ is 0 there: the opening quote reset it).
            Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
            if (f.kind == Kind::kString && f.state == State::kChars && f.utf8_left == 0 &&
                !f.want_low && schema_->node(f.node).format == StringFormat::kNone) {
                const int64_t room = schema_->node(f.node).max - f.count;
                size_t j = i;
                while (j < bytes.size() && static_cast<int64_t>(j - i) < room &&
                       is_plain(static_cast<unsigned char>(bytes[j])) &&
                       (pairs_ == nullptr || bytes[j] != '<')) {
                    ++j;
                }
                if (j > i) {
                    f.count += static_cast<int32_t>(j - i);
                    if (f.key) {
                        hash_key(bytes.substr(i, j - i));
                    }
                    i = j;
                    continue;
                }
            }
        }
        const auto c = static_cast<unsigned char>(bytes[i++]);
        if (!is_space(c)) {
            spaces_ = 0;
        }
        const size_t before = forks->size();
        forks_ = forks;
        const bool taken = step(c);
        forks_ = nullptr;
        if (forks->size() > before) {
            // Readings forked at `c` go on with the bytes after it.
            const std::vector<JsonPrefix> born(forks->begin() + static_cast<ptrdiff_t>(before),
                                               forks->end());
            forks->resize(before);
            for (const JsonPrefix& b : born) {
                JsonPrefix r = b;
                if (r.read(bytes.substr(i), forks)) {
                    forks->push_back(r);
                }
            }
        }
        if (!taken) {
            return false;
        }
    }
    return true;
}

bool JsonPrefix::step_head(unsigned char c) {
    // The heads still matching share the bytes written so far; the first that takes `c` next.
    if (heads_.empty()) {
        return false;
    }
    if (heads_[head_].number_at == static_cast<int32_t>(head_pos_)) {
        // The head's number: one digit at least, then its text goes on.
        if (c >= '0' && c <= '9' && head_digits_ < JsonHead::kMaxHeadDigits) {
            ++head_digits_;
            return true;
        }
        if (head_digits_ == 0) {
            return false;
        }
    }
    const std::string_view written = std::string_view(heads_[head_].text).substr(0, head_pos_);
    size_t i = head_;
    while (i < heads_.size() && !(heads_[i].text.size() > head_pos_ &&
                                  static_cast<unsigned char>(heads_[i].text[head_pos_]) == c &&
                                  std::string_view(heads_[i].text).starts_with(written))) {
        ++i;
    }
    if (i == heads_.size()) {
        return false;
    }
    head_ = i;
    if (++head_pos_ == heads_[i].text.size()) {
        schema_ = heads_[i].schema.get();  // The document is next.
        pairs_ = heads_[i].pairs.get();
    }
    return true;
}

bool JsonPrefix::step_tail(unsigned char c) {
    // The tail, exactly, and nothing after it; or from next_at_ on, the next call's start.
    const size_t i = tail_pos_;
    const bool tail = tail_alive_ && i < tail_.size() && c == static_cast<unsigned char>(tail_[i]);
    const bool next = next_alive_ && !next_.empty() &&
                      (i < next_at_ ? tail
                                    : i - next_at_ < next_.size() &&
                                          c == static_cast<unsigned char>(next_[i - next_at_]));
    if (!tail && !next) {
        return false;
    }
    tail_alive_ = tail;
    next_alive_ = next;
    ++tail_pos_;
    if (next && !tail && tail_pos_ == next_at_ + next_.size()) {
        // Another call: a head again, its document, the tail.
        schema_ = nullptr;
        head_ = 0;
        head_pos_ = 0;
        head_digits_ = 0;
        pairs_ = nullptr;
        pair_ = Pairs::kBetween;
        lit_ = 0;
        pairs_done_ = 0;
        started_ = false;
        spaces_ = 0;
        tail_pos_ = 0;
        tail_alive_ = true;
        next_alive_ = true;
    }
    return true;
}

bool JsonPrefix::space(unsigned char c) {
    // Whitespace between tokens is bounded: a model that likes whitespace better than anything
    // else could otherwise fill max_tokens with it, valid JSON all the way. Any object
    // (json_object): runs of at most kMaxSpaces bytes; a schema: one space (as Outlines does).
    if (schema_->compact() ? spaces_ == 1 || c != ' ' : spaces_ == kMaxSpaces) {
        return false;
    }
    ++spaces_;
    return true;
}

bool JsonPrefix::push(int32_t node, State state, bool container) {
    // kMaxDepth containers, and one more slot for the string, number or literal in the innermost.
    if (depth_ >= (container ? kMaxDepth : kMaxDepth + 1)) {
        return false;
    }
    frames_[static_cast<size_t>(depth_++)] = Frame{.node = node,
                                                   .kind = schema_->node(node).kind,
                                                   .state = state,
                                                   .count = 0,
                                                   .candidate = 0,
                                                   .pos = 0,
                                                   .format_state = 0,
                                                   .digits = 0,
                                                   .negative = false,
                                                   .utf8_left = 0,
                                                   .utf8_lo = 0x80,
                                                   .utf8_hi = 0xBF,
                                                   .hex_left = 0,
                                                   .surrogate = false,
                                                   .want_low = false,
                                                   .key = false};
    return true;
}

bool JsonPrefix::begin_value(int32_t node, unsigned char c) {
    // A value begins only where the containers it must open fit below kMaxDepth
    // (JsonSchema::Node::min_depth), so that it can be completed: a recursive schema's optional
    // parts are left out near the limit rather than begun and never closed.
    auto fits = [&](const JsonSchema::Node& n) {
        return n.first.test(c) && depth_ + n.min_depth <= kMaxDepth;
    };
    const JsonSchema::Node& n = schema_->node(node);
    if (!fits(n)) {
        return false;
    }
    if (n.kind != Kind::kUnion) {
        return begin_leaf(node, c);
    }
    auto opens = [&](int32_t alt) { return fits(schema_->node(alt)); };
    if (std::count_if(n.alternatives.begin(), n.alternatives.end(), opens) == 1) {
        return begin_leaf(*std::find_if(n.alternatives.begin(), n.alternatives.end(), opens), c);
    }
    const JsonPrefix before = *this;  // No others_ during read().
    bool taken = false;
    for (const int32_t alt : n.alternatives) {
        if (!opens(alt)) {
            continue;
        }
        if (!taken) {
            taken = begin_leaf(alt, c);
            if (!taken) {
                *this = before;
            }
            continue;
        }
        if (forks_ == nullptr || forks_->size() + 1 >= kMaxReadings) {
            break;
        }
        JsonPrefix fork = before;
        if (fork.begin_leaf(alt, c)) {
            forks_->push_back(fork);
        }
    }
    return taken;
}

bool JsonPrefix::begin_leaf(int32_t node, unsigned char c) {
    switch (schema_->node(node).kind) {
        case Kind::kObject:
            if (!push(node, State::kFirst, true)) {
                return false;
            }
            frames_[static_cast<size_t>(depth_ - 1)].count = -1;
            return true;
        case Kind::kArray:
            return push(node, State::kFirst, true);
        case Kind::kString:
            return push(node, State::kChars, false);
        case Kind::kNumber:
        case Kind::kInteger: {
            if (!push(node,
                      c == '-'   ? State::kMinus
                      : c == '0' ? State::kZero
                                 : State::kInteger,
                      false)) {
                return false;
            }
            Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
            f.negative = c == '-';
            if (c != '-') {
                f.digits = c - '0';
                f.pos = 1;
            }
            return number_reachable(f);
        }
        case Kind::kLiterals: {
            if (!push(node, State::kLiteral, false)) {
                return false;
            }
            Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
            f.count = static_cast<int32_t>(schema_->node(node).literals.size());
            return step_literal(f, c) == 1;
        }
        case Kind::kUnion:
            break;
    }
    return false;
}

bool JsonPrefix::step(unsigned char c) {
    if (pairs_ != nullptr && pair_ != Pairs::kDone) {
        return step_pairs(c);
    }
    if (markers_only_ && (depth_ > 0 || (schema_ != nullptr && !started_))) {
        return false;  // A marker never writes the document.
    }
    return step_json(c);
}

bool JsonPrefix::json(std::string_view bytes) {
    for (const char b : bytes) {
        const auto c = static_cast<unsigned char>(b);
        if (!is_space(c)) {
            spaces_ = 0;
        }
        if (!step_json(c)) {
            return false;
        }
    }
    return true;
}

bool JsonPrefix::step_pairs(unsigned char c) {
    switch (pair_) {
        case Pairs::kBetween:
            // "<arg_key>" or the tail ("</tool_call>"), which share their first byte.
            if (lit_ == 0) {
                if (c != '<' || tail_.size() < 2 || tail_[0] != '<') {
                    return false;
                }
                lit_ = 1;
                // The object opens with the first marker (a union's readings fork here, and go
                // on from this state).
                if (!started_ && !json("{")) {
                    return false;
                }
                return json_accepts(pairs_done_ == 0 ? "\"" : ",\"") || json_accepts("}");
            }
            if (c == static_cast<unsigned char>(kKeyOpen[1])) {
                pair_ = Pairs::kKeyOpen;
                lit_ = 2;
                return json_accepts(pairs_done_ == 0 ? "\"" : ",\"");
            }
            if (c == static_cast<unsigned char>(tail_[1])) {
                pair_ = Pairs::kDone;
                tail_pos_ = 2;
                return json("}");
            }
            return false;
        case Pairs::kKeyOpen:
        case Pairs::kValueOpen: {
            const std::string_view marker = pair_ == Pairs::kKeyOpen ? kKeyOpen : kValueOpen;
            if (c != static_cast<unsigned char>(marker[lit_])) {
                return false;
            }
            if (++lit_ < marker.size()) {
                return true;
            }
            lit_ = 0;
            if (pair_ == Pairs::kValueOpen) {
                pair_ = Pairs::kValue;
                return !raw_value_ || json("\"");  // A raw value is a string's text.
            }
            pair_ = Pairs::kKey;
            raw_lo_ = 0;
            raw_hi_ = static_cast<int32_t>(pairs_->raw_keys.size());
            key_len_ = 0;
            return json(pairs_done_ == 0 ? "\"" : ",\"");
        }
        case Pairs::kKey:
        case Pairs::kValue:
            return step_pair_text(c);
        case Pairs::kNewline:
            if (c != '\n') {
                return false;
            }
            pair_ = Pairs::kBetween;
            lit_ = 0;
            ++pairs_done_;
            return true;
        case Pairs::kDone:
            break;
    }
    return false;
}

bool JsonPrefix::step_pair_text(unsigned char c) {
    const std::string_view close = pair_ == Pairs::kKey ? kKeyClose : kValueClose;
    if (c == static_cast<unsigned char>(close[lit_])) {
        if (++lit_ == close.size()) {
            return end_pair_text();
        }
        // The closing marker's beginning, or text: one of them must still be possible.
        if (can_end_pair_text()) {
            return true;
        }
        JsonPrefix copy = *this;
        copy.lit_ = 0;
        return copy.pair_text(close.substr(0, lit_));
    }
    if (lit_ > 0) {
        // What was pending is text after all; `c` may begin the marker again.
        const std::string_view pending = close.substr(0, lit_);
        lit_ = 0;
        return pair_text(pending) && step_pair_text(c);
    }
    const auto b = static_cast<char>(c);
    return pair_text(std::string_view(&b, 1));
}

bool JsonPrefix::pair_text(std::string_view bytes) {
    if (markers_only_) {
        return false;
    }
    const bool escaped = pair_ == Pairs::kKey || raw_value_;
    if (!escaped) {
        // JSON text, as it is, within the value: around it only whitespace (the object's frame
        // before or after the value), never what follows a value in an object.
        for (const char b : bytes) {
            if (!json(std::string_view(&b, 1))) {
                return false;
            }
            const State around = frames_[0].state;
            if (depth_ < 2 && (depth_ < 1 || (around != State::kValue && around != State::kNext))) {
                return false;
            }
        }
        return true;
    }
    for (const char b : bytes) {
        const auto c = static_cast<unsigned char>(b);
        if (pair_ == Pairs::kKey) {
            // The raw keys that begin with the key so far (sorted: a range).
            const std::vector<std::string>& keys = pairs_->raw_keys;
            const auto pos = static_cast<size_t>(key_len_);
            const auto first = keys.begin() + raw_lo_;
            const auto last = keys.begin() + raw_hi_;
            const auto lo = std::partition_point(first, last, [&](const std::string& k) {
                return k.size() <= pos || static_cast<unsigned char>(k[pos]) < c;
            });
            const auto hi = std::partition_point(lo, last, [&](const std::string& k) {
                return static_cast<unsigned char>(k[pos]) == c;
            });
            raw_lo_ = static_cast<int32_t>(lo - keys.begin());
            raw_hi_ = static_cast<int32_t>(hi - keys.begin());
            ++key_len_;
        }
        char buf[6];
        if (!json(json_escaped(c, buf))) {
            return false;
        }
    }
    return true;
}

bool JsonPrefix::can_end_pair_text() const {
    if (pair_ == Pairs::kKey || raw_value_) {
        return json_accepts("\"");  // The name or string can close.
    }
    // A JSON value is complete: the object takes what may follow it.
    JsonPrefix more = *this;
    if (more.json(",") && more.depth_ == 1) {
        return true;
    }
    JsonPrefix end = *this;
    return end.json("}") && end.depth_ == 0;
}

bool JsonPrefix::end_pair_text() {
    lit_ = 0;
    if (pair_ == Pairs::kKey) {
        const std::vector<std::string>& keys = pairs_->raw_keys;
        raw_value_ = raw_lo_ < raw_hi_ &&
                     keys[static_cast<size_t>(raw_lo_)].size() == static_cast<size_t>(key_len_);
        pair_ = Pairs::kValueOpen;
        return json("\":");
    }
    if (!raw_value_ && !can_end_pair_text()) {
        return false;
    }
    pair_ = Pairs::kNewline;
    return !raw_value_ || json("\"");
}

bool JsonPrefix::step_json(unsigned char c) {
    for (;;) {
        if (depth_ == 0) {
            if (schema_ == nullptr) {
                return step_head(c);
            }
            if (!started_) {
                // The document starts at once, with its object.
                started_ = true;
                return c == '{' && begin_value(schema_->root(), c);
            }
            if (!tail_.empty()) {
                return step_tail(c);
            }
            return is_space(c) && space(c);
        }
        Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
        int taken = 0;
        switch (f.kind) {
            case Kind::kObject:
                taken = step_object(f, c);
                break;
            case Kind::kArray:
                taken = step_array(f, c);
                break;
            case Kind::kString:
                taken = step_string(f, c);
                break;
            case Kind::kNumber:
            case Kind::kInteger:
                taken = step_number(f, c);
                break;
            case Kind::kLiterals:
                taken = step_literal(f, c);
                break;
            case Kind::kUnion:
                return false;  // Never on the stack: begin_value picks an alternative.
        }
        if (taken >= 0) {
            return taken == 1;
        }
        --depth_;  // The number or literal ended before `c`: its container takes `c`.
    }
}

int JsonPrefix::step_object(Frame& f, unsigned char c) {
    const JsonSchema::Node& n = schema_->node(f.node);
    const auto count = static_cast<int32_t>(n.properties.size());
    // Listed properties come in order, each after `f.count`, and none past a required one.
    const int32_t next_required =
        count == 0 ? 0 : n.next_required[static_cast<size_t>(f.count + 1)];
    const int32_t last_allowed = std::min(next_required, count - 1);
    const bool closable = next_required == count;
    // Only a property whose value fits in the nesting left is begun (begin_value), so only its
    // key is written; a required one always fits where its object did.
    auto fits = [&](int32_t node) { return depth_ + schema_->node(node).min_depth <= kMaxDepth; };
    auto fits_at = [&](int32_t j) { return fits(n.properties[static_cast<size_t>(j)].node); };
    auto key_may_come = [&] {
        for (int32_t j = f.count + 1; j <= last_allowed; ++j) {
            if (fits_at(j)) {
                return true;
            }
        }
        return false;
    };
    // Whether a property of the names `r` may come. Where every property fits in the nesting
    // left (almost always), the index answers by its order alone; otherwise each is looked at.
    auto may_come = [&](PropertyIndex::Range r) {
        if (depth_ + n.by_name.deepest() <= kMaxDepth) {
            return n.by_name.any_between(r, f.count, last_allowed);
        }
        for (int32_t at = r.begin; at < r.end; ++at) {
            const int32_t j = n.by_name.property(at);
            if (j > f.count && j <= last_allowed && fits_at(j)) {
                return true;
            }
        }
        return false;
    };
    if (f.state != State::kInKey && is_space(c)) {
        return space(c) ? 1 : 0;
    }
    switch (f.state) {
        case State::kFirst:
        case State::kKey:
            if (c == '}' && f.state == State::kFirst && closable) {
                end_object();
                return 1;
            }
            if (c != '"') {
                return 0;
            }
            if (count == 0) {
                // Any key, as a string of any characters.
                if (n.additional < 0 || !fits(n.additional)) {
                    return 0;
                }
                f.state = State::kColon;
                if (!push(schema_->any_string(), State::kChars, false)) {
                    return 0;
                }
                frames_[static_cast<size_t>(depth_ - 1)].key = true;
                key_hash_ = kFnv1aSeed;
                return 1;
            }
            if (!key_may_come()) {
                return 0;
            }
            f.state = State::kInKey;
            f.candidate = 0;
            f.format_state = count;
            f.pos = 0;
            return 1;
        case State::kInKey: {
            // The names that go on with `c`, if one of them may still come; else the key ends
            // at a closing quote if its bytes are one such name.
            const PropertyIndex& names = n.by_name;
            const PropertyIndex::Range matched{f.candidate, f.format_state};
            const auto pos = static_cast<size_t>(f.pos);
            const PropertyIndex::Range next = names.narrow(matched, pos, c);
            if (may_come(next)) {
                f.candidate = next.begin;
                f.format_state = next.end;
                ++f.pos;
                return 1;
            }
            if (c != '"') {
                return 0;
            }
            const int32_t j = names.exact(matched, pos);
            if (j > f.count && j <= last_allowed && fits_at(j)) {
                f.count = j;
                f.state = State::kColon;
                return 1;
            }
            return 0;
        }
        case State::kColon:
            if (c != ':') {
                return 0;
            }
            f.state = State::kValue;
            return 1;
        case State::kValue: {
            const int32_t value =
                count == 0 ? n.additional : n.properties[static_cast<size_t>(f.count)].node;
            f.state = State::kNext;
            return begin_value(value, c) ? 1 : 0;
        }
        case State::kNext:
            if (c == ',' && (count == 0 || key_may_come())) {
                f.state = State::kKey;
                return 1;
            }
            if (c == '}' && closable) {
                end_object();
                return 1;
            }
            return 0;
        default:
            return 0;
    }
}

int JsonPrefix::step_array(Frame& f, unsigned char c) {
    const JsonSchema::Node& n = schema_->node(f.node);
    if (is_space(c)) {
        return space(c) ? 1 : 0;
    }
    switch (f.state) {
        case State::kFirst:
        case State::kValue:
            if (c == ']' && f.state == State::kFirst && n.min == 0) {
                --depth_;
                return 1;
            }
            if (f.count >= n.max) {
                return 0;
            }
            ++f.count;
            f.state = State::kNext;
            return begin_value(n.items, c) ? 1 : 0;
        case State::kNext:
            if (c == ',' && f.count < n.max) {
                f.state = State::kValue;
                return 1;
            }
            if (c == ']' && f.count >= n.min) {
                --depth_;
                return 1;
            }
            return 0;
        default:
            return 0;
    }
}

bool JsonPrefix::utf8_lead(Frame& f, unsigned char c) {
    // Well-formed UTF-8 only (Unicode table 3-7): no overlong forms, surrogates or code points
    // past U+10FFFF, as a strict JSON parser reads it.
    f.utf8_lo = 0x80;
    f.utf8_hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        f.utf8_left = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        f.utf8_left = 2;
        f.utf8_lo = c == 0xE0 ? 0xA0 : 0x80;
        f.utf8_hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        f.utf8_left = 3;
        f.utf8_lo = c == 0xF0 ? 0x90 : 0x80;
        f.utf8_hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        return false;
    }
    return true;
}

int JsonPrefix::step_string(Frame& f, unsigned char c) {
    const JsonSchema::Node& n = schema_->node(f.node);
    switch (f.state) {
        case State::kChars:
            if (f.utf8_left > 0) {
                // A continuation byte of a UTF-8 character, in the range its lead allows.
                if (c < f.utf8_lo || c > f.utf8_hi) {
                    return 0;
                }
                --f.utf8_left;
                f.utf8_lo = 0x80;
                f.utf8_hi = 0xBF;
                if (f.key) {
                    hash_key(std::string_view(reinterpret_cast<const char*>(&c), 1));
                }
                return 1;
            }
            if (f.want_low && c != '\\') {
                return 0;  // A high surrogate escape must be followed by a low one.
            }
            if (c == '"') {
                if (f.count < n.min || !format_complete(n.format, f.format_state) ||
                    (f.key && !end_key())) {
                    return 0;  // Too short, not a whole value, or a key its object has already.
                }
                --depth_;
                return 1;
            }
            if (n.format != StringFormat::kNone) {
                // Only the format's own characters, all plain ASCII (no escape), each leaving
                // room for the rest of a value within maxLength.
                const int64_t limit = std::min<int64_t>(n.max, format_lengths(n.format).max);
                const int32_t next = format_step(n.format, f.format_state, c, limit - f.count - 1);
                if (next < 0) {
                    return 0;
                }
                f.format_state = next;
            }
            // A character begins (the low half of a surrogate pair is the same character).
            if (!f.want_low) {
                if (f.count >= n.max || c < 0x20 || (c >= 0x80 && !utf8_lead(f, c))) {
                    return 0;  // Too long, a raw control character, or not UTF-8.
                }
                ++f.count;
            }
            if (c == '\\') {
                f.state = State::kEscape;
            } else if (f.key) {
                hash_key(std::string_view(reinterpret_cast<const char*>(&c), 1));
            }
            return 1;
        case State::kEscape:
            if (c == 'u') {
                f.state = State::kHex;
                f.hex_left = 4;
                f.candidate = 0;
                return 1;
            }
            if (f.want_low) {
                return 0;
            }
            if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                c == 'r' || c == 't') {
                f.state = State::kChars;
                if (f.key) {
                    const char b = unescaped(c);
                    hash_key(std::string_view(&b, 1));
                }
                return 1;
            }
            return 0;
        case State::kHex: {
            if (!is_hex(c)) {
                return 0;
            }
            // Surrogates come in pairs, \uD800-\uDBFF then \uDC00-\uDFFF (strict parsers
            // refuse a lone one): decided by the first two digits, so no dead end is entered.
            const int digit = 4 - f.hex_left;
            const auto lower = static_cast<unsigned char>(c | 0x20);
            if (digit == 0) {
                f.surrogate = lower == 'd';
                if (f.want_low && !f.surrogate) {
                    return 0;
                }
            } else if (digit == 1 && f.surrogate) {
                const bool low = lower >= 'c' && lower <= 'f';
                const bool high = lower >= '8' && lower <= 'b';
                if (f.want_low ? !low : low) {
                    return 0;
                }
                f.surrogate = high;  // Now: a high surrogate, wanting its low half next.
                f.want_low = false;
            }
            f.candidate = f.candidate * 16 + (is_digit(c) ? c - '0' : lower - 'a' + 10);
            if (--f.hex_left == 0) {
                f.state = State::kChars;
                f.want_low = f.surrogate;
                f.surrogate = false;
                if (f.key) {
                    hash_key_unit(f);
                }
            }
            return 1;
        }
        default:
            return 0;
    }
}

namespace {

// Whether the interval from `lo` to `hi` (each end open or not) meets the node's range.
bool meets(const JsonSchema::Node& n, double lo, bool lo_open, double hi, bool hi_open) {
    const double l = std::max(lo, n.lo);
    const bool l_open = (lo == l && lo_open) || (n.lo == l && n.lo_open);
    const double h = std::min(hi, n.hi);
    const bool h_open = (hi == h && hi_open) || (n.hi == h && n.hi_open);
    return l < h || (l == h && !l_open && !h_open);
}

}  // namespace

bool JsonPrefix::number_reachable(const Frame& f) const {
    const JsonSchema::Node& n = schema_->node(f.node);
    if (!n.bounded()) {
        return true;
    }
    // Magnitudes [p, q) the prefix can still become, as one interval per count of integer
    // digits still to come; a negative number's are mirrored.
    auto fits = [&](double p, double q) {
        return f.negative ? meets(n, -q, true, -p, false) : meets(n, p, false, q, true);
    };
    if (f.pos == JsonSchema::kBoundedDigits &&
        (f.state == State::kInteger || f.state == State::kFraction)) {
        return number_in_range(f);  // No digit can come: the number must end as it is.
    }
    // Each value the prefix can still become is m / 10^e for a whole m: its digits so far
    // followed by `left` more (fewer are the same values with zeros after them), e the fraction
    // digits among them. A range narrower than that grid (a minimum of 9.999999999999995 and a
    // maximum of 10) must meet one of its points, not just the interval the prefix spans, or
    // the prefix could never end.
    const double inf = std::numeric_limits<double>::infinity();
    const int left = JsonSchema::kBoundedDigits - f.pos;
    const bool integer = f.kind == Kind::kInteger;
    const double first = f.digits * std::pow(10.0, left);
    const double last = (f.digits + 1) * std::pow(10.0, left) - 1;
    switch (f.state) {
        case State::kMinus:
            return fits(0, inf);
        case State::kZero:
            return integer ? n.grid_meets(f.negative, 0, 0, 0)
                           : n.grid_meets(f.negative, 0, std::pow(10.0, left) - 1, left);
        case State::kInteger: {
            // `more` of the digits left go before the point, the rest after it.
            for (int more = 0; more <= left; ++more) {
                const bool met = integer
                                     ? n.grid_meets(f.negative, f.digits * std::pow(10.0, more),
                                                    (f.digits + 1) * std::pow(10.0, more) - 1, 0)
                                     : n.grid_meets(f.negative, first, last, left - more);
                if (met) {
                    return true;
                }
            }
            return false;
        }
        case State::kDot:
        case State::kFraction:
            return n.grid_meets(f.negative, first, last, f.count + left);
        default:
            return false;
    }
}

bool JsonPrefix::number_in_range(const Frame& f) const {
    const JsonSchema::Node& n = schema_->node(f.node);
    if (!n.bounded()) {
        return true;
    }
    double value = f.digits / std::pow(10.0, f.count);
    value = f.negative ? -value : value;
    return meets(n, value, false, value, false);
}

int JsonPrefix::step_number(Frame& f, unsigned char c) {
    const bool integer = f.kind == Kind::kInteger;
    // A bounded number has no exponent and at most kBoundedDigits digits (json_schema.h).
    const bool bounded = schema_->node(f.node).bounded();
    auto digit = [&]() {
        if (bounded && f.pos == JsonSchema::kBoundedDigits) {
            return 0;
        }
        f.digits = f.digits * 10 + (c - '0');
        ++f.pos;
        if (f.state == State::kDot || f.state == State::kFraction) {
            ++f.count;
        }
        return 1;
    };
    switch (f.state) {
        case State::kMinus:
            if (!is_digit(c)) {
                return 0;
            }
            f.state = c == '0' ? State::kZero : State::kInteger;
            return digit() == 1 && number_reachable(f) ? 1 : 0;
        case State::kZero:
        case State::kInteger:
        case State::kFraction:
            if (is_digit(c) && f.state != State::kZero) {
                return digit() == 1 && number_reachable(f) ? 1 : 0;
            }
            if (c == '.' && f.state != State::kFraction && !integer &&
                !(bounded && f.pos == JsonSchema::kBoundedDigits)) {
                f.state = State::kDot;
                return number_reachable(f) ? 1 : 0;
            }
            if ((c == 'e' || c == 'E') && !integer && !bounded) {
                f.state = State::kExponent;
                return 1;
            }
            // The number ended: `c` is what follows it.
            return number_in_range(f) ? -1 : 0;
        case State::kDot:
            if (!is_digit(c)) {
                return 0;
            }
            if (digit() == 0) {
                return 0;
            }
            f.state = State::kFraction;
            return number_reachable(f) ? 1 : 0;
        case State::kExponent:
            if (c == '+' || c == '-') {
                f.state = State::kExponentSign;
                return 1;
            }
            [[fallthrough]];
        case State::kExponentSign:
            if (is_digit(c)) {
                f.state = State::kExponentDigits;
                f.candidate = c == '0' ? 0 : 1;
                return 1;
            }
            return 0;
        case State::kExponentDigits:
            if (!is_digit(c)) {
                return -1;
            }
            // Leading zeros are free; the others stop at kMaxExponentDigits.
            if (f.candidate > 0 || c != '0') {
                if (f.candidate == kMaxExponentDigits) {
                    return 0;
                }
                ++f.candidate;
            }
            return 1;
        default:
            return 0;
    }
}

int JsonPrefix::step_literal(Frame& f, unsigned char c) {
    // The literals are sorted (json_schema.h), so those that begin with the f.pos bytes written
    // are a range, [f.candidate, f.count), and those of them that go on with `c` a range within
    // it: a binary search a byte, however many values an enum lists. In a range a literal of
    // f.pos bytes, if any, comes first (the prefix of all the others).
    const std::vector<std::string>& literals = schema_->node(f.node).literals;
    const auto pos = static_cast<size_t>(f.pos);
    auto byte_at = [pos](const std::string& l) {
        return l.size() > pos ? static_cast<int>(static_cast<unsigned char>(l[pos])) : -1;
    };
    const auto begin = literals.begin() + f.candidate;
    const auto end = literals.begin() + f.count;
    const int want = c;
    const auto lo =
        std::partition_point(begin, end, [&](const std::string& l) { return byte_at(l) < want; });
    const auto hi =
        std::partition_point(lo, end, [&](const std::string& l) { return byte_at(l) == want; });
    if (lo == hi) {
        // No candidate takes `c`: the value ended before it if one is complete (a number such as
        // 1 among 1 and 12).
        return byte_at(*begin) < 0 ? -1 : 0;
    }
    // Only values whose own containers fit below kMaxDepth, with those around this one (depth_
    // less this value's slot): a deep value near the limit would make a reply nest past what
    // every JSON reader here takes. Looked through only that near the limit.
    const JsonSchema::Node& n = schema_->node(f.node);
    if (depth_ - 1 + n.max_literal_depth > kMaxDepth) {
        const auto first = static_cast<size_t>(lo - literals.begin());
        const auto last = static_cast<size_t>(hi - literals.begin());
        bool fits = false;
        for (size_t i = first; i < last && !fits; ++i) {
            fits = depth_ - 1 + n.literal_depths[i] <= kMaxDepth;
        }
        if (!fits) {
            return 0;
        }
    }
    f.candidate = static_cast<int32_t>(lo - literals.begin());
    f.count = static_cast<int32_t>(hi - literals.begin());
    ++f.pos;
    // Complete, and no other candidate goes on: the value ends here.
    if (hi - lo == 1 && lo->size() == pos + 1) {
        --depth_;
    }
    return 1;
}

}  // namespace edge::engine::sampling
