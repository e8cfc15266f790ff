// Multi-tenant serving benchmark: 64 concurrent streams (closed loop: a stream sends its next
// request when the previous ends) from 4 tenants of weights 1, 2, 3 and 4 (16 streams each) on
// one model through the Scheduler, with a paged KV cache and a per-tenant prefix cache (every
// prompt starts with the same system prompt). The running batch holds 32 sequences, so admission
// is contended and the weighted fair share decides it.
// Figures: total generated tokens/s and its ratio to a single stream measured in the same run
// (before and after the 64 streams, averaged),
// per tenant its share of generated tokens against its weight share, time to first token and
// inter-token latency p50/p99 (wall time) with their sample counts, mean KV-cache use,
// prefix-cache hit rate, and the two limits of the throughput ratio: the step's weight bytes and
// its products at the kernels' multiply-add peak measured in the same run. Every figure covers
// the same window, from the end of the warm-up to the last step; latency samples are taken as
// tokens arrive, so requests still streaming at the end count (bench/latency_samples.h).
// Goals: 64-stream throughput >= 8x single stream; each tenant's share within 10% of its weight;
// p99 inter-token latency < 3x its median.
// Usage: bench_tenancy [--model DIR | --preset bench|tiny] [--steps N] [--threads N]
//                      [--batch N] [--out TOKENS] [--step-tokens N] [--activations exact|bf16]
//                      [--decode N] [--warmup STEPS] [--backend cpu|cuda]
// --decode N: SchedulerConfig::max_decode_sequences (at most N sequences decode per step, picked
// by tenant weight; 0, the default: every running sequence decodes). With --batch 64 every
// stream stays admitted and the weights act through which streams decode. --warmup: steps before
// the figures are taken (default min(steps / 4, 40)); with --batch 64 the first prompts of all 64
// streams take ~140 steps to prefill, so take --steps 400 --warmup 160 there.
// --backend cuda: the model on the GPU as `engine.backend: cuda` serves it (every op of a step on
// the device, engine/cuda/device_causal_lm.h; CUDA builds only), the scheduler, KV bookkeeping
// and prefix cache on the host as with cpu; --threads is then unused.
// --cpu-kernels: engine.cpu_kernels (auto, or e.g. avx512_bf16 to measure without AMX tiles).
// --activations: engine.activation_precision of the multi-token steps (the single stream decodes
// one token per step, which is always exact).
// Without --model it writes the preset (default `bench`, about 2.5 GB) to a temp dir and removes
// it afterwards. The last line of output is one JSON object with the figures.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/dot_peak.h"
#include "bench/latency_samples.h"
#include "bench/moe_bytes.h"
#include "engine/cpu/matmul.h"
#if defined(EDGE_HAVE_CUDA)
#include "engine/cuda/device_causal_lm.h"
#endif
#include "engine/model/loader.h"
#include "engine/model/model_config.h"
#include "engine/sched/scheduler.h"
#include "engine/tokenizer/tiktoken.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tools/make_model.h"

namespace {

using edge::engine::Finish;
using edge::engine::GenerationSink;
using edge::engine::TokenDelta;
using edge::engine::TokenId;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0, Clock::time_point t1) {
    return std::chrono::duration<double>(t1 - t0).count();
}

// Records the wall time of each streamed token and the finish. Called on the stepping thread.
class TimingSink final : public GenerationSink {
public:
    void on_delta(TokenDelta delta) override {
        for (size_t i = 0; i < delta.token_ids.size(); ++i) {
            times_.push_back(Clock::now());
        }
    }
    void on_finish(Finish finish) override {
        done_ = true;
        finish_ = std::move(finish);
    }
    bool done() const { return done_; }
    const Finish& finish() const { return finish_; }
    const std::vector<Clock::time_point>& times() const { return times_; }

private:
    std::vector<Clock::time_point> times_;
    bool done_ = false;
    Finish finish_;
};

struct TenantFigures {
    int32_t weight = 1;
    int64_t tokens = 0;
    int64_t prompt_tokens = 0;
    int64_t cached_tokens = 0;
    edge::bench::LatencySamples latency;
    int64_t waiting = 0;  // Requests of the window still without a first token at its end.
};

