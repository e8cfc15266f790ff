// One-token matrix-vector throughput of the float matmul kernels through the engine's real path
// (cpu::matmul on a ThreadPool), against a read-bandwidth probe measured in the same run: the part
// of decode that should run at memory speed, without the rest of the model. The weights are
// 1024 x 1024 BF16 matrices (the bench preset's attention shape) filling --mb MiB, in a file mapped
// as the loader maps a checkpoint (the engine's MappedFile: 2 MiB aligned, MADV_HUGEPAGE, read in
// by populate()) after the written file is dropped from the page cache, as BenchCheckpoint drops
// a preset: read back from disk it comes in as 2 MiB folios, so the kernels read through the same
// page size as the bandwidth probe's huge-page buffer (a file still cached from its write keeps
// 4 KiB folios; until 2026-12-07 this bench mapped it so, unaligned and unadvised). Each kernel
// the CPU has is timed at 1 and 2 threads; the figure is the median of --rounds passes over all
// matrices. At 1 thread it also prints the rate per second of CPU time against the probe's
// (steadier when other work shares the machine).
//
//   bench_matvec [--mb MiB] [--rounds R] [--tokens N] [--experts [--sequences S]] [--gemm]
// With --tokens N each call multiplies N tokens (weights still read once per call).
// With --experts the same mapping holds routed experts of the bench preset's shape (gate and up
// 512 x 1024, down 1024 x 512, BF16, 3 MiB each), and each layer's worth (64 experts, --tokens
// tokens each) runs through cpu::swiglu_batch (one task per expert) and through the two-step
// form (every gate/up in one matmul_batch, the SiLU product, every down in another), as batched
// decode's routed experts do. With --sequences S the experts' token counts are those of a
// decode step of S sequences (each picks 8 distinct experts of a layer, seeded), uneven as in
// batched decode, instead of --tokens each; the rate counts the experts that got tokens. The
// swiglu_batch path also runs with single-bf16 activations (engine.activation_precision: bf16).
// With --gemm (AVX512_BF16 CPUs) the same mapping holds the bench preset's non-expert matmuls
// (12 layers of q/k/v 1536 x 1024 through matmul_batch and o 1024 x 1024 through matmul, then
// lm_head 32000 x 1024), each call --tokens tokens (32: a batched decode step): the
// compute-bound part of a batched step. The figure is products per second against a vdpbf16ps
// loop on registers at the same thread count (`fraction_of_peak`), in both activation precisions.

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/dot_peak.h"
#include "bench/membw_probe.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/cpu/ops.h"
#include "engine/cpu/thread_pool.h"
#include "engine/model/safetensors.h"

