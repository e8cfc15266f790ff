#pragma once

// MoeBlock is the routed-expert half of a sparse MoE layer, shared by every architecture
// (Qwen3-MoE, GLM-4.5, DeepSeek-V3 / Kimi K2), and the place where expert parallelism happens.
// The architecture computes the normed input h of a layer (and adds its shared expert itself);
// MoeBlock::forward() then, on each of R ranks (engine/shard/rank_group.h) at once:
//   routing:  the rank's share of the tokens (contiguous rows [r*n/R, (r+1)*n/R)) through the
//             layer's router weight and ExpertRouter: top-k expert ids and combine weights;
//   dispatch: every (token, expert) assignment goes to a rank holding that expert in the current
//             ExpertPlacement (replicas taken in turn), grouped by destination; one count exchange
//             and one all-to-all through the rank's Communicator;
//   compute:  the received rows grouped by expert and run as ONE grouped pass, so an expert
//             chosen by several tokens is read once per step: with several tokens (batched
//             decode, prefill) one Backend::swiglu_batch over every expert with work (the CPU
//             runs each expert whole as one task); with one token all gate/up projections in
//             one matmul_batch, then all down projections in another;
//   combine:  results returned by a second all-to-all and added to x with the routing weights, per
//             token in top-k order. Deterministic for a given R and plan. Across R and plans, the
//             only difference is how many rows share a matmul call, so output matches R = 1 to
//             a few ulps (docs/sharding.md).
// Between steps, end_step() counts the step into the per-layer expert-load window and, every
// rebalance_interval_steps, all-reduces the window and plans a new placement
// (engine/shard/placement_planner.h) that begin_step() applies before the next step's first layer.
// In-process ranks share memory, so every rank can reach every expert's weights and a new plan
// moves no weights (docs/sharding.md says what a GPU rank would do). A device backend uploads an
// expert on first use, so begin_step() tells each rank backend (Backend::release_weights) which
// experts the new plan took off it; otherwise every GPU would keep every expert it ever held.
//
// Threading: driven by the model's one forward thread (begin_step, forward, end_step, set_plan,
// stats); the ranks' threads live inside. Lifetime: weights given to set_layer must outlive it,
// and the driver backend passed to create() too.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/backend.h"
#include "engine/cpu/router.h"
#include "engine/model/expert_placement.h"
#include "engine/shard/communicator.h"
#include "engine/shard/rank_group.h"
#include "engine/shard/shard_stats.h"
#include "engine/shard/sharding_config.h"

namespace edge::engine {

class WeightLoader;
struct LoadOptions;

// One SwiGLU feed-forward: down(silu(gate x) * up x).
struct SwiGlu {
    Weight gate;
    Weight up;
    Weight down;
};

// gate_proj, up_proj (inter x hidden) and down_proj (hidden x inter) under `prefix`, through
// weights.matrix_for(backend, ...).
Result<SwiGlu> load_swiglu(WeightLoader& weights, const Backend& backend, const std::string& prefix,
                           int64_t hidden, int64_t inter);

// The `count` routed experts `prefix`0. .. `prefix`(count-1). (load_swiglu each), loaded on up
// to `threads` threads at once: quantizing on load, requantizing FP8 and tiling take most of a
// quantized model's load, one expert at a time. The first failing expert's error (by index), as
// one thread would have met it.
Result<std::vector<SwiGlu>> load_experts(WeightLoader& weights, const Backend& backend,
                                         const std::string& prefix, int64_t count, int64_t hidden,
                                         int64_t inter, int threads);

// Threads to load with: LoadOptions::threads, or one per core for 0.
int load_threads(const LoadOptions& options);

// Scratch of swiglu_rows, kept by its caller between calls (it grows to the largest call).
struct SwiGluScratch {
    std::vector<float> gate, up, act;
};

// A dense SwiGLU over `rows` rows of `in` (gate.cols floats each) into `out` (down.rows floats
// each): the dense layers and shared experts of every architecture. Gate and up run as one batch.
void swiglu_rows(Backend& backend, const SwiGlu& m, const float* in, int64_t rows, float* out,
                 SwiGluScratch* scratch);

// Chooses the experts of one token from its router logits. Implementations are immutable and
// called concurrently from the ranks' threads.
class ExpertRouter {
public:
    virtual ~ExpertRouter() = default;
    // Floats of scratch route() needs.
    virtual int64_t scratch_floats() const = 0;
    // Writes top_k expert ids (best first, ties to the lower id) and their combine weights.
    virtual void route(const float* logits, int32_t* idx, float* weights,
                       float* scratch) const = 0;
};

// Qwen3-MoE: softmax over the experts, top-k, optionally renormalised to sum to 1.
std::unique_ptr<ExpertRouter> make_softmax_router(int32_t experts, int32_t top_k,
                                                  bool norm_topk_prob);
// DeepSeek-V3 / GLM-4.5: sigmoid, correction bias, group-limited top-k (engine/cpu/router.h).
// `bias` is copied (empty: none).
std::unique_ptr<ExpertRouter> make_sigmoid_group_router(const cpu::GroupRouterConfig& config,
                                                        std::vector<float> bias);

struct MoeShape {
    int64_t hidden = 0;  // Model width H (floats per token row).
    int64_t inter = 0;   // Width of one routed expert's FFN.
    int32_t experts = 0; // Routed experts per MoE layer (E).
    int32_t top_k = 0;   // Experts chosen per token (K).
    int32_t layers = 0;  // Decoder layers, dense ones included (they never reach the block).
};

// Makes one rank's backend when ranks > 1, from options holding the rank's share of the driver's
// threads and its device (rank r on device r).
using RankBackendFactory =
    std::function<Result<std::unique_ptr<Backend>>(const BackendOptions& options)>;

// Makes the group's `ranks` connected communicators, element r rank r's endpoint.
using CommunicatorFactory =
    std::function<Result<std::vector<std::unique_ptr<shard::Communicator>>>(int32_t ranks)>;

// `config`'s checks against a model of `layers` MoE layers with `experts` routed experts each
// (ranks, slots, the static plan), and the placement it gives: what MoeBlock::create starts
// from, and what `check-config` runs before a load. kInvalidArgument naming the setting.
Result<ExpertPlacement> plan_expert_placement(const shard::ShardingConfig& config, int32_t layers,
                                              int32_t experts);

class MoeBlock {
public:
    // kInvalidArgument for a bad shape or sharding config (ranks, slots, static plan);
    // kNotFound for an unknown communicator. Rank backends come from `make_rank_backend`, by
    // default create_backend() with the driver's name (tests pass their own to watch the ranks);
    // communicators from `make_communicators`, by default shard::create_communicators() of the
    // config's kind (tests pass their own to fail a collective).
    static Result<std::unique_ptr<MoeBlock>> create(const MoeShape& shape,
                                                    const shard::ShardingConfig& config,
                                                    Backend* driver,
                                                    RankBackendFactory make_rank_backend = {},
                                                    CommunicatorFactory make_communicators = {});
    ~MoeBlock();

