#pragma once

// ShardStats: what the sharded MoE block (engine/model/moe_block.h) reports about expert-parallel
// sharding: plan changes, per-expert load over the window, the current plan's imbalance, work per
// rank and the time per phase. A plain value, copied out between steps (CausalLM::shard_stats()),
// for benchmarks and for the daemon to turn into metrics.

#include <cstdint>
#include <vector>

namespace edge::engine::shard {

// Time spent in each phase, seconds summed over calls; per phase the busiest rank's sum.
struct MoePhaseTimes {
    double routing_s = 0.0;   // Router matmul and top-k.
    double dispatch_s = 0.0;  // Grouping by rank, count exchange, all-to-all out.
    double compute_s = 0.0;   // Grouping by expert and the grouped expert pass.
    double combine_s = 0.0;   // All-to-all back and the weighted sum into x.
    double total_s = 0.0;     // Wall time of forward() calls as the driver saw it.
    int64_t calls = 0;        // forward() calls (MoE layers x steps).
};

// What the sharded block exports (the daemon may turn it into metrics).
struct ShardStats {
    int32_t ranks = 1;              // R.
    int64_t steps = 0;              // end_step() calls.
    int64_t plans_applied = 0;      // Placements applied after the first.
    int64_t rebalances = 0;         // Plans computed from measured load.
    int64_t extra_replicas = 0;     // Replica copies beyond one per expert in the current plan.
    int64_t window_steps = 0;       // Steps the load window covers when full.
    // Assignments per [layer * experts + expert] over the window, summed over ranks, as of the
    // last refresh (every quarter window).
    std::vector<int64_t> expert_load;
    // Imbalance of the current plan under expert_load (placement_planner.h; 1.0 is perfect).
    double imbalance = 1.0;
    // Expert rows each rank computed since creation ([rank]).
    std::vector<int64_t> rank_rows;
    // Expert passes since creation: one for each expert given rows in one MoE layer's forward,
    // summed over layers and ranks. Each pass reads that expert's weights once, however many
    // tokens it serves, so passes per step say how many expert bytes a batched step reads.
    int64_t expert_passes = 0;
    // Tokens routed to each expert since creation, summed over layers and ranks ([expert]).
    std::vector<int64_t> expert_tokens;
    MoePhaseTimes times;
};

}  // namespace edge::engine::shard
