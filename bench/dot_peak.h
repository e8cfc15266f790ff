#pragma once

// The multiply-add peaks shared by the benches: independent chains of the instruction a CPU
// kernel family multiplies with, on registers, the most products per second those kernels could
// retire, measured at T threads at once. vdpbf16ps (32 BF16 products) for the AVX512_BF16
// kernels; a 256-bit or 512-bit FMA (8 or 16 F32 products) for the kernels that widen BF16 and
// multiply in F32 (avx2, avx512). The compute-side limit of a batched step, as the bandwidth probe
// (membw_probe.h) is the memory-side one. Header-only; bench code, not part of a library.

#include <immintrin.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "engine/cpu/matmul.h"

namespace edge::bench {

// Runs `iters` rounds of 16 independent chains on one thread: iters * 16 * 32 products.
__attribute__((target("avx512f,avx512bw,avx512bf16"), noinline)) inline void dot_peak_chains(
    int64_t iters) {
    constexpr int kChains = 16;
    __m512 acc[kChains];
    for (int i = 0; i < kChains; ++i) {
        acc[i] = _mm512_set1_ps(static_cast<float>(i));
    }
    const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));
    __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3c00));
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
        for (int i = 0; i < kChains; ++i) {
            acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        }
        __asm__ volatile("" : "+v"(b));  // Keeps the loop from being folded away.
    }
    __m512 sum = acc[0];
    for (int i = 1; i < kChains; ++i) {
        sum = _mm512_add_ps(sum, acc[i]);
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum);
    volatile float sink = lanes[0];
    (void)sink;
}

inline constexpr int64_t kDotPeakProductsPerIter = 16 * 32;

// The same for the widen + FMA kernels: 12 independent F32 FMA chains (enough to cover the FMA
// latency on two pipes) of 8 lanes (AVX2) or 16 (AVX-512F).
__attribute__((target("avx2,fma"), noinline)) inline void fma256_peak_chains(int64_t iters) {
    constexpr int kChains = 12;
    __m256 acc[kChains];
    for (int i = 0; i < kChains; ++i) {
        acc[i] = _mm256_set1_ps(static_cast<float>(i));
    }
    const __m256 a = _mm256_set1_ps(0.999f);
    __m256 b = _mm256_set1_ps(1e-3f);
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
        for (int i = 0; i < kChains; ++i) {
            acc[i] = _mm256_fmadd_ps(acc[i], a, b);
        }
        __asm__ volatile("" : "+x"(b));
    }
    __m256 sum = acc[0];
    for (int i = 1; i < kChains; ++i) {
        sum = _mm256_add_ps(sum, acc[i]);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, sum);
    volatile float sink = lanes[0];
    (void)sink;
}

__attribute__((target("avx512f"), noinline)) inline void fma512_peak_chains(int64_t iters) {
    constexpr int kChains = 12;
    __m512 acc[kChains];
    for (int i = 0; i < kChains; ++i) {
        acc[i] = _mm512_set1_ps(static_cast<float>(i));
    }
    const __m512 a = _mm512_set1_ps(0.999f);
    __m512 b = _mm512_set1_ps(1e-3f);
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
        for (int i = 0; i < kChains; ++i) {
            acc[i] = _mm512_fmadd_ps(acc[i], a, b);
        }
        __asm__ volatile("" : "+v"(b));
    }
    __m512 sum = acc[0];
    for (int i = 1; i < kChains; ++i) {
        sum = _mm512_add_ps(sum, acc[i]);
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum);
    volatile float sink = lanes[0];
    (void)sink;
}

// Products per second of `threads` threads running the loop at once: all start at a barrier and
// the products of all are divided by the wall time from the barrier until the last one ends, so
// threads that do not overlap count once, not as a sum of their separate rates. Each run lasts
// about 200 ms (from a one-thread calibration, which also warms the vector units up); the median
// of five runs. `chains(iters)` runs iters rounds of products_per_iter products.
inline double chains_peak(void (*chains)(int64_t), int64_t products_per_iter, int threads) {
    threads = std::max(threads, 1);
    constexpr double kRunSeconds = 0.2;
    constexpr int64_t kCalibrationIters = int64_t{1} << 20;
    const auto c0 = std::chrono::steady_clock::now();
    chains(kCalibrationIters);
    const double cal_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
    // Each thread runs as long as one thread alone would in kRunSeconds; fewer cores than threads
    // only make the run longer.
    const int64_t iters = std::max<int64_t>(
        kCalibrationIters,
        static_cast<int64_t>(static_cast<double>(kCalibrationIters) * kRunSeconds / cal_s));
    std::vector<double> runs;
    for (int r = 0; r < 5; ++r) {
        std::chrono::steady_clock::time_point t0;
        // The completion step runs once, when the last thread arrives, before any is released.
        std::barrier start(threads, [&t0]() noexcept { t0 = std::chrono::steady_clock::now(); });
        std::vector<std::thread> ts;
        for (int t = 1; t < threads; ++t) {
            ts.emplace_back([&start, chains, iters] {
                start.arrive_and_wait();
                chains(iters);
            });
        }
        start.arrive_and_wait();
        chains(iters);
        for (auto& t : ts) {
            t.join();
        }
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        runs.push_back(static_cast<double>(iters) * products_per_iter * threads / s);
    }
    std::sort(runs.begin(), runs.end());
    return runs[runs.size() / 2];
}

// The vdpbf16ps peak; 0 on a CPU without AVX512_BF16.
inline double dot_peak(int threads) {
    return __builtin_cpu_supports("avx512bf16")
               ? chains_peak(dot_peak_chains, kDotPeakProductsPerIter, threads)
               : 0.0;
}

// The kernels engine.cpu_kernels selects ("auto" or an ISA name), by name.
inline std::string kernels_name(const std::string& cpu_kernels) {
    return cpu_kernels != "auto"
               ? cpu_kernels
               : std::string(edge::engine::cpu::isa_name(edge::engine::cpu::detect_isa()));
}

// The multiply-add peak of the kernels engine.cpu_kernels selects, and what one weight times one
// exact (F32) activation costs there in the peak's products: 2 for the AVX512_BF16 kernels (a hi
// and a lo BF16 product; 1 with BF16 activations), 1 for the widen + FMA kernels (avx2, avx512:
// both precisions multiply in F32). 0 products/s for the AMX tiles and the scalar kernels, which
// these loops would not bound.
struct KernelPeak {
    double products_per_s = 0.0;
    double exact_cost = 1.0;
};

inline KernelPeak kernels_peak(const std::string& cpu_kernels, int threads) {
    const std::string name = kernels_name(cpu_kernels);
    if (name == "avx512_bf16") {
        return {dot_peak(threads), 2.0};
    }
    if (name == "avx512") {
        return {chains_peak(fma512_peak_chains, 12 * 16, threads), 1.0};
    }
    if (name == "avx2") {
        return {chains_peak(fma256_peak_chains, 12 * 8, threads), 1.0};
    }
    return {};
}

}  // namespace edge::bench
