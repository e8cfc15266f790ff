#include "engine/sampling/json_prefix.h"

#include <algorithm>
#include <string>

#include "common/fnv1a.h"
#include "engine/sampling/json_prefix_internal.h"

namespace edge::engine::sampling {
namespace {

// A character that stands for itself in a JSON string.
bool is_plain(unsigned char c) { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\'; }

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
    copy_state(other, false);
}

JsonPrefix::~JsonPrefix() = default;

JsonPrefix& JsonPrefix::operator=(const JsonPrefix& other) {
    if (this != &other) {
        copy_state(other);
        keys_ = other.keys_;
    }
    return *this;
}

void JsonPrefix::copy_state(const JsonPrefix& other, bool with_others) {
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
    if (with_others) {
        others_ = other.others_;
    } else {
        others_.clear();
    }
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
    // Braces (an aggregate): clang before 16 has no parenthesized aggregate init (P0960).
    keys_ = std::shared_ptr<const WrittenKey>(new WrittenKey{key_hash_, object, std::move(keys_)});
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

bool JsonPrefix::some_reading_takes(std::string_view bytes, bool markers_only) const {
    // take() over every reading is true when one of them, or a reading one forks, takes the
    // bytes: the same, without building the readings that follow.
    auto takes = [&](const JsonPrefix& reading) {
        JsonPrefix copy = reading.scratch();
        copy.markers_only_ = markers_only;
        std::vector<JsonPrefix> forks;
        return copy.read(bytes, &forks) || !forks.empty();
    };
    return takes(*this) || std::any_of(others_.begin(), others_.end(), takes);
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

}  // namespace edge::engine::sampling
