#pragma once

// The load-following placement planner, in the spirit of DeepSeek's EPLB: given each expert's
// measured load in each MoE layer (token assignments counted over a sliding window), it
//   1. hands the spare slots (ranks * slots_per_rank - experts) out as extra replicas, each to the
//      expert whose load per replica is currently the highest (a replicated expert's tokens are
//      split evenly over its replicas, so this lowers the heaviest item first);
//   2. packs the replicas onto ranks heaviest first, each onto the least-loaded rank that still
//      has a free slot and does not hold that expert yet (longest-processing-time greedy).
// Ties break by expert id then rank id, so the same load always gives the same plan; every rank
// can compute the plan itself from the all-reduced load, with nothing to broadcast.
// Free functions over caller-owned data; thread-safe.

#include <cstdint>
#include <span>

#include "common/result.h"
#include "engine/model/expert_placement.h"

namespace edge::engine::shard {

// load has layers * experts entries ([layer][expert]); layers with no load at all (dense layers,
// or nothing measured yet) get the contiguous layout. `replicas` false: every expert is placed
// once (step 1 skipped), whatever slots are free (slots_per_rank 0 in the config promises no
// replicas, though ceil(E / R) slots a rank leave some free when R does not divide E).
// kInvalidArgument when the slots cannot hold every expert or a load is negative.
Result<ExpertPlacement> plan_placement(std::span<const int64_t> load, int32_t layers,
                                       int32_t experts, int32_t ranks, int32_t slots_per_rank,
                                       bool replicas = true);

// Per-layer rank loads of `plan` under `load` (a replicated expert's load split evenly over its
// replicas): out[layer * ranks + rank]. `load` as above.
std::vector<double> rank_loads(const ExpertPlacement& plan, std::span<const int64_t> load);

// Imbalance of `plan` under `load`: the sum over layers of the busiest rank's load divided by
// the sum over layers of the mean rank load (each MoE layer waits for its slowest rank, so this
// is the step-time cost of imbalance). 1.0 is perfect; 1.0 also when there is no load.
double imbalance(const ExpertPlacement& plan, std::span<const int64_t> load);

}  // namespace edge::engine::shard
