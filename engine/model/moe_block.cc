#include "engine/model/moe_block.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/check.h"
#include "common/log.h"
#include "engine/cpu/ops.h"
#include "engine/model/loader.h"
#include "engine/model/weight_loader.h"
#include "engine/shard/placement_planner.h"

namespace edge::engine {
namespace {

using SteadyClock = std::chrono::steady_clock;

double since(SteadyClock::time_point t0) {
    return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// Load is counted in this many buckets; the window slides a bucket at a time.
constexpr int32_t kBuckets = 4;

class SoftmaxRouter final : public ExpertRouter {
public:
    SoftmaxRouter(int32_t experts, int32_t top_k, bool norm)
        : experts_(experts), top_k_(top_k), norm_(norm) {}
    int64_t scratch_floats() const override { return experts_; }
    void route(const float* logits, int32_t* top, float* weights, float* p) const override {
        std::copy(logits, logits + experts_, p);
        cpu::softmax(p, experts_);
        // Top-k by probability, ties to the lower expert index.
        for (int32_t j = 0; j < top_k_; ++j) {
            int32_t best = -1;
            for (int32_t e = 0; e < experts_; ++e) {
                bool taken = false;
                for (int32_t t = 0; t < j; ++t) {
                    taken = taken || top[t] == e;
                }
                if (!taken && (best < 0 || p[e] > p[best])) {
                    best = e;
                }
            }
            top[j] = best;
        }
        float sum = 0.0f;
        for (int32_t j = 0; j < top_k_; ++j) {
            sum += p[top[j]];
        }
        for (int32_t j = 0; j < top_k_; ++j) {
            weights[j] = norm_ ? p[top[j]] / sum : p[top[j]];
        }
    }

private:
    int32_t experts_;
    int32_t top_k_;
    bool norm_;
};

class SigmoidGroupRouter final : public ExpertRouter {
public:
    SigmoidGroupRouter(const cpu::GroupRouterConfig& c, std::vector<float> bias)
        : c_(c), bias_(std::move(bias)) {}
    int64_t scratch_floats() const override { return 2 * c_.experts + c_.n_group; }
    void route(const float* logits, int32_t* idx, float* weights, float* scratch) const override {
        cpu::route_sigmoid_grouped(logits, bias_.empty() ? nullptr : bias_.data(), c_, idx,
                                   weights, scratch);
    }

private:
    cpu::GroupRouterConfig c_;
    std::vector<float> bias_;
};

// A communicator's error as the block reports it. A collective that cannot get memory (NCCL's
// staging and gather buffers on a full device) answers kResourceExhausted, and hands that code to
// every rank; out of a model's forward() it would read as a full KV cache (CausalLM::forward), and
// the scheduler would preempt sequences, which frees none of the memory the communicator needs.
// So it is the server's capacity, kUnavailable, whichever communicator ran.
Status communicator_status(Status s) {
    if (s.code() == StatusCode::kResourceExhausted) {
        return unavailable_error("communicator out of memory: " + s.message());
    }
    return s;
}

template <typename T>
T* grow(std::vector<T>& v, size_t n) {
    if (v.size() < n) {
        v.resize(n);
    }
    return v.data();
}

}  // namespace

std::unique_ptr<ExpertRouter> make_softmax_router(int32_t experts, int32_t top_k,
                                                  bool norm_topk_prob) {
    return std::make_unique<SoftmaxRouter>(experts, top_k, norm_topk_prob);
}

std::unique_ptr<ExpertRouter> make_sigmoid_group_router(const cpu::GroupRouterConfig& config,
                                                        std::vector<float> bias) {
    return std::make_unique<SigmoidGroupRouter>(config, std::move(bias));
}

struct MoeBlock::Layer {
    Weight router;
    std::unique_ptr<ExpertRouter> route;
    std::vector<SwiGlu> experts;
};

// One rank's backend, communicator, scratch, load window and timers. Touched only by that rank's
// thread during forward(), by the driver between steps.
struct MoeBlock::Rank {
    int32_t id = 0;
    Backend* backend = nullptr;
    std::unique_ptr<Backend> own_backend;
    std::unique_ptr<shard::Communicator> comm;
    Status status;

