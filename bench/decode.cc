// Decode benchmark on make-model's `bench` preset (Qwen3-MoE, hidden 1024, 12 layers, 64 experts
// top-8, expert FFN 512, 16/4 heads of 64, vocab 32000, BF16): single-stream decode and prefill
// tokens/s at 1 and 2 threads, batched decode at 8 and 32 sequences, weight bytes read per decode
// token and the fraction of measured memory bandwidth decode reaches, resident memory after load
// (the KV cache's reservation, printed beside it, becomes resident only as it is written),
// and the two limits of batched 32 / single: the bytes (the step's weight reads against a token's)
// and the products (the step's arithmetic at the kernels' multiply-add peak measured in the same
// run).
// Usage: bench_decode [--model DIR] [--steps N] [--prefill N] [--threads 1|2]
//                     [--profile single|batchedN] [--activations exact|bf16|both]
//                     [--cpu-kernels auto|amx_bf16|avx512_bf16|...]
// (batched figures use the last thread count run: 2 by default; --activations picks
// engine.activation_precision for them, default both: exact, then the same phases on a second
// load of the model with single-bf16 activations; single-stream decode is always exact). Decode
// rates are taken at the median step, like the probe's median pass (StepTimes), and prefill at the
// median of five prefills on fresh slots; the whole-run single-stream rate is printed too.
// --cpu-kernels is engine.cpu_kernels (avx512_bf16 measures without the AMX tiles).
// Without --model it writes the preset to a temp dir (about 2.5 GB) and removes it afterwards.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/dot_peak.h"
#include "bench/membw_probe.h"
#include "bench/moe_bytes.h"
#include "engine/cpu/matmul.h"
#include "engine/model/loader.h"
#include "engine/model/model_config.h"
#include "engine/tools/make_model.h"

