#include "engine/cpu/cpu_backend.h"

#include <algorithm>

#include "engine/cpu/ops.h"

namespace edge::engine::cpu {

CpuBackend::CpuBackend(const BackendOptions& options, std::optional<Isa> isa)
    : pool_(options.threads),
      isa_(isa.value_or(detect_isa())),
      precision_(options.activation_precision) {}

bool CpuBackend::supports(Op op, WeightFormat format) const {
    if (op == Op::kMatmul) {
        return matmul_kernel(format, isa_) != nullptr;
    }
    return true;
}

void CpuBackend::matmul(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy) {
    cpu::matmul(pool_, isa_, w, x, n, y, ldy, precision_);
}

void CpuBackend::matmul_exact(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy) {
    cpu::matmul(pool_, isa_, w, x, n, y, ldy, ActivationPrecision::kExact);
}

void CpuBackend::matmul_batch(std::span<const MatmulJob> jobs) {
    cpu::matmul_batch(pool_, isa_, jobs, precision_);
}

void CpuBackend::swiglu_batch(std::span<const SwiGluJob> jobs) {
    // BF16 experts with AVX512_BF16 stream each expert's three matrices on one thread at any
    // token count (rows_stream in matmul_avx512_bf16.cc: four long sequential reads per matrix,
    // each prefetching ahead of itself). For one token that beat the split task list below by
    // 12-16%: bench_decode --profile single --threads 2, three interleaved pairs, 95.2 / 95.9 /
    // 98.0 against 85.0 / 84.5 / 81.8 tokens/s. The quantized kernels keep the task list.
    bool one_token = true;
    bool streamed_bf16 = isa_ == Isa::kAvx512Bf16;
    for (const SwiGluJob& j : jobs) {
        one_token = one_token && j.n == 1;
        streamed_bf16 = streamed_bf16 && j.gate->format == WeightFormat::kBF16 &&
                        j.up->format == WeightFormat::kBF16 &&
                        j.down->format == WeightFormat::kBF16;
    }
    if (one_token && !streamed_bf16) {
        swiglu_one_token(jobs);
        return;
    }
    cpu::swiglu_batch(pool_, isa_, jobs, precision_);
}

void CpuBackend::swiglu_one_token(std::span<const SwiGluJob> jobs) {
    // Parts per job: few enough that each streams for a while (every part starts cold, its first
    // rows not prefetched, and the quantized kernels prepare the activations once per call;
    // bench preset: a gate/up part reads 2 MiB, a down part 512 KiB), enough that the workers
    // end together. Measured: BF16 (bench_decode --profile single) 1-2 parts beat 4 by ~5%, 8
    // lost ~10%; INT8 and INT4 (bench_decode_quant --formats int8,int4-g128) one gate/up part
    // beat two by 1-35% tokens/s in two interleaved pairs.
    constexpr int64_t kUpParts = 1;
    constexpr int64_t kDownParts = 2;
    constexpr int64_t kAlign = 16;  // Part boundaries in rows (whole 4-row kernel blocks).
    const auto nj = static_cast<int64_t>(jobs.size());
    if (nj == 0) {
        return;
    }
    if (static_cast<int64_t>(up_done_.size()) < nj) {
        up_done_ = std::vector<std::atomic<int>>(static_cast<size_t>(nj));
    }
    // Each job's gate, up and SiLU-product rows start at offset[j] in the scratch.
    offset_.assign(static_cast<size_t>(nj) + 1, 0);
    for (int64_t j = 0; j < nj; ++j) {
        up_done_[j].store(0, std::memory_order_relaxed);
        offset_[j + 1] = offset_[j] + jobs[j].gate->rows;
    }
    if (gate_.size() < static_cast<size_t>(offset_[nj])) {
        gate_.resize(static_cast<size_t>(offset_[nj]));
        up_.resize(static_cast<size_t>(offset_[nj]));
        act_.resize(static_cast<size_t>(offset_[nj]));
    }
    auto part = [](int64_t rows, int64_t parts, int64_t p) {
        const int64_t units = (rows + kAlign - 1) / kAlign;
        return std::min(rows, units * p / parts * kAlign);
    };
    auto task = [&](int64_t t, int) {
        if (t < nj * kUpParts) {
            const SwiGluJob& j = jobs[t / kUpParts];
            const int64_t o = offset_[t / kUpParts];
            const int64_t p = t % kUpParts;
            const int64_t rows = j.gate->rows;
            const int64_t r0 = part(rows, kUpParts, p);
            const int64_t r1 = part(rows, kUpParts, p + 1);
            if (r0 < r1) {
                float* gate = gate_.data() + o;
                float* up = up_.data() + o;
                matmul_kernel(j.gate->format, isa_)(*j.gate, j.x, 1, gate, rows, r0, r1);
                matmul_kernel(j.up->format, isa_)(*j.up, j.x, 1, up, rows, r0, r1);
                silu_mul(gate + r0, up + r0, r1 - r0, act_.data() + o + r0);
            }
            up_done_[t / kUpParts].fetch_add(1, std::memory_order_release);
            return;
        }
        t -= nj * kUpParts;
        const SwiGluJob& j = jobs[t / kDownParts];
        const float* act = act_.data() + offset_[t / kDownParts];
        const std::atomic<int>& done = up_done_[t / kDownParts];
        while (done.load(std::memory_order_acquire) < kUpParts) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        }
        const int64_t p = t % kDownParts;
        const int64_t rows = j.down->rows;
        const int64_t r0 = part(rows, kDownParts, p);
        const int64_t r1 = part(rows, kDownParts, p + 1);
        if (r0 < r1) {
            matmul_kernel(j.down->format, isa_)(*j.down, act, 1, j.y, rows, r0, r1);
        }
    };
    pool_.for_each_task(nj * (kUpParts + kDownParts), task);
}

void CpuBackend::run_tasks(int64_t n, void (*fn)(void*, int64_t, int), void* ctx) {
    pool_.for_each_task(n, [fn, ctx](int64_t i, int worker) { fn(ctx, i, worker); });
}

}  // namespace edge::engine::cpu
