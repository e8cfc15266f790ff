#pragma once

// ShardingConfig: how a model's MoE layers are spread over expert-parallel ranks
// (docs/sharding.md). Part of EngineConfig (engine.h; `engine.sharding` in the daemon's YAML)
// and of LoadOptions (loader.h); a plain value type.

#include <cstdint>
#include <string>

namespace edge::engine::shard {

struct ShardingConfig {
    // Expert-parallel ranks R. 1: no sharding (one rank computes every expert).
    int32_t ranks = 1;
    // Expert slots per rank per MoE layer. 0: ceil(experts / ranks) and no replicas (the
    // rebalancer places every expert once, leaving empty the slots that remain when ranks does
    // not divide experts), or with a static plan its widest rank's count, whose spare slots
    // keep holding replicas. Set, the slots beyond the experts (ranks x slots - experts) hold
    // replicas of the hottest experts.
    int32_t slots_per_rank = 0;
    // Engine steps (forward calls) between placement rebalances. 0: never rebalance (the plan
    // stays the static plan or the contiguous one).
    int32_t rebalance_interval_steps = 0;
    // Steps over which expert load is counted (sliding window, kept as 4 buckets of a quarter
    // each).
    int32_t load_window_steps = 1024;
    // Static plan, the same for every MoE layer: ranks separated by ';', each a list of expert
    // ids or ranges "a-b", e.g. "0-31;32-63". Empty: contiguous blocks of expert ids.
    std::string static_plan;
    // Communicator implementation (communicator.h): "in_process".
    std::string communicator = "in_process";

    bool operator==(const ShardingConfig&) const = default;
};

}  // namespace edge::engine::shard
