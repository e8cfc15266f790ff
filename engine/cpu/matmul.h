#pragma once

// Matrix multiplication over a Weight of any format, split over a ThreadPool:
//   y[t * ldy + r] = sum_c W[r][c] * x[t * W.cols + c]   for t < n, r < W.rows.
// Float formats (F32/BF16/F16) use engine/cpu's kernels for the best ISA the CPU has; quantized
// formats use quant::matmul_kernel_for(). One call reads each weight row once for all n tokens.
//
// Threading: a Matmul is immutable after construction; matmul() uses the pool and so must be called
// from one thread at a time per pool.

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include "common/result.h"

#include "engine/cpu/matmul_job.h"
#include "engine/cpu/thread_pool.h"
#include "engine/cpu/weight.h"
#include "engine/quant/quant_kernels.h"

namespace edge::engine::cpu {

// kAvx512Bf16 is kAvx512 plus AVX512_BF16 dot products for BF16 weights (F32/F16 as kAvx512).
// kAmxBf16 is kAvx512Bf16 plus AMX-BF16 tiles for multi-token products (matmul_kernels.h
// amx_min_tokens: BF16 weights from 4 tokens with exact activations, else, and for quantized
// weights decoded to bf16, from 16).
enum class Isa { kScalar, kAvx2, kAvx512, kAvx512Bf16, kAmxBf16 };

// The best ISA this CPU runs (cpuid; for kAmxBf16 also the kernel's grant of the tile state).
Isa detect_isa();
// The ISA isa_name() calls `name`, when this CPU runs it (engine.cpu_kernels); kInvalidArgument
// naming the known names, or that this CPU's best is lower.
Result<Isa> isa_by_name(std::string_view name);
// Whether `isa` has the AVX512_BF16 kernels (kAvx512Bf16, and kAmxBf16 below the tiles' threshold).
inline bool has_avx512_bf16(Isa isa) { return isa == Isa::kAvx512Bf16 || isa == Isa::kAmxBf16; }
std::string_view isa_name(Isa isa);
// The quantized kernels `isa` may use (engine.cpu_kernels caps them as it caps the float ones).
quant::KernelLevel kernel_level(Isa isa);

// The kernel for `format` at `isa` (float formats), the quantized kernel within `isa`'s level for
// quantized formats, or nullptr when there is none. `precision` kBf16 picks the
// single-bf16-activation BF16 kernel at kAvx512Bf16 (the callers below pass it only for calls of
// more than one token).
quant::MatmulKernel matmul_kernel(WeightFormat format, Isa isa,
                                  ActivationPrecision precision = ActivationPrecision::kExact);
// The kernel for `w` as laid out: matmul_kernel(w.format, ...) for row-major weights,
// quant::matmul_kernel_for(w.format, w.layout, ...) for row tiles (nullptr when there is none:
// their kernels need kAvx512 and VNNI).
quant::MatmulKernel matmul_kernel(const Weight& w, Isa isa,
                                  ActivationPrecision precision = ActivationPrecision::kExact);

// Runs the kernel for w.format at `isa` with rows split across the pool. The kernel must exist
// (checked by the loader through Backend::supports). `precision` applies when n > 1 (and to the
// BF16 kernel at kAvx512Bf16 only); the same holds for the batch forms below, per job.
void matmul(ThreadPool& pool, Isa isa, const Weight& w, const float* x, int64_t n, float* y,
            int64_t ldy, ActivationPrecision precision = ActivationPrecision::kExact);

// Runs independent matmuls (e.g. q/k/v, or every active expert's gate and up projections) as one
// parallel loop over all their rows: one dispatch instead of one per matrix.
void matmul_batch(ThreadPool& pool, Isa isa, std::span<const MatmulJob> jobs,
                  ActivationPrecision precision = ActivationPrecision::kExact);

// Runs independent SwiGLU feed-forwards (a step's routed experts, each with its own few tokens):
// jobs[i].y = down(silu(gate x) * up x). With enough jobs to share out, each job is one task run
// whole by one worker (largest first): its gate, up and down weights are streamed once, back to
// back, and there is no barrier between the projections. With fewer jobs than that (one dense MLP,
// a few experts) the projections are split by rows across the pool instead. Same results as the
// separate matmuls to rounding.
void swiglu_batch(ThreadPool& pool, Isa isa, std::span<const SwiGluJob> jobs,
                  ActivationPrecision precision = ActivationPrecision::kExact);

// The same in two parallel steps through `matmul_batch`: every gate and up projection, the SiLU
// product on the calling thread, then every down projection (for backends without a fused form
// and for few jobs). Scratch is the calling thread's own.
void swiglu_two_steps(std::span<const SwiGluJob> jobs,
                      const std::function<void(std::span<const MatmulJob>)>& matmul_batch);

// Bytes `w` occupies as stored (data only, without scales).
int64_t weight_bytes(const Weight& w);

}  // namespace edge::engine::cpu
