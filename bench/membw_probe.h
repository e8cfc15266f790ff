#pragma once

// Memory read bandwidth probe shared by the benches: streams a buffer much larger than the caches
// with T threads (each reading its own contiguous part, as the matmul kernels do) and reports the
// median of several runs in bytes per second. Each thread's part is read four ways, one
// sequential stream (as the BF16 kernel reads a matrix for one token) and four interleaved ones
// (its quarters in step, as it reads one for several tokens): without software prefetch,
// prefetching 2 KiB ahead into L1 (as that kernel did until 2026-12-04), and prefetching 256 B
// ahead into L1 and 8 KiB into L2 (as it does now); the fastest median is the limit: on this
// project's Zen 5 VM four streams read 6-17% faster than one, and an engine kernel that reads that
// way must not score above 1.0 against a probe that does not. The buffer is 2 MiB aligned and
// advised huge pages, as the engine's weights are (a checkpoint mapped by MappedFile, row tiles in
// the WeightArena) and as the benches that compare with it hold theirs. Header-only; bench code,
// not part of a library.

#include <immintrin.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace edge::bench {

__attribute__((target("avx2"))) inline uint64_t read_sum_avx2(const uint8_t* p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t out[4];
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), s);
    return out[0] + out[1] + out[2] + out[3];
}

// Four streams: the four quarters of [p, p + n) read in step, 128 bytes each per round, each
// prefetching `l1_ahead` bytes further along itself into L1 and `l2_ahead` into L2 (0: none).
__attribute__((target("avx2"))) inline uint64_t read_sum_streams_avx2(const uint8_t* p, size_t n,
                                                                      size_t l1_ahead,
                                                                      size_t l2_ahead) {
    const size_t q = n / 4 / 128 * 128;
    __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
    for (size_t i = 0; i < q; i += 128) {
        for (int s = 0; s < 4; ++s) {
            const uint8_t* b = p + s * q + i;
            const auto* c = reinterpret_cast<const char*>(b);
            if (l1_ahead != 0) {
                _mm_prefetch(c + l1_ahead, _MM_HINT_T0);
                _mm_prefetch(c + l1_ahead + 64, _MM_HINT_T0);
            }
            if (l2_ahead != 0) {
                _mm_prefetch(c + l2_ahead, _MM_HINT_T1);
                _mm_prefetch(c + l2_ahead + 64, _MM_HINT_T1);
            }
            const __m256i x =
                _mm256_add_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)),
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32)));
            const __m256i y =
                _mm256_add_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64)),
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 96)));
            a[s] = _mm256_add_epi64(a[s], _mm256_add_epi64(x, y));
        }
    }
    __m256i t = _mm256_add_epi64(_mm256_add_epi64(a[0], a[1]), _mm256_add_epi64(a[2], a[3]));
    uint64_t out[4];
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), t);
    return out[0] + out[1] + out[2] + out[3];
}

inline uint64_t read_sum_scalar(const uint8_t* p, size_t n) {
    uint64_t s0 = 0, s1 = 0;
    for (size_t i = 0; i + 16 <= n; i += 16) {
        uint64_t a, b;
        std::memcpy(&a, p + i, 8);
        std::memcpy(&b, p + i + 8, 8);
        s0 += a;
        s1 += b;
    }
    return s0 + s1;
}

// Seconds of CPU time this process has used (all threads).
inline double process_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Read bandwidth (bytes/s) of `threads` threads over a `bytes` buffer: the fastest of the medians
// of `runs` runs reading one stream, four streams, and four streams with either prefetch per
// thread.
// With `per_cpu_second` set, the rate is per second of CPU time instead of wall time: on a
// machine shared with other work, the bandwidth while this process actually runs (meaningful for
// one thread; with more, the threads may not have run at the same time).
inline double measure_read_bandwidth(int threads, size_t bytes = size_t{1} << 30, int runs = 7,
                                     bool per_cpu_second = false) {
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t mapped = bytes + kHuge;
    void* mem = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        return 0.0;
    }
    auto* buf = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(mem) + kHuge - 1) &
                                           ~(uintptr_t{kHuge} - 1));
    madvise(buf, bytes, MADV_HUGEPAGE);  // Advice only: 4 KiB pages if refused.
    std::memset(buf, 1, bytes);          // Fault every page in before timing.
    const bool avx2 = __builtin_cpu_supports("avx2");
    std::vector<uint64_t> sink(threads);
    // kind 0: one stream; 1: four streams; 2: four streams prefetching 2 KiB ahead into L1; 3:
    // four streams prefetching 256 B ahead into L1 and 8 KiB into L2.
    constexpr size_t kL1Ahead[4] = {0, 0, 2048, 256};
    constexpr size_t kL2Ahead[4] = {0, 0, 0, 8192};
    auto median_of = [&](int kind) {
        std::vector<double> rates;
        for (int r = 0; r < runs; ++r) {
            auto t0 = std::chrono::steady_clock::now();
            const double cpu0 = process_cpu_seconds();
            std::vector<std::thread> ts;
            for (int t = 0; t < threads; ++t) {
                ts.emplace_back([&, t] {
                    size_t b = bytes / threads * t;
                    size_t n = bytes / threads;
                    sink[t] += !avx2       ? read_sum_scalar(buf + b, n)
                               : kind == 0 ? read_sum_avx2(buf + b, n)
                                           : read_sum_streams_avx2(buf + b, n, kL1Ahead[kind],
                                                                   kL2Ahead[kind]);
                });
            }
            for (auto& t : ts) {
                t.join();
            }
            double s =
                per_cpu_second
                    ? (process_cpu_seconds() - cpu0) / threads
                    : std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            rates.push_back(static_cast<double>(bytes) / s);
        }
        std::sort(rates.begin(), rates.end());
        return rates[rates.size() / 2];
    };
    double best = median_of(0);
    for (int kind = 1; avx2 && kind <= 3; ++kind) {
        best = std::max(best, median_of(kind));
    }
    munmap(mem, mapped);
    volatile uint64_t keep = sink[0];
    (void)keep;
    return best;
}

}  // namespace edge::bench
