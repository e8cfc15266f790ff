// One-token matrix-vector throughput of the float matmul kernels through the engine's real path
// (cpu::matmul on a ThreadPool), against a read-bandwidth probe measured in the same run: the part
// of decode that should run at memory speed, without the rest of the model. The weights are
// 1024 x 1024 BF16 matrices (the bench preset's attention shape) filling --mb MiB, in a file-backed
// mapping like a loaded checkpoint. Each kernel the CPU has is timed at 1 and 2 threads; the
// figure is the median of --rounds passes over all matrices. At 1 thread it also prints the rate
// per second of CPU time against the probe's (steadier when other work shares the machine).
//
//   bench_matvec [--mb MiB] [--rounds R] [--tokens N]
// With --tokens N each call multiplies N tokens (weights still read once per call).

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench/membw_probe.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/cpu/thread_pool.h"

namespace {

using edge::engine::Weight;
using edge::engine::WeightFormat;
namespace cpu = edge::engine::cpu;

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

int main(int argc, char** argv) {
    int64_t mb = 1024;
    int rounds = 7;
    int64_t tokens = 1;  // Tokens per call (batched decode's experts see a few each).
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--mb")) {
            mb = std::max<int64_t>(64, std::atoll(argv[i + 1]));
        } else if (!std::strcmp(argv[i], "--rounds")) {
            rounds = std::max(1, std::atoi(argv[i + 1]));
        } else if (!std::strcmp(argv[i], "--tokens")) {
            tokens = std::max<int64_t>(1, std::atoll(argv[i + 1]));
        }
    }
    constexpr int64_t kRows = 1024, kCols = 1024;
    const int64_t matrix_bytes = kRows * kCols * 2;
    const int64_t count = mb * 1024 * 1024 / matrix_bytes;
    const int64_t total = count * matrix_bytes;

    // A file-backed mapping, as the loader maps safetensors.
    const std::string path =
        (std::filesystem::temp_directory_path() /
         ("edge_bench_matvec_" + std::to_string(getpid())))
            .string();
    {
        std::vector<uint16_t> chunk(static_cast<size_t>(kRows * kCols));
        std::mt19937 rng(7);
        for (uint16_t& v : chunk) {
            v = static_cast<uint16_t>(0x3c00 + (rng() & 0x3ff) - 0x200);  // bf16 near +-[0.002, 0.03].
        }
        FILE* f = std::fopen(path.c_str(), "wb");
        if (f == nullptr) {
            std::fprintf(stderr, "cannot write %s\n", path.c_str());
            return 1;
        }
        for (int64_t m = 0; m < count; ++m) {
            std::fwrite(chunk.data(), 2, chunk.size(), f);
        }
        std::fclose(f);
    }
    const int fd = open(path.c_str(), O_RDONLY);
    void* mem = mmap(nullptr, static_cast<size_t>(total), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    std::filesystem::remove(path);
    if (mem == MAP_FAILED) {
        std::fprintf(stderr, "mmap failed\n");
        return 1;
    }
    const auto* base = static_cast<const char*>(mem);
    std::vector<Weight> weights;
    for (int64_t m = 0; m < count; ++m) {
        weights.push_back({WeightFormat::kBF16, kRows, kCols, base + m * matrix_bytes, nullptr});
    }
    std::vector<float> x(kCols * tokens), y(kRows * tokens);
    for (int64_t c = 0; c < kCols * tokens; ++c) {
        x[c] = std::sin(static_cast<float>(c));
    }

    struct Variant {
        const char* name;
        cpu::Isa isa;
    };
    std::vector<Variant> variants;
    const cpu::Isa best = cpu::detect_isa();
    if (best == cpu::Isa::kAvx512Bf16) {
        variants.push_back({"bf16 avx512_bf16 (vdpbf16ps)", cpu::Isa::kAvx512Bf16});
    }
    if (best == cpu::Isa::kAvx512Bf16 || best == cpu::Isa::kAvx512) {
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
                if (r > 0) {  // The first pass faults the pages in.
                    rates.push_back(static_cast<double>(total) / s);
                    cpu_rates.push_back(static_cast<double>(total) / cs);
                }
            }
            std::sort(rates.begin(), rates.end());
            std::sort(cpu_rates.begin(), cpu_rates.end());
            const double gbps = rates[rates.size() / 2];
            const double cpu_frac = threads == 1 ? cpu_rates[cpu_rates.size() / 2] / probe_cpu : 0.0;
            std::printf("%-32s %8d %10.2f %10.2f %9.3f %10.3f\n", v.name, threads, gbps / 1e9,
                        probe / 1e9, gbps / probe, cpu_frac);
            if (threads == 1) {
                json += ",\"" + std::string(cpu::isa_name(v.isa)) + "_cpu_fraction_1t\":" +
                        std::to_string(cpu_frac);
            }
            json += ",\"" + std::string(cpu::isa_name(v.isa)) + "_fraction_" +
                    std::to_string(threads) + "t\":" + std::to_string(gbps / probe);
        }
    }
    munmap(mem, static_cast<size_t>(total));
    std::printf("%s}\n", json.c_str());
    return 0;
}
