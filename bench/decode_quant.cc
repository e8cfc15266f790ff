// Decode benchmark per weight format on make-model's `bench` preset: single-stream decode
// tokens/s for BF16, FP8 (all-fp8), INT8 (all-int8), INT4 group 32 and group 128 (every linear
// layer), and experts-int4 (routed experts INT4-g32, the rest BF16), all quantized on load from
// the same BF16 checkpoint; with the weight bytes one decode token reads in each format and the
// fraction of memory read bandwidth (measured in this run, same thread count: the median of the
// probe readings taken between the formats' runs) that it reaches. Rates are at the median step.
// Embeddings and lm_head stay BF16 in every policy, as the presets leave them. resident_MB is what
// the model counts as held in memory (ModelSpec::weight_bytes); rss_MB is what the process's
// resident set grew by from before the load to after the warm-up steps (weights, KV cache,
// scratch).
// A second table splits the decode steps with the MoE block's own phase timers (ShardStats):
// routing (router matmul and top-k), the routed experts and their combine, each the mean per step
// over every timed step, the rest of the mean step, and the experts' weight bytes over their time.
// Usage: bench_decode_quant [--model DIR] [--steps N] [--reps N] [--threads N]
//                           [--formats bf16,fp8,int8,int4-g32,int4-g128,experts-int4]
//                           [--row-major]
// --row-major keeps INT4/INT8 weights row-major instead of the CPU's row tiles
// (LoadOptions::row_tiles), for A/B runs of the two layouts with one binary.
// Without --model it writes the preset to a temp dir (about 2.5 GB) and removes it afterwards.

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/membw_probe.h"
#include "engine/model/loader.h"
#include "engine/model/model_config.h"
#include "engine/quant/policy.h"
#include "engine/quant/quantized_weight.h"
#include "engine/shard/shard_stats.h"
#include "engine/tools/make_model.h"

