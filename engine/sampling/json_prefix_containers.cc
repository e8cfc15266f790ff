// JsonPrefix's containers: a byte of the JSON text given to the frame on top (json_prefix.h), and
// the steps of objects (listed properties in the schema's order, none skipped past a required
// one; free keys, each written once) and arrays (item counts).

#include <algorithm>

#include "common/fnv1a.h"
#include "engine/sampling/json_prefix.h"
#include "engine/sampling/json_prefix_internal.h"

namespace edge::engine::sampling {

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

}  // namespace edge::engine::sampling
