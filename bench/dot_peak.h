#pragma once

// The BF16 dot-product peak shared by the benches: independent vdpbf16ps chains on registers,
// the most BF16 products per second the AVX512_BF16 kernels could retire (32 per instruction),
// measured at T threads at once. The compute-side limit of a batched step, as the bandwidth
// probe (membw_probe.h) is the memory-side one. Header-only; bench code, not part of a library.

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

// Products per second of `threads` threads running the loop at once: all start at a barrier and
// the products of all are divided by the wall time from the barrier until the last one ends, so
// threads that do not overlap count once, not as a sum of their separate rates. Each run lasts
// about 200 ms (from a one-thread calibration, which also warms the vector units up); the median
// of five runs. 0 on a CPU without AVX512_BF16.
inline double dot_peak(int threads) {
    if (!__builtin_cpu_supports("avx512bf16")) {
        return 0.0;
    }
    threads = std::max(threads, 1);
    constexpr double kRunSeconds = 0.2;
    constexpr int64_t kCalibrationIters = int64_t{1} << 20;
    const auto c0 = std::chrono::steady_clock::now();
    dot_peak_chains(kCalibrationIters);
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
            ts.emplace_back([&start, iters] {
                start.arrive_and_wait();
                dot_peak_chains(iters);
            });
        }
        start.arrive_and_wait();
        dot_peak_chains(iters);
        for (auto& t : ts) {
            t.join();
        }
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        runs.push_back(static_cast<double>(iters) * kDotPeakProductsPerIter * threads / s);
    }
    std::sort(runs.begin(), runs.end());
    return runs[runs.size() / 2];
}

// The kernels engine.cpu_kernels selects ("auto" or an ISA name), by name.
inline std::string kernels_name(const std::string& cpu_kernels) {
    return cpu_kernels != "auto"
               ? cpu_kernels
               : std::string(edge::engine::cpu::isa_name(edge::engine::cpu::detect_isa()));
}

// dot_peak() when those kernels are the AVX512_BF16 ones whose peak it measures; 0 for the
// others (the AMX tiles, the widen + FMA fallbacks), which it would not bound.
inline double kernels_dot_peak(const std::string& cpu_kernels, int threads) {
    return kernels_name(cpu_kernels) == "avx512_bf16" ? dot_peak(threads) : 0.0;
}

}  // namespace edge::bench
