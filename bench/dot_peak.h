#pragma once

// The BF16 dot-product peak shared by the benches: independent vdpbf16ps chains on registers,
// the most BF16 products per second the AVX512_BF16 kernels could retire (32 per instruction),
// measured at T threads at once. The compute-side limit of a batched step, as the bandwidth
// probe (membw_probe.h) is the memory-side one. Header-only; bench code, not part of a library.

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "engine/cpu/matmul.h"

namespace edge::bench {

// One thread's rate: products per second over 2^22 rounds of 16 independent chains.
__attribute__((target("avx512f,avx512bw,avx512bf16"), noinline)) inline double
dot_peak_one_thread() {
    constexpr int kChains = 16;
    constexpr int64_t kIters = 1 << 22;
    __m512 acc[kChains];
    for (int i = 0; i < kChains; ++i) {
        acc[i] = _mm512_set1_ps(static_cast<float>(i));
    }
    const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));
    __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3c00));
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t it = 0; it < kIters; ++it) {
#pragma GCC unroll 16
        for (int i = 0; i < kChains; ++i) {
            acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        }
        __asm__ volatile("" : "+v"(b));  // Keeps the loop from being folded away.
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    __m512 sum = acc[0];
    for (int i = 1; i < kChains; ++i) {
        sum = _mm512_add_ps(sum, acc[i]);
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum);
    volatile float sink = lanes[0];
    (void)sink;
    return static_cast<double>(kIters) * kChains * 32 / s;
}

// Products per second of `threads` threads running the loop at once (their rates summed), the
// median of three runs; 0 on a CPU without AVX512_BF16.
inline double dot_peak(int threads) {
    if (!__builtin_cpu_supports("avx512bf16")) {
        return 0.0;
    }
    std::vector<double> runs;
    for (int r = 0; r < 3; ++r) {
        std::vector<double> rate(static_cast<size_t>(threads), 0.0);
        std::vector<std::thread> ts;
        for (int t = 1; t < threads; ++t) {
            ts.emplace_back([&rate, t] { rate[static_cast<size_t>(t)] = dot_peak_one_thread(); });
        }
        rate[0] = dot_peak_one_thread();
        for (auto& t : ts) {
            t.join();
        }
        double sum = 0;
        for (double x : rate) {
            sum += x;
        }
        runs.push_back(sum);
    }
    std::sort(runs.begin(), runs.end());
    return runs[1];
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
