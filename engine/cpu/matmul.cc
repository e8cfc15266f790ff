#include "engine/cpu/matmul.h"

#include <algorithm>

#include "common/check.h"
#include "engine/cpu/matmul_kernels.h"

namespace edge::engine::cpu {

Isa detect_isa() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma")) {
        return __builtin_cpu_supports("avx512bf16") ? Isa::kAvx512Bf16 : Isa::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        // F16C is implied on every AVX2 CPU shipped; the F16 kernel relies on it.
        return Isa::kAvx2;
    }
#endif
    return Isa::kScalar;
}

std::string_view isa_name(Isa isa) {
    switch (isa) {
        case Isa::kScalar:
            return "scalar";
        case Isa::kAvx2:
            return "avx2";
        case Isa::kAvx512:
            return "avx512";
        case Isa::kAvx512Bf16:
            return "avx512_bf16";
    }
    return "?";
}

quant::MatmulKernel matmul_kernel(WeightFormat format, Isa isa) {
    if (format == WeightFormat::kBF16 && isa == Isa::kAvx512Bf16) {
        return matmul_bf16_avx512bf16;
    }
    if (isa == Isa::kAvx512Bf16) {
        isa = Isa::kAvx512;  // The other float formats have no BF16-specific kernel.
    }
    switch (format) {
        case WeightFormat::kF32:
            return isa == Isa::kAvx512 ? matmul_f32_avx512
                   : isa == Isa::kAvx2 ? matmul_f32_avx2
                                       : matmul_f32_scalar;
        case WeightFormat::kBF16:
            return isa == Isa::kAvx512 ? matmul_bf16_avx512
                   : isa == Isa::kAvx2 ? matmul_bf16_avx2
                                       : matmul_bf16_scalar;
        case WeightFormat::kF16:
            return isa == Isa::kAvx512 ? matmul_f16_avx512
                   : isa == Isa::kAvx2 ? matmul_f16_avx2
                                       : matmul_f16_scalar;
        default:
            return quant::matmul_kernel_for(format);
    }
}

int64_t weight_bytes(const Weight& w) {
    switch (w.format) {
        case WeightFormat::kF32:
            return w.rows * w.cols * 4;
        case WeightFormat::kBF16:
        case WeightFormat::kF16:
            return w.rows * w.cols * 2;
        case WeightFormat::kFP8E4M3Block128:
        case WeightFormat::kInt8Row:
            return w.rows * w.cols;
        case WeightFormat::kInt4G32:
        case WeightFormat::kInt4G128:
            return w.rows * ((w.cols + 1) / 2);
    }
    return 0;
}

void matmul(ThreadPool& pool, Isa isa, const Weight& w, const float* x, int64_t n, float* y,
            int64_t ldy) {
    quant::MatmulKernel kernel = matmul_kernel(w.format, isa);
    EDGE_CHECK(kernel != nullptr, "matmul on a weight format without a kernel");
    // Below this much work (multiply-adds) a split costs more than it saves.
    constexpr int64_t kMinParallelWork = 1 << 15;
    if (pool.size() == 1 || w.rows * w.cols * n < kMinParallelWork) {
        kernel(w, x, n, y, ldy, 0, w.rows);
        return;
    }
    pool.parallel_for(w.rows, 16, [&](int64_t b, int64_t e) { kernel(w, x, n, y, ldy, b, e); });
}

}  // namespace edge::engine::cpu

namespace edge::engine::cpu {

void matmul_batch(ThreadPool& pool, Isa isa, std::span<const MatmulJob> jobs) {
    // Rows are handed out in grains of kGrain within each job, so a part never straddles jobs
    // mid-grain and the kernels see whole 4-row blocks.
    constexpr int64_t kGrain = 16;
    int64_t grains = 0;
    int64_t work = 0;
    for (const MatmulJob& j : jobs) {
        grains += (j.w->rows + kGrain - 1) / kGrain;
        work += j.w->rows * j.w->cols * j.n;
    }
    auto run_grains = [&](int64_t g0, int64_t g1) {
        int64_t base = 0;
        for (const MatmulJob& j : jobs) {
            const int64_t jg = (j.w->rows + kGrain - 1) / kGrain;
            const int64_t b = std::max(g0, base);
            const int64_t e = std::min(g1, base + jg);
            if (b < e) {
                quant::MatmulKernel kernel = matmul_kernel(j.w->format, isa);
                kernel(*j.w, j.x, j.n, j.y, j.ldy, (b - base) * kGrain,
                       std::min(j.w->rows, (e - base) * kGrain));
            }
            base += jg;
        }
    };
    constexpr int64_t kMinParallelWork = 1 << 15;
    if (pool.size() == 1 || work < kMinParallelWork) {
        run_grains(0, grains);
        return;
    }
    pool.parallel_for(grains, 1, run_grains);
}

}  // namespace edge::engine::cpu