namespace {

using namespace edge::engine;
using Clock = std::chrono::steady_clock;

int64_t matrix_bytes(WeightFormat f, int64_t rows, int64_t cols) {
    if (f == WeightFormat::kBF16) {
        return rows * cols * 2;
    }
    return quant::weight_data_bytes(f, rows, cols) + quant::weight_scale_count(f, rows, cols) * 4;
}

// Weight bytes of the routed experts one decode token reads under `p` (top-k per layer).
int64_t expert_bytes_per_token(const ConfigJson& c, const quant::QuantPolicy& p) {
    auto g = [&](const char* k) { return c.get_int(k).value_or(0); };
    const int64_t H = g("hidden_size"), L = g("num_hidden_layers"), K = g("num_experts_per_tok");
    const int64_t I = g("moe_intermediate_size");
    const WeightFormat x = p.format_for(quant::TensorClass::kRoutedExperts);
    return L * K * (2 * matrix_bytes(x, I, H) + matrix_bytes(x, H, I));
}

// Weight bytes one decode token reads under `p`: attention, router (BF16), the top-k experts of
// each layer (every layer of the preset is MoE), one embedding row and lm_head.
int64_t bytes_per_token(const ConfigJson& c, const quant::QuantPolicy& p) {
    auto g = [&](const char* k) { return c.get_int(k).value_or(0); };
    const int64_t H = g("hidden_size"), L = g("num_hidden_layers"), hd = g("head_dim");
    const int64_t q = g("num_attention_heads") * hd, kv = g("num_key_value_heads") * hd;
    const int64_t E = g("num_experts"), V = g("vocab_size");
    const WeightFormat a = p.format_for(quant::TensorClass::kAttention);
    int64_t b = expert_bytes_per_token(c, p);
    for (int64_t l = 0; l < L; ++l) {
        b += matrix_bytes(a, q, H) + 2 * matrix_bytes(a, kv, H) + matrix_bytes(a, H, q);
        b += E * H * 2;
    }
    b += H * 2 + matrix_bytes(p.format_for(quant::TensorClass::kLmHead), V, H);
    return b;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// Seconds summed over the timed decode steps: all of them, and the MoE block's phases.
struct PhaseSums {
    double steps_s = 0, routing_s = 0, experts_s = 0, combine_s = 0;
    int64_t steps = 0;
};

// Decode tokens/s at the median step (edge::bench::StepTimes); adds the steps' times to `sums`.
double decode_tps(CausalLM& m, int steps, PhaseSums* sums = nullptr) {
    std::vector<TokenId> prompt(16);
    std::mt19937 rng(5);
    for (TokenId& t : prompt) {
        t = static_cast<TokenId>(rng() % 256);
    }
    int32_t slot = *m.acquire_slot();
    std::vector<float> logits;
    SequenceChunk ch{slot, 0, prompt, false};
    if (edge::Status st = m.forward({&ch, 1}, &logits); !st.ok()) {
        std::fprintf(stderr, "prefill failed: %s\n", st.to_string().c_str());
        std::exit(1);
    }
    TokenId tok = 0;
    edge::bench::StepTimes times;
    const std::optional<edge::engine::shard::ShardStats> before = m.shard_stats();
    for (int s = 0; s < steps; ++s) {
        const auto t0 = Clock::now();
        tok = static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        SequenceChunk d{slot, m.slot_length(slot), {&tok, 1}, false};
        if (edge::Status st = m.forward({&d, 1}, &logits); !st.ok()) {
            std::fprintf(stderr, "decode failed: %s\n", st.to_string().c_str());
            std::exit(1);
        }
        times.add(t0);
    }
    m.release_slot(slot);
    const std::optional<edge::engine::shard::ShardStats> after = m.shard_stats();
    if (sums != nullptr) {
        for (double t : times.seconds) {
            sums->steps_s += t;
        }
        sums->steps += static_cast<int64_t>(times.seconds.size());
        if (before && after) {
            sums->routing_s += after->times.routing_s - before->times.routing_s;
            sums->experts_s += after->times.compute_s - before->times.compute_s;
            sums->combine_s += after->times.combine_s - before->times.combine_s;
        }
    }
    return times.median_rate(1);
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_dir;
    int steps = 24, reps = 3, threads = 2;
    std::string only;  // --formats a,b: run only these rows (names as printed), e.g. for A/B runs.
    std::string formats;
    bool row_major = false;
    edge::bench::parse_flags(
        argc, argv,
        {edge::bench::Flag::string("--model", &model_dir, "checkpoint (default: the bench preset)"),
         edge::bench::Flag::integer("--steps", &steps, 1, "decode steps per run"),
         edge::bench::Flag::integer("--reps", &reps, 1, "runs per figure (median)"),
         edge::bench::Flag::integer("--threads", &threads, 1, "compute threads"),
         edge::bench::Flag::string("--formats", &formats,
                                   "a,b: only these rows (names as printed)"),
         edge::bench::Flag::boolean("--row-major", &row_major,
                                    "INT4/INT8 weights row-major, not in row tiles")},
        "bench_decode_quant: single-stream decode per weight format against memory bandwidth");
    const std::vector<std::string> format_names = {"bf16",      "fp8",       "int8",
                                                   "int4-g32", "int4-g128", "experts-int4"};
    if (!formats.empty()) {
        for (const std::string& f :
             edge::bench::known_names(argv[0], "--formats", formats, format_names)) {
            only += "," + f + ",";
        }
    }
    const edge::bench::BenchCheckpoint checkpoint(model_dir);
    model_dir = checkpoint.dir();
    auto config = ConfigJson::read(model_dir);
    if (!config.ok()) {
        std::fprintf(stderr, "%s\n", config.status().to_string().c_str());
        return 1;
    }
    const std::string int4_all =
        "attention=int4-g32,dense_mlp=int4-g32,shared_expert=int4-g32,routed_experts=int4-g32";
    const std::string int4_all128 =
        "attention=int4-g128,dense_mlp=int4-g128,shared_expert=int4-g128,routed_experts=int4-g128";
    const std::vector<std::pair<std::string, std::string>> runs = {
        {"bf16", "none"},       {"fp8", "all-fp8"},         {"int8", "all-int8"},
        {"int4-g32", int4_all}, {"int4-g128", int4_all128}, {"experts-int4", "experts-int4"}};
    struct Row {
        std::string name;
        int64_t bytes = 0, resident = 0, expert_bytes = 0;
        int64_t rss = 0;  // Growth of the process's resident set from before load to warm.
        double tps = 0, bw = 0;
        PhaseSums phases;
    };
    std::vector<Row> rows;
    std::vector<double> all_bw;  // Every probe reading of the run.
    for (const auto& [name, policy] : runs) {
        if (!only.empty() && only.find("," + name + ",") == std::string::npos) {
            continue;
        }
        malloc_trim(0);  // Hand the previous format's freed heap back, so rss0 is a baseline.
        const int64_t rss0 = edge::bench::rss_bytes();
        LoadOptions lo;
        lo.threads = threads;
        lo.max_slots = 1;
        lo.max_context = 16 + std::max(steps, 4) + 1;  // The warm-up decodes 4.
        lo.quantization = policy;
        lo.row_tiles = !row_major;
        auto model = load_model(model_dir, lo);
        if (!model.ok()) {
            std::fprintf(stderr, "%s: %s\n", name.c_str(), model.status().to_string().c_str());
            return 1;
        }
        Row r;
        r.name = name;
        r.bytes = bytes_per_token(*config, *edge::engine::quant::parse_quant_policy(policy));
        r.resident = (*model)->spec().weight_bytes;
        r.expert_bytes =
            expert_bytes_per_token(*config, *edge::engine::quant::parse_quant_policy(policy));
        decode_tps(**model, 4);  // Warm-up: pages in the weights.
        r.rss = edge::bench::rss_bytes() - rss0;
        std::vector<double> tps, bw;
        for (int k = 0; k < reps; ++k) {
            bw.push_back(edge::bench::measure_read_bandwidth(threads, size_t{1} << 30, 3));
            tps.push_back(decode_tps(**model, steps, &r.phases));
        }
        r.tps = median(tps);
        all_bw.insert(all_bw.end(), bw.begin(), bw.end());
        rows.push_back(r);
    }
    // One limit for every format: the median of all the run's probe readings. Readings taken
    // next to one format moved by 2x within minutes on the shared VM, more than the formats differ.
    const double limit = median(all_bw);
    for (Row& r : rows) {
        r.bw = limit;
    }
    std::printf("%-13s %14s %12s %8s %10s %12s %10s %8s\n", "format", "bytes/token_MB",
                "resident_MB", "rss_MB", "decode/s", "GB/s_eff", "GB/s_bw", "bw_frac");
    std::string json = "{\"bench\":\"decode_quant\",\"threads\":" + std::to_string(threads) +
                       ",\"bandwidth_gbps\":" + std::to_string(limit / 1e9) + ",\"rows\":[";
    // The bf16 row's rate, when it ran: the speed-ups are to it, or null.
    double bf16_tps = 0;
    for (const Row& r : rows) {
        bf16_tps = r.name == "bf16" ? r.tps : bf16_tps;
    }
    std::vector<std::string> phase_lines;
    for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        const double eff = r.tps * static_cast<double>(r.bytes);
        std::printf("%-13s %14.2f %12.1f %8.1f %10.2f %12.2f %10.2f %8.3f\n", r.name.c_str(),
                    r.bytes / 1e6, r.resident / 1e6, r.rss / 1e6, r.tps, eff / 1e9, r.bw / 1e9,
                    eff / r.bw);
        // Mean milliseconds per timed step.
        const double n = static_cast<double>(std::max<int64_t>(1, r.phases.steps));
        const double step_ms = r.phases.steps_s * 1e3 / n;
        const double routing_ms = r.phases.routing_s * 1e3 / n;
        const double experts_ms = r.phases.experts_s * 1e3 / n;
        const double combine_ms = r.phases.combine_s * 1e3 / n;
        const double experts_gbps = experts_ms > 0 ? r.expert_bytes / (experts_ms * 1e6) : 0.0;
        const double rest_ms = step_ms - routing_ms - experts_ms - combine_ms;
        char line[256];
        std::snprintf(line, sizeof line, "%-13s %10.3f %11.3f %11.3f %11.3f %9.3f %13.2f %12.3f",
                      r.name.c_str(), step_ms, routing_ms, experts_ms, combine_ms, rest_ms,
                      experts_gbps, experts_gbps * 1e9 / r.bw);
        phase_lines.emplace_back(line);
        char buf[1024];
        std::snprintf(buf, sizeof buf,
                      "%s{\"format\":\"%s\",\"bytes_per_token\":%lld,\"resident_bytes\":%lld,"
                      "\"rss_growth_bytes\":%lld,"
                      "\"decode_tps\":%.4g,\"effective_gbps\":%.4g,\"bandwidth_gbps\":%.4g,"
                      "\"bandwidth_fraction\":%.4g,\"speedup_vs_bf16\":%s,"
                      "\"mean_step_ms\":%.4g,\"moe_routing_ms\":%.4g,\"experts_ms\":%.4g,"
                      "\"moe_combine_ms\":%.4g,\"rest_ms\":%.4g,\"expert_bytes_per_token\":%lld,"
                      "\"experts_gbps\":%.4g,\"experts_bandwidth_fraction\":%.4g}",
                      i ? "," : "", r.name.c_str(), static_cast<long long>(r.bytes),
                      static_cast<long long>(r.resident), static_cast<long long>(r.rss), r.tps,
                      eff / 1e9, r.bw / 1e9, eff / r.bw,
                      bf16_tps > 0 ? std::to_string(r.tps / bf16_tps).c_str() : "null",
                      step_ms, routing_ms, experts_ms, combine_ms, rest_ms,
                      static_cast<long long>(r.expert_bytes), experts_gbps,
                      experts_gbps * 1e9 / r.bw);
        json += buf;
    }
    std::printf("\nper decode step, mean over the timed steps (MoE phases from ShardStats):\n");
    std::printf("%-13s %10s %11s %11s %11s %9s %13s %12s\n", "format", "step_ms", "routing_ms",
                "experts_ms", "combine_ms", "rest_ms", "experts_GB/s", "experts_frac");
    for (const std::string& line : phase_lines) {
        std::printf("%s\n", line.c_str());
    }
    std::printf("%s]}\n", json.c_str());
    return 0;
}
