// JsonPrefix's argument pairs (ArgumentPairs): the markers around each key and value, the text
// between them, and the JSON that text stands for, fed to the automaton (json_prefix.h).

#include <algorithm>
#include <string>
#include <string_view>

#include "engine/sampling/json_prefix.h"

namespace edge::engine::sampling {
namespace {

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

}  // namespace

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

}  // namespace edge::engine::sampling