    std::vector<float> logits, route_scratch, topk_w;
    std::vector<int32_t> topk_idx, dest, slot, turn;
    std::vector<int64_t> send_rows, send_bytes, recv_bytes, back_send, back_recv, row_begin;
    std::vector<unsigned char> send, recv;
    std::vector<float> in, out, back, ret;
    std::vector<int32_t> row_of, expert_begin, fill;
    std::vector<MatmulJob> jobs;
    std::vector<SwiGluJob> swiglu_jobs;

    std::vector<int64_t> window;  // [bucket][layer * experts + expert].
    std::vector<int64_t> load;    // Window summed, then all-reduced.
    int64_t rows_computed = 0;
    int64_t expert_passes = 0;    // ShardStats::expert_passes, this rank's.
    std::vector<int64_t> routed;  // Tokens this rank routed to each expert, [expert], all layers.
    shard::MoePhaseTimes times;
};

MoeBlock::~MoeBlock() = default;

Result<ExpertPlacement> plan_expert_placement(const shard::ShardingConfig& config, int32_t layers,
                                              int32_t experts) {
    if (config.ranks < 1 || config.ranks > 256) {
        return invalid_argument_error("sharding: ranks " + std::to_string(config.ranks) +
                                      " is outside [1, 256]");
    }
    if (config.ranks > experts) {
        return invalid_argument_error("sharding: ranks " + std::to_string(config.ranks) +
                                      " exceeds the model's " + std::to_string(experts) +
                                      " routed experts");
    }
    if (config.slots_per_rank < 0 || config.rebalance_interval_steps < 0 ||
        config.load_window_steps < 1) {
        return invalid_argument_error(
            "sharding: slots_per_rank and rebalance_interval_steps must be >= 0 and "
            "load_window_steps >= 1");
    }
    Result<ExpertPlacement> placement =
        config.static_plan.empty()
            ? ExpertPlacement::contiguous(layers, experts, config.ranks, config.slots_per_rank)
            : ExpertPlacement::parse(config.static_plan, layers, experts, config.ranks,
                                     config.slots_per_rank);
    if (!placement.ok()) {
        return placement.status().with_context("sharding");
    }
    return placement;
}

Result<std::unique_ptr<MoeBlock>> MoeBlock::create(const MoeShape& shape,
                                                   const shard::ShardingConfig& config,
                                                   Backend* driver,
                                                   RankBackendFactory make_rank_backend,
                                                   CommunicatorFactory make_communicators) {
    if (shape.hidden < 1 || shape.inter < 1 || shape.experts < 1 || shape.top_k < 1 ||
        shape.top_k > shape.experts || shape.layers < 1 || driver == nullptr) {
        return invalid_argument_error("moe block: bad shape (hidden " +
                                      std::to_string(shape.hidden) + ", experts " +
                                      std::to_string(shape.experts) + ", top_k " +
                                      std::to_string(shape.top_k) + ")");
    }
    // Per (layer, expert) the block keeps load windows and placement: the largest open models
    // have ~24 k pairs (Kimi K2: 61 x 384). A config whose product is far beyond would allocate
    // gigabytes here before any layer's tensors are read.
    constexpr int64_t kMaxLayerExperts = int64_t{1} << 20;
    if (int64_t{shape.layers} * shape.experts > kMaxLayerExperts) {
        return invalid_argument_error("moe block: " + std::to_string(shape.layers) + " layers x " +
                                      std::to_string(shape.experts) + " routed experts exceeds " +
                                      std::to_string(kMaxLayerExperts) + " (layer, expert) pairs");
    }
    auto block = std::unique_ptr<MoeBlock>(new MoeBlock());
    block->shape_ = shape;
    block->config_ = config;
    block->driver_ = driver;
    block->layers_.resize(static_cast<size_t>(shape.layers));
    EDGE_ASSIGN_OR_RETURN(block->placement_,
                          plan_expert_placement(config, shape.layers, shape.experts));
    EDGE_ASSIGN_OR_RETURN(auto comms, make_communicators ? make_communicators(config.ranks)
                                                         : shard::create_communicators(
                                                               config.communicator, config.ranks));
    if (comms.size() != static_cast<size_t>(config.ranks)) {
        return internal_error("moe block: " + std::to_string(comms.size()) + " communicators for " +
                              std::to_string(config.ranks) + " ranks");
    }
    const size_t cells = static_cast<size_t>(shape.layers) * static_cast<size_t>(shape.experts);
    for (int32_t r = 0; r < config.ranks; ++r) {
        auto rank = std::make_unique<Rank>();
        rank->id = r;
        rank->comm = std::move(comms[r]);
        if (config.ranks == 1) {
            rank->backend = driver;
        } else {
            // Each rank gets its share of the driver's threads and, on a device backend, its
            // own device (rank r on GPU r; the CPU ignores it).
            BackendOptions bo;
            bo.threads = std::max(1, driver->threads() / config.ranks);
            bo.device = r;
            bo.activation_precision = driver->activation_precision();
            bo.cpu_kernels = driver->cpu_kernels();
            if (make_rank_backend) {
                EDGE_ASSIGN_OR_RETURN(rank->own_backend, make_rank_backend(bo));
            } else {
                EDGE_ASSIGN_OR_RETURN(rank->own_backend, create_backend(driver->name(), bo));
            }
            rank->backend = rank->own_backend.get();
        }
        rank->window.assign(cells * kBuckets, 0);
        rank->routed.assign(static_cast<size_t>(shape.experts), 0);
        rank->load.assign(cells, 0);
        block->ranks_.push_back(std::move(rank));
    }
    std::vector<shard::Communicator*> endpoints;
    for (const auto& rk : block->ranks_) {
        endpoints.push_back(rk->comm.get());
    }
    block->group_ = std::make_unique<shard::RankGroup>(std::move(endpoints));
    block->bucket_steps_ = std::max<int64_t>(1, config.load_window_steps / kBuckets);
    block->load_.assign(cells, 0);
    return block;
}

void MoeBlock::set_layer(int32_t layer, Weight router, std::unique_ptr<ExpertRouter> route,
                         std::vector<SwiGlu> experts) {
    EDGE_CHECK(layer >= 0 && layer < shape_.layers, "moe block: layer out of range");
    EDGE_CHECK(static_cast<int32_t>(experts.size()) == shape_.experts,
               "moe block: wrong number of experts");
    auto l = std::make_unique<Layer>();
    l->router = router;
    l->route = std::move(route);
    l->experts = std::move(experts);
    layers_[layer] = std::move(l);
}

void MoeBlock::begin_step() {
    if (pending_) {
        ExpertPlacement next = std::move(*pending_);
        pending_.reset();
        release_moved_experts(next);
        placement_ = std::move(next);
        ++plans_applied_;
    }
}

void MoeBlock::release_moved_experts(const ExpertPlacement& next) {
    if (ranks() == 1) {
        // The one rank holds every expert under any plan (and its backend is the driver's).
        return;
    }
    std::unordered_set<const void*> kept;
    std::vector<const Weight*> gone;
    for (const auto& rk : ranks_) {
        // Backends key what they keep by the host data, and one buffer may back several weights
        // (tied or deduplicated tensors): a weight goes only when nothing the rank still runs
        // under `next` (its routers, its experts in any layer) reads the same data.
        kept.clear();
        gone.clear();
        for (int32_t li = 0; li < shape_.layers; ++li) {
            const Layer* layer = layers_[li].get();
            if (layer == nullptr) {
                continue;
            }
            kept.insert(layer->router.data);
            for (int32_t e : next.experts_on(li, rk->id)) {
                const SwiGlu& s = layer->experts[e];
                kept.insert({s.gate.data, s.up.data, s.down.data});
            }
        }
        for (int32_t li = 0; li < shape_.layers; ++li) {
            const Layer* layer = layers_[li].get();
            if (layer == nullptr) {
                continue;
            }
            for (int32_t e : placement_.experts_on(li, rk->id)) {
                if (next.holds(li, e, rk->id)) {
                    continue;
                }
                const SwiGlu& s = layer->experts[e];
                for (const Weight* w : {&s.gate, &s.up, &s.down}) {
                    // Inserting into `kept` also names a shared buffer only once.
                    if (kept.insert(w->data).second) {
                        gone.push_back(w);
                    }
                }
            }
        }
        if (!gone.empty()) {
            rk->backend->release_weights(gone);
        }
    }
}

Status MoeBlock::set_plan(ExpertPlacement plan) {
    if (plan.layers() != shape_.layers || plan.experts() != shape_.experts ||
        plan.ranks() != ranks()) {
        return invalid_argument_error(
            "moe block: plan for " + std::to_string(plan.layers()) + " layers x " +
            std::to_string(plan.experts()) + " experts on " + std::to_string(plan.ranks()) +
            " ranks does not fit " + std::to_string(shape_.layers) + " x " +
            std::to_string(shape_.experts) + " on " + std::to_string(ranks()));
    }
    pending_ = std::move(plan);
    return ok_status();
}

Status MoeBlock::group_failed(Status ran) {
    if (!ran.ok()) {
        // The group's communicators are aborted for good: every later step of this model fails.
        // Reported as a device fault, so the daemon stops taking traffic (readyz, gossip
        // draining) and exits for a restart rather than answering errors from then on.
        report_device_fault(ran.with_context("expert-parallel rank group"));
    }
    return ran;
}

Status MoeBlock::forward(int32_t li, const float* h, int64_t n, float* x) {
    EDGE_CHECK(li >= 0 && li < shape_.layers && layers_[li] != nullptr,
               "moe block: layer not registered");
    const auto t0 = SteadyClock::now();
    const Layer& layer = *layers_[li];
    // Errors of the collectives reach every rank alike and leave the communicators usable, so
    // they stay in rk.status; what run() returns is one rank's failure (an exception, such as
    // std::bad_alloc growing a buffer), after which the communicators are aborted for good.
    const Status ran = group_->run([&](int32_t r) {
        Rank& rk = *ranks_[r];
        rk.status = rank_forward(rk, layer, li, h, n, x);
    });
    total_s_ += since(t0);
    ++calls_;
    // The step's error: the group's failure, else a rank's collective error, else a rank
    // backend's call error. A rank whose backend failed a call (a full device arena) still took
    // part in every exchange, so no peer was left waiting; its rows are NaN, and the step fails
    // here. Every rank backend's error is taken even when the step failed for another reason:
    // only the driver's is cleared at the start of a forward, and a collective error leaves the
    // communicators usable, so one left behind would fail the next, healthy step.
    Status failed = group_failed(ran);
    for (const auto& rk : ranks_) {
        if (failed.ok()) {
            failed = rk->status;
        }
    }
    for (const auto& rk : ranks_) {
        Status s = rk->backend->take_error();
        if (failed.ok()) {
            failed = std::move(s);
        }
    }
    return failed;
}

Status MoeBlock::rank_forward(Rank& rk, const Layer& layer, int32_t li, const float* h,
                              int64_t n, float* x) {
    const int64_t H = shape_.hidden;
    const int32_t E = shape_.experts;
    const int32_t K = shape_.top_k;
    const auto R = static_cast<int32_t>(ranks_.size());
    const int32_t me = rk.id;
    const int64_t b = n * me / R;
    const int64_t m = n * (me + 1) / R - b;
    // A record is the expert id then the token's H input floats.
    const int64_t rec_bytes = static_cast<int64_t>(sizeof(int32_t)) + H * 4;

    // Routing: this rank's rows through the router, top-k per token, counted into the window.
    auto t = SteadyClock::now();
    float* logits = grow(rk.logits, static_cast<size_t>(m * E));
    if (m > 0) {
        // Exact activations whatever the backend's setting: a near tie between experts must not
        // flip on the rounding of bf16 activations (engine.activation_precision).
        rk.backend->matmul_exact(layer.router, h + b * H, m, logits, E);
    }
    float* scratch = grow(rk.route_scratch, static_cast<size_t>(layer.route->scratch_floats()));
    int32_t* idx = grow(rk.topk_idx, static_cast<size_t>(m * K));
    float* w = grow(rk.topk_w, static_cast<size_t>(m * K));
    int64_t* window = rk.window.data() + static_cast<size_t>(bucket_) * rk.load.size() +
                      static_cast<size_t>(li) * E;
    for (int64_t i = 0; i < m; ++i) {
        layer.route->route(logits + i * E, idx + i * K, w + i * K, scratch);
        for (int32_t j = 0; j < K; ++j) {
            EDGE_CHECK(idx[i * K + j] >= 0 && idx[i * K + j] < E, "router chose no expert");
            ++window[idx[i * K + j]];
            ++rk.routed[static_cast<size_t>(idx[i * K + j])];
        }
    }
    rk.times.routing_s += since(t);
    if (R == 1) {
        // One rank: no exchange to make, so the records, both all-to-alls and their copies are
        // skipped; rows reach the experts in the same order as through them (same results).
        local_compute(rk, layer, li, h, m, idx, w, x);
        return ok_status();
    }

    // Dispatch: each assignment to one rank holding its expert (replicas in turn, starting at a
    // rank-dependent offset), records grouped by destination in (token, k) order.
    t = SteadyClock::now();
    rk.send_rows.assign(R, 0);
    rk.turn.assign(E, 0);
    int32_t* dest = grow(rk.dest, static_cast<size_t>(m * K));
    int32_t* slot = grow(rk.slot, static_cast<size_t>(m * K));
    for (int64_t a = 0; a < m * K; ++a) {
        const int32_t e = idx[a];
        std::span<const int32_t> reps = placement_.replicas(li, e);
        const int32_t d = reps[static_cast<size_t>(me + rk.turn[e]++) % reps.size()];
        dest[a] = d;
        slot[a] = static_cast<int32_t>(rk.send_rows[d]++);
    }
    rk.row_begin.assign(R + 1, 0);
    rk.send_bytes.assign(R, 0);
    for (int32_t d = 0; d < R; ++d) {
        rk.row_begin[d + 1] = rk.row_begin[d] + rk.send_rows[d];
        rk.send_bytes[d] = rk.send_rows[d] * rec_bytes;
    }
    unsigned char* send = grow(rk.send, static_cast<size_t>(m * K * rec_bytes));
    for (int64_t a = 0; a < m * K; ++a) {
        unsigned char* rec = send + (rk.row_begin[dest[a]] + slot[a]) * rec_bytes;
        std::memcpy(rec, &idx[a], sizeof(int32_t));
        std::memcpy(rec + sizeof(int32_t), h + (b + a / K) * H, static_cast<size_t>(H) * 4);
    }
    rk.recv_bytes.assign(R, 0);
    EDGE_RETURN_IF_ERROR(
        communicator_status(rk.comm->exchange_counts(rk.send_bytes, rk.recv_bytes)));
    int64_t recv_total = 0;
    for (int64_t c : rk.recv_bytes) {
        recv_total += c;
    }
    unsigned char* recv = grow(rk.recv, static_cast<size_t>(recv_total));
    EDGE_RETURN_IF_ERROR(
        communicator_status(rk.comm->all_to_all_v(send, rk.send_bytes, recv, rk.recv_bytes)));
    rk.times.dispatch_s += since(t);

    // Compute: received rows grouped by expert (stable, so source order is kept), then one
    // grouped pass over every expert this rank was sent work for.
    t = SteadyClock::now();
    const int64_t rows = recv_total / rec_bytes;
    rk.expert_begin.assign(E + 1, 0);
    rk.fill.assign(E, 0);
    int32_t* row_of = grow(rk.row_of, static_cast<size_t>(rows));
    for (int64_t k = 0; k < rows; ++k) {
        int32_t e = 0;
        std::memcpy(&e, recv + k * rec_bytes, sizeof(int32_t));
        EDGE_CHECK(e >= 0 && e < E && placement_.holds(li, e, me),
                   "moe block: a rank was sent an expert it does not hold");
        row_of[k] = e;
        ++rk.expert_begin[e + 1];
    }
    for (int32_t e = 0; e < E; ++e) {
        rk.expert_begin[e + 1] += rk.expert_begin[e];
    }
    float* in = grow(rk.in, static_cast<size_t>(rows * H));
    for (int64_t k = 0; k < rows; ++k) {
        const int32_t e = row_of[k];
        const int32_t row = rk.expert_begin[e] + rk.fill[e]++;
        row_of[k] = row;
        std::memcpy(in + row * H, recv + k * rec_bytes + sizeof(int32_t),
                    static_cast<size_t>(H) * 4);
    }
    float* out = grow(rk.out, static_cast<size_t>(rows * H));
    run_experts(rk, layer, in, out);
    rk.rows_computed += rows;
    rk.times.compute_s += since(t);

    // Combine: results back in the order the records came, then per token in top-k order.
    t = SteadyClock::now();
    float* back = grow(rk.back, static_cast<size_t>(rows * H));
    for (int64_t k = 0; k < rows; ++k) {
        std::memcpy(back + k * H, out + static_cast<int64_t>(row_of[k]) * H,
                    static_cast<size_t>(H) * 4);
    }
    rk.back_send.assign(R, 0);
    rk.back_recv.assign(R, 0);
    for (int32_t r = 0; r < R; ++r) {
        rk.back_send[r] = rk.recv_bytes[r] / rec_bytes * H * 4;
        rk.back_recv[r] = rk.send_rows[r] * H * 4;
    }
    float* ret = grow(rk.ret, static_cast<size_t>(m * K * H));
    EDGE_RETURN_IF_ERROR(
        communicator_status(rk.comm->all_to_all_v(back, rk.back_send, ret, rk.back_recv)));
    for (int64_t i = 0; i < m; ++i) {
        float* xi = x + (b + i) * H;
        for (int32_t j = 0; j < K; ++j) {
            const int64_t a = i * K + j;
            const float wt = w[a];
            const float* res = ret + (rk.row_begin[dest[a]] + slot[a]) * H;
            for (int64_t d = 0; d < H; ++d) {
                xi[d] += wt * res[d];
            }
        }
    }
    rk.times.combine_s += since(t);
    return ok_status();
}

void MoeBlock::run_experts(Rank& rk, const Layer& layer, const float* in, float* out) {
    const int64_t H = shape_.hidden;
    const int32_t E = shape_.experts;
    // Each expert with rows is one job, its whole SwiGLU over them (the CPU backend runs one
    // token per expert as one parallel step without barriers, several tokens one expert a task).
    rk.swiglu_jobs.clear();
    for (int32_t e = 0; e < E; ++e) {
        const int64_t cnt = rk.expert_begin[e + 1] - rk.expert_begin[e];
        if (cnt == 0) {
            continue;
        }
        const int64_t r0 = rk.expert_begin[e];
        const SwiGlu& s = layer.experts[e];
        rk.swiglu_jobs.push_back({&s.gate, &s.up, &s.down, in + r0 * H, cnt, out + r0 * H, H});
    }
    if (!rk.swiglu_jobs.empty()) {
        rk.backend->swiglu_batch(rk.swiglu_jobs);
    }
    rk.expert_passes += static_cast<int64_t>(rk.swiglu_jobs.size());
}

void MoeBlock::local_compute(Rank& rk, const Layer& layer, int32_t li, const float* h, int64_t m,
                             const int32_t* idx, const float* w, float* x) {
    const int64_t H = shape_.hidden;
    const int32_t E = shape_.experts;
    const int32_t K = shape_.top_k;
    auto t = SteadyClock::now();
    const int64_t rows = m * K;
    rk.expert_begin.assign(E + 1, 0);
    rk.fill.assign(E, 0);
    for (int64_t a = 0; a < rows; ++a) {
        EDGE_CHECK(placement_.holds(li, idx[a], rk.id),
                   "moe block: the only rank does not hold an expert");
        ++rk.expert_begin[idx[a] + 1];
    }
    for (int32_t e = 0; e < E; ++e) {
        rk.expert_begin[e + 1] += rk.expert_begin[e];
    }
    int32_t* row_of = grow(rk.row_of, static_cast<size_t>(rows));
    float* in = grow(rk.in, static_cast<size_t>(rows * H));
    float* out = grow(rk.out, static_cast<size_t>(rows * H));
    for (int64_t a = 0; a < rows; ++a) {
        const int32_t e = idx[a];
        const int32_t row = rk.expert_begin[e] + rk.fill[e]++;
        row_of[a] = row;
        std::memcpy(in + row * H, h + (a / K) * H, static_cast<size_t>(H) * 4);
    }
    run_experts(rk, layer, in, out);
    rk.rows_computed += rows;
    rk.times.compute_s += since(t);
    t = SteadyClock::now();
    auto combine = [&](int64_t i) {
        float* __restrict xi = x + i * H;
        for (int32_t j = 0; j < K; ++j) {
            const int64_t a = i * K + j;
            const float wt = w[a];
            const float* __restrict res = out + static_cast<int64_t>(row_of[a]) * H;
            // Fixed-width chunks: the compiler vectorizes a loop of known trip count at -O2.
            constexpr int64_t kChunk = 16;
            int64_t d = 0;
            for (; d + kChunk <= H; d += kChunk) {
                for (int64_t c = 0; c < kChunk; ++c) {
                    xi[d + c] += wt * res[d + c];
                }
            }
            for (; d < H; ++d) {
                xi[d] += wt * res[d];
            }
        }
    };
    // Batched steps (bench preset, 32 tokens: ~8 MiB of expert outputs per layer) split the
    // tokens over the pool; a few tokens are cheaper here than a dispatch.
    constexpr int64_t kParallelCombineTokens = 8;
    if (m >= kParallelCombineTokens && rk.backend->threads() > 1) {
        rk.backend->for_each_task(m, [&](int64_t i, int) { combine(i); });
    } else {
        for (int64_t i = 0; i < m; ++i) {
            combine(i);
        }
    }
    rk.times.combine_s += since(t);
}

Status MoeBlock::refresh_load(bool plan) {
    EDGE_RETURN_IF_ERROR(group_failed(group_->run([&](int32_t r) {
        Rank& rk = *ranks_[r];
        const size_t cells = rk.load.size();
        std::fill(rk.load.begin(), rk.load.end(), 0);
        for (int32_t bk = 0; bk < kBuckets; ++bk) {
            const int64_t* src = rk.window.data() + static_cast<size_t>(bk) * cells;
            for (size_t c = 0; c < cells; ++c) {
                rk.load[c] += src[c];
            }
        }
        rk.status = communicator_status(rk.comm->all_reduce_sum(std::span<int64_t>(rk.load)));
    })));
    for (const auto& rk : ranks_) {
        EDGE_RETURN_IF_ERROR(rk->status);
    }
    load_ = ranks_[0]->load;
    if (plan) {
        // Every rank could compute this same plan from its identical all-reduced load; the
        // in-process group shares one copy. slots_per_rank 0 promises no replicas
        // (sharding_config.h), so none goes into the slots that ceil(E / R) leaves free when R
        // does not divide E either: an operator asks for replicas by setting the slots, or by
        // a static plan that lists some (its widest rank sizes the slots), kept as replicas.
        const bool replicas = config_.slots_per_rank > 0 || !config_.static_plan.empty();
        EDGE_ASSIGN_OR_RETURN(ExpertPlacement next,
                              shard::plan_placement(load_, shape_.layers, shape_.experts, ranks(),
                                                    placement_.slots_per_rank(), replicas));
        ++rebalances_;
        if (!(next == placement_)) {
            pending_ = std::move(next);
        }
    }
    return ok_status();
}

Status MoeBlock::end_step() {
    ++steps_;
    const bool rebalance =
        config_.rebalance_interval_steps > 0 && steps_ % config_.rebalance_interval_steps == 0;
    const bool new_bucket = steps_ % bucket_steps_ == 0;
    // The models call this after the step's KV is committed, so its failure cannot fail the
    // step: a refresh that fails keeps the last load and placement (this rebalance is skipped,
    // the next one tries again) and the window still slides, so its buckets stay in step with
    // steps_. The error is logged here and returned.
    Status refreshed;
    if (rebalance || new_bucket) {
        refreshed = refresh_load(rebalance);
        if (!refreshed.ok()) {
            log::warn(
                "moe_load_refresh_failed",
                {{"step", steps_}, {"rebalance", rebalance}, {"error", refreshed.to_string()}});
        }
    }
    if (new_bucket) {
        // Slide the window: the oldest bucket is cleared and becomes the current one.
        bucket_ = (bucket_ + 1) % kBuckets;
        for (auto& rk : ranks_) {
            const size_t cells = rk->load.size();
            std::fill_n(rk->window.begin() + static_cast<std::ptrdiff_t>(bucket_ * cells), cells,
                        0);
        }
    }
    return refreshed;
}

shard::ShardStats MoeBlock::stats() const {
    shard::ShardStats s;
    s.ranks = ranks();
    s.steps = steps_;
    s.plans_applied = plans_applied_;
    s.rebalances = rebalances_;
    s.extra_replicas = placement_.extra_replicas();
    s.window_steps = bucket_steps_ * kBuckets;
    s.expert_load = load_;
    s.imbalance = shard::imbalance(placement_, load_);
    for (const auto& rk : ranks_) {
        s.rank_rows.push_back(rk->rows_computed);
        s.expert_passes += rk->expert_passes;
        s.expert_tokens.resize(rk->routed.size(), 0);
        for (size_t e = 0; e < rk->routed.size(); ++e) {
            s.expert_tokens[e] += rk->routed[e];
        }
        s.times.routing_s = std::max(s.times.routing_s, rk->times.routing_s);
        s.times.dispatch_s = std::max(s.times.dispatch_s, rk->times.dispatch_s);
        s.times.compute_s = std::max(s.times.compute_s, rk->times.compute_s);
        s.times.combine_s = std::max(s.times.combine_s, rk->times.combine_s);
    }
    s.times.total_s = total_s_;
    s.times.calls = calls_;
    return s;
}

Result<SwiGlu> load_swiglu(WeightLoader& weights, const Backend& backend, const std::string& prefix,
                           int64_t hidden, int64_t inter) {
    SwiGlu m;
    EDGE_ASSIGN_OR_RETURN(m.gate,
                          weights.matrix_for(backend, prefix + "gate_proj.weight", inter, hidden));
    EDGE_ASSIGN_OR_RETURN(m.up,
                          weights.matrix_for(backend, prefix + "up_proj.weight", inter, hidden));
    EDGE_ASSIGN_OR_RETURN(m.down,
                          weights.matrix_for(backend, prefix + "down_proj.weight", hidden, inter));
    return m;
}

int load_threads(const LoadOptions& options) {
    return options.threads > 0
               ? options.threads
               : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

Result<std::vector<SwiGlu>> load_experts(WeightLoader& weights, const Backend& backend,
                                         const std::string& prefix, int64_t count, int64_t hidden,
                                         int64_t inter, int threads) {
    std::vector<SwiGlu> experts(static_cast<size_t>(count));
    std::vector<Status> failed(static_cast<size_t>(count));
    std::atomic<int64_t> next{0};
    auto work = [&] {
        for (int64_t e = next.fetch_add(1); e < count; e = next.fetch_add(1)) {
            Result<SwiGlu> m = load_swiglu(weights, backend, prefix + std::to_string(e) + ".",
                                           hidden, inter);
            if (m.ok()) {
                experts[static_cast<size_t>(e)] = *m;
            } else {
                failed[static_cast<size_t>(e)] = m.status();
            }
        }
    };
    std::vector<std::thread> helpers;
    const int64_t extra = std::min<int64_t>(std::max(threads, 1), count) - 1;
    for (int64_t i = 0; i < extra; ++i) {
        try {
            helpers.emplace_back(work);
        } catch (const std::system_error&) {
            break;  // No more threads to be had: the ones running (and this one) do the rest.
        }
    }
    work();
    for (std::thread& t : helpers) {
        t.join();
    }
    for (const Status& st : failed) {
        if (!st.ok()) {
            return st;
        }
    }
    return experts;
}

void swiglu_rows(Backend& backend, const SwiGlu& m, const float* in, int64_t rows, float* out,
                 SwiGluScratch* scratch) {
    const int64_t inter = m.gate.rows;
    float* gate = grow(scratch->gate, static_cast<size_t>(rows * inter));
    float* up = grow(scratch->up, static_cast<size_t>(rows * inter));
    float* act = grow(scratch->act, static_cast<size_t>(rows * inter));
    const MatmulJob gate_up[] = {{&m.gate, in, rows, gate, inter}, {&m.up, in, rows, up, inter}};
    backend.matmul_batch(gate_up);
    cpu::silu_mul(gate, up, rows * inter, act);
    backend.matmul(m.down, act, rows, out, m.down.rows);
}

}  // namespace edge::engine
