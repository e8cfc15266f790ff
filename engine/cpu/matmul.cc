#include "engine/cpu/matmul.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/cpu/ops.h"

namespace edge::engine::cpu {

bool amx_bf16_usable() {
#if defined(__x86_64__)
    static const bool usable = [] {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) {
            return false;
        }
        const bool amx_bf16 = ((edx >> 22) & 1) != 0;
        const bool amx_tile = ((edx >> 24) & 1) != 0;
        if (!amx_bf16 || !amx_tile) {
            return false;
        }
        // Linux hands the tile data state out on request (ARCH_REQ_XCOMP_PERM, XTILEDATA = 18);
        // refused (an old kernel, a hypervisor that hides it), the tiles cannot be used.
        constexpr long kArchReqXcompPerm = 0x1023;
        constexpr long kXfeatureXtiledata = 18;
        return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
    }();
    return usable;
#else
    return false;
#endif
}

Isa detect_isa() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    // F16C (CPUID leaf 1, ECX bit 29; GCC's builtin does not name it): the AVX2 and AVX-512
    // files are compiled with it for the F16 kernels. Every AVX2 CPU has it, but a VM may mask
    // it, and the kernels would then fault.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
    if (!f16c) {
        return Isa::kScalar;
    }
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma")) {
        if (!__builtin_cpu_supports("avx512bf16")) {
            return Isa::kAvx512;
        }
        return amx_bf16_usable() ? Isa::kAmxBf16 : Isa::kAvx512Bf16;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
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
        case Isa::kAmxBf16:
            return "amx_bf16";
    }
    return "?";
}

Result<Isa> isa_by_name(std::string_view name) {
    // Each includes the ones before it: a CPU runs every ISA up to its best.
    constexpr Isa kAll[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16,
                            Isa::kAmxBf16};
    std::string known;
    for (Isa isa : kAll) {
        if (isa_name(isa) == name) {
            const Isa best = detect_isa();
            if (static_cast<int>(isa) > static_cast<int>(best)) {
                return invalid_argument_error("'" + std::string(name) +
                                              "' is not available on this CPU (its best: " +
                                              std::string(isa_name(best)) + ")");
            }
            return isa;
        }
        known += (known.empty() ? "" : ", ") + std::string(isa_name(isa));
    }
    return invalid_argument_error("'" + std::string(name) + "' is not auto or one of " + known);
}

quant::KernelLevel kernel_level(Isa isa) {
    switch (isa) {
        case Isa::kScalar:
            return quant::KernelLevel::kScalar;
        case Isa::kAvx2:
            return quant::KernelLevel::kAvx2;
        case Isa::kAvx512:
            return quant::KernelLevel::kAvx512;
        case Isa::kAvx512Bf16:
        case Isa::kAmxBf16:
            break;
    }
    return quant::KernelLevel::kAvx512Bf16;
}

quant::MatmulKernel matmul_kernel(WeightFormat format, Isa isa, ActivationPrecision precision) {
    if (format == WeightFormat::kBF16 && isa == Isa::kAmxBf16) {
        return precision == ActivationPrecision::kBf16 ? matmul_bf16_amx_bf16act : matmul_bf16_amx;
    }
    if (format == WeightFormat::kBF16 && isa == Isa::kAvx512Bf16) {
        return precision == ActivationPrecision::kBf16 ? matmul_bf16_avx512bf16_bf16act
                                                       : matmul_bf16_avx512bf16;
    }
    const quant::KernelLevel level = kernel_level(isa);
    if (has_avx512_bf16(isa)) {
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
            return quant::matmul_kernel_for(format, WeightLayout::kRows, level);
    }
}

