#pragma once

// ServingStats is a snapshot of what one served model's scheduler has done and holds, per tenant
// and overall, for the daemon's Prometheus metrics: queue and running counts, tokens, prefix-cache
// queries and hits, admission rejections, and latency histograms (queue time, time to first
// token, inter-token, end to end). LatencyHistogram has fixed bucket bounds (seconds) shared by
// every histogram, so the daemon renders them without configuration.
//
// Threading: plain values; the scheduler fills a copy under its own lock.

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace edge::engine {

class LatencyHistogram {
public:
    // Upper bounds of the buckets, seconds (a last +Inf bucket is implied). Up to 10 minutes:
    // a long reply (thousands of tokens of reasoning) takes minutes end to end, and a p99 past
    // the last bound reads as +Inf.
    static constexpr std::array<double, 18> kBounds = {0.001, 0.0025, 0.005, 0.01,  0.025, 0.05,
                                                       0.1,   0.25,   0.5,   1.0,   2.5,   5.0,
                                                       10.0,  30.0,   60.0,  120.0, 300.0, 600.0};

    void observe(double seconds) {
        size_t i = 0;
        while (i < kBounds.size() && seconds > kBounds[i]) {
            ++i;
        }
        ++counts_[i];
        ++count_;
        sum_ += seconds;
    }
    // Observations in bucket i (not cumulative); i == kBounds.size() is the +Inf bucket.
    uint64_t bucket(size_t i) const { return counts_[i]; }
    uint64_t count() const { return count_; }
    double sum() const { return sum_; }
    // The smallest bucket bound at or above quantile q (0..1) of the observations; +inf past
    // the last bound, 0 when empty.
    double quantile_bound(double q) const;

private:
    std::array<uint64_t, kBounds.size() + 1> counts_{};
    uint64_t count_ = 0;
    double sum_ = 0.0;
};

struct TenantServingStats {
    int64_t queued = 0;              // Requests waiting for admission now.
    int64_t running = 0;             // Requests in the running batch now.
    int64_t prompt_tokens = 0;       // Prompt tokens of finished requests.
    int64_t generated_tokens = 0;    // Tokens generated (streamed), counted as they are produced.
    int64_t prefix_query_tokens = 0; // Prompt tokens looked up in the prefix cache.
    int64_t prefix_hit_tokens = 0;   // Of those, tokens found cached.
    int64_t rejected_queue_full = 0; // submit() refusals: the tenant's queue was full...
    int64_t rejected_model_queue_full = 0;  // ...the model's whole queue was full...
    int64_t rejected_queue_wait = 0;        // ...the estimated queue wait passed the limit.
    int64_t preemptions = 0;         // Times its sequences were preempted.
    int64_t fair_preemptions = 0;    // Of those, to make room for a tenant below its share.
    LatencyHistogram queue_time;     // Submit to first admission, seconds.
    LatencyHistogram ttft;           // Submit to first generated token, seconds.
    LatencyHistogram inter_token;    // Between consecutive generated tokens, seconds.
    LatencyHistogram end_to_end;     // Submit to finish, seconds.
};

struct ServingStats {
    std::string model;                  // Served name.
    double kv_use = 0.0;                // Referenced KV blocks over all blocks, 0..1.
    int64_t kv_blocks_total = 0;        // Blocks the KV budget holds.
    int64_t kv_blocks_used = 0;         // Blocks referenced by running sequences.
    int64_t kv_blocks_cached = 0;       // Unreferenced blocks kept for the prefix cache.
    int64_t kv_budget_bytes = 0;        // Configured KV memory budget, bytes.
    int64_t kv_swap_bytes = 0;          // Host memory holding preempted sequences' KV now.
    // Positions computed again after preemptions dropped them unsaved (SchedulerStats).
    int64_t preempt_recompute_tokens = 0;
    int64_t steps = 0;                  // Engine iterations run.
    int64_t layers_run = 0;             // Decoder layers run (CausalLM::layers_run; live).
    int64_t batch_sequences = 0;        // Sequences in the running batch now.
    int64_t queued = 0;                 // Requests waiting for admission now (all tenants).
    // Tokens routed to each MoE expert since load, summed over layers ([expert]); empty for a
    // model without a sharded MoE block.
    std::vector<int64_t> expert_tokens;
    std::map<std::string, TenantServingStats> tenants;  // By tenant name.
};

}  // namespace edge::engine
