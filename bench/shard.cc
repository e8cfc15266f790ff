// Expert-parallel sharding benchmark on make-model's `bench` preset (Qwen3-MoE, hidden 1024, 12
// layers, 64 experts top-8, BF16):
//   1. per decode step of a 32-sequence batch, the time split into attention (+ norms, lm_head),
//      routing, dispatch, expert compute and combine, for R = 1 and R = 2 in-process ranks;
//   2. the imbalance ratio (per layer max rank load / mean, summed over layers) of a skewed trace
//      (32 sequences teacher-forced with tokens drawn from Zipf(1.5) over 8 ids) before and after
//      the planner rebalances (R = 2, 4 spare slots a rank): "after" is measured on the NEXT
//      window, under the plan made from the previous one (out of sample); goal <= 1.15;
//   3. decode tokens/s with 8 and 32 sequences against one stream (R = 1), as ratios.
// Usage: bench_shard [--model DIR] [--steps N] [--threads T]
// Without --model it writes the preset to a temp dir (about 2.5 GB) and removes it afterwards.
// Prints a table, then one JSON line.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <utility>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "engine/model/expert_placement.h"
#include "engine/model/loader.h"
#include "engine/shard/placement_planner.h"
#include "engine/tools/make_model.h"

namespace {

using edge::engine::CausalLM;
using edge::engine::SequenceChunk;
using edge::engine::TokenId;
using edge::engine::shard::ShardStats;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

double load_average() {
    std::ifstream in("/proc/loadavg");
    double a = 0;
    in >> a;
    return a;
}

[[noreturn]] void die(const std::string& what) {
    std::fprintf(stderr, "bench_shard: %s\n", what.c_str());
    std::exit(1);
}

TokenId argmax(const float* l, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; ++i) {
        if (l[i] > l[b]) {
            b = i;
        }
    }
    return static_cast<TokenId>(b);
}

std::unique_ptr<CausalLM> load(const std::string& dir, int threads,
                               const edge::engine::shard::ShardingConfig& sc) {
    edge::engine::LoadOptions lo;
    lo.threads = threads;
    lo.max_slots = 40;
    lo.max_context = 256;
    lo.sharding = sc;
    auto m = edge::engine::load_model(dir, lo);
    if (!m.ok()) {
        die(m.status().to_string());
    }
    return std::move(m).value();
}

// A batch of `n` sequences: prefill 16 random tokens each, then decode. `next` picks each
// sequence's next token (greedy or from a trace).
class Batch {
public:
    Batch(CausalLM& m, int n, uint32_t seed) : m_(m), n_(n) {
        std::mt19937 rng(seed);
        prompts_.resize(n);
        std::vector<SequenceChunk> chunks;
        for (int i = 0; i < n; ++i) {
            auto s = m.acquire_slot();
            if (!s.ok()) {
                die(s.status().to_string());
            }
            slots_.push_back(*s);
            for (int j = 0; j < 16; ++j) {
                prompts_[i].push_back(static_cast<TokenId>(rng() % 256));
            }
            chunks.push_back({slots_[i], 0, prompts_[i], false});
        }
        forward(chunks);
        next_.resize(n);
    }
    ~Batch() {
        for (int32_t s : slots_) {
            m_.release_slot(s);
        }
    }
    // One decode step; trace == nullptr: greedy.
    void step(std::mt19937* trace = nullptr, std::discrete_distribution<int>* zipf = nullptr) {
        const int64_t V = m_.spec().vocab_size;
        std::vector<SequenceChunk> chunks;
        for (int i = 0; i < n_; ++i) {
            next_[i] = trace ? static_cast<TokenId>(97 + (*zipf)(*trace))
                             : argmax(logits_.data() + i * V, V);
            chunks.push_back({slots_[i], m_.slot_length(slots_[i]), {&next_[i], 1}, false});
        }
        forward(chunks);
    }

private:
    void forward(const std::vector<SequenceChunk>& chunks) {
        auto st = m_.forward(chunks, &logits_);
        if (!st.ok()) {
            die(st.to_string());
        }
    }
    CausalLM& m_;
    int n_;
    std::vector<int32_t> slots_;
    std::vector<std::vector<TokenId>> prompts_;
    std::vector<TokenId> next_;
    std::vector<float> logits_;
};

struct Split {
    double step_ms = 0, attention_ms = 0, routing_ms = 0, dispatch_ms = 0, compute_ms = 0,
           combine_ms = 0;
};