quant::MatmulKernel matmul_kernel(const Weight& w, Isa isa, ActivationPrecision precision) {
    if (w.layout != WeightLayout::kRows) {
        return quant::matmul_kernel_for(w.format, w.layout, kernel_level(isa));
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

int64_t packed_activation_floats(int64_t n, int64_t k) { return n * (k / 16 * 16); }

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

// Multi-token calls prepare their activations once, on the calling thread, and every row range
// reads them (rather than each claim of the pool preparing them again): BF16 weights at
// kAvx512Bf16 split them into bf16 (Bf16Activations; at kAmxBf16 from amx_min_tokens() on, for
// quantized weights the tiles decode too, only in the tiles' layout), float weights at kAvx2
// pack them in token groups (PackedActivations). At most one of the two is set (n > 0).
struct PreparedInput {
    Bf16Activations bf16;
    PackedActivations packed;
};

enum class Prep { kNone, kBf16, kAmx, kPacked };

Prep prep_for(const Weight& w, Isa isa, int64_t n, ActivationPrecision precision) {
    if (n <= 1 || w.layout != WeightLayout::kRows) {
        return Prep::kNone;
    }
    if (isa == Isa::kAmxBf16 && n >= amx_min_tokens(w.format, precision) &&
        (w.format == WeightFormat::kBF16 || quant::decodes_to_bf16(w))) {
        return Prep::kAmx;
    }
    if (has_avx512_bf16(isa) && w.format == WeightFormat::kBF16) {
        return Prep::kBf16;
    }
    const bool float_format = w.format == WeightFormat::kF32 || w.format == WeightFormat::kBF16 ||
                              w.format == WeightFormat::kF16;
    return isa == Isa::kAvx2 && float_format ? Prep::kPacked : Prep::kNone;
}

// Floats of scratch prepare_input needs (bf16 elements stored two per float).
int64_t prep_floats(const Weight& w, Isa isa, int64_t n, ActivationPrecision precision) {
    switch (prep_for(w, isa, n, precision)) {
        case Prep::kBf16:
            return (bf16_activation_elements(n, w.cols, precision) + 1) / 2;
        case Prep::kAmx:
            // The tiles' layout, and one 16-token group split row-major on its way there.
            return ((precision == ActivationPrecision::kExact ? 2 : 1) *
                        amx_activation_elements(n, w.cols) +
                    bf16_activation_elements(kAmxGroup, w.cols, precision) + 1) / 2;
        case Prep::kPacked:
            return packed_activation_floats(n, w.cols);
        case Prep::kNone:
            break;
    }
    return 0;
}

PreparedInput prepare_input(const Weight& w, Isa isa, const float* x, int64_t n,
                            ActivationPrecision precision, float* scratch) {
    PreparedInput p;
    switch (prep_for(w, isa, n, precision)) {
        case Prep::kBf16:
            p.bf16 = prepare_bf16_activations(x, n, w.cols, precision,
                                              reinterpret_cast<uint16_t*>(scratch));
            break;
        case Prep::kAmx: {
            // Split 16 tokens at a time into a small row-major buffer and lay each group out for
            // the tiles (the layout is group-major), so only the tiles' copy is n tokens long.
            const bool exact = precision == ActivationPrecision::kExact;
            auto* hi = reinterpret_cast<uint16_t*>(scratch);
            uint16_t* lo = exact ? hi + amx_activation_elements(n, w.cols) : nullptr;
            uint16_t* group = hi + (exact ? 2 : 1) * amx_activation_elements(n, w.cols);
            const int64_t group_elems = amx_activation_elements(kAmxGroup, w.cols);
            for (int64_t t0 = 0; t0 < n; t0 += kAmxGroup) {
                const int64_t nt = std::min(kAmxGroup, n - t0);
                const Bf16Activations g =
                    prepare_bf16_activations(x + t0 * w.cols, nt, w.cols, precision, group);
                const int64_t at = t0 / kAmxGroup * group_elems;
                to_amx_layout(g.hi, nt, g.kp, hi + at);
                if (lo != nullptr) {
                    to_amx_layout(g.lo, nt, g.kp, lo + at);
                }
                p.bf16.kp = g.kp;
            }
            p.bf16.n = n;
            p.bf16.k = w.cols;
            p.bf16.amx_hi = hi;
            p.bf16.amx_lo = lo;
            break;
        }
        case Prep::kPacked:
            p.packed = pack_activations_avx2(w.format, x, n, w.cols, scratch);
            break;
        case Prep::kNone:
            break;
    }
    return p;
}

// Whether an input of n tokens prepared for weight a serves weight b too (q, k and v share
// their input, as gate and up do).
bool same_preparation(const Weight& a, const Weight& b, Isa isa, int64_t n,
                      ActivationPrecision precision) {
    return a.cols == b.cols && a.format == b.format &&
           prep_for(a, isa, n, precision) == prep_for(b, isa, n, precision);
}

// Rows [r0, r1) of w times x: from the prepared input when there is one, else with the format's
// kernel.
void run_rows(const Weight& w, Isa isa, const PreparedInput& p, const float* x, int64_t n, float* y,
              int64_t ldy, ActivationPrecision precision, int64_t r0, int64_t r1) {
    if (p.bf16.amx_hi != nullptr) {
        (w.format == WeightFormat::kBF16 ? matmul_bf16_amx_prepared
                                         : matmul_quant_amx_prepared)(w, p.bf16, y, ldy, r0, r1);
    } else if (p.bf16.n > 0) {
        matmul_bf16_avx512bf16_prepared(w, p.bf16, y, ldy, r0, r1);
    } else if (p.packed.n > 0) {
        matmul_avx2_packed(w, p.packed, y, ldy, r0, r1);
    } else {
        quant::MatmulKernel kernel = matmul_kernel(w, isa, for_tokens(precision, n));
        EDGE_CHECK(kernel != nullptr, "matmul on a weight format without a kernel");
        kernel(w, x, n, y, ldy, r0, r1);
    }
}

// Below this much work (multiply-adds) a split over the pool costs more than it saves.
constexpr int64_t kMinParallelWork = 1 << 15;

// matmul_bf16_amx(_bf16act): the activations prepared here, then the tiles; fewer than
// amx_min_tokens() on the AVX512_BF16 kernels, as matmul() would run them.
void matmul_bf16_amx_call(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                          int64_t r0, int64_t r1, ActivationPrecision precision) {
    if (n < amx_min_tokens(WeightFormat::kBF16, precision)) {
        (precision == ActivationPrecision::kBf16 ? matmul_bf16_avx512bf16_bf16act
                                                 : matmul_bf16_avx512bf16)(w, x, n, y, ldy, r0,
                                                                            r1);
        return;
    }
    thread_local std::vector<float> scratch;
    const auto need = static_cast<size_t>(prep_floats(w, Isa::kAmxBf16, n, precision));
    if (scratch.size() < need) {
        scratch.resize(need);
    }
    const PreparedInput p = prepare_input(w, Isa::kAmxBf16, x, n, precision, scratch.data());
    EDGE_CHECK(p.bf16.amx_hi != nullptr && amx_bf16_usable(),
               "matmul_bf16_amx: a row-major BF16 weight on a CPU with usable AMX tiles");
    matmul_bf16_amx_prepared(w, p.bf16, y, ldy, r0, r1);
}

}  // namespace

void matmul_bf16_amx(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                     int64_t r0, int64_t r1) {
    matmul_bf16_amx_call(w, x, n, y, ldy, r0, r1, ActivationPrecision::kExact);
}

void matmul_bf16_amx_bf16act(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                             int64_t r0, int64_t r1) {
    matmul_bf16_amx_call(w, x, n, y, ldy, r0, r1, ActivationPrecision::kBf16);
}

void matmul(ThreadPool& pool, Isa isa, const Weight& w, const float* x, int64_t n, float* y,
            int64_t ldy, ActivationPrecision precision) {
    thread_local std::vector<float> scratch;
    const auto need = static_cast<size_t>(prep_floats(w, isa, n, precision));
    if (scratch.size() < need) {
        scratch.resize(need);
    }
    const PreparedInput prepared = prepare_input(w, isa, x, n, precision, scratch.data());
    auto rows = [&](int64_t b, int64_t e) {
        run_rows(w, isa, prepared, x, n, y, ldy, precision, b, e);
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
    // Multi-token jobs' activations, prepared once here (once for jobs that share their input,
    // as q/k/v do); prep[i] holds none for the other jobs.
    thread_local std::vector<float> scratch;
    thread_local std::vector<PreparedInput> prep;
    prep.assign(jobs.size(), PreparedInput{});
    size_t need = 0;  // Sized as if none shared.
    for (const MatmulJob& j : jobs) {
        need += static_cast<size_t>(prep_floats(*j.w, isa, j.n, precision));
    }
    if (scratch.size() < need) {
        scratch.resize(need);
    }
    size_t used = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
        const MatmulJob& j = jobs[i];
        if (i > 0 && j.x == jobs[i - 1].x && j.n == jobs[i - 1].n &&
            same_preparation(*jobs[i - 1].w, *j.w, isa, j.n, precision)) {
            prep[i] = prep[i - 1];
            continue;
        }
        prep[i] = prepare_input(*j.w, isa, j.x, j.n, precision, scratch.data() + used);
        used += static_cast<size_t>(prep_floats(*j.w, isa, j.n, precision));
    }
    const PreparedInput* prepared = prep.data();
    auto run_grains = [&](int64_t g0, int64_t g1) {
        int64_t base = 0;
        for (size_t i = 0; i < jobs.size(); ++i) {
            const MatmulJob& j = jobs[i];
            const int64_t jg = (j.w->rows + kGrain - 1) / kGrain;
            const int64_t b = std::max(g0, base);
            const int64_t e = std::min(g1, base + jg);
            if (b < e) {
                run_rows(*j.w, isa, prepared[i], j.x, j.n, j.y, j.ldy, precision,
                         (b - base) * kGrain, std::min(j.w->rows, (e - base) * kGrain));
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
    if ((isa == Isa::kAvx512Bf16 ||
         (isa == Isa::kAmxBf16 && j.n < amx_min_tokens(WeightFormat::kBF16, precision))) &&
        all_bf16(j)) {
        swiglu_bf16_avx512bf16(j, precision);
        return;
    }
    const int64_t inter = j.gate->rows;
    thread_local std::vector<float> scratch, prep_scratch;
    if (scratch.size() < static_cast<size_t>(3 * j.n * inter)) {
        scratch.resize(static_cast<size_t>(3 * j.n * inter));
    }
    const auto need = static_cast<size_t>(std::max({prep_floats(*j.gate, isa, j.n, precision),
                                                    prep_floats(*j.up, isa, j.n, precision),
                                                    prep_floats(*j.down, isa, j.n, precision)}));
    if (prep_scratch.size() < need) {
        prep_scratch.resize(need);
    }
    float* gate = scratch.data();
    float* up = gate + j.n * inter;
    float* act = up + j.n * inter;
    // Gate and up read the same input: prepared once when their formats agree.
    PreparedInput p = prepare_input(*j.gate, isa, j.x, j.n, precision, prep_scratch.data());
    run_rows(*j.gate, isa, p, j.x, j.n, gate, inter, precision, 0, inter);
    if (!same_preparation(*j.gate, *j.up, isa, j.n, precision)) {
        p = prepare_input(*j.up, isa, j.x, j.n, precision, prep_scratch.data());
    }
    run_rows(*j.up, isa, p, j.x, j.n, up, inter, precision, 0, inter);
    silu_mul(gate, up, j.n * inter, act);
    p = prepare_input(*j.down, isa, act, j.n, precision, prep_scratch.data());
    run_rows(*j.down, isa, p, act, j.n, j.y, j.ldy, precision, 0, j.down->rows);
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
