#pragma once

// ExpertPlacement is a plan that says which ranks hold each (MoE layer, routed expert): every rank
// has `slots_per_rank` expert slots per layer, every expert sits in at least one slot, and the
// spare slots (ranks * slots_per_rank - experts per layer) may hold extra replicas of hot experts.
// A token routed to a replicated expert is computed by one of its replicas (sharded_moe.h picks
// which, deterministically). Plans come from contiguous() (the default: rank r holds a contiguous
// block of expert ids), parse() (a static plan written in the config) or the load-following
// planner (engine/shard/placement_planner.h). Validation of untrusted input (parse, from_slots)
// yields kInvalidArgument naming what is wrong.
//
// Threading: immutable after construction; safe to share and copy.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace edge::engine {

class ExpertPlacement {
public:
    ExpertPlacement() = default;

    // Every expert of every layer on the single rank 0 (slots_per_rank = experts).
    static ExpertPlacement single_rank(int32_t layers, int32_t experts);

    // Rank r holds experts [r * E / R, (r + 1) * E / R) of every layer, no replicas.
    // slots_per_rank 0 means ceil(E / R). kInvalidArgument when the slots cannot hold E experts.
    static Result<ExpertPlacement> contiguous(int32_t layers, int32_t experts, int32_t ranks,
                                              int32_t slots_per_rank);

    // From explicit slots: slots[layer][rank] lists the experts rank holds in that layer.
    // kInvalidArgument for an id out of range, an expert held nowhere or twice on one rank, a
    // rank over its slots, or wrong dimensions.
    static Result<ExpertPlacement> from_slots(
        int32_t layers, int32_t experts, int32_t ranks, int32_t slots_per_rank,
        const std::vector<std::vector<std::vector<int32_t>>>& slots);

    // A static plan applied to every layer: ranks separated by ';', each a comma-separated list
    // of expert ids or inclusive ranges "a-b", e.g. "0-3,7;4-6,7" (expert 7 on both ranks).
    // Whitespace around ids, items and ranks is ignored. Every rank lists at least one expert,
    // and none twice; an error names the rank and the 1-based character where the problem is.
    static Result<ExpertPlacement> parse(std::string_view spec, int32_t layers, int32_t experts,
                                         int32_t ranks, int32_t slots_per_rank);

    int32_t layers() const { return layers_; }
    int32_t experts() const { return experts_; }
    int32_t ranks() const { return ranks_; }
    int32_t slots_per_rank() const { return slots_per_rank_; }

    // Ranks holding `expert` in `layer`, ascending; never empty for a valid plan.
    std::span<const int32_t> replicas(int32_t layer, int32_t expert) const {
        return replicas_[static_cast<size_t>(layer) * experts_ + expert];
    }
    // Experts `rank` holds in `layer`, ascending.
    std::span<const int32_t> experts_on(int32_t layer, int32_t rank) const {
        return on_rank_[static_cast<size_t>(layer) * ranks_ + rank];
    }
    bool holds(int32_t layer, int32_t expert, int32_t rank) const;
    // Copies beyond the first, summed over layers and experts.
    int64_t extra_replicas() const;
    // The plan as text, one line per layer: "layer L: 0-3,7 | 4-7" (for logs and tests).
    std::string describe() const;

    friend bool operator==(const ExpertPlacement& a, const ExpertPlacement& b) {
        return a.layers_ == b.layers_ && a.experts_ == b.experts_ && a.ranks_ == b.ranks_ &&
               a.slots_per_rank_ == b.slots_per_rank_ && a.on_rank_ == b.on_rank_;
    }

private:
    int32_t layers_ = 0;
    int32_t experts_ = 0;
    int32_t ranks_ = 1;
    int32_t slots_per_rank_ = 0;
    std::vector<std::vector<int32_t>> replicas_;  // [layer * experts + expert] -> ranks.
    std::vector<std::vector<int32_t>> on_rank_;   // [layer * ranks + rank] -> experts.
};

}  // namespace edge::engine