// A figure as the table prints it ("n/a" when there is none) and as the JSON line holds it
// (null).
std::string table_value(std::optional<double> v, int width, int precision) {
    char buf[64];
    if (!v) {
        std::snprintf(buf, sizeof buf, "%*s", width, "n/a");
    } else {
        std::snprintf(buf, sizeof buf, "%*.*f", width, precision, *v);
    }
    return buf;
}

std::string json_value(std::optional<double> v) {
    if (!v || !std::isfinite(*v)) {
        return "null";
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", *v);
    return buf;
}

struct Stream {
    std::string tenant;
    int32_t weight = 1;
    int32_t next_request = 0;
    std::shared_ptr<TimingSink> sink;
    edge::bench::RequestLatency latency{Clock::time_point{}};  // The request in flight.
};

std::vector<TokenId> make_prompt(const std::vector<TokenId>& system, int stream, int request,
                                 int user_tokens, int32_t vocab) {
    std::vector<TokenId> p = system;
    std::mt19937 rng(static_cast<uint32_t>(stream * 7919 + request));
    for (int i = 0; i < user_tokens; ++i) {
        p.push_back(static_cast<TokenId>(rng() % static_cast<uint32_t>(vocab - 10) + 5));
    }
    return p;
}

edge::engine::sched::SequenceRequest request_for(const Stream& s, std::vector<TokenId> prompt,
                                                 int out_tokens,
                                                 std::shared_ptr<TimingSink> sink) {
    edge::engine::sched::SequenceRequest r;
    r.request_id = s.tenant;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = out_tokens;
    r.sampling.ignore_eos = true;
    r.sink = std::move(sink);
    r.tenant = s.tenant;
    r.tenant_weight = s.weight;
    return r;
}

// The model on `backend`: "cpu", the engine's forward; "cuda", every op of a step on the device.
edge::Result<std::unique_ptr<edge::engine::CausalLM>> load_on(const std::string& backend,
                                                              const std::string& dir,
                                                              const edge::engine::LoadOptions& lo) {
#if defined(EDGE_HAVE_CUDA)
    if (backend == "cuda") {
        return edge::engine::cuda::load_device_causal_lm(dir, lo);
    }
#endif
    (void)backend;
    return edge::engine::load_model(dir, lo);
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_dir;
    std::string preset = "bench";
    int steps = 160;
    int threads = 2;
    int batch = 32;
    int out_tokens = 24;
    int step_tokens = 64;
    int decode = 0;
    int warmup_steps = -1;
    std::string activations = "exact";
    std::string cpu_kernels = "auto";
    std::string backend = "cpu";
    edge::bench::parse_flags(
        argc, argv,
        {edge::bench::Flag::string("--model", &model_dir, "checkpoint (default: --preset's)"),
         edge::bench::Flag::string("--preset", &preset, "make-model preset (default bench)"),
         edge::bench::Flag::integer("--steps", &steps, 10, "scheduler steps measured"),
         edge::bench::Flag::integer("--threads", &threads, 1, "compute threads"),
         edge::bench::Flag::integer("--batch", &batch, 1, "max running sequences"),
         edge::bench::Flag::integer("--step-tokens", &step_tokens, 1, "token budget per step"),
         edge::bench::Flag::integer("--out", &out_tokens, 2, "tokens generated per request"),
         edge::bench::Flag::integer("--decode", &decode, 0,
                                    "most sequences decoding per step (0: all running)"),
         edge::bench::Flag::integer("--warmup", &warmup_steps, 0,
                                    "steps before measuring (default min(steps / 4, 40))"),
         edge::bench::Flag::string("--cpu-kernels", &cpu_kernels,
                                   "auto or an ISA this CPU runs (engine.cpu_kernels)"),
         edge::bench::Flag::string("--activations", &activations,
                                   "exact or bf16: engine.activation_precision"),
         edge::bench::Flag::string("--backend", &backend, "cpu, or cuda (CUDA builds)")},
        "bench_tenancy: 64 streams from 4 tenants of different weights on one engine");
    // Flags first: a bad one must not cost the write of a 2.5 GB preset.
    if (cpu_kernels != "auto") {
        if (auto isa = edge::engine::cpu::isa_by_name(cpu_kernels); !isa.ok()) {
            std::fprintf(stderr, "--cpu-kernels: %s\n", isa.status().message().c_str());
            return 2;
        }
    }
    if (activations != "exact" && activations != "bf16") {
        std::fprintf(stderr, "--activations: expected exact or bf16, got '%s'\n",
                     activations.c_str());
        return 2;
    }
#if defined(EDGE_HAVE_CUDA)
    const bool cuda_built = true;
#else
    const bool cuda_built = false;
#endif
    if (backend != "cpu" && !(backend == "cuda" && cuda_built)) {
        std::fprintf(stderr, "--backend: expected cpu%s, got '%s'\n",
                     cuda_built ? " or cuda" : " (this build has no CUDA)", backend.c_str());
        return 2;
    }
    if (model_dir.empty()) {
        const std::vector<std::string> presets = edge::engine::make_model_presets();
        if (std::find(presets.begin(), presets.end(), preset) == presets.end()) {
            edge::bench::usage_error(argv[0], "--preset: unknown preset '" + preset + "'");
        }
    }
    // What ran: the --model folder, else the preset.
    const std::string model_name = model_dir.empty() ? preset : model_dir;
    const edge::bench::BenchCheckpoint checkpoint(model_dir, preset);
    model_dir = checkpoint.dir();
    // As the engine loads it: tokenizer.json, else Kimi K2's tiktoken.model.
    auto tok = edge::engine::tokenizer::load_checkpoint_tokenizer(model_dir);
    if (!tok.ok()) {
        std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
        return 1;
    }
    constexpr int kStreams = 64;
    constexpr int kSystemTokens = 64;
    constexpr int kUserTokens = 16;
    edge::engine::LoadOptions lo;
    lo.threads = threads;
    lo.backend = backend;
    lo.cpu_kernels = cpu_kernels;
    lo.max_slots = batch;
    lo.max_context = 512;
    lo.kv_block_tokens = 16;
    lo.activation_precision = activations == "bf16" ? edge::engine::ActivationPrecision::kBf16
                                                    : edge::engine::ActivationPrecision::kExact;
    // `model` (when set) gets the scheduler's model, to read its ShardStats between steps.
    auto make_scheduler = [&](int32_t max_batch, int64_t kv_bytes,
                              edge::engine::CausalLM** model_out = nullptr)
        -> std::unique_ptr<edge::engine::sched::Scheduler> {
        lo.kv_cache_bytes = kv_bytes;
        auto model = load_on(backend, model_dir, lo);
        if (!model.ok()) {
            std::fprintf(stderr, "%s\n", model.status().to_string().c_str());
            return nullptr;
        }
        if (model_out != nullptr) {
            *model_out = model->get();
        }
        edge::engine::sched::SchedulerConfig sc;
        sc.max_batch_sequences = max_batch;
        sc.max_batch_tokens = step_tokens;  // Small prefill chunks keep decode steps even.
        sc.fair_quantum_tokens = 128;
        sc.max_decode_sequences = max_batch > 1 ? decode : 0;
        return std::make_unique<edge::engine::sched::Scheduler>(std::move(model).value(),
                                                                tok->get(), sc);
    };
    // KV budget: the running batch's worst case plus a quarter for the prefix cache.
    auto probe = load_on(backend, model_dir, lo);
    if (!probe.ok()) {
        std::fprintf(stderr, "%s\n", probe.status().to_string().c_str());
        return 1;
    }
    const int32_t vocab = (*probe)->spec().vocab_size;
    const int64_t per_token = (*probe)->spec().kv_bytes_per_token;
    probe->reset();
    const int64_t per_seq = kSystemTokens + kUserTokens + out_tokens;
    const int64_t kv_bytes = per_token * per_seq * batch * 5 / 4;

    std::vector<TokenId> system;
    for (int i = 0; i < kSystemTokens; ++i) {
        system.push_back(static_cast<TokenId>(7 + (i * 131) % (vocab - 20)));
    }

    // Single stream: one request after another, same prompts and lengths, on a scheduler of
    // its own; the first request (weights and the system prompt's cache warming) is not counted.
    // Taken before and after the 64 streams, and the two averaged: the host's memory bandwidth
    // moves by half between minutes on the shared VM (one run: 60.7 tokens/s before, 92.7
    // after; another 87.6 then 63.4 back to back).
    constexpr int kSingleRequests = 4;  // Counted, each time.
    auto measure_single = [&](int first_request) -> double {
        auto sched = make_scheduler(1, kv_bytes);
        if (!sched) {
            return -1.0;
        }
        Stream s{"solo", 1, 0, nullptr};
        int64_t tokens = 0;
        Clock::time_point start = Clock::now();
        for (int r = 0; r <= kSingleRequests; ++r) {
            auto sink = std::make_shared<TimingSink>();
            auto h = sched->submit(
                request_for(s, make_prompt(system, 0, first_request + r, kUserTokens, vocab),
                            out_tokens, sink));
            while (!sink->done() && sched->step()) {
            }
            if (r == 0) {
                start = Clock::now();
                continue;
            }
            tokens += static_cast<int64_t>(sink->times().size());
        }
        return static_cast<double>(tokens) / since(start, Clock::now());
    };
    const double single_before = measure_single(0);
    if (single_before < 0) {
        return 1;
    }

    // 64 streams from 4 tenants.
    edge::engine::CausalLM* model = nullptr;
    auto sched = make_scheduler(batch, kv_bytes, &model);
    if (!sched) {
        return 1;
    }
    const std::vector<std::pair<std::string, int32_t>> tenants = {
        {"t1", 1}, {"t2", 2}, {"t3", 3}, {"t4", 4}};
    std::map<std::string, TenantFigures> figures;
    std::vector<Stream> streams;
    for (int i = 0; i < kStreams; ++i) {
        const auto& [name, weight] = tenants[static_cast<size_t>(i) % tenants.size()];
        streams.push_back(Stream{name, weight, 0, nullptr});
        figures[name].weight = weight;
    }
    auto submit_next = [&](int i) {
        Stream& s = streams[static_cast<size_t>(i)];
        s.sink = std::make_shared<TimingSink>();
        s.latency = edge::bench::RequestLatency(Clock::now());
        auto h = sched->submit(request_for(
            s, make_prompt(system, i + 1, s.next_request++, kUserTokens, vocab), out_tokens,
            s.sink));
        if (!h.ok()) {
            std::fprintf(stderr, "submit: %s\n", h.status().to_string().c_str());
        }
    };
    // The window of the latency figures starts here: the start of the step that ends the warm-up
    // (with no warm-up, before the first requests). A TTFT counts for a request submitted in it,
    // an inter-token gap when both its tokens arrived in it (latency_samples.h).
    Clock::time_point latency_start = Clock::now();
    for (int i = 0; i < kStreams; ++i) {
        submit_next(i);
    }
    // Every figure describes the steps from the end of the warm-up (when every tenant is
    // backlogged) to the end: tokens, latency, KV use and prefix hits alike.
    const int warmup =
        warmup_steps >= 0 ? std::min(warmup_steps, steps - 1) : std::min(steps / 4, 40);
    double kv_sum = 0.0;
    int kv_samples = 0;
    Clock::time_point measure_start = Clock::now();
    int64_t measured_tokens = 0;
    int measured_steps = 0;
    auto passes = [&] {
        const auto stats = model->shard_stats();  // Between steps: no forward is running.
        return stats ? stats->expert_passes : int64_t{0};
    };
    // Routed rows (a token's top-k in each MoE layer), the tokens the steps computed, prefill
    // chunks included.
    auto routed_rows = [&] {
        const auto stats = model->shard_stats();
        return stats ? std::accumulate(stats->rank_rows.begin(), stats->rank_rows.end(), int64_t{0})
                     : int64_t{0};
    };
    int64_t passes0 = 0, rows0 = 0, preemptions0 = 0;
    // When the last step ended: requests submitted after it (a finished stream's next one) had
    // no step to give them a first token.
    Clock::time_point last_step_end = Clock::now();
    for (int step = 0; step < steps; ++step) {
        if (step == warmup) {
            measure_start = Clock::now();
            if (warmup > 0) {
                latency_start = measure_start;
            }
            measured_tokens = 0;
            passes0 = passes();
            rows0 = routed_rows();
            preemptions0 = sched->stats().preemptions;
            kv_sum = 0.0;
            kv_samples = 0;
            for (auto& [name, f] : figures) {
                f.tokens = 0;
                f.prompt_tokens = 0;
                f.cached_tokens = 0;
                f.latency.clear();
            }
        }
        if (!sched->step()) {
            break;
        }
        last_step_end = Clock::now();
        measured_steps += step >= warmup ? 1 : 0;
        kv_sum += sched->load().kv_use;
        ++kv_samples;
        for (int i = 0; i < kStreams; ++i) {
            Stream& s = streams[static_cast<size_t>(i)];
            TenantFigures& f = figures[s.tenant];
            // Taken as the tokens arrive: a request still streaming when the run ends counts
            // its first token and its gaps so far.
            const int64_t added = s.latency.observe(s.sink->times(), latency_start, &f.latency);
            f.tokens += added;
            measured_tokens += added;
            if (!s.sink->done()) {
                continue;
            }
            // Prefix hits of the requests that finished in the window (usage comes with the
            // finish).
            f.prompt_tokens += s.sink->finish().usage.prompt_tokens;
            f.cached_tokens += s.sink->finish().usage.cached_tokens;
            submit_next(i);
        }
    }
    // Requests of the window that got no first token before its end: their TTFTs, the longest,
    // are not in the lists, so the table says how many there are.
    for (const Stream& s : streams) {
        if (s.sink->times().empty() && s.latency.submitted() >= latency_start &&
            s.latency.submitted() < last_step_end) {
            ++figures[s.tenant].waiting;
        }
    }
    const double elapsed = since(measure_start, Clock::now());
    const double total_tps = static_cast<double>(measured_tokens) / elapsed;
    // What a step reads (make-model's bench layout; 0 for a model without a sharded MoE block):
    // the non-expert weights once and each expert it routes to once. A token decoded alone
    // reads the single-token bytes, so tokens per step x single-token bytes / step bytes is the
    // ratio to a single stream that decodes at the same fraction of the bandwidth: the bound the
    // weights' bytes put on the throughput ratio (prefill chunks in the step cost it too).
    // (The device model keeps no ShardStats: its passes and bytes stay 0.)
    // The step's arithmetic bounds the ratio too: every token computed (decode and prefill)
    // multiplies the weights a lone token would (twice with exact activations on the AVX512_BF16
    // kernels), less lm_head for prefill tokens that end no prompt (a step computes about one
    // logits row per token it generates); at the kernels' multiply-add peak measured here
    // (dot_peak.h; CPU backend only, 0 for the AMX tiles), generated tokens per step / the step's
    // products at the peak, over the single stream's rate, is the most the ratio can be.
    double passes_per_step = 0.0, bytes_per_step = 0.0, bytes_bound = 0.0;
    double computed_per_step = 0.0, products_per_step = 0.0;
    const double tokens_per_step =
        measured_steps > 0 ? static_cast<double>(measured_tokens) / measured_steps : 0.0;
    const edge::bench::KernelPeak kernel_peak =
        backend == "cpu" ? edge::bench::kernels_peak(cpu_kernels, threads)
                         : edge::bench::KernelPeak{};
    const double peak = kernel_peak.products_per_s;
    if (auto config = edge::engine::ConfigJson::read(model_dir);
        config.ok() && measured_steps > 0 && passes() > passes0) {
        passes_per_step = static_cast<double>(passes() - passes0) / measured_steps;
        bytes_per_step = edge::bench::step_bytes(*config, passes_per_step);
        bytes_bound = tokens_per_step *
                      static_cast<double>(edge::bench::decode_bytes_per_token(*config)) /
                      bytes_per_step;
        const int64_t routed_per_token = config->get_int("num_experts_per_tok").value_or(1) *
                                         config->get_int("num_hidden_layers").value_or(1);
        computed_per_step = static_cast<double>(routed_rows() - rows0) /
                            static_cast<double>(routed_per_token) / measured_steps;
        const auto head = static_cast<double>(edge::bench::lm_head_products(*config));
        products_per_step =
            (activations == "exact" ? kernel_peak.exact_cost : 1.0) *
            (computed_per_step *
                 (static_cast<double>(edge::bench::decode_products_per_token(*config)) - head) +
             tokens_per_step * head);
    }
    const edge::engine::ServingStats serving = sched->serving_stats();
    const int64_t preemptions = sched->stats().preemptions - preemptions0;  // In the window.
    sched->stop();
    sched.reset();
    const double single_after = measure_single(kSingleRequests + 1);
    if (single_after < 0) {
        return 1;
    }
    const double single_tps = (single_before + single_after) / 2;
    const double products_bound = peak > 0 && single_tps > 0 && products_per_step > 0
                                      ? tokens_per_step / (products_per_step / peak) / single_tps
                                      : 0.0;
    // Both limits at once, phase by phase (moe_bytes.h), reading at the single stream's
    // bandwidth (the one fraction of the bytes bound) and multiplying at the peak.
    double phase_bound = 0.0;
    if (auto config = edge::engine::ConfigJson::read(model_dir);
        config.ok() && single_tps > 0 && passes_per_step > 0) {
        const double single_bw =
            single_tps * static_cast<double>(edge::bench::decode_bytes_per_token(*config));
        const double s = edge::bench::phase_bound_seconds(
            *config, computed_per_step, tokens_per_step, passes_per_step,
            activations == "exact" ? kernel_peak.exact_cost : 1.0, single_bw, peak);
        phase_bound = s > 0 ? tokens_per_step / s / single_tps : 0.0;
    }

    int64_t all_tokens = 0;
    int32_t all_weight = 0;
    int64_t prompt = 0, cached = 0;
    for (const auto& [name, f] : figures) {
        all_tokens += f.tokens;
        all_weight += f.weight;
        prompt += f.prompt_tokens;
        cached += f.cached_tokens;
    }
    std::printf(
        "model %s on %s, %d streams, batch %d, %d threads, %d steps (%d warm-up),"
        " %d out tokens, %d tokens per step, decode %d, activations %s\n",
        model_name.c_str(), backend.c_str(), kStreams, batch, threads, steps, warmup, out_tokens,
        step_tokens, decode, activations.c_str());
    std::printf("%-8s %6s %7s %7s %6s %8s %8s %6s %8s %8s %8s %7s\n", "tenant", "weight",
                "share", "target", "ttft_n", "ttft p50", "ttft p99", "itl_n", "itl p50", "itl p99",
                "itl99/50", "waiting");
    std::string json_tenants;
    double worst_share_err = 0.0;
    double worst_itl_ratio = 0.0;
    bool latency_measured = true;  // Every tenant has a p99 inter-token latency.
    for (const auto& [name, f] : figures) {
        const double share = all_tokens > 0 ? static_cast<double>(f.tokens) / all_tokens : 0.0;
        const double target = static_cast<double>(f.weight) / all_weight;
        const double err = target > 0 ? std::abs(share - target) / target : 0.0;
        worst_share_err = std::max(worst_share_err, err);
        const edge::bench::LatencySummary ttft = edge::bench::summarize(f.latency.ttft);
        const edge::bench::LatencySummary itl = edge::bench::summarize(f.latency.itl);
        std::optional<double> ratio;
        if (itl.p99 && itl.p50 && *itl.p50 > 0) {
            ratio = *itl.p99 / *itl.p50;
            worst_itl_ratio = std::max(worst_itl_ratio, *ratio);
        }
        latency_measured = latency_measured && ratio.has_value();
        std::printf("%-8s %6d %7.3f %7.3f %6zu %s %s %6zu %s %s %s %7lld\n", name.c_str(),
                    f.weight, share, target, ttft.n, table_value(ttft.p50, 8, 3).c_str(),
                    table_value(ttft.p99, 8, 3).c_str(), itl.n,
                    table_value(itl.p50, 8, 4).c_str(), table_value(itl.p99, 8, 4).c_str(),
                    table_value(ratio, 8, 2).c_str(), static_cast<long long>(f.waiting));
        json_tenants += (json_tenants.empty() ? "\"" : ",\"") + name + "\":{\"weight\":" +
                        std::to_string(f.weight) + ",\"share\":" + json_value(share) +
                        ",\"target\":" + json_value(target) + ",\"share_error\":" +
                        json_value(err) + ",\"ttft_n\":" + std::to_string(ttft.n) +
                        ",\"ttft_p50_s\":" + json_value(ttft.p50) +
                        ",\"ttft_p99_s\":" + json_value(ttft.p99) +
                        ",\"itl_n\":" + std::to_string(itl.n) +
                        ",\"itl_p50_s\":" + json_value(itl.p50) +
                        ",\"itl_p99_s\":" + json_value(itl.p99) +
                        ",\"itl_p99_over_p50\":" + json_value(ratio) +
                        ",\"ttft_waiting\":" + std::to_string(f.waiting) + "}";
    }
    std::printf(
        "(TTFT of requests submitted after the warm-up, taken at their first token; ITL gaps "
        "after it, of\n requests finished or still streaming; p99 n/a under %zu samples; waiting: "
        "requests of the\n window with no first token at its end, not in the TTFT figures)\n",
        edge::bench::kMinP99Samples);
    const double hit_rate = prompt > 0 ? static_cast<double>(cached) / prompt : 0.0;
    const double kv_use = kv_samples > 0 ? kv_sum / kv_samples : 0.0;
    const double speedup = single_tps > 0 ? total_tps / single_tps : 0.0;
    // Every figure the table shows goes into the JSON line under `key`, from this one call: the
    // table prints `value * table_scale` (the JSON holds `value`), "n/a" for none.
    std::string json_figures;
    auto figure = [&](const char* label, const char* key, std::optional<double> value,
                      int precision, const std::string& note = "", double table_scale = 1.0) {
        const std::optional<double> shown =
            value ? std::optional<double>(*value * table_scale) : std::nullopt;
        std::printf("%-44s %s%s\n", label, table_value(shown, 12, precision).c_str(),
                    note.c_str());
        json_figures += ",\"" + std::string(key) + "\":" + json_value(value);
    };
    char note[96];
    std::snprintf(note, sizeof note, "  (before %.2f, after %.2f)", single_before, single_after);
    figure("single-stream tokens/s", "single_tokens_per_s", single_tps, 2, note);
    json_figures += ",\"single_before_tokens_per_s\":" + json_value(single_before) +
                    ",\"single_after_tokens_per_s\":" + json_value(single_after);
    figure("64-stream total tokens/s", "total_tokens_per_s", total_tps, 2);
    figure("throughput ratio 64 streams / single", "throughput_ratio", speedup, 2, "  (goal >= 8)");
    figure("generated tokens per step", "tokens_per_step", tokens_per_step, 2);
    figure("expert passes per step", "expert_passes_per_step", passes_per_step, 1);
    figure("weight MB read per step", "step_bytes", bytes_per_step, 1, "", 1e-6);
    figure("64 streams / single at one fraction (bytes)", "throughput_ratio_bytes_bound",
           bytes_bound, 2);
    figure("tokens computed per step (prefill included)", "computed_tokens_per_step",
           computed_per_step, 2);
    figure("G products per step", "step_gproducts", products_per_step / 1e9, 2);
    figure("multiply-add peak (G products/s)", "dot_peak_gprod", peak / 1e9, 1);
    figure("64 streams fraction of the peak", "peak_fraction",
           peak > 0 && tokens_per_step > 0
               ? total_tps / tokens_per_step * products_per_step / peak
               : 0.0,
           3);
    figure("64 streams / single at the peak (products)", "throughput_ratio_products_bound",
           products_bound, 2);
    figure("64 streams / single at most (phases, 1 frac.)", "throughput_ratio_phase_bound",
           phase_bound, 2);
    figure("worst tenant share error (relative)", "worst_share_error", worst_share_err, 3,
           "  (goal <= 0.10)");
    figure("worst p99/p50 inter-token latency", "worst_itl_p99_over_p50",
           latency_measured ? std::optional<double>(worst_itl_ratio) : std::nullopt, 2,
           latency_measured ? "  (goal < 3)" : "  (goal < 3; a tenant has too few ITL samples)");
    figure("mean KV-cache use", "kv_use_mean", kv_use, 3);
    figure("prefix-cache hit rate (prompt tokens)", "prefix_hit_rate", hit_rate, 3);
    figure("preemptions", "preemptions", static_cast<double>(preemptions), 0);
    figure("KV blocks total", "kv_blocks_total", static_cast<double>(serving.kv_blocks_total), 0);
    std::printf(
        "{\"bench\":\"tenancy\",\"model\":\"%s\",\"backend\":\"%s\",\"activations\":\"%s\","
        "\"streams\":%d,\"batch\":%d,\"decode\":%d,\"threads\":%d,\"steps\":%d,\"warmup\":%d,"
        "\"throughput_goal_met\":%s,\"share_goal_met\":%s,\"itl_goal_met\":%s%s,"
        "\"tenants\":{%s}}\n",
        model_name.c_str(), backend.c_str(), activations.c_str(), kStreams, batch, decode, threads,
        steps, warmup, speedup >= 8 ? "true" : "false",
        worst_share_err <= 0.10 ? "true" : "false",
        !latency_measured     ? "null"
        : worst_itl_ratio < 3 ? "true"
                              : "false",
        json_figures.c_str(), json_tenants.c_str());
    return 0;
}
