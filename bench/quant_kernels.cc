// Single-stream decode throughput of the quantized matrix kernels against measured memory
// bandwidth. Builds the routed experts of the `bench` shape (hidden 1024, expert intermediate 512,
// per layer 64 experts x gate/up [512 x 1024] + down [1024 x 512]) in each format, with as many
// layers as it takes for that format's weights to fill --mb MiB (default 1024: this machine's
// caches hold well over 128 MiB, so smaller sets measure the cache, not memory), then times GEMV
// (1 token) over all of them with 1 and 2 threads, each thread taking half the rows of every
// matrix as the engine's dispatcher does, and the default kernel with a batch of 8 tokens; where
// this CPU has kernels for row tiles (WeightLayout::kRowTiles16), those too (1 and 8 tokens, on
// tiled copies of the same weights, split at tile boundaries). BF16 runs through the engine's
// own float kernels (engine/cpu), so a format's speedup is over what the engine would read BF16
// with. The limit is the shared read-bandwidth probe (bench/membw_probe.h, 1 GiB) with the same
// thread count, measured in every round. Each figure is the median of all passes of all rounds,
// and the probe the median of its rounds: the machine is shared, and the fastest pass of a noisy
// run flatters a kernel as much as the fastest probe flatters the limit. Formats are built one at
// a time to bound memory, their bytes in the engine's huge-page WeightArena (as the loader keeps
// row tiles, and as the probe's buffer is advised). Prints a table, then one JSON line.
//
//   bench_quant_kernels [--passes N] [--rounds R] [--mb MiB] [--formats bf16,fp8-block128,...]

#include "engine/quant/quant_kernels.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/membw_probe.h"
#include "engine/cpu/matmul.h"
#include "engine/quant/quantized_weight.h"
#include "engine/quant/row_tiles.h"
#include "engine/quant/weight_arena.h"

