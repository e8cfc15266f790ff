#pragma once

// CpuBackend runs everything on the host: a ThreadPool of BackendOptions::threads workers and the
// SIMD kernels for the best ISA cpuid reports (or a forced one, for tests).
//
// Threading: as Backend: one driving thread at a time.

#include <optional>

#include "engine/backend.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/thread_pool.h"

namespace edge::engine::cpu {

class CpuBackend final : public Backend {
public:
    // `isa`: the kernels to use; the detected best when empty (a forced ISA must be supported).
    explicit CpuBackend(const BackendOptions& options, std::optional<Isa> isa = std::nullopt);

    std::string_view name() const override { return "cpu"; }
    bool supports(Op op, WeightFormat format) const override;
    // Row tiles have AVX-512 VNNI kernels only: not at a lower engine.cpu_kernels.
    bool supports_row_tiles() const override {
        return static_cast<int>(isa_) >= static_cast<int>(Isa::kAvx512);
    }
    int threads() const override { return pool_.size(); }
    void matmul(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy) override;
    void matmul_exact(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy) override;
    void matmul_batch(std::span<const MatmulJob> jobs) override;
    // One task per expert (cpu::swiglu_batch), at any token count and weight format.
    void swiglu_batch(std::span<const SwiGluJob> jobs) override;

    Isa isa() const { return isa_; }
    ActivationPrecision activation_precision() const override { return precision_; }
    std::string cpu_kernels() const override { return std::string(isa_name(isa_)); }
    ThreadPool& pool() { return pool_; }

protected:
    void run_tasks(int64_t n, void (*fn)(void*, int64_t, int), void* ctx) override;

private:
    ThreadPool pool_;
    Isa isa_;
    ActivationPrecision precision_;  // BackendOptions::activation_precision.
};

}  // namespace edge::engine::cpu