namespace {

using edge::engine::Weight;
using edge::engine::WeightFormat;
namespace cpu = edge::engine::cpu;

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// --experts: see the file comment.
int run_experts(const char* base, int64_t total, int64_t tokens, int rounds, int64_t sequences) {
    constexpr int64_t kHidden = 1024, kInter = 512, kPerLayer = 64;
    constexpr int64_t kExpertBytes = 3 * kHidden * kInter * 2;
    const int64_t layers = total / (kExpertBytes * kPerLayer);
    if (layers < 1) {
        std::fprintf(stderr, "--experts needs --mb of at least 192\n");
        return 2;
    }
    struct Expert {
        Weight gate, up, down;
    };
    std::vector<Expert> experts;
    for (int64_t e = 0; e < layers * kPerLayer; ++e) {
        const char* p = base + e * kExpertBytes;
        experts.push_back(
            {{WeightFormat::kBF16, kInter, kHidden, p, nullptr},
             {WeightFormat::kBF16, kInter, kHidden, p + kExpertBytes / 3, nullptr},
             {WeightFormat::kBF16, kHidden, kInter, p + 2 * kExpertBytes / 3, nullptr}});
    }
    // Tokens per expert and each expert's first row in its layer's inputs.
    constexpr int kTopK = 8;
    std::vector<int64_t> count(static_cast<size_t>(layers * kPerLayer), tokens);
    if (sequences > 0) {
        std::fill(count.begin(), count.end(), 0);
        std::mt19937 rng(1);
        std::vector<int64_t> pick(kPerLayer);
        for (int64_t l = 0; l < layers; ++l) {
            for (int64_t s = 0; s < sequences; ++s) {
                std::iota(pick.begin(), pick.end(), 0);
                std::shuffle(pick.begin(), pick.end(), rng);
                for (int k = 0; k < kTopK; ++k) {
                    ++count[static_cast<size_t>(l * kPerLayer + pick[static_cast<size_t>(k)])];
                }
            }
        }
    }
    std::vector<int64_t> first(count.size());
    int64_t rows = 0;  // The most rows of any layer.
    int64_t bytes = 0;
    for (int64_t l = 0; l < layers; ++l) {
        int64_t r = 0;
        for (int64_t e = 0; e < kPerLayer; ++e) {
            const size_t i = static_cast<size_t>(l * kPerLayer + e);
            first[i] = r;
            r += count[i];
            bytes += count[i] > 0 ? kExpertBytes : 0;
        }
        rows = std::max(rows, r);
    }
    std::vector<float> x(static_cast<size_t>(rows * kHidden)), y(x.size());
    std::vector<float> gate(static_cast<size_t>(rows * kInter)), up(gate.size()), act(gate.size());
    for (size_t c = 0; c < x.size(); ++c) {
        x[c] = std::sin(static_cast<float>(c));
    }
    const cpu::Isa isa = cpu::detect_isa();
    const auto [lo, hi] = std::minmax_element(count.begin(), count.end());
    std::printf("%lld layers of %lld experts, %lld-%lld tokens each (%s), isa %s\n",
                static_cast<long long>(layers), static_cast<long long>(kPerLayer),
                static_cast<long long>(*lo), static_cast<long long>(*hi),
                sequences > 0 ? "a step of --sequences" : "--tokens",
                std::string(cpu::isa_name(isa)).c_str());
    std::printf("%-32s %8s %10s %10s %9s\n", "path", "threads", "GB/s", "probe", "fraction");
    std::string json = "{\"bench\":\"matvec_experts\",\"tokens\":" + std::to_string(tokens) +
                       ",\"sequences\":" + std::to_string(sequences);
    for (int threads = 1; threads <= 2; ++threads) {
        cpu::ThreadPool pool(threads);
        const double probe = edge::bench::measure_read_bandwidth(threads);
        json += ",\"membw_gbps_" + std::to_string(threads) + "t\":" + std::to_string(probe / 1e9);
        // Path 0: swiglu_batch, 1: the two-step form, 2: swiglu_batch with single-bf16
        // activations (engine.activation_precision: bf16).
        for (int path = 0; path < 3; ++path) {
            std::vector<double> rates;
            for (int r = 0; r < rounds + 1; ++r) {
                const double t0 = now_s();
                for (int64_t l = 0; l < layers; ++l) {
                    const Expert* ex = experts.data() + l * kPerLayer;
                    const int64_t* n = count.data() + l * kPerLayer;
                    const int64_t* o = first.data() + l * kPerLayer;
                    if (path != 1) {
                        std::vector<edge::engine::SwiGluJob> jobs;
                        for (int64_t e = 0; e < kPerLayer; ++e) {
                            if (n[e] > 0) {
                                jobs.push_back({&ex[e].gate, &ex[e].up, &ex[e].down,
                                                x.data() + o[e] * kHidden, n[e],
                                                y.data() + o[e] * kHidden, kHidden});
                            }
                        }
                        cpu::swiglu_batch(pool, isa, jobs,
                                          path == 2 ? edge::engine::ActivationPrecision::kBf16
                                                    : edge::engine::ActivationPrecision::kExact);
                    } else {
                        std::vector<edge::engine::MatmulJob> jobs;
                        for (int64_t e = 0; e < kPerLayer; ++e) {
                            if (n[e] > 0) {
                                jobs.push_back({&ex[e].gate, x.data() + o[e] * kHidden, n[e],
                                                gate.data() + o[e] * kInter, kInter});
                                jobs.push_back({&ex[e].up, x.data() + o[e] * kHidden, n[e],
                                                up.data() + o[e] * kInter, kInter});
                            }
                        }
                        cpu::matmul_batch(pool, isa, jobs);
                        cpu::silu_mul(gate.data(), up.data(), rows * kInter, act.data());
                        jobs.clear();
                        for (int64_t e = 0; e < kPerLayer; ++e) {
                            if (n[e] > 0) {
                                jobs.push_back({&ex[e].down, act.data() + o[e] * kInter, n[e],
                                                y.data() + o[e] * kHidden, kHidden});
                            }
                        }
                        cpu::matmul_batch(pool, isa, jobs);
                    }
                }
                const double s = now_s() - t0;
                if (r > 0) {
                    rates.push_back(static_cast<double>(bytes) / s);
                }
            }
            std::sort(rates.begin(), rates.end());
            const double gbps = rates[rates.size() / 2];
            const char* name = path == 0   ? "swiglu_batch (task per expert)"
                               : path == 1 ? "two matmul_batch"
                                           : "swiglu_batch, bf16 activations";
            std::printf("%-32s %8d %10.2f %10.2f %9.3f\n", name, threads, gbps / 1e9, probe / 1e9,
                        gbps / probe);
            json += std::string(",\"") +
                    (path == 0   ? "swiglu_batch"
                     : path == 1 ? "two_step"
                                 : "swiglu_batch_bf16") +
                    "_fraction_" + std::to_string(threads) + "t\":" + std::to_string(gbps / probe);
        }
    }
    std::printf("%s}\n", json.c_str());
    return 0;
}

// --gemm: see the file comment.
int run_gemm(const char* base, int64_t total, int64_t tokens, int rounds) {
    constexpr int64_t kHidden = 1024, kQ = 1024, kKv = 256, kVocab = 32000, kLayers = 12;
    const int64_t layer_bytes = (kQ + 2 * kKv + kHidden) * kHidden * 2;
    const int64_t need = kLayers * layer_bytes + kVocab * kHidden * 2;
    if (total < need) {
        std::fprintf(stderr, "--gemm needs --mb of at least %lld\n",
                     static_cast<long long>((need >> 20) + 1));
        return 2;
    }
    if (!cpu::has_avx512_bf16(cpu::detect_isa())) {
        std::fprintf(stderr, "--gemm needs a CPU with AVX512_BF16\n");
        return 1;
    }
    struct Layer {
        Weight q, k, v, o;
    };
    std::vector<Layer> layers;
    const char* p = base;
    auto take = [&](int64_t rows) {
        Weight w{WeightFormat::kBF16, rows, kHidden, p, nullptr};
        p += rows * kHidden * 2;
        return w;
    };
    for (int64_t l = 0; l < kLayers; ++l) {
        Layer L;
        L.q = take(kQ);
        L.k = take(kKv);
        L.v = take(kKv);
        L.o = take(kHidden);
        layers.push_back(L);
    }
    const Weight lm_head = take(kVocab);
    std::vector<float> x(static_cast<size_t>(tokens * kHidden));
    for (size_t c = 0; c < x.size(); ++c) {
        x[c] = std::sin(static_cast<float>(c));
    }
    std::vector<float> q(static_cast<size_t>(tokens * kQ)), k(static_cast<size_t>(tokens * kKv));
    std::vector<float> v(k.size()), o(static_cast<size_t>(tokens * kHidden));
    std::vector<float> logits(static_cast<size_t>(tokens * kVocab));
    const double attn_products = static_cast<double>(kLayers) * (kQ + 2 * kKv + kHidden) *
                                 kHidden * static_cast<double>(tokens);
    const double head_products = static_cast<double>(kVocab) * kHidden * tokens;
    std::printf("non-expert matmuls of the bench preset, %lld tokens per call\n",
                static_cast<long long>(tokens));
    std::printf("%-22s %-6s %8s %12s %12s %9s %9s\n", "part", "acts", "threads", "Gprod/s",
                "peak", "fraction", "ms");
    std::string json = "{\"bench\":\"matvec_gemm\",\"tokens\":" + std::to_string(tokens);
    const cpu::Isa isa = cpu::Isa::kAvx512Bf16;
    for (int threads = 1; threads <= 2; ++threads) {
        cpu::ThreadPool pool(threads);
        const double peak = edge::bench::dot_peak(threads);
        json += ",\"peak_gprod_" + std::to_string(threads) + "t\":" + std::to_string(peak / 1e9);
        for (int prec = 0; prec < 2; ++prec) {
            const auto precision = prec == 0 ? edge::engine::ActivationPrecision::kExact
                                             : edge::engine::ActivationPrecision::kBf16;
            // Exact mode multiplies each weight twice (hi and lo); the figure counts weights
            // times tokens, and the peak is halved to match.
            const double pk = prec == 0 ? peak / 2 : peak;
            for (int part = 0; part < 2; ++part) {
                std::vector<double> secs;
                for (int r = 0; r < rounds + 1; ++r) {
                    const double t0 = now_s();
                    if (part == 0) {
                        for (const Layer& L : layers) {
                            const edge::engine::MatmulJob jobs[] = {
                                {&L.q, x.data(), tokens, q.data(), kQ},
                                {&L.k, x.data(), tokens, k.data(), kKv},
                                {&L.v, x.data(), tokens, v.data(), kKv}};
                            cpu::matmul_batch(pool, isa, jobs, precision);
                            cpu::matmul(pool, isa, L.o, x.data(), tokens, o.data(), kHidden,
                                        precision);
                        }
                    } else {
                        cpu::matmul(pool, isa, lm_head, x.data(), tokens, logits.data(), kVocab,
                                    precision);
                    }
                    if (r > 0) {
                        secs.push_back(now_s() - t0);
                    }
                }
                std::sort(secs.begin(), secs.end());
                const double s = secs[secs.size() / 2];
                const double rate = (part == 0 ? attn_products : head_products) / s;
                const char* name = part == 0 ? "12 x (q/k/v, o)" : "lm_head";
                const char* acts = prec == 0 ? "exact" : "bf16";
                std::printf("%-22s %-6s %8d %12.1f %12.1f %9.3f %9.3f\n", name, acts, threads,
                            rate / 1e9, pk / 1e9, rate / pk, s * 1e3);
                json += std::string(",\"") + (part == 0 ? "attn" : "lm_head") + "_" + acts +
                        "_fraction_of_peak_" + std::to_string(threads) +
                        "t\":" + std::to_string(rate / pk);
            }
        }
    }
    std::printf("%s}\n", json.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    int64_t mb = 1024;
    int rounds = 7;
    int64_t tokens = 1;  // Tokens per call (batched decode's experts see a few each).
    bool experts_mode = false;
    bool gemm_mode = false;
    int64_t sequences = 0;  // --experts: token counts of a step of this many sequences (0: off).
    edge::bench::parse_flags(
        argc, argv,
        {edge::bench::Flag::integer("--mb", &mb, 64, 65536,
                                    "MiB of BF16 weights streamed per pass"),
         edge::bench::Flag::integer("--rounds", &rounds, 1, "rounds (median)"),
         edge::bench::Flag::integer("--tokens", &tokens, 1, 4096, "tokens per call"),
         edge::bench::Flag::boolean("--experts", &experts_mode,
                                    "routed-expert SwiGLU tasks instead of plain matvec"),
         edge::bench::Flag::integer("--sequences", &sequences, 0,
                                    "--experts: token counts of a decode step of S sequences"),
         edge::bench::Flag::boolean("--gemm", &gemm_mode,
                                    "the bench preset's non-expert matmuls (q/k/v, o, lm_head)")},
        "bench_matvec: the BF16 matvec/matmul kernels against memory bandwidth");
    constexpr int64_t kRows = 1024, kCols = 1024;
    const int64_t matrix_bytes = kRows * kCols * 2;
    const int64_t count = mb * 1024 * 1024 / matrix_bytes;
    const int64_t total = count * matrix_bytes;

    // A file mapped as the loader maps safetensors (see the file comment).
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("edge_bench_matvec_" + std::to_string(getpid()));
    std::error_code dir_error;
    std::filesystem::create_directory(dir, dir_error);
    const std::string path = (dir / "weights.bin").string();
    {
        std::vector<uint16_t> chunk(static_cast<size_t>(kRows * kCols));
        std::mt19937 rng(7);
        for (uint16_t& v : chunk) {
            v = static_cast<uint16_t>(0x3c00 + (rng() & 0x3ff) - 0x200);  // bf16 near +-[0.002, 0.03].
        }
        FILE* f = std::fopen(path.c_str(), "wb");
        if (f == nullptr) {
            std::fprintf(stderr, "cannot write %s\n", path.c_str());
            std::filesystem::remove_all(dir, dir_error);
            return 1;
        }
        for (int64_t m = 0; m < count; ++m) {
            std::fwrite(chunk.data(), 2, chunk.size(), f);
        }
        std::fclose(f);
    }
    edge::bench::BenchCheckpoint::evict_from_page_cache(dir.string());
    auto mapped = edge::engine::MappedFile::open(path);
    edge::Status read = mapped.ok() ? (*mapped)->populate() : mapped.status();
    std::filesystem::remove_all(dir, dir_error);  // The mapping keeps the file's pages.
    if (!read.ok()) {
        std::fprintf(stderr, "%s\n", read.to_string().c_str());
        return 1;
    }
    const auto* base = reinterpret_cast<const char*>((*mapped)->data());
    std::vector<Weight> weights;
    for (int64_t m = 0; m < count; ++m) {
        weights.push_back({WeightFormat::kBF16, kRows, kCols, base + m * matrix_bytes, nullptr});
    }
    std::vector<float> x(kCols * tokens), y(kRows * tokens);
    for (int64_t c = 0; c < kCols * tokens; ++c) {
        x[c] = std::sin(static_cast<float>(c));
    }
    if (gemm_mode) {
        return run_gemm(base, total, tokens, rounds);
    }
    if (experts_mode) {
        return run_experts(base, total, tokens, rounds, sequences);
    }

    struct Variant {
        const char* name;
        cpu::Isa isa;
    };
    std::vector<Variant> variants;
    const cpu::Isa best = cpu::detect_isa();
    if (cpu::has_avx512_bf16(best)) {
        variants.push_back({"bf16 avx512_bf16 (vdpbf16ps)", cpu::Isa::kAvx512Bf16});
    }
    if (cpu::has_avx512_bf16(best) || best == cpu::Isa::kAvx512) {
        variants.push_back({"bf16 avx512 (widen + fma)", cpu::Isa::kAvx512});
    }
    if (best != cpu::Isa::kScalar) {
        variants.push_back({"bf16 avx2 (widen + fma)", cpu::Isa::kAvx2});
    }

    std::printf("%-32s %8s %10s %10s %9s %10s\n", "kernel", "threads", "GB/s", "probe", "fraction",
                "cpu-frac");
    std::string json = "{\"bench\":\"matvec\",\"tokens\":" + std::to_string(tokens) +
                       ",\"mb\":" + std::to_string(total >> 20);
    for (int threads = 1; threads <= 2; ++threads) {
        cpu::ThreadPool pool(threads);
        const double probe = edge::bench::measure_read_bandwidth(threads);
        const double probe_cpu =
            threads == 1 ? edge::bench::measure_read_bandwidth(1, size_t{1} << 30, 7, true) : 0.0;
        json += ",\"membw_gbps_" + std::to_string(threads) + "t\":" + std::to_string(probe / 1e9);
        for (const Variant& v : variants) {
            std::vector<double> rates, cpu_rates;
            for (int r = 0; r < rounds + 1; ++r) {
                const double t0 = now_s();
                const double c0 = edge::bench::process_cpu_seconds();
                for (const Weight& w : weights) {
                    cpu::matmul(pool, v.isa, w, x.data(), tokens, y.data(), kRows);
                }
                const double s = now_s() - t0;
                const double cs = (edge::bench::process_cpu_seconds() - c0) / threads;
                if (r > 0) {  // The first pass is a warm-up (caches, TLB).
                    rates.push_back(static_cast<double>(total) / s);
                    cpu_rates.push_back(static_cast<double>(total) / cs);
                }
            }
            std::sort(rates.begin(), rates.end());
            std::sort(cpu_rates.begin(), cpu_rates.end());
            const double gbps = rates[rates.size() / 2];
            const double cpu_frac = threads == 1 ? cpu_rates[cpu_rates.size() / 2] / probe_cpu : 0.0;
            // The CPU-time fraction is measured at one thread only: "-" at two.
            char cpu_col[16] = "         -";
            if (threads == 1) {
                std::snprintf(cpu_col, sizeof cpu_col, "%10.3f", cpu_frac);
            }
            std::printf("%-32s %8d %10.2f %10.2f %9.3f %s\n", v.name, threads, gbps / 1e9,
                        probe / 1e9, gbps / probe, cpu_col);
            if (threads == 1) {
                json += ",\"" + std::string(cpu::isa_name(v.isa)) + "_cpu_fraction_1t\":" +
                        std::to_string(cpu_frac);
            }
            json += ",\"" + std::string(cpu::isa_name(v.isa)) + "_fraction_" +
                    std::to_string(threads) + "t\":" + std::to_string(gbps / probe);
        }
    }
    std::printf("%s}\n", json.c_str());
    return 0;
}
