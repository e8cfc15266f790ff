#pragma once

// PropertyIndex holds an object's listed property names (JsonSchema::Property::key: a JSON
// string's contents in canonical encoding, the bytes JsonPrefix compares a key's against) in
// bytewise order, so that the names a key written so far may still become are a range of that
// order: each byte of the key narrows the range by binary search instead of looking through
// every name. Whether one of the range's properties may still come (those after the last one
// written, up to the next required one) is a walk through the range or through those properties,
// whichever is short, or else asked of a merge-sort tree over the range's property indices: a
// few binary searches. With 1024 names a vocabulary pass inside a key took 13-17 ms walking
// them all, 2.6-5.4 ms so (bench_sampler's wide_key rows).
//
// Threading: immutable after construction (part of a compiled JsonSchema).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace edge::engine::sampling {

class PropertyIndex {
  public:
    // Positions [begin, end) in the names' bytewise order.
    struct Range {
        int32_t begin = 0;
        int32_t end = 0;
        bool empty() const { return begin >= end; }
    };

    PropertyIndex() = default;
    // `keys`: the object's property names in schema order (the property indices), distinct;
    // `depths`: each one's node's min_depth (JsonSchema::Node), the same length.
    PropertyIndex(std::span<const std::string_view> keys, std::span<const int32_t> depths);

    int32_t size() const { return static_cast<int32_t>(order_.size()); }
    Range all() const { return {0, size()}; }
    // Of `r`, whose names all begin with the same `pos` bytes, those whose byte at `pos` is `c`.
    Range narrow(Range r, size_t pos, unsigned char c) const;
    // Of `r` (as for narrow()), the property whose name is exactly those `pos` bytes; -1: none.
    int32_t exact(Range r, size_t pos) const;
    // The property index of the name at `at` (a position in bytewise order).
    int32_t property(int32_t at) const { return order_[static_cast<size_t>(at)]; }
    // Whether a name of `r` is a property's with an index in (after, last].
    bool any_between(Range r, int32_t after, int32_t last) const;
    // The largest of `depths`: where an object's depth plus this is within the nesting allowed,
    // every one of its properties fits (0 without properties).
    int32_t deepest() const { return deepest_; }

  private:
    size_t length(int32_t at) const {
        return offsets_[static_cast<size_t>(at) + 1] - offsets_[static_cast<size_t>(at)];
    }
    unsigned char byte(int32_t at, size_t pos) const {
        return static_cast<unsigned char>(bytes_[offsets_[static_cast<size_t>(at)] + pos]);
    }
    // Whether the sorted property indices of tree node `node` hold one in (after, last].
    bool node_between(size_t node, int32_t after, int32_t last) const;

    std::string bytes_;            // The names, one after another, in bytewise order.
    std::vector<size_t> offsets_;  // Where each begins in bytes_, and the end (size() + 1).
    std::vector<int32_t> order_;   // By position: the property index.
    std::vector<int32_t> rank_;    // By property index: the position.
    // Merge-sort tree over positions, laid out as an iterative segment tree of 2 * size() nodes
    // (leaf size() + p holds position p): node i's property indices, ascending, are
    // tree_[tree_offsets_[i], tree_offsets_[i + 1]).
    std::vector<int32_t> tree_;
    std::vector<size_t> tree_offsets_;
    int32_t deepest_ = 0;
};

}  // namespace edge::engine::sampling
