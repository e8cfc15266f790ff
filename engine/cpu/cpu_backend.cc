#include "engine/cpu/cpu_backend.h"

namespace edge::engine::cpu {

CpuBackend::CpuBackend(const BackendOptions& options, std::optional<Isa> isa)
    : pool_(options.threads), isa_(isa.value_or(detect_isa())) {}

bool CpuBackend::supports(Op op, WeightFormat format) const {
    if (op == Op::kMatmul) {
        return matmul_kernel(format, isa_) != nullptr;
    }
    return true;
}

void CpuBackend::matmul(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy) {
    cpu::matmul(pool_, isa_, w, x, n, y, ldy);
}

void CpuBackend::matmul_batch(std::span<const MatmulJob> jobs) {
    cpu::matmul_batch(pool_, isa_, jobs);
}

void CpuBackend::swiglu_batch(std::span<const SwiGluJob> jobs) {
    cpu::swiglu_batch(pool_, isa_, jobs);
}

void CpuBackend::run_tasks(int64_t n, void (*fn)(void*, int64_t, int), void* ctx) {
    pool_.for_each_task(n, [fn, ctx](int64_t i, int worker) { fn(ctx, i, worker); });
}

}  // namespace edge::engine::cpu
