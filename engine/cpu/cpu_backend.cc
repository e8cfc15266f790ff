#include "engine/cpu/cpu_backend.h"

#include <algorithm>

#include "common/check.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/cpu/ops.h"

namespace edge::engine::cpu {

CpuBackend::CpuBackend(const BackendOptions& options, std::optional<Isa> isa)
    : pool_(options.threads),
      isa_(isa.value_or(detect_isa())),
      precision_(options.activation_precision) {
    // Tile instructions without the kernel's grant fault (SIGILL): an explicit kAmxBf16 needs it.
    EDGE_CHECK(isa_ != Isa::kAmxBf16 || amx_bf16_usable(),
               "Isa::kAmxBf16 on a CPU or kernel without usable AMX-BF16 tiles");
}

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
    // One task per expert at any token count and weight format (cpu::swiglu_batch): one thread
    // streams an expert's gate, up and down matrices in turn, each as long sequential reads
    // (BF16 with AVX512_BF16: rows_stream; the quantized kernels: four row streams per call).
    // For one token through quantized experts this replaced a task list that split each
    // expert's gate/up and down over the workers (every part starting a matrix cold, down parts
    // spinning until their gate/up was done). Measured as an in-process A/B (the two forms
    // alternating every 16 decode steps on one loaded bench preset, 12-20 rounds, median of the
    // per-round ratios; docs/quantization.md): per-expert tasks faster by 5.4% / 2.6% (int4-g128,
    // two runs), 2.1% / 1.8% (fp8), 1.3% (int8), 1.8% (int4-g32), 0.3% (experts-int4).
    cpu::swiglu_batch(pool_, isa_, jobs, precision_);
}

void CpuBackend::run_tasks(int64_t n, void (*fn)(void*, int64_t, int), void* ctx) {
    pool_.for_each_task(n, [fn, ctx](int64_t i, int worker) { fn(ctx, i, worker); });
}

}  // namespace edge::engine::cpu
