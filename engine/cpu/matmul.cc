#include "engine/cpu/matmul.h"

#include <algorithm>
#include <vector>

#include "common/check.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/cpu/ops.h"

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

quant::MatmulKernel matmul_kernel(WeightFormat format, Isa isa, ActivationPrecision precision) {
    if (format == WeightFormat::kBF16 && isa == Isa::kAvx512Bf16) {
        return precision == ActivationPrecision::kBf16 ? matmul_bf16_avx512bf16_bf16act
                                                       : matmul_bf16_avx512bf16;
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

quant::MatmulKernel matmul_kernel(const Weight& w, Isa isa, ActivationPrecision precision) {
    if (w.layout != WeightLayout::kRows) {
        return quant::matmul_kernel_for(w.format, w.layout);
    }
    return matmul_kernel(w.format, isa, precision);
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

void* kernel_scratch(int slot, int64_t bytes) {
    EDGE_CHECK(slot >= 0 && slot < kKernelScratchSlots && bytes >= 0, "bad kernel scratch request");
    // Floats, so the storage is aligned for every element type the kernels put in it.
    thread_local std::vector<float> buffers[kKernelScratchSlots];
    std::vector<float>& b = buffers[slot];
    const auto floats = static_cast<size_t>((bytes + 3) / 4);
    if (b.size() < floats) {
        b.resize(floats);
    }
    return b.data();
}

namespace {

// The precision a call of n tokens runs at: one-token calls stay exact.
ActivationPrecision for_tokens(ActivationPrecision precision, int64_t n) {
    return n > 1 ? precision : ActivationPrecision::kExact;
}

// Multi-token BF16 calls at kAvx512Bf16 prepare their activations once, on the calling thread,
// and every row range reads them (rather than each claim of the pool splitting them again).
bool prepared_path(const Weight& w, Isa isa, int64_t n) {
    return n > 1 && isa == Isa::kAvx512Bf16 && w.format == WeightFormat::kBF16;
}

// Below this much work (multiply-adds) a split over the pool costs more than it saves.
constexpr int64_t kMinParallelWork = 1 << 15;

}  // namespace

void matmul(ThreadPool& pool, Isa isa, const Weight& w, const float* x, int64_t n, float* y,
            int64_t ldy, ActivationPrecision precision) {
    Bf16Activations prepared;  // prepared.n == 0: the format's kernel prepares its own.
    quant::MatmulKernel kernel = nullptr;
    if (prepared_path(w, isa, n)) {
        thread_local std::vector<uint16_t> scratch;
        const auto need = static_cast<size_t>(bf16_activation_elements(n, w.cols, precision));
        if (scratch.size() < need) {
            scratch.resize(need);
        }
        prepared = prepare_bf16_activations(x, n, w.cols, precision, scratch.data());
    } else {
        kernel = matmul_kernel(w, isa, for_tokens(precision, n));
        EDGE_CHECK(kernel != nullptr, "matmul on a weight format without a kernel");
    }
    auto rows = [&](int64_t b, int64_t e) {
        if (prepared.n > 0) {
            matmul_bf16_avx512bf16_prepared(w, prepared, y, ldy, b, e);
        } else {
            kernel(w, x, n, y, ldy, b, e);
        }
    };
    if (pool.size() == 1 || w.rows * w.cols * n < kMinParallelWork) {
        rows(0, w.rows);
        return;
    }
    pool.parallel_for(w.rows, 16, rows);
}

}  // namespace edge::engine::cpu

namespace edge::engine::cpu {

void matmul_batch(ThreadPool& pool, Isa isa, std::span<const MatmulJob> jobs,
                  ActivationPrecision precision) {
    // Rows are handed out in grains of kGrain within each job, so a part never straddles jobs
    // mid-grain and the kernels see whole 4-row blocks.
    constexpr int64_t kGrain = 16;
    int64_t grains = 0;
    int64_t work = 0;
    for (const MatmulJob& j : jobs) {
        grains += (j.w->rows + kGrain - 1) / kGrain;
        work += j.w->rows * j.w->cols * j.n;
    }
    // Multi-token BF16 jobs' activations, prepared once here (once for jobs that share their
    // input, as q/k/v do); prep[i].n == 0 for the other jobs.
    thread_local std::vector<uint16_t> scratch;
    thread_local std::vector<Bf16Activations> prep;
    prep.assign(jobs.size(), Bf16Activations{});
    size_t need = 0;  // Sized as if none shared.
    for (const MatmulJob& j : jobs) {
        if (prepared_path(*j.w, isa, j.n)) {
            need += static_cast<size_t>(bf16_activation_elements(j.n, j.w->cols, precision));
        }
    }
    if (scratch.size() < need) {
        scratch.resize(need);
    }
    size_t used = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
        const MatmulJob& j = jobs[i];
        if (!prepared_path(*j.w, isa, j.n)) {
            continue;
        }
        if (i > 0 && prep[i - 1].n > 0 && j.x == jobs[i - 1].x && j.n == jobs[i - 1].n &&
            j.w->cols == jobs[i - 1].w->cols) {
            prep[i] = prep[i - 1];
            continue;
        }
        prep[i] = prepare_bf16_activations(j.x, j.n, j.w->cols, precision, scratch.data() + used);
        used += static_cast<size_t>(bf16_activation_elements(j.n, j.w->cols, precision));
    }
    const Bf16Activations* prepared = prep.data();
    auto run_grains = [&](int64_t g0, int64_t g1) {
        int64_t base = 0;
        for (size_t i = 0; i < jobs.size(); ++i) {
            const MatmulJob& j = jobs[i];
            const int64_t jg = (j.w->rows + kGrain - 1) / kGrain;
            const int64_t b = std::max(g0, base);
            const int64_t e = std::min(g1, base + jg);
            if (b < e && prepared[i].n > 0) {
                matmul_bf16_avx512bf16_prepared(*j.w, prepared[i], j.y, j.ldy, (b - base) * kGrain,
                                                std::min(j.w->rows, (e - base) * kGrain));
            } else if (b < e) {
                quant::MatmulKernel kernel =
                    matmul_kernel(*j.w, isa, for_tokens(precision, j.n));
                kernel(*j.w, j.x, j.n, j.y, j.ldy, (b - base) * kGrain,
                       std::min(j.w->rows, (e - base) * kGrain));
            }
            base += jg;
        }
    };
    if (pool.size() == 1 || work < kMinParallelWork) {
        run_grains(0, grains);
        return;
    }
    pool.parallel_for(grains, 1, run_grains);
}

}  // namespace edge::engine::cpu

namespace edge::engine::cpu {
namespace {

bool all_bf16(const SwiGluJob& j) {
    return j.gate->format == WeightFormat::kBF16 && j.up->format == WeightFormat::kBF16 &&
           j.down->format == WeightFormat::kBF16;
}

// One job on the calling thread, with the kernels of any format: gate and up, the SiLU product,
// then down, in per-thread scratch.
void swiglu_one(Isa isa, const SwiGluJob& j, ActivationPrecision precision) {
    precision = for_tokens(precision, j.n);
    if (isa == Isa::kAvx512Bf16 && all_bf16(j)) {
        swiglu_bf16_avx512bf16(j, precision);
        return;
    }
    const int64_t inter = j.gate->rows;
    thread_local std::vector<float> scratch;
    if (scratch.size() < static_cast<size_t>(3 * j.n * inter)) {
        scratch.resize(static_cast<size_t>(3 * j.n * inter));
    }
    float* gate = scratch.data();
    float* up = gate + j.n * inter;
    float* act = up + j.n * inter;
    quant::MatmulKernel kg = matmul_kernel(*j.gate, isa, precision);
    quant::MatmulKernel ku = matmul_kernel(*j.up, isa, precision);
    quant::MatmulKernel kd = matmul_kernel(*j.down, isa, precision);
    EDGE_CHECK(kg != nullptr && ku != nullptr && kd != nullptr,
               "swiglu on a weight format without a kernel");
    kg(*j.gate, j.x, j.n, gate, inter, 0, inter);
    ku(*j.up, j.x, j.n, up, inter, 0, inter);
    silu_mul(gate, up, j.n * inter, act);
    kd(*j.down, act, j.n, j.y, j.ldy, 0, j.down->rows);
}

}  // namespace

void swiglu_batch(ThreadPool& pool, Isa isa, std::span<const SwiGluJob> jobs,
                  ActivationPrecision precision) {
    int64_t work = 0;
    for (const SwiGluJob& j : jobs) {
        EDGE_CHECK(j.gate->rows == j.up->rows && j.gate->cols == j.up->cols &&
                       j.down->cols == j.gate->rows,
                   "swiglu job with mismatched gate/up/down shapes");
        work += j.n * j.gate->cols * j.gate->rows * 3;
    }
    if (jobs.empty()) {
        return;
    }
    const auto count = static_cast<int64_t>(jobs.size());
    if (pool.size() > 1 && work >= kMinParallelWork && count < 2 * pool.size()) {
        // Few jobs: each projection split by rows over the pool.
        swiglu_two_steps(jobs, [&](std::span<const MatmulJob> mm) {
            matmul_batch(pool, isa, mm, precision);
        });
        return;
    }
    // Largest jobs first, so the last task to finish is a small one.
    thread_local std::vector<int32_t> order;
    order.resize(jobs.size());
    for (int32_t i = 0; i < static_cast<int32_t>(count); ++i) {
        order[static_cast<size_t>(i)] = i;
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return jobs[a].n > jobs[b].n; });
    // A thread_local named inside the lambda would be each worker's own (empty) one.
    const int32_t* ord = order.data();
    auto run = [&](int64_t task, int) { swiglu_one(isa, jobs[ord[task]], precision); };
    if (pool.size() == 1 || work < kMinParallelWork) {
        for (int64_t t = 0; t < count; ++t) {
            run(t, 0);
        }
        return;
    }
    pool.for_each_task(count, run);
}

void swiglu_two_steps(std::span<const SwiGluJob> jobs,
                      const std::function<void(std::span<const MatmulJob>)>& matmul_batch) {
    thread_local std::vector<float> gate, up, act;
    thread_local std::vector<MatmulJob> mm;
    int64_t total = 0;
    for (const SwiGluJob& j : jobs) {
        total += j.n * j.gate->rows;
    }
    if (gate.size() < static_cast<size_t>(total)) {
        gate.resize(static_cast<size_t>(total));
        up.resize(static_cast<size_t>(total));
        act.resize(static_cast<size_t>(total));
    }
    mm.clear();
    int64_t off = 0;
    for (const SwiGluJob& j : jobs) {
        mm.push_back({j.gate, j.x, j.n, gate.data() + off, j.gate->rows});
        mm.push_back({j.up, j.x, j.n, up.data() + off, j.gate->rows});
        off += j.n * j.gate->rows;
    }
    if (!mm.empty()) {
        matmul_batch(mm);
    }
    silu_mul(gate.data(), up.data(), total, act.data());
    mm.clear();
    off = 0;
    for (const SwiGluJob& j : jobs) {
        mm.push_back({j.down, act.data() + off, j.n, j.y, j.ldy});
        off += j.n * j.gate->rows;
    }
    if (!mm.empty()) {
        matmul_batch(mm);
    }
}

}  // namespace edge::engine::cpu
