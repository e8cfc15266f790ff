// Single-stream decode throughput of the quantized matrix kernels against measured memory
// bandwidth. Builds the routed experts of the `bench` shape (hidden 1024, expert intermediate 512,
// 64 experts x gate/up [512 x 1024] + down [1024 x 512], two layers so the weights are far larger
// than the last-level cache) in each format, then times GEMV (1 token) over all of them with 1
// and 2 threads, each thread taking half the rows of every matrix as the engine's dispatcher does.
// The limit is a read-bandwidth probe in the same run with the same thread count. Prints a table,
// then one JSON line with every figure.
//
//   bench_quant_kernels [--passes N] [--rounds R] [--layers L]

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <chrono>
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

#include "engine/quant/quant_kernels.h"
#include "engine/quant/quantized_weight.h"

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

// Runs `body(thread_index)` on `threads` persistent threads `passes` times; returns the fastest
// pass in seconds (a pass ends when every thread has finished it).
double time_passes(int threads, int passes, const std::function<void(int)>& body) {
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
    return *std::min_element(pass_times.begin(), pass_times.end());
}

// --- Bandwidth probe: sum 64-bit words of a buffer much larger than the caches. ---

__attribute__((target("avx2"))) uint64_t sum_avx2(const uint64_t* p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t out[4];
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), a0);
    uint64_t s = out[0] + out[1] + out[2] + out[3];
    for (; i < n; ++i) {
        s += p[i];
    }
    return s;
}

struct AlignedBuffer {
    explicit AlignedBuffer(size_t bytes)
        : ptr(static_cast<uint64_t*>(std::aligned_alloc(64, bytes))), size(bytes) {
        std::memset(ptr, 1, bytes);  // Touch every page.
    }
    ~AlignedBuffer() { std::free(ptr); }
    uint64_t* ptr;
    size_t size;
};

// GB/s of reading `buf` with `threads` threads, each summing its contiguous share.
double probe_bandwidth(const AlignedBuffer& buf, int threads, int passes) {
    const size_t kBytes = buf.size;
    const size_t words = kBytes / 8;
    std::atomic<uint64_t> sink{0};
    const double t = time_passes(threads, passes, [&](int index) {
        const size_t begin = words * index / threads;
        const size_t end = words * (index + 1) / threads;
        sink += sum_avx2(buf.ptr + begin, end - begin);
    });
    if (sink.load() == 42) {
        std::printf("#");
    }
    return static_cast<double>(kBytes) / t / 1e9;
}

// --- BF16 baseline, a simple AVX2 loop (widen to f32, FMA). ---

__attribute__((target("avx2,fma"))) void bf16_gemv(const Weight& w, const float* x, float* y,
                                                   int64_t row_begin, int64_t row_end) {
    const auto* data = static_cast<const uint16_t*>(w.data);
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint16_t* q = data + r * w.cols;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        for (int64_t c = 0; c < w.cols; c += 16) {
            const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + c));
            const __m256 lo = _mm256_castsi256_ps(
                _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(b)), 16));
            const __m256 hi = _mm256_castsi256_ps(
                _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(b, 1)), 16));
            a0 = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + c), a0);
            a1 = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + c + 8), a1);
        }
        alignas(32) float s[8];
        _mm256_store_ps(s, _mm256_add_ps(a0, a1));
        y[r] = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
    }
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
    int threads;
    double bytes;
    double seconds;
    double gbps;
    double fraction;
};

}  // namespace

