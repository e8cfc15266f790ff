// Decode benchmark per architecture: make-model's `bench` size of Qwen3-MoE, GLM-4.5 MoE and
// DeepSeek-V3 (MLA) (hidden 1024, 12 layers, 64 experts top-8 of width 512, vocab 32000), each in
// BF16 and with experts-int4 (routed experts INT4-g32 quantized on load, the rest BF16). For each:
// the KV-cache bytes one token takes (ModelSpec::kv_bytes_per_token), greedy decode tokens/s with
// one stream and with 32 streams decoding together (one batched forward per step; the rate at the
// median step), and the
// fraction of memory read bandwidth (measured in this run, same thread count) that the weight
// bytes read per step reach.
//
// Weight bytes read per step: everything resident except the embedding matrix and the routed
// experts, plus one embedding row per stream and the routed experts the step uses: K per MoE
// layer for one stream; for 32 streams the expected number of distinct experts under uniform
// routing, E (1 - (1 - K/E)^32) (random weights route close to uniformly). KV-cache reads are not
// counted (a few hundred positions at most).
//
// Usage: bench_decode_archs [--models DIR] [--steps N] [--reps N] [--threads N]
//                           [--archs qwen3_moe,glm4_moe,deepseek_v3] [--row-major]
// --archs runs only those architectures; --row-major keeps INT4 weights row-major instead of the
// CPU's row tiles (LoadOptions::row_tiles), for A/B runs of the two layouts with one binary.
// --models DIR holds (or receives) DIR/<arch> checkpoints; without it they are written to a temp
// dir (about 2.5 GB each, one at a time) and removed afterwards. Prints a table, then one JSON
// line.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/membw_probe.h"
#include "engine/model/loader.h"
#include "engine/model/model_config.h"
#include "engine/quant/policy.h"
#include "engine/quant/quantized_weight.h"
#include "engine/tools/make_model.h"