    const MoeShape& shape() const { return shape_; }
    int32_t ranks() const { return static_cast<int32_t>(ranks_.size()); }

    // Registers MoE layer `layer`: its router weight ([experts, hidden]), router and the experts
    // (indexed by id, all `experts` of them).
    void set_layer(int32_t layer, Weight router, std::unique_ptr<ExpertRouter> route,
                   std::vector<SwiGlu> experts);

    // Applies a plan set by set_plan() or a rebalance; call before a step's first layer. Each rank
    // backend is told to release the experts the plan moved off that rank.
    void begin_step();
    // x[i] += sum_j w_ij * expert_ij(h[i]) for the n token rows of h and x ([n][hidden]).
    // `layer` must have been registered. Errors come from the communicator or a rank backend's
    // take_error() (a device rank whose arena is full), or are one rank's failure (an exception:
    // kInternal naming the rank), after which the communicators are aborted and every later
    // call fails with it. Every rank backend's error is taken whatever the step's outcome, so
    // none is left to fail a later step.
    [[nodiscard]] Status forward(int32_t layer, const float* h, int64_t n, float* x);
    // Counts the step; refreshes the load window and rebalances when due.
    [[nodiscard]] Status end_step();

    // A plan to apply at the next begin_step(). kInvalidArgument when its layers, experts or
    // ranks do not match this block.
    [[nodiscard]] Status set_plan(ExpertPlacement plan);
    const ExpertPlacement& placement() const { return placement_; }
    shard::ShardStats stats() const;

private:
    struct Layer;
    struct Rank;
    MoeBlock() = default;
    Status rank_forward(Rank& rk, const Layer& layer, int32_t li, const float* h, int64_t n,
                        float* x);
    // The one-rank form of rank_forward's dispatch, compute and combine (no records, no exchange).
    void local_compute(Rank& rk, const Layer& layer, int32_t li, const float* h, int64_t m,
                       const int32_t* idx, const float* w, float* x);
    // Runs every expert that rk.expert_begin gives rows, reading `in` and writing `out` by row.
    void run_experts(Rank& rk, const Layer& layer, const float* in, float* out);
    Status refresh_load(bool plan);
    // `ran` (a RankGroup::run result); a failure is also reported as a device fault
    // (report_device_fault): the aborted group fails every later step.
    static Status group_failed(Status ran);
    // Tells each rank backend which expert weights it holds under placement_ but not `next`.
    void release_moved_experts(const ExpertPlacement& next);

    MoeShape shape_;
    shard::ShardingConfig config_;
    Backend* driver_ = nullptr;
    std::vector<std::unique_ptr<Layer>> layers_;  // [layer]; null for dense layers.
    std::vector<std::unique_ptr<Rank>> ranks_;
    std::unique_ptr<shard::RankGroup> group_;
    ExpertPlacement placement_;
    std::optional<ExpertPlacement> pending_;
    int64_t steps_ = 0;
    int64_t bucket_steps_ = 1;
    int32_t bucket_ = 0;
    int64_t plans_applied_ = 0;
    int64_t rebalances_ = 0;
    std::vector<int64_t> load_;  // Last all-reduced window, [layer * experts + expert].
    double total_s_ = 0.0;
    int64_t calls_ = 0;
};

}  // namespace edge::engine