namespace {

using edge::engine::CausalLM;
using edge::engine::SequenceChunk;
using edge::engine::TokenId;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
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

struct Single {
    double prefill_tps = 0;             // At the median of kPrefills prefills.
    double decode_tps = 0;              // At the median step.
    double decode_tps_run = 0;          // Steps over the whole run's wall time.
    double decode_cpu_s_per_token = 0;  // Process CPU seconds (all threads) per decode token.
};

int32_t acquire_or_exit(CausalLM& m) {
    auto slot = m.acquire_slot();
    if (!slot.ok()) {
        std::fprintf(stderr, "%s\n", slot.status().to_string().c_str());
        std::exit(1);
    }
    return *slot;
}

// Prefills timed per figure: the rate is the median one's, as decode takes the median step (one
// timed forward moved with whatever else the shared machine ran in that moment).
constexpr int kPrefills = 5;

Single run_single(CausalLM& m, int prefill, int steps) {
    const int64_t V = m.spec().vocab_size;
    std::vector<TokenId> prompt(prefill);
    std::mt19937 rng(5);
    std::vector<float> logits;
    edge::bench::StepTimes prefills;
    int32_t slot = -1;
    // Each prefill on a fresh slot with its own prompt; decode continues the last one.
    for (int k = 0; k < kPrefills; ++k) {
        if (slot >= 0) {
            m.release_slot(slot);
        }
        for (TokenId& t : prompt) {
            t = static_cast<TokenId>(rng() % 256);
        }
        slot = acquire_or_exit(m);
        SequenceChunk ch{slot, 0, prompt, false};
        const auto t0 = Clock::now();
        if (edge::Status st = m.forward({&ch, 1}, &logits); !st.ok()) {
            std::fprintf(stderr, "prefill failed: %s\n", st.to_string().c_str());
            std::exit(1);
        }
        prefills.add(t0);
    }
    Single r;
    r.prefill_tps = prefills.median_rate(prefill);
    TokenId tok = argmax(logits.data(), V);
    edge::bench::StepTimes times;
    const double cpu0 = edge::bench::process_cpu_seconds();
    for (int s = 0; s < steps; ++s) {
        const auto ts = Clock::now();
        SequenceChunk d{slot, m.slot_length(slot), {&tok, 1}, false};
        if (!m.forward({&d, 1}, &logits).ok()) {
            std::fprintf(stderr, "decode failed\n");
            std::exit(1);
        }
        tok = argmax(logits.data(), V);
        times.add(ts);
    }
    r.decode_tps = times.median_rate(1);
    r.decode_tps_run = times.run_rate(1);
    r.decode_cpu_s_per_token = (edge::bench::process_cpu_seconds() - cpu0) / steps;
    m.release_slot(slot);
    return r;
}

// Batched decode tokens/s at the median step (see StepTimes). With `passes_per_step`, also the
// expert passes (ShardStats::expert_passes) per timed step: each reads one expert's weights.
double run_batched(CausalLM& m, int sequences, int steps, double* passes_per_step = nullptr) {
    const int64_t V = m.spec().vocab_size;
    std::vector<int32_t> slots;
    std::vector<std::vector<TokenId>> prompts(sequences);
    std::vector<SequenceChunk> batch;
    std::mt19937 rng(11);
    for (int i = 0; i < sequences; ++i) {
        slots.push_back(acquire_or_exit(m));
        for (int j = 0; j < 16; ++j) {
            prompts[i].push_back(static_cast<TokenId>(rng() % 256));
        }
        batch.push_back({slots[i], 0, prompts[i], false});
    }
    std::vector<float> logits;
    if (!m.forward(batch, &logits).ok()) {
        std::fprintf(stderr, "batched prefill failed\n");
        std::exit(1);
    }
    std::vector<TokenId> next(sequences);
    edge::bench::StepTimes times;
    const auto stats0 = m.shard_stats();
    for (int s = 0; s < steps; ++s) {
        const auto ts = Clock::now();
        batch.clear();
        for (int i = 0; i < sequences; ++i) {
            next[i] = argmax(logits.data() + i * V, V);
            batch.push_back({slots[i], m.slot_length(slots[i]), {&next[i], 1}, false});
        }
        if (!m.forward(batch, &logits).ok()) {
            std::fprintf(stderr, "batched decode failed\n");
            std::exit(1);
        }
        times.add(ts);
    }
    const double tps = times.median_rate(sequences);
    const auto stats1 = m.shard_stats();
    if (passes_per_step != nullptr && stats0 && stats1) {
        *passes_per_step =
            static_cast<double>(stats1->expert_passes - stats0->expert_passes) / steps;
    }
    for (int32_t s : slots) {
        m.release_slot(s);
    }
    return tps;
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_dir;
    int steps = 32;
    int prefill = 128;
    int only_threads = 0;  // 1 or 2: run that thread count only (faster, for experiments).
    // "single" or "batchedN": after warm-up run only that phase for --steps steps and exit,
    // printing its tokens/s (for `perf record`; skips the probes and the table).
    std::string profile;
    std::string activations = "both";
    std::string cpu_kernels = "auto";
    edge::bench::parse_flags(
        argc, argv,
        {edge::bench::Flag::string("--model", &model_dir, "checkpoint (default: the bench preset)"),
         edge::bench::Flag::integer("--steps", &steps, 1, "decode steps per figure"),
         edge::bench::Flag::integer("--prefill", &prefill, 1, "prompt tokens"),
         edge::bench::Flag::integer("--threads", &only_threads, 0, 2,
                                    "run only this thread count (0: 1 and 2)"),
         edge::bench::Flag::string("--profile", &profile,
                                   "single or batchedN: only that phase, for perf record"),
         edge::bench::Flag::string("--cpu-kernels", &cpu_kernels,
                                   "auto or an ISA this CPU runs (engine.cpu_kernels)"),
         edge::bench::Flag::string("--activations", &activations,
                                   "exact, bf16 or both: activation precision of batched steps")},
        "bench_decode: decode and prefill on the bench preset against memory bandwidth");
    if (cpu_kernels != "auto") {
        if (auto isa = edge::engine::cpu::isa_by_name(cpu_kernels); !isa.ok()) {
            std::fprintf(stderr, "--cpu-kernels: %s\n", isa.status().message().c_str());
            return 2;
        }
    }
    if (activations != "exact" && activations != "bf16" && activations != "both") {
        std::fprintf(stderr, "--activations: expected exact, bf16 or both, got '%s'\n",
                     activations.c_str());
        return 2;
    }
    // --profile: "single" or "batched1".."batched72" (the profile model's slots).
    int profile_seqs = 0;
    if (!profile.empty() && profile != "single") {
        const std::string_view n = std::string_view(profile).substr(
            profile.rfind("batched", 0) == 0 ? 7 : profile.size());
        const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), profile_seqs);
        if (profile.rfind("batched", 0) != 0 || ec != std::errc() || end != n.data() + n.size() ||
            profile_seqs < 1 || profile_seqs > 72) {
            std::fprintf(stderr, "--profile: expected single or batched1..batched72, got '%s'\n",
                         profile.c_str());
            return 2;
        }
    }
    const bool run_exact = activations != "bf16";
    const bool run_bf16 = activations != "exact";
    const edge::bench::BenchCheckpoint checkpoint(model_dir);
    model_dir = checkpoint.dir();
    auto config = edge::engine::ConfigJson::read(model_dir);
    if (!config.ok()) {
        std::fprintf(stderr, "%s\n", config.status().to_string().c_str());
        return 1;
    }
    const int64_t bytes_per_token = edge::bench::decode_bytes_per_token(*config);
    if (!profile.empty()) {
        edge::engine::LoadOptions lo;
        lo.threads = only_threads == 0 ? 2 : only_threads;
        lo.cpu_kernels = cpu_kernels;
        lo.activation_precision = run_exact ? edge::engine::ActivationPrecision::kExact
                                            : edge::engine::ActivationPrecision::kBf16;
        lo.max_slots = 72;
        lo.max_context = 1024;
        auto model = edge::engine::load_model(model_dir, lo);
        if (!model.ok()) {
            std::fprintf(stderr, "%s\n", model.status().to_string().c_str());
            return 1;
        }
        const int seqs = profile_seqs;
        run_batched(**model, 32, 4);
        const auto s0 = (*model)->shard_stats();
        const auto t0 = Clock::now();
        const double tps = seqs > 0 ? run_batched(**model, seqs, steps)
                                    : run_single(**model, prefill, steps).decode_tps;
        const double wall = seconds_since(t0);
        std::printf("%s tokens/s %.2f\n", profile.c_str(), tps);
        const auto s1 = (*model)->shard_stats();
        if (s0 && s1) {
            std::printf("wall %.1f ms, moe dispatch %.1f ms, compute %.1f ms, combine %.1f ms\n",
                        wall * 1e3, (s1->times.dispatch_s - s0->times.dispatch_s) * 1e3,
                        (s1->times.compute_s - s0->times.compute_s) * 1e3,
                        (s1->times.combine_s - s0->times.combine_s) * 1e3);
            std::vector<int64_t> tok = s1->expert_tokens;
            std::sort(tok.begin(), tok.end());
            if (!tok.empty()) {
                std::printf("expert tokens (all layers): min %lld median %lld max %lld\n",
                            static_cast<long long>(tok.front()),
                            static_cast<long long>(tok[tok.size() / 2]),
                            static_cast<long long>(tok.back()));
            }
        }
        std::printf("{\"bench\":\"decode_profile\",\"profile\":\"%s\",\"tokens_per_s\":%.3f,"
                    "\"wall_ms\":%.1f}\n",
                    profile.c_str(), tps, wall * 1e3);
        return 0;
    }
    const double bw1 = edge::bench::measure_read_bandwidth(1);
    const double bw2 = edge::bench::measure_read_bandwidth(2);
    // Per second of CPU time: on a machine shared with other work, what one thread reads while
    // it runs; compared with decode's bytes per CPU second at 1 thread.
    const double bw1_cpu = edge::bench::measure_read_bandwidth(1, size_t{1} << 30, 7, true);

    Single single[2];
    double batched8 = 0, batched32 = 0;            // Exact activations.
    double passes32 = 0;                           // Expert passes per 32-sequence step.
    double batched8_bf16 = 0, batched32_bf16 = 0;  // Single-bf16 activations.
    int64_t rss_load = 0, rss_warm = 0, weight_bytes = 0, kv_per_token = 0;
    // The KV cache's address space, reserved at load and made resident only as blocks are
    // written: outside rss_load, partly inside rss_warm.
    int64_t kv_reserved = 0, kv_budget = 0;
    for (int threads = 1; threads <= 2; ++threads) {
        if (only_threads != 0 && threads != only_threads) {
            continue;
        }
        edge::engine::LoadOptions lo;
        lo.threads = threads;
        lo.cpu_kernels = cpu_kernels;
        lo.max_slots = 40;
        lo.max_context = 1024;
        const int64_t rss0 = edge::bench::rss_bytes();
        auto model = edge::engine::load_model(model_dir, lo);
        if (!model.ok()) {
            std::fprintf(stderr, "%s\n", model.status().to_string().c_str());
            return 1;
        }
        CausalLM& m = **model;
        if (rss_load == 0) {
            rss_load = edge::bench::rss_bytes() - rss0;
        }
        weight_bytes = m.spec().weight_bytes;
        kv_per_token = m.spec().kv_bytes_per_token;
        kv_reserved = m.kv_stats().allocated_bytes;
        kv_budget = m.kv_stats().budget_bytes;
        // Warm up: several passes over every expert (a 32-sequence step routes to nearly all);
        // in this VM the first passes over freshly mapped memory run several times slower.
        run_batched(m, 32, 10);
        run_single(m, 8, 8);
        if (rss_warm == 0) {
            rss_warm = edge::bench::rss_bytes() - rss0;
        }
        single[threads - 1] = run_single(m, prefill, steps);
        if (threads == 2 || only_threads == 1) {
            if (run_exact) {
                batched8 = run_batched(m, 8, std::max(4, steps / 2));
                batched32 = run_batched(m, 32, std::max(4, steps / 4), &passes32);
            }
            if (run_bf16) {
                // Same weights (the same mapped file), another backend setting.
                lo.activation_precision = edge::engine::ActivationPrecision::kBf16;
                auto bf16_model = edge::engine::load_model(model_dir, lo);
                if (!bf16_model.ok()) {
                    std::fprintf(stderr, "%s\n", bf16_model.status().to_string().c_str());
                    return 1;
                }
                run_batched(**bf16_model, 32, 4);
                batched8_bf16 = run_batched(**bf16_model, 8, std::max(4, steps / 2));
                batched32_bf16 = run_batched(**bf16_model, 32, std::max(4, steps / 4));
            }
        }
    }
    // A figure of a phase that did not run is 0, never NaN (the JSON line must parse).
    auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    const double frac1 = single[0].decode_tps * bytes_per_token / bw1;
    const double frac2 = single[1].decode_tps * bytes_per_token / bw2;
    const double frac1_cpu = single[0].decode_cpu_s_per_token > 0
                                 ? bytes_per_token / single[0].decode_cpu_s_per_token / bw1_cpu
                                 : 0.0;
    // The single-stream rate at the thread count the batched figures were taken with.
    const double single_ref = only_threads == 1 ? single[0].decode_tps : single[1].decode_tps;
    // A 32-sequence step reads the non-expert weights once and each expert it routes to once:
    // the single token's bytes with its top-k passes per layer replaced by the step's passes.
    // 32 x (single token's bytes) / (step's bytes) is what batched 32 / single comes to when
    // both read at one fraction of the bandwidth (a 64-expert top-8 model routes 32 tokens to
    // nearly every expert, so this is well under 32).
    const double step32_bytes = edge::bench::step_bytes(*config, passes32);
    const double bw_ref = only_threads == 1 ? bw1 : bw2;
    const double batched32_frac = passes32 > 0 ? batched32 / 32 * step32_bytes / bw_ref : 0.0;
    const double bytes_bound = passes32 > 0 ? 32 * bytes_per_token / step32_bytes : 0.0;
    // The kernels the figures come from (--cpu-kernels avx512_bf16 measures without the tiles).
    const std::string isa = edge::bench::kernels_name(cpu_kernels);
    // The other side of a batched step, its arithmetic: each of the 32 tokens multiplies the
    // weights it would read alone (with the AVX512_BF16 kernels exact activations twice, hi and
    // lo), so at the kernels' multiply-add peak (dot_peak.h, at the batched figures' thread count)
    // batched decode runs at most peak / (a token's products) tokens/s, whatever the bandwidth.
    // 0 for the AMX tiles and the scalar kernels, whose peaks these loops do not measure.
    const edge::bench::KernelPeak kernel_peak =
        edge::bench::kernels_peak(cpu_kernels, only_threads == 1 ? 1 : 2);
    const double peak = kernel_peak.products_per_s;
    const auto products = static_cast<double>(edge::bench::decode_products_per_token(*config));
    const double peak_tps_exact = peak / (kernel_peak.exact_cost * products);
    const double peak_tps_bf16 = peak / products;
    const double products_bound = ratio(peak_tps_exact, single_ref);
    const double products_bound_bf16 = ratio(peak_tps_bf16, single_ref);
    // Both at once, phase by phase (moe_bytes.h): the most batched 32 / single can be here when
    // the step reads at the bandwidth this machine showed (the probe's, or the single stream's
    // where a busy moment held the probe under it) and multiplies at the peak.
    const double shown_bw = std::max(bw_ref, single_ref * static_cast<double>(bytes_per_token));
    const double phase_s = edge::bench::phase_bound_seconds(
        *config, 32, 32, passes32, kernel_peak.exact_cost, shown_bw, peak);
    const double phase_bound = phase_s > 0 ? ratio(32 / phase_s, single_ref) : 0.0;
    std::printf("%-44s %14s\n", "figure", "value");
    std::printf("%-44s %14s\n", "CPU kernels", isa.c_str());
    std::printf("%-44s %14.2f\n", "memory read bandwidth 1 thread (GB/s)", bw1 / 1e9);
    std::printf("%-44s %14.2f\n", "memory read bandwidth 2 threads (GB/s)", bw2 / 1e9);
    std::printf("%-44s %14.1f\n", "weight MB read per decode token", bytes_per_token / 1e6);
    std::printf("%-44s %14.2f\n", "decode tokens/s, 1 thread", single[0].decode_tps);
    std::printf("%-44s %14.2f\n", "decode tokens/s, 2 threads", single[1].decode_tps);
    std::printf("%-44s %14.2f\n", "same, over the whole run, 1 thread", single[0].decode_tps_run);
    std::printf("%-44s %14.2f\n", "same, over the whole run, 2 threads", single[1].decode_tps_run);
    std::printf("%-44s %14.3f\n", "decode fraction of bandwidth, 1 thread", frac1);
    std::printf("%-44s %14.3f\n", "decode fraction of bandwidth, 2 threads", frac2);
    std::printf("%-44s %14.3f\n", "same, per CPU second, 1 thread", frac1_cpu);
    std::printf("%-44s %14.2f\n", "decode CPU ms per token, 1 thread",
                single[0].decode_cpu_s_per_token * 1e3);
    std::printf("%-44s %14.2f\n", "decode CPU ms per token, 2 threads (sum)",
                single[1].decode_cpu_s_per_token * 1e3);
    std::printf("%-44s %14.1f\n", "prefill tokens/s, 1 thread (median of 5)",
                single[0].prefill_tps);
    std::printf("%-44s %14.1f\n", "prefill tokens/s, 2 threads (median of 5)",
                single[1].prefill_tps);
    std::printf("%-44s %14.2f\n", "batched decode tokens/s, 8 seqs", batched8);
    std::printf("%-44s %14.2f\n", "batched decode tokens/s, 32 seqs", batched32);
    std::printf("%-44s %14.2f\n", "batched 32 / single-stream (same threads)",
                ratio(batched32, single_ref));
    std::printf("%-44s %14.1f\n", "expert passes per 32-sequence step", passes32);
    std::printf("%-44s %14.1f\n", "weight MB read per 32-sequence step",
                passes32 > 0 ? step32_bytes / 1e6 : 0.0);
    std::printf("%-44s %14.3f\n", "batched 32 fraction of bandwidth", batched32_frac);
    std::printf("%-44s %14.2f\n", "batched 32 / single at one fraction (bytes)", bytes_bound);
    std::printf("%-44s %14.1f\n", "multiply-add peak (G products/s)", peak / 1e9);
    std::printf("%-44s %14.3f\n", "batched 32 fraction of the peak",
                ratio(batched32, peak_tps_exact));
    std::printf("%-44s %14.2f\n", "batched 32 / single at the peak (products)", products_bound);
    std::printf("%-44s %14.2f\n", "batched 32 / single at most (by phase)", phase_bound);
    std::printf("%-44s %14.2f\n", "bf16 activations: batched tokens/s, 8 seqs", batched8_bf16);
    std::printf("%-44s %14.2f\n", "bf16 activations: batched tokens/s, 32 seqs", batched32_bf16);
    std::printf("%-44s %14.2f\n", "bf16 activations: batched 32 / single-stream",
                ratio(batched32_bf16, single_ref));
    std::printf("%-44s %14.3f\n", "bf16 activations: fraction of the peak",
                ratio(batched32_bf16, peak_tps_bf16));
    std::printf("%-44s %14.2f\n", "bf16 activations: 32 / single at the peak", products_bound_bf16);
    std::printf("%-44s %14.1f\n", "weight MB (mapped)", weight_bytes / 1e6);
    std::printf("%-44s %14.1f\n", "KV cache budget MB", kv_budget / 1e6);
    std::printf("%-44s %14.1f\n", "KV cache reserved MB (resident when written)",
                kv_reserved / 1e6);
    std::printf("%-44s %14.1f\n", "resident MB after load (KV cache untouched)", rss_load / 1e6);
    std::printf("%-44s %14.1f\n", "resident MB after warm-up (KV partly written)",
                rss_warm / 1e6);
    std::printf(
        "{\"bench\":\"decode\",\"isa\":\"%s\",\"membw_gbps_1t\":%.3f,\"membw_gbps_2t\":%.3f,"
        "\"weight_bytes_per_decode_token\":%lld,\"decode_tps_1t\":%.3f,\"decode_tps_2t\":%.3f,"
        "\"decode_tps_run_1t\":%.3f,\"decode_tps_run_2t\":%.3f,\"decode_bw_fraction_1t\":%.4f,"
        "\"decode_bw_fraction_2t\":%.4f,"
        "\"decode_bw_fraction_per_cpu_s_1t\":%.4f,\"decode_cpu_ms_per_token_1t\":%.3f,"
        "\"decode_cpu_ms_per_token_2t\":%.3f,\"prefill_tps_1t\":%.2f,"
        "\"prefill_tps_2t\":%.2f,\"batched_tps_8\":%.3f,\"batched_tps_32\":%.3f,"
        "\"batched32_over_single\":%.3f,\"batched32_expert_passes_per_step\":%.2f,"
        "\"batched32_step_bytes\":%.0f,\"batched32_bw_fraction\":%.4f,"
        "\"batched32_over_single_bytes_bound\":%.3f,\"batched_tps_8_bf16\":%.3f,"
        "\"batched_tps_32_bf16\":%.3f,\"batched32_bf16_over_single\":%.3f,"
        "\"dot_peak_gprod\":%.2f,\"batched32_peak_fraction\":%.4f,"
        "\"batched32_over_single_products_bound\":%.3f,\"batched32_over_single_phase_bound\":%.3f,"
        "\"batched32_bf16_peak_fraction\":%.4f,"
        "\"batched32_bf16_over_single_products_bound\":%.3f,\"weight_bytes\":%lld,"
        "\"kv_bytes_per_token\":%lld,\"kv_cache_budget_bytes\":%lld,"
        "\"kv_cache_reserved_bytes\":%lld,"
        "\"rss_after_load\":%lld,\"rss_after_warmup\":%lld}\n",
        isa.c_str(), bw1 / 1e9, bw2 / 1e9, static_cast<long long>(bytes_per_token),
        single[0].decode_tps, single[1].decode_tps, single[0].decode_tps_run,
        single[1].decode_tps_run, frac1, frac2, frac1_cpu, single[0].decode_cpu_s_per_token * 1e3,
        single[1].decode_cpu_s_per_token * 1e3, single[0].prefill_tps, single[1].prefill_tps,
        batched8, batched32, ratio(batched32, single_ref), passes32,
        passes32 > 0 ? step32_bytes : 0.0, batched32_frac, bytes_bound, batched8_bf16,
        batched32_bf16, ratio(batched32_bf16, single_ref), peak / 1e9,
        ratio(batched32, peak_tps_exact), products_bound, phase_bound,
        ratio(batched32_bf16, peak_tps_bf16),
        products_bound_bf16, static_cast<long long>(weight_bytes),
        static_cast<long long>(kv_per_token), static_cast<long long>(kv_budget),
        static_cast<long long>(kv_reserved), static_cast<long long>(rss_load),
        static_cast<long long>(rss_warm));
    return 0;
}
