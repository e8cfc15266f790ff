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

// The instructions, each as an Op for peak_chains: Acc the accumulator, In the two operands,
// kChains independent chains (enough to cover the instruction's latency on its pipes), kProducts
// per instruction. Operands and results go by reference, so the generic loop passes no vector by
// value (which would change its ABI); the wrappers below flatten it into code of their target.
struct DotBf16Op {
    using Acc = __m512;
    using In = __m512bh;
    static constexpr int kChains = 16;
    static constexpr int64_t kProducts = 32;
    __attribute__((target("avx512f,avx512bw,avx512bf16"))) static void fill(Acc& v, float x) {
        v = _mm512_set1_ps(x);
    }
    __attribute__((target("avx512f,avx512bw,avx512bf16"))) static void fill(In& v, float x) {
        v = reinterpret_cast<__m512bh>(_mm512_set1_epi16(x < 0.5f ? 0x3c00 : 0x3f80));
    }
    __attribute__((target("avx512f,avx512bw,avx512bf16"))) static void madd(
        Acc& acc, const In& a, const In& b) {
        acc = _mm512_dpbf16_ps(acc, a, b);
    }
    __attribute__((target("avx512f,avx512bw,avx512bf16"))) static void opaque(In& v) {
        __asm__ volatile("" : "+v"(v));
    }
    __attribute__((target("avx512f,avx512bw,avx512bf16"))) static void keep(const Acc& v) {
        __asm__ volatile("" : : "v"(v));
    }
};

struct Fma512Op {
    using Acc = __m512;
    using In = __m512;
    static constexpr int kChains = 12;
    static constexpr int64_t kProducts = 16;
    __attribute__((target("avx512f"))) static void fill(Acc& v, float x) { v = _mm512_set1_ps(x); }
    __attribute__((target("avx512f"))) static void madd(Acc& acc, const In& a, const In& b) {
        acc = _mm512_fmadd_ps(acc, a, b);
    }
    __attribute__((target("avx512f"))) static void opaque(In& v) { __asm__ volatile("" : "+v"(v)); }
    __attribute__((target("avx512f"))) static void keep(const Acc& v) {
        __asm__ volatile("" : : "v"(v));
    }
};

struct Fma256Op {
    using Acc = __m256;
    using In = __m256;
    static constexpr int kChains = 12;
    static constexpr int64_t kProducts = 8;
    __attribute__((target("avx2,fma"))) static void fill(Acc& v, float x) { v = _mm256_set1_ps(x); }
    __attribute__((target("avx2,fma"))) static void madd(Acc& acc, const In& a, const In& b) {
        acc = _mm256_fmadd_ps(acc, a, b);
    }
    __attribute__((target("avx2,fma"))) static void opaque(In& v) {
        __asm__ volatile("" : "+x"(v));
    }
    __attribute__((target("avx2,fma"))) static void keep(const Acc& v) {
        __asm__ volatile("" : : "x"(v));
    }
};

// Runs `iters` rounds of Op::kChains independent chains on one thread: iters * kChains *
// kProducts products. opaque() keeps the loop from being folded away, keep() the results.
template <typename Op>
inline void peak_chains(int64_t iters) {
    typename Op::Acc acc[Op::kChains];
    for (int i = 0; i < Op::kChains; ++i) {
        Op::fill(acc[i], static_cast<float>(i));
    }
    typename Op::In a, b;
    Op::fill(a, 0.999f);
    Op::fill(b, 1e-3f);
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
        for (int i = 0; i < Op::kChains; ++i) {
            Op::madd(acc[i], a, b);
        }
        Op::opaque(b);
    }
    for (int i = 0; i < Op::kChains; ++i) {
        Op::keep(acc[i]);
    }
}

template <typename Op>
inline constexpr int64_t kPeakProductsPerIter = Op::kChains * Op::kProducts;

__attribute__((target("avx512f,avx512bw,avx512bf16"), flatten, noinline)) inline void
dot_peak_chains(int64_t iters) {
    peak_chains<DotBf16Op>(iters);
}
__attribute__((target("avx512f"), flatten, noinline)) inline void fma512_peak_chains(
    int64_t iters) {
    peak_chains<Fma512Op>(iters);
}
__attribute__((target("avx2,fma"), flatten, noinline)) inline void fma256_peak_chains(
    int64_t iters) {
    peak_chains<Fma256Op>(iters);
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
               ? chains_peak(dot_peak_chains, kPeakProductsPerIter<DotBf16Op>, threads)
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
        return {chains_peak(fma512_peak_chains, kPeakProductsPerIter<Fma512Op>, threads), 1.0};
    }
    if (name == "avx2") {
        return {chains_peak(fma256_peak_chains, kPeakProductsPerIter<Fma256Op>, threads), 1.0};
    }
    return {};
}

}  // namespace edge::bench
