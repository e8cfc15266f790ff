#include "engine/sampling/property_index.h"

#include <algorithm>
#include <numeric>

namespace edge::engine::sampling {

namespace {

// Ranges of names, or windows of property indices, up to this size are looked through rather
// than asked of the tree.
constexpr int32_t kScan = 64;

}  // namespace

PropertyIndex::PropertyIndex(std::span<const std::string_view> keys,
                             std::span<const int32_t> depths) {
    const size_t n = keys.size();
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0);
    // std::string_view compares as unsigned bytes (char_traits<char>), as narrow() does.
    std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
        return keys[static_cast<size_t>(a)] < keys[static_cast<size_t>(b)];
    });
    rank_.resize(n);
    for (size_t at = 0; at < n; ++at) {
        rank_[static_cast<size_t>(order_[at])] = static_cast<int32_t>(at);
    }
    offsets_.reserve(n + 1);
    for (const int32_t p : order_) {
        offsets_.push_back(bytes_.size());
        bytes_ += keys[static_cast<size_t>(p)];
    }
    offsets_.push_back(bytes_.size());
    for (const int32_t d : depths) {
        deepest_ = std::max(deepest_, d);
    }
    // Node i < n merges nodes 2i and 2i + 1; a node's size is the leaves below it.
    std::vector<size_t> sizes(2 * n, 0);
    for (size_t i = 2 * n; i-- > 1;) {
        sizes[i] = i >= n ? 1 : sizes[2 * i] + sizes[2 * i + 1];
    }
    tree_offsets_.assign(2 * n + 1, 0);
    for (size_t i = 0; i < 2 * n; ++i) {
        tree_offsets_[i + 1] = tree_offsets_[i] + sizes[i];
    }
    tree_.resize(tree_offsets_[2 * n]);
    for (size_t p = 0; p < n; ++p) {
        tree_[tree_offsets_[n + p]] = order_[p];
    }
    for (size_t i = n; i-- > 1;) {
        const auto* left = tree_.data() + tree_offsets_[2 * i];
        const auto* right = tree_.data() + tree_offsets_[2 * i + 1];
        std::merge(left, left + sizes[2 * i], right, right + sizes[2 * i + 1],
                   tree_.begin() + static_cast<std::ptrdiff_t>(tree_offsets_[i]));
    }
}

PropertyIndex::Range PropertyIndex::narrow(Range r, size_t pos, unsigned char c) const {
    // A name of exactly `pos` bytes sorts first (at most one: the names are distinct); the
    // others, from their byte at `pos` on, in order of that byte.
    int32_t lo = r.begin;
    if (lo < r.end && length(lo) == pos) {
        ++lo;
    }
    const int32_t hi = r.end;
    // A byte below the range's first or above its last (most a vocabulary pass asks about).
    if (lo >= hi || byte(lo, pos) > c || byte(hi - 1, pos) < c) {
        return {lo, lo};
    }
    // The first position whose byte is >= c, then the first whose byte is > c.
    int32_t first = lo;
    for (int32_t count = hi - lo; count > 0;) {
        const int32_t half = count / 2;
        if (byte(first + half, pos) < c) {
            first += half + 1;
            count -= half + 1;
        } else {
            count = half;
        }
    }
    int32_t last = first;
    for (int32_t count = hi - first; count > 0;) {
        const int32_t half = count / 2;
        if (byte(last + half, pos) <= c) {
            last += half + 1;
            count -= half + 1;
        } else {
            count = half;
        }
    }
    return {first, last};
}

int32_t PropertyIndex::exact(Range r, size_t pos) const {
    return !r.empty() && length(r.begin) == pos ? property(r.begin) : -1;
}

bool PropertyIndex::node_between(size_t node, int32_t after, int32_t last) const {
    const auto begin = tree_.begin() + static_cast<std::ptrdiff_t>(tree_offsets_[node]);
    const auto end = tree_.begin() + static_cast<std::ptrdiff_t>(tree_offsets_[node + 1]);
    const auto it = std::upper_bound(begin, end, after);
    return it != end && *it <= last;
}

bool PropertyIndex::any_between(Range r, int32_t after, int32_t last) const {
    if (r.empty() || after >= last) {
        return false;
    }
    if (after < 0 && last >= size() - 1) {
        return true;
    }
    // The shorter of the window and the range, looked through when short: a walk of a few
    // dozen steps beats the tree's dozens of binary-search steps.
    const int32_t window = last - after;
    const int32_t names = r.end - r.begin;
    if (std::min(window, names) <= kScan) {
        if (window <= names) {
            for (int32_t j = after + 1; j <= last; ++j) {
                const int32_t at = rank_[static_cast<size_t>(j)];
                if (at >= r.begin && at < r.end) {
                    return true;
                }
            }
            return false;
        }
        for (int32_t at = r.begin; at < r.end; ++at) {
            if (property(at) > after && property(at) <= last) {
                return true;
            }
        }
        return false;
    }
    // The iterative segment tree's walk: [l, r) climbs, taking the odd ends on its way.
    const auto n = static_cast<size_t>(size());
    for (size_t l = n + static_cast<size_t>(r.begin), h = n + static_cast<size_t>(r.end); l < h;
         l /= 2, h /= 2) {
        if ((l & 1) != 0 && node_between(l++, after, last)) {
            return true;
        }
        if ((h & 1) != 0 && node_between(--h, after, last)) {
            return true;
        }
    }
    return false;
}

}  // namespace edge::engine::sampling