namespace {

using namespace edge::engine;

constexpr int kPrompt = 8;    // Prompt tokens per stream before decoding.
constexpr int kStreams = 32;  // Streams of the batched run.

int64_t matrix_bytes(WeightFormat f, int64_t rows, int64_t cols) {
    if (f == WeightFormat::kBF16) {
        return rows * cols * 2;
    }
    return quant::weight_data_bytes(f, rows, cols) + quant::weight_scale_count(f, rows, cols) * 4;
}

struct ArchShape {
    int64_t hidden = 0, vocab = 0, moe_layers = 0, experts = 0, top_k = 0, moe_inter = 0;
};

ArchShape shape_of(const ConfigJson& c) {
    auto g = [&](const char* k) { return c.get_int(k).value_or(0); };
    ArchShape s;
    s.hidden = g("hidden_size");
    s.vocab = g("vocab_size");
    s.experts = g("num_experts") > 0 ? g("num_experts") : g("n_routed_experts");
    s.top_k = g("num_experts_per_tok");
    s.moe_inter = g("moe_intermediate_size");
    const int64_t layers = g("num_hidden_layers");
    const int64_t dense = g("first_k_dense_replace");  // 0 for Qwen3's bench (no dense layer).
    s.moe_layers = layers - dense;
    return s;
}

// Weight bytes one decode step of `streams` streams reads (see the header comment).
double bytes_per_step(const ArchShape& s, int64_t resident, WeightFormat experts, int streams) {
    const double expert = 2.0 * matrix_bytes(experts, s.moe_inter, s.hidden) +
                          matrix_bytes(experts, s.hidden, s.moe_inter);
    const double all_experts = static_cast<double>(s.moe_layers * s.experts) * expert;
    const double embed = static_cast<double>(s.vocab * s.hidden * 2);
    const double fixed = static_cast<double>(resident) - all_experts - embed;
    const double p = static_cast<double>(s.top_k) / static_cast<double>(s.experts);
    const double used = streams == 1
                            ? static_cast<double>(s.top_k)
                            : static_cast<double>(s.experts) * (1.0 - std::pow(1.0 - p, streams));
    return fixed + streams * s.hidden * 2.0 + static_cast<double>(s.moe_layers) * used * expert;
}

void fail(const char* what, const edge::Status& st) {
    std::fprintf(stderr, "%s: %s\n", what, st.to_string().c_str());
    std::exit(1);
}

// Greedy decode of `streams` streams for `steps` steps after a kPrompt-token prefill each;
// decode tokens/s over all streams.
double decode_tps(CausalLM& m, int streams, int steps) {
    std::mt19937 rng(5);
    std::vector<int32_t> slots;
    std::vector<std::vector<TokenId>> prompts(streams, std::vector<TokenId>(kPrompt));
    for (int s = 0; s < streams; ++s) {
        auto slot = m.acquire_slot();
        if (!slot.ok()) {
            fail("acquire_slot", slot.status());
        }
        slots.push_back(*slot);
        for (TokenId& t : prompts[s]) {
            t = static_cast<TokenId>(rng() % 256);
        }
    }
    const size_t vocab = static_cast<size_t>(m.spec().vocab_size);
    std::vector<float> logits;
    std::vector<SequenceChunk> batch;
    for (int s = 0; s < streams; ++s) {
        batch.push_back(SequenceChunk{slots[s], 0, prompts[s], false});
    }
    if (edge::Status st = m.forward(batch, &logits); !st.ok()) {
        fail("prefill", st);
    }
    std::vector<TokenId> next(streams);
    // The rate at the median step (edge::bench::StepTimes), as bench_decode takes it: the
    // real-time throttle and other tenants stretch a few steps several times over.
    edge::bench::StepTimes times;
    for (int step = 0; step < steps; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        batch.clear();
        for (int s = 0; s < streams; ++s) {
            const float* row = logits.data() + static_cast<size_t>(s) * vocab;
            next[s] = static_cast<TokenId>(std::max_element(row, row + vocab) - row);
            batch.push_back(SequenceChunk{slots[s], m.slot_length(slots[s]), {&next[s], 1}, false});
        }
        if (edge::Status st = m.forward(batch, &logits); !st.ok()) {
            fail("decode", st);
        }
        times.add(t0);
    }
    for (int32_t slot : slots) {
        m.release_slot(slot);
    }
    return times.median_rate(streams);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Row {
    std::string arch, format;
    int streams = 1;
    int64_t kv_bytes = 0, resident = 0;
    double step_bytes = 0, tps = 0, bw = 0;
    double fraction() const { return tps / streams * step_bytes / bw; }
};

}  // namespace

int main(int argc, char** argv) {
    std::string models_dir;
    int steps = 12, reps = 3, threads = 2;
    std::string archs = "qwen3_moe,glm4_moe,deepseek_v3";
    bool row_major = false;
    edge::bench::parse_flags(
        argc, argv,
        {edge::bench::Flag::string("--models", &models_dir,
                                   "folder of <arch> checkpoints, written where missing "
                                   "(default: temporary)"),
         edge::bench::Flag::integer("--steps", &steps, 1, "decode steps per run"),
         edge::bench::Flag::integer("--reps", &reps, 1, "runs per figure (median)"),
         edge::bench::Flag::integer("--threads", &threads, 1, "compute threads"),
         edge::bench::Flag::string("--archs", &archs, "a,b: only these architectures"),
         edge::bench::Flag::boolean("--row-major", &row_major,
                                    "INT4 weights row-major, not in row tiles")},
        "bench_decode_archs: decode per architecture, BF16 and experts-int4");
    const std::vector<std::string> wanted =
        edge::bench::known_names(argv[0], "--archs", archs,
                                 {"qwen3_moe", "glm4_moe", "deepseek_v3"});
    std::vector<Row> rows;
    for (const char* arch : {"qwen3_moe", "glm4_moe", "deepseek_v3"}) {
        if (std::find(wanted.begin(), wanted.end(), arch) == wanted.end()) {
            continue;
        }
        const edge::bench::BenchCheckpoint checkpoint(
            models_dir.empty() ? "" : models_dir + "/" + arch, "bench", arch, true);
        const std::string& dir = checkpoint.dir();
        auto config = ConfigJson::read(dir);
        if (!config.ok()) {
            fail(arch, config.status());
        }
        const ArchShape shape = shape_of(*config);
        int64_t bf16_resident = 0;
        for (const char* policy : {"none", "experts-int4"}) {
            LoadOptions lo;
            lo.threads = threads;
            lo.max_slots = kStreams;
            lo.max_context = kPrompt + steps + 8;
            lo.quantization = policy;
            lo.row_tiles = !row_major;
            auto model = load_model(dir, lo);
            if (!model.ok()) {
                fail(arch, model.status());
            }
            auto parsed_policy = quant::parse_quant_policy(policy);
            if (!parsed_policy.ok()) {
                fail(policy, parsed_policy.status());
            }
            // An architecture that does not quantize on load keeps BF16 experts: count what is
            // resident, not what the policy asked for (the table then shows resident unchanged).
            const int64_t resident = (*model)->spec().weight_bytes;
            if (bf16_resident == 0) {
                bf16_resident = resident;
            }
            const WeightFormat experts =
                resident < bf16_resident
                    ? parsed_policy->format_for(quant::TensorClass::kRoutedExperts)
                    : WeightFormat::kBF16;
            decode_tps(**model, 1, 2);  // Warm-up: pages in the weights.
            for (int streams : {1, kStreams}) {
                Row r;
                r.arch = arch;
                r.format = std::string(policy) == "none" ? "bf16" : policy;
                r.streams = streams;
                r.kv_bytes = (*model)->spec().kv_bytes_per_token;
                r.resident = (*model)->spec().weight_bytes;
                r.step_bytes = bytes_per_step(shape, r.resident, experts, streams);
                std::vector<double> tps, bw;
                for (int k = 0; k < reps; ++k) {
                    bw.push_back(edge::bench::measure_read_bandwidth(threads, size_t{1} << 30, 3));
                    tps.push_back(decode_tps(**model, streams, steps));
                }
                r.tps = median(tps);
                r.bw = median(bw);
                rows.push_back(r);
                std::fprintf(stderr, "%s %s x%d: %.2f tok/s\n", arch, r.format.c_str(), streams,
                             r.tps);
            }
        }
    }
    std::printf("%-12s %-13s %7s %12s %11s %13s %10s %9s %8s\n", "arch", "format", "streams",
                "kv_B/token", "resident_MB", "bytes/step_MB", "tokens/s", "GB/s_bw", "bw_frac");
    std::string json = "{\"bench\":\"decode_archs\",\"threads\":" + std::to_string(threads) +
                       ",\"steps\":" + std::to_string(steps) + ",\"rows\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        std::printf("%-12s %-13s %7d %12lld %11.1f %13.2f %10.2f %9.2f %8.3f\n", r.arch.c_str(),
                    r.format.c_str(), r.streams, static_cast<long long>(r.kv_bytes),
                    r.resident / 1e6, r.step_bytes / 1e6, r.tps, r.bw / 1e9, r.fraction());
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "%s{\"arch\":\"%s\",\"format\":\"%s\",\"streams\":%d,"
                      "\"kv_bytes_per_token\":%lld,\"resident_bytes\":%lld,"
                      "\"weight_bytes_per_step\":%.0f,\"decode_tps\":%.4g,"
                      "\"bandwidth_bytes_per_s\":%.4g,\"bandwidth_fraction\":%.4g}",
                      i ? "," : "", r.arch.c_str(), r.format.c_str(), r.streams,
                      static_cast<long long>(r.kv_bytes), static_cast<long long>(r.resident),
                      r.step_bytes, r.tps, r.bw, r.fraction());
        json += buf;
    }
    std::printf("%s]}\n", json.c_str());
    return 0;
}
