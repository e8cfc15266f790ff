#pragma once

// ExpertPlacement says which rank holds each (layer, expert). The forward pass computes only the
// experts placed on its own rank; the sharding issue fills the map from measured load and moves
// the others' tokens by all-to-all. Today every expert sits on rank 0.
//
// Threading: immutable after construction; safe to share.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace edge::engine {

class ExpertPlacement {
public:
    // Every expert of every layer on rank 0, which is also the local rank.
    static ExpertPlacement single_rank(int32_t layers, int32_t experts);

    int32_t local_rank() const { return local_rank_; }
    int32_t ranks() const { return ranks_; }
    int32_t rank_of(int32_t layer, int32_t expert) const {
        return rank_[static_cast<size_t>(layer) * experts_ + expert];
    }
    bool is_local(int32_t layer, int32_t expert) const {
        return rank_of(layer, expert) == local_rank_;
    }

private:
    int32_t experts_ = 0;
    int32_t ranks_ = 1;
    int32_t local_rank_ = 0;
    std::vector<int32_t> rank_;  // [layer * experts + expert].
};

}  // namespace edge::engine