Split time_split(const std::string& dir, int threads, int ranks, int batch, int steps) {
    edge::engine::shard::ShardingConfig sc;
    sc.ranks = ranks;
    auto m = load(dir, threads, sc);
    Batch b(*m, batch, 11);
    b.step();
    b.step();
    const ShardStats s0 = *m->shard_stats();
    auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) {
        b.step();
    }
    const double wall = seconds_since(t0);
    const ShardStats s1 = *m->shard_stats();
    auto ms = [&](double a, double b0) { return (a - b0) * 1e3 / steps; };
    Split r;
    r.step_ms = wall * 1e3 / steps;
    r.routing_ms = ms(s1.times.routing_s, s0.times.routing_s);
    r.dispatch_ms = ms(s1.times.dispatch_s, s0.times.dispatch_s);
    r.compute_ms = ms(s1.times.compute_s, s0.times.compute_s);
    r.combine_ms = ms(s1.times.combine_s, s0.times.combine_s);
    r.attention_ms = r.step_ms - ms(s1.times.total_s, s0.times.total_s);
    return r;
}

// Decode tokens/s at the median step (edge::bench::StepTimes), after the warm-up bench_decode
// does: passes over every expert (a 32-sequence step routes to nearly all), since the first
// passes over freshly mapped memory run several times slower, then a few steps of this batch.
double decode_tps(const std::string& dir, int threads, int sequences, int steps) {
    auto m = load(dir, threads, {});
    {
        Batch warm(*m, 32, 5);
        for (int s = 0; s < 10; ++s) {
            warm.step();
        }
    }
    Batch b(*m, sequences, 3);
    for (int s = 0; s < 3; ++s) {
        b.step();
    }
    edge::bench::StepTimes times;
    for (int s = 0; s < steps; ++s) {
        const auto t0 = std::chrono::steady_clock::now();
        b.step();
        times.add(t0);
    }
    return times.median_rate(sequences);
}

struct Balance {
    double before = 0, after = 0, after_in_sample = 0;
    int64_t replicas = 0;
};

Balance skewed_balance(const std::string& dir, int threads, int window) {
    edge::engine::shard::ShardingConfig sc;
    sc.ranks = 2;
    sc.slots_per_rank = 32 + 4;
    sc.rebalance_interval_steps = window;
    sc.load_window_steps = window;
    auto m = load(dir, threads, sc);
    Batch b(*m, 32, 21);
    // Zipf(1.5) over 8 token ids: a few tokens, and so their experts, are hot.
    std::vector<double> w;
    for (int k = 1; k <= 8; ++k) {
        w.push_back(1.0 / std::pow(k, 1.5));
    }
    std::discrete_distribution<int> zipf(w.begin(), w.end());
    std::mt19937 trace(7);
    // The prefill counted as step 0; run to the end of the first window.
    for (int s = 1; s < window; ++s) {
        b.step(&trace, &zipf);
    }
    const ShardStats first = *m->shard_stats();
    Balance r;
    r.before = first.imbalance;  // Contiguous plan on window 1 (the new plan is still pending).
    auto planned = edge::engine::shard::plan_placement(first.expert_load, 12, 64, 2, 36);
    if (!planned.ok()) {
        die(planned.status().to_string());
    }
    r.after_in_sample = edge::engine::shard::imbalance(*planned, first.expert_load);
    for (int s = 0; s < window; ++s) {
        b.step(&trace, &zipf);
    }
    const ShardStats second = *m->shard_stats();
    // Window 2 under the plan made from window 1 (the window-2 plan is pending, not applied).
    if (second.rebalances != 2 || second.plans_applied < 1) {
        die("expected 2 rebalances and an applied plan");
    }
    r.after = edge::engine::shard::imbalance(*planned, second.expert_load);
    r.replicas = planned->extra_replicas();
    return r;
}