namespace {

using edge::engine::Weight;
using edge::engine::WeightFormat;
namespace quant = edge::engine::quant;

constexpr int64_t kHidden = 1024;
constexpr int64_t kExpertInter = 512;
constexpr int64_t kExperts = 64;

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Runs `body(thread_index)` on `threads` persistent threads `passes` times; returns each pass's
// time in seconds (a pass ends when every thread has finished it).
std::vector<double> time_passes(int threads, int passes, const std::function<void(int)>& body) {
    std::barrier sync(threads);
    std::vector<double> pass_times(static_cast<size_t>(passes));
    auto worker = [&](int index) {
        for (int p = 0; p < passes; ++p) {
            sync.arrive_and_wait();
            const double t0 = now_s();
            body(index);
            sync.arrive_and_wait();
            if (index == 0) {
                pass_times[static_cast<size_t>(p)] = now_s() - t0;
            }
        }
    };
    std::vector<std::thread> pool;
    for (int i = 1; i < threads; ++i) {
        pool.emplace_back(worker, i);
    }
    worker(0);
    for (auto& t : pool) {
        t.join();
    }
    return pass_times;
}

// The engine's BF16 kernels for one token at each ISA this CPU runs from AVX2 up (the decode
// path: exact activations), named by ISA; the one the engine picks here last.
std::vector<std::pair<std::string, quant::MatmulKernel>> bf16_kernels() {
    namespace cpu = edge::engine::cpu;
    std::vector<std::pair<std::string, quant::MatmulKernel>> kernels;
    const cpu::Isa best = cpu::detect_isa();
    for (cpu::Isa isa : {cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAvx512Bf16}) {
        if (isa <= best) {
            kernels.emplace_back(cpu::isa_name(isa), cpu::matmul_kernel(WeightFormat::kBF16, isa));
        }
    }
    return kernels;
}

// --- The expert matrices of one format. ---

struct Matrix {
    int64_t rows;
    int64_t cols;
};

std::vector<Matrix> expert_shapes(int layers) {
    std::vector<Matrix> m;
    for (int l = 0; l < layers; ++l) {
        for (int e = 0; e < kExperts; ++e) {
            m.push_back({kExpertInter, kHidden});  // gate_proj
            m.push_back({kExpertInter, kHidden});  // up_proj
            m.push_back({kHidden, kExpertInter});  // down_proj
        }
    }
    return m;
}

struct Row {
    std::string format;
    std::string variant;
    int tokens;
    int threads;
    int layers;
    double bytes;    // Weight bytes read per call (all layers).
    double seconds;  // Fastest pass.
    double gbps;
    double fraction;
};

// One format's expert weights. Their bytes live in a WeightArena, as the loader keeps row tiles:
// chunks on 2 MiB boundaries advised huge pages, the pages of the bandwidth probe's buffer and of
// a mapped checkpoint. (Until 2026-12-07 they were malloc'd, in 4 KiB pages where THP is
// "madvise", so the fractions of the probe compared two page sizes.)
struct FormatSet {
    quant::WeightArena arena;  // Declared first: outlives the weights that point into it.
    std::vector<quant::QuantizedWeight> quantized;
    std::vector<Weight> weights;
    std::vector<quant::QuantizedWeight> tiled;  // Row-tile copies, when this CPU has the kernels.
    std::vector<Weight> tiled_weights;
    double bytes = 0;
    int layers = 0;
};

// Bytes one layer of experts takes in `format` (bf16 included).
double layer_bytes(WeightFormat format) {
    double total = 0;
    for (const Matrix& m : expert_shapes(1)) {
        total += format == WeightFormat::kBF16
                     ? static_cast<double>(m.rows * m.cols * 2)
                     : static_cast<double>(quant::weight_data_bytes(format, m.rows, m.cols) +
                                           4 * quant::weight_scale_count(format, m.rows, m.cols));
    }
    return total;
}

// A copy of `q` (row-major) with its data in `arena`.
quant::QuantizedWeight in_arena(const quant::QuantizedWeight& q, quant::WeightArena* arena) {
    const Weight& w = q.view();
    const auto n = static_cast<size_t>(quant::weight_data_bytes(w.format, w.rows, w.cols));
    quant::AlignedBytes data(arena->allocate(n), n);
    std::memcpy(data.data(), w.data, n);
    return quant::QuantizedWeight(w.format, w.rows, w.cols, std::move(data),
                                  std::vector<float>(q.scales().begin(), q.scales().end()));
}

// Quantizes one layer of random experts, then copies its buffers for the other layers (generating
// and quantizing a GiB of random weights would take minutes; the bytes only need to be distinct).
bool build_set(WeightFormat format, double target_bytes, std::mt19937& rng, FormatSet* set) {
    std::normal_distribution<float> normal(0.0f, 0.02f);
    set->layers = std::max(1, static_cast<int>(std::ceil(target_bytes / layer_bytes(format))));
    const std::vector<Matrix> shapes = expert_shapes(1);
    // A pool of random values; each matrix takes a window at a random offset.
    std::vector<float> pool(size_t{1} << 22);
    for (float& v : pool) {
        v = normal(rng);
    }
    std::uniform_int_distribution<size_t> offset(0, pool.size() / 2);
    for (int layer = 0; layer < set->layers; ++layer) {
        for (size_t i = 0; i < shapes.size(); ++i) {
            const Matrix& m = shapes[i];
            const size_t n = static_cast<size_t>(m.rows * m.cols);
            if (format == WeightFormat::kBF16) {
                auto* d = reinterpret_cast<uint16_t*>(set->arena.allocate(n * 2));
                if (layer == 0) {
                    const float* src = pool.data() + offset(rng);
                    for (size_t k = 0; k < n; ++k) {
                        d[k] = static_cast<uint16_t>(std::bit_cast<uint32_t>(src[k]) >> 16);
                    }
                } else {
                    std::memcpy(d, set->weights[i].data, n * 2);
                }
                set->weights.push_back(Weight{WeightFormat::kBF16, m.rows, m.cols, d, nullptr});
                set->bytes += static_cast<double>(n * 2);
                continue;
            }
            if (layer == 0) {
                auto q = quant::quantize(
                    quant::SourceMatrix::f32(pool.data() + offset(rng), m.rows, m.cols), format);
                if (!q.ok()) {
                    std::printf("quantize failed: %s\n", q.status().to_string().c_str());
                    return false;
                }
                set->quantized.push_back(in_arena(*q, &set->arena));
            } else {
                set->quantized.push_back(in_arena(set->quantized[i], &set->arena));
            }
            set->bytes += static_cast<double>(set->quantized.back().size_bytes());
        }
    }
    for (const quant::QuantizedWeight& q : set->quantized) {
        set->weights.push_back(q.view());
    }
    if (quant::matmul_kernel_for(format, edge::engine::WeightLayout::kRowTiles16) != nullptr) {
        for (const quant::QuantizedWeight& q : set->quantized) {
            auto t = quant::tile_rows(q.view(), &set->arena);
            if (!t.ok()) {
                std::printf("tile_rows failed: %s\n", t.status().to_string().c_str());
                return false;
            }
            set->tiled.push_back(std::move(t).value());
        }
        for (const quant::QuantizedWeight& q : set->tiled) {
            set->tiled_weights.push_back(q.view());
        }
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    int passes = 5;
    int rounds = 4;
    int64_t target_mib = 1024;
    std::string formats_flag;  // Comma-separated format names (as printed); empty: all.
    edge::bench::parse_flags(
        argc, argv,
        {edge::bench::Flag::integer("--passes", &passes, 1, "passes per round"),
         edge::bench::Flag::integer("--rounds", &rounds, 1,
                                    "rounds (each figure: the median pass of all rounds)"),
         edge::bench::Flag::integer("--mb", &target_mib, 256, 65536,
                                    "MiB of weights per format (>= 256: past the caches)"),
         edge::bench::Flag::string("--formats", &formats_flag,
                                   "only these formats, e.g. bf16,int4-g32 (default: all)")},
        "bench_quant_kernels: quantized matvec/matmul kernels against memory bandwidth");
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        std::printf("bench_quant_kernels needs AVX2+FMA\n{\"error\": \"no avx2\"}\n");
        return 0;
    }
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    constexpr int kBatch = 8;  // Tokens of the n-token case (prefill, or several streams).
    std::vector<float> x(static_cast<size_t>(kBatch * kHidden));
    for (float& v : x) {
        v = normal(rng);
    }
    std::vector<double> probes[3];  // Each round's probe, by thread count.
    std::vector<Row> rows;

    const WeightFormat formats[] = {WeightFormat::kBF16, WeightFormat::kFP8E4M3Block128,
                                    WeightFormat::kInt8Row, WeightFormat::kInt4G32,
                                    WeightFormat::kInt4G128};
    std::string only;
    if (!formats_flag.empty()) {
        std::vector<std::string> names;
        for (WeightFormat f : formats) {
            names.emplace_back(quant::weight_format_name(f));
        }
        for (const std::string& f :
             edge::bench::known_names(argv[0], "--formats", formats_flag, names)) {
            only += "," + f + ",";
        }
    }
    auto selected = [&](WeightFormat format) {
        return formats_flag.empty() ||
               only.find("," + std::string(quant::weight_format_name(format)) + ",") !=
                   std::string::npos;
    };
    for (WeightFormat format : formats) {
        if (!selected(format)) {
            continue;
        }
        FormatSet set;
        if (!build_set(format, static_cast<double>(target_mib) * 1048576.0, rng, &set)) {
            return 1;
        }
        struct Case {
            std::string variant;
            int tokens;
            quant::MatmulKernel kernel;
            bool tiles = false;          // Runs on the row-tile copies (WeightLayout::kRowTiles16).
        };
        std::vector<Case> cases;
        if (format == WeightFormat::kBF16) {
            for (const auto& [name, kernel] : bf16_kernels()) {
                cases.push_back({name, 1, kernel});
            }
            cases.push_back(
                {"default", kBatch,
                 edge::engine::cpu::matmul_kernel(format, edge::engine::cpu::detect_isa(),
                                                  edge::engine::ActivationPrecision::kExact)});
        } else {
            for (const quant::KernelVariant& v : quant::matmul_kernel_variants(format)) {
                if (std::string(v.name) != "scalar") {  // Not a decode path; only slows the run.
                    cases.push_back({v.name, 1, v.kernel});
                }
            }
            cases.push_back({"default", kBatch, quant::matmul_kernel_for(format)});
            for (const quant::KernelVariant& v :
                 quant::matmul_kernel_variants(format, edge::engine::WeightLayout::kRowTiles16)) {
                cases.push_back({v.name, 1, v.kernel, true});
                cases.push_back({v.name, kBatch, v.kernel, true});
            }
        }
        std::vector<std::vector<double>> passes_by_case(cases.size() * 2);
        for (int round = 0; round < rounds; ++round) {
            // The shared probe (bench/membw_probe.h): the fastest of one stream and four
            // interleaved ones, as the engine's four-stream kernels read.
            for (int threads : {1, 2}) {
                probes[threads].push_back(
                    edge::bench::measure_read_bandwidth(threads, size_t{1} << 30, passes) / 1e9);
            }
            for (size_t i = 0; i < cases.size(); ++i) {
                const Case& c = cases[i];
                for (int threads : {1, 2}) {
                    const std::vector<double> t = time_passes(threads, passes, [&](int index) {
                        thread_local std::vector<float> y(kBatch * kHidden);
                        // Row tiles are split at tile boundaries, as the engine's pool does.
                        const int64_t align = c.tiles ? edge::engine::kRowTile : 1;
                        for (const Weight& w : c.tiles ? set.tiled_weights : set.weights) {
                            const int64_t b = w.rows * index / threads / align * align;
                            const int64_t e = index + 1 == threads
                                                  ? w.rows
                                                  : w.rows * (index + 1) / threads / align * align;
                            c.kernel(w, x.data(), c.tokens, y.data(), w.rows, b, e);
                        }
                    });
                    std::vector<double>& all = passes_by_case[i * 2 + threads - 1];
                    all.insert(all.end(), t.begin(), t.end());
                }
            }
        }
        for (size_t i = 0; i < cases.size(); ++i) {
            for (int threads : {1, 2}) {
                const double t = median(passes_by_case[i * 2 + threads - 1]);
                rows.push_back({quant::weight_format_name(format), cases[i].variant,
                                cases[i].tokens, threads, set.layers, set.bytes, t,
                                set.bytes / t / 1e9, 0.0});
            }
        }
    }
    const double bw[3] = {0.0, median(probes[1]), median(probes[2])};
    for (Row& r : rows) {
        r.fraction = r.gbps / bw[r.threads];
    }

    std::printf(
        "read bandwidth (median of the rounds, 1 GiB buffer): 1 thread %.2f GB/s, "
        "2 threads %.2f GB/s\n",
        bw[1], bw[2]);
    std::printf(
        "GB/s = weight bytes read per call / time; 'of BW' = that / the probe's GB/s at "
        "the same thread count; us/layer = time for one layer of 64 experts.\n\n");
    std::printf("%-12s %-12s %6s %7s %6s %9s %10s %9s %8s %7s\n", "format", "kernel", "tokens",
                "threads", "layers", "weight MB", "us/layer", "us/l/tok", "GB/s", "of BW");
    for (const Row& r : rows) {
        const double per_layer = r.seconds * 1e6 / r.layers;
        std::printf("%-12s %-12s %6d %7d %6d %9.1f %10.1f %9.1f %8.2f %6.0f%%\n", r.format.c_str(),
                    r.variant.c_str(), r.tokens, r.threads, r.layers, r.bytes / 1e6, per_layer,
                    per_layer / r.tokens, r.gbps, r.fraction * 100.0);
    }

    // Decode speedup over BF16 of each format's default kernel at 2 threads (time per layer).
    auto per_layer_time = [&](const std::string& format, const std::string& kernel, int threads,
                              int tokens) {
        for (const Row& r : rows) {
            if (r.format == format && r.variant == kernel && r.threads == threads &&
                r.tokens == tokens) {
                return r.seconds / r.layers;
            }
        }
        return 0.0;
    };
    std::string json = "{\"bench\":\"quant_kernels\",\"rounds\":" + std::to_string(rounds) +
                       ",\"passes\":" + std::to_string(passes) +
                       ",\"bandwidth_gbps_1t\":" + std::to_string(bw[1]) +
                       ",\"bandwidth_gbps_2t\":" + std::to_string(bw[2]) + ",\"results\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        char item[400];
        std::snprintf(item, sizeof(item),
                      "%s{\"format\":\"%s\",\"kernel\":\"%s\",\"tokens\":%d,\"threads\":%d,"
                      "\"layers\":%d,\"bytes\":%.0f,\"seconds\":%.6g,\"gbps\":%.3f,"
                      "\"fraction_of_bandwidth\":%.3f}",
                      i ? "," : "", r.format.c_str(), r.variant.c_str(), r.tokens, r.threads,
                      r.layers, r.bytes, r.seconds, r.gbps, r.fraction);
        json += item;
    }
    json += "],\"default_kernel_2t\":{";
    const double bf16_layer = per_layer_time("bf16", bf16_kernels().back().first, 2, 1);
    bool first = true;
    for (WeightFormat format : formats) {
        if (format == WeightFormat::kBF16 || !selected(format)) {
            continue;
        }
        const std::string name = quant::weight_format_name(format);
        // The default kernel is the last variant; find its name.
        const std::string kernel = quant::matmul_kernel_variants(format).back().name;
        double fraction = 0;
        for (const Row& r : rows) {
            if (r.format == name && r.variant == kernel && r.threads == 2 && r.tokens == 1) {
                fraction = r.fraction;
            }
        }
        const double t = per_layer_time(name, kernel, 2, 1);
        char item[200];
        std::snprintf(item, sizeof(item),
                      "%s\"%s\":{\"kernel\":\"%s\",\"fraction_of_bandwidth\":%.3f,"
                      "\"speedup_vs_bf16\":%s}",
                      first ? "" : ",", name.c_str(), kernel.c_str(), fraction,
                      t > 0 && bf16_layer > 0 ? std::to_string(bf16_layer / t).c_str()
                                              : "null");
        json += item;
        first = false;
    }
    json += "}}";
    std::printf("%s\n", json.c_str());
    return 0;
}