int main(int argc, char** argv) {
    int passes = 5;
    int layers = 2;
    int rounds = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--passes") == 0) {
            passes = std::max(1, std::atoi(argv[i + 1]));
        } else if (std::strcmp(argv[i], "--rounds") == 0) {
            rounds = std::max(1, std::atoi(argv[i + 1]));
        } else if (std::strcmp(argv[i], "--layers") == 0) {
            layers = std::max(1, std::atoi(argv[i + 1]));
        }
    }
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        std::printf("bench_quant_kernels needs AVX2+FMA\n{\"error\": \"no avx2\"}\n");
        return 0;
    }

    const std::vector<Matrix> shapes = expert_shapes(layers);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> x(static_cast<size_t>(kHidden));
    for (float& v : x) {
        v = normal(rng);
    }
    std::vector<float> y(static_cast<size_t>(kHidden));
    std::vector<Row> rows;

    // Every (format, kernel) case is built first, then timed in `rounds` interleaved rounds, each
    // figure keeping its fastest pass: on a shared machine this spreads other load over all cases.
    struct Case {
        std::string format;
        std::string variant;
        const std::vector<Weight>* weights;
        double bytes;
        std::function<void(const Weight&, int64_t, int64_t)> gemv;
    };
    std::vector<Case> cases;
    auto measure = [&](const std::string& format, const std::string& variant,
                       const std::vector<Weight>& weights, double bytes,
                       std::function<void(const Weight&, int64_t, int64_t)> gemv) {
        cases.push_back({format, variant, &weights, bytes, std::move(gemv)});
    };
    std::vector<std::vector<uint16_t>> bf16_store;
    std::vector<Weight> bf16_weights;
    std::vector<std::vector<quant::QuantizedWeight>> quant_store;
    std::vector<std::vector<Weight>> quant_weights;
    quant_store.reserve(8);
    quant_weights.reserve(8);

    {  // BF16 baseline.
        auto& store = bf16_store;
        auto& weights = bf16_weights;
        double bytes = 0;
        for (const Matrix& m : shapes) {
            std::vector<uint16_t> d(static_cast<size_t>(m.rows * m.cols));
            for (auto& v : d) {
                v = static_cast<uint16_t>(std::bit_cast<uint32_t>(normal(rng)) >> 16);
            }
            store.push_back(std::move(d));
            weights.push_back(Weight{WeightFormat::kBF16, m.rows, m.cols, store.back().data(),
                                     nullptr});
            bytes += static_cast<double>(m.rows * m.cols * 2);
        }
        measure("bf16", "avx2-loop", weights, bytes, [&](const Weight& w, int64_t b, int64_t e) {
            // x has kHidden >= cols entries; y is only written, per row.
            thread_local std::vector<float> yl(kHidden);
            bf16_gemv(w, x.data(), yl.data(), b, e);
        });
    }

    const WeightFormat formats[] = {WeightFormat::kFP8E4M3Block128, WeightFormat::kInt8Row,
                                    WeightFormat::kInt4G32, WeightFormat::kInt4G128};
    for (WeightFormat format : formats) {
        auto& store = quant_store.emplace_back();
        auto& weights = quant_weights.emplace_back();
        double bytes = 0;
        std::vector<float> src;
        for (const Matrix& m : shapes) {
            src.resize(static_cast<size_t>(m.rows * m.cols));
            for (float& v : src) {
                v = normal(rng);
            }
            auto q = quant::quantize(quant::SourceMatrix::f32(src.data(), m.rows, m.cols), format);
            if (!q.ok()) {
                std::printf("quantize failed: %s\n", q.status().to_string().c_str());
                return 1;
            }
            bytes += static_cast<double>(q->size_bytes());
            store.push_back(std::move(q).value());
            weights.push_back(store.back().view());
        }
        for (const quant::KernelVariant& v : quant::matmul_kernel_variants(format)) {
            if (std::string(v.name) == "scalar") {
                continue;  // The reference is not a decode path; it would only slow the run.
            }
            const quant::MatmulKernel kernel = v.kernel;
            measure(quant::weight_format_name(format), v.name, weights, bytes,
                    [&](const Weight& w, int64_t b, int64_t e) {
                        thread_local std::vector<float> yl(kHidden);
                        kernel(w, x.data(), 1, yl.data(), w.rows, b, e);
                    });
        }
    }

    std::vector<double> best(cases.size() * 2, 1e30);
    double bw[3] = {0.0, 0.0, 0.0};
    const AlignedBuffer probe_buffer(size_t{512} << 20);
    for (int round = 0; round < rounds; ++round) {
        bw[1] = std::max(bw[1], probe_bandwidth(probe_buffer, 1, passes));
        bw[2] = std::max(bw[2], probe_bandwidth(probe_buffer, 2, passes));
        for (size_t i = 0; i < cases.size(); ++i) {
            const Case& c = cases[i];
            for (int threads : {1, 2}) {
                const double t = time_passes(threads, passes, [&](int index) {
                    for (const Weight& w : *c.weights) {
                        c.gemv(w, w.rows * index / threads, w.rows * (index + 1) / threads);
                    }
                });
                best[i * 2 + threads - 1] = std::min(best[i * 2 + threads - 1], t);
            }
        }
    }
    std::printf("read bandwidth (best of %d rounds): 1 thread %.2f GB/s, 2 threads %.2f GB/s\n",
                rounds, bw[1], bw[2]);
    for (size_t i = 0; i < cases.size(); ++i) {
        for (int threads : {1, 2}) {
            const double t = best[i * 2 + threads - 1];
            const double gbps = cases[i].bytes / t / 1e9;
            rows.push_back({cases[i].format, cases[i].variant, threads, cases[i].bytes, t, gbps,
                            gbps / bw[threads]});
        }
    }

    std::printf("\n%-12s %-12s %7s %10s %10s %9s %9s\n", "format", "kernel", "threads", "MB/token",
                "us/token", "GB/s", "of BW");
    for (const Row& r : rows) {
        std::printf("%-12s %-12s %7d %10.1f %10.1f %9.2f %8.0f%%\n", r.format.c_str(),
                    r.variant.c_str(), r.threads, r.bytes / 1e6, r.seconds * 1e6, r.gbps,
                    r.fraction * 100.0);
    }
    // Best variant per format at 2 threads vs BF16: decode speedup for the routed experts.
    std::string json = "{\"bench\":\"quant_kernels\",\"layers\":" + std::to_string(layers) +
                       ",\"rounds\":" + std::to_string(rounds) +
                       ",\"bandwidth_gbps_1t\":" + std::to_string(bw[1]) +
                       ",\"bandwidth_gbps_2t\":" + std::to_string(bw[2]) + ",\"results\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        char item[320];
        std::snprintf(item, sizeof(item),
                      "%s{\"format\":\"%s\",\"kernel\":\"%s\",\"threads\":%d,\"bytes\":%.0f,"
                      "\"seconds\":%.6g,\"gbps\":%.3f,\"fraction_of_bandwidth\":%.3f}",
                      i ? "," : "", r.format.c_str(), r.variant.c_str(), r.threads, r.bytes,
                      r.seconds, r.gbps, r.fraction);
        json += item;
    }
    json += "]";
    double bf16_2t = 0;
    for (const Row& r : rows) {
        if (r.format == "bf16" && r.threads == 2) {
            bf16_2t = r.seconds;
        }
    }
    json += ",\"speedup_vs_bf16_2t\":{";
    bool first = true;
    for (WeightFormat format : formats) {
        double best = 0;
        for (const Row& r : rows) {
            if (r.format == quant::weight_format_name(format) && r.threads == 2 &&
                (best == 0 || r.seconds < best)) {
                best = r.seconds;
            }
        }
        char item[96];
        std::snprintf(item, sizeof(item), "%s\"%s\":%.3f", first ? "" : ",",
                      quant::weight_format_name(format), best > 0 ? bf16_2t / best : 0.0);
        json += item;
        first = false;
    }
    json += "}}";
    std::printf("%s\n", json.c_str());
    return 0;
}