// Routing with random weights spreads load evenly, so also a synthetic trace with real skew: per
// layer, 4096 assignments a window drawn from Zipf(1.0) over the 64 experts (hottest experts at a
// random permutation per layer); a plan made from window 1, measured on window 2.
Balance synthetic_balance(int ranks, int spare_per_rank) {
    const int L = 12;
    const int E = 64;
    std::mt19937 rng(99);
    std::vector<double> w;
    for (int k = 1; k <= E; ++k) {
        w.push_back(1.0 / k);
    }
    std::discrete_distribution<int> zipf(w.begin(), w.end());
    std::vector<std::vector<int>> perm(L);
    for (auto& p : perm) {
        for (int e = 0; e < E; ++e) {
            p.push_back(e);
        }
        std::shuffle(p.begin(), p.end(), rng);
    }
    auto window = [&] {
        std::vector<int64_t> load(static_cast<size_t>(L) * E, 0);
        for (int l = 0; l < L; ++l) {
            for (int a = 0; a < 4096; ++a) {
                ++load[static_cast<size_t>(l) * E + perm[l][zipf(rng)]];
            }
        }
        return load;
    };
    const auto w1 = window();
    const auto w2 = window();
    const int slots = E / ranks + spare_per_rank;
    auto base = edge::engine::ExpertPlacement::contiguous(L, E, ranks, slots);
    auto plan = edge::engine::shard::plan_placement(w1, L, E, ranks, slots);
    if (!base.ok() || !plan.ok()) {
        die("synthetic plan failed");
    }
    Balance b;
    b.before = edge::engine::shard::imbalance(*base, w2);
    b.after_in_sample = edge::engine::shard::imbalance(*plan, w1);
    b.after = edge::engine::shard::imbalance(*plan, w2);
    b.replicas = plan->extra_replicas();
    return b;
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_dir;
    int steps = 12;
    int threads = 2;
    edge::bench::parse_flags(argc, argv,
                             {edge::bench::Flag::string("--model", &model_dir,
                                                        "checkpoint (default: the bench preset)"),
                              edge::bench::Flag::integer("--steps", &steps, 1, "decode steps"),
                              edge::bench::Flag::integer("--threads", &threads, 1,
                                                         "compute threads")},
                             "bench_shard: expert-parallel sharding on the bench preset");
    const edge::bench::BenchCheckpoint checkpoint(model_dir);
    model_dir = checkpoint.dir();
    const double load0 = load_average();
    Split split[2];
    for (int r = 1; r <= 2; ++r) {
        split[r - 1] = time_split(model_dir, threads, r, 32, steps);
    }
    const Balance bal = skewed_balance(model_dir, threads, 16);
    const Balance syn2 = synthetic_balance(2, 4);
    const Balance syn4 = synthetic_balance(4, 4);
    const double tps1 = decode_tps(model_dir, threads, 1, steps);
    const double tps8 = decode_tps(model_dir, threads, 8, steps);
    const double tps32 = decode_tps(model_dir, threads, 32, steps);
    const double load1 = load_average();

    std::printf("bench_shard: bench preset, %d threads, 32-sequence decode, %d steps, load avg "
                "%.1f -> %.1f\n\n",
                threads, steps, load0, load1);
    std::printf("%-4s %9s %10s %9s %9s %9s %9s\n", "R", "step ms", "attn+rest", "routing",
                "dispatch", "experts", "combine");
    for (int r = 0; r < 2; ++r) {
        const Split& s = split[r];
        std::printf("%-4d %9.1f %10.1f %9.2f %9.2f %9.1f %9.2f\n", r + 1, s.step_ms,
                    s.attention_ms, s.routing_ms, s.dispatch_ms, s.compute_ms, s.combine_ms);
    }
    std::printf("\nskewed trace, R=2, 4 spare slots a rank, windows of 16 steps:\n");
    std::printf("  imbalance before rebalancing      %.3f\n", bal.before);
    std::printf("  after, same window (in sample)    %.3f\n", bal.after_in_sample);
    std::printf("  after, next window (out of sample) %.3f   (goal <= 1.15)\n", bal.after);
    std::printf("  extra replicas in the plan        %lld\n",
                static_cast<long long>(bal.replicas));
    std::printf(
        "\nsynthetic Zipf(1.0) expert load, 12 layers x 64 experts, 4 spare slots a rank:\n");
    for (const auto& [r, b] : {std::pair{2, syn2}, std::pair{4, syn4}}) {
        std::printf("  R=%d: before %.3f, after in sample %.3f, after next window %.3f "
                    "(%lld replicas)\n",
                    r, b.before, b.after_in_sample, b.after, static_cast<long long>(b.replicas));
    }
    std::printf("\ndecode tokens/s (R=1): 1 seq %.1f, 8 seq %.1f (%.2fx), 32 seq %.1f (%.2fx)\n",
                tps1, tps8, tps8 / tps1, tps32, tps32 / tps1);
    std::printf(
        "{\"bench\":\"shard\",\"threads\":%d,\"load_avg\":%.1f,\"r1_step_ms\":%.2f,"
        "\"r2_step_ms\":%.2f,\"r2_vs_r1_step\":%.3f,"
        "\"r1\":{\"attention_ms\":%.2f,\"routing_ms\":%.3f,\"dispatch_ms\":%.3f,"
        "\"experts_ms\":%.2f,\"combine_ms\":%.3f},"
        "\"r2\":{\"attention_ms\":%.2f,\"routing_ms\":%.3f,\"dispatch_ms\":%.3f,"
        "\"experts_ms\":%.2f,\"combine_ms\":%.3f},"
        "\"imbalance_before\":%.3f,\"imbalance_after\":%.3f,\"imbalance_after_in_sample\":%.3f,"
        "\"synthetic_r2_before\":%.3f,\"synthetic_r2_after\":%.3f,"
        "\"synthetic_r4_before\":%.3f,\"synthetic_r4_after\":%.3f,\"imbalance_goal\":1.15,"
        "\"batched8_vs_single\":%.2f,\"batched32_vs_single\":%.2f}\n",
        threads, load1, split[0].step_ms, split[1].step_ms, split[1].step_ms / split[0].step_ms,
        split[0].attention_ms, split[0].routing_ms, split[0].dispatch_ms, split[0].compute_ms,
        split[0].combine_ms, split[1].attention_ms, split[1].routing_ms, split[1].dispatch_ms,
        split[1].compute_ms, split[1].combine_ms, bal.before, bal.after, bal.after_in_sample,
        syn2.before, syn2.after, syn4.before, syn4.after, tps8 / tps1, tps32 / tps1);
    return 0;
}
