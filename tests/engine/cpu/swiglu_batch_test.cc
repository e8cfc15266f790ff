// cpu::swiglu_batch (the routed experts of a batched step, one task per expert, and the row-split
// form for few jobs) equals the scalar reference built from the scalar matmul kernels and the
// scalar SiLU product, for every ISA this CPU has, BF16 and F32 weights, expert widths that are not
// multiples of the vector width, 1..9 and 70 tokens per expert, and pools of 1 and 3 threads.
// Tolerance per output: 1e-4 * (sum_c |down[r][c] * act[c]| + sum_c |down[r][c]|) + 1e-5, with
// weights scaled 1/sqrt(fan_in) so activations are O(1) (the AVX512_BF16 kernels carry activations
// as bf16 hi + lo, about 2^-17 relative per product; the error of gate and up reaches the output
// through down). Also: the paged attention's SIMD forms equal cpu::attention_gqa to rounding.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "engine/cpu/convert.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/cpu/ops.h"
#include "engine/cpu/ops_kernels.h"
#include "engine/cpu/thread_pool.h"
#include "engine/model/kv_cache.h"
#include "engine/model/paged_attention.h"
#include "engine/model/paged_attention_simd.h"
#include "tests/engine/model/random_kv_slot.h"

namespace edge::engine::cpu {
namespace {

struct Expert {
    std::vector<float> gate, up, down;  // Values as stored (rounded to the format).
    std::vector<uint8_t> gate_bytes, up_bytes, down_bytes;
    Weight g, u, d;
};

std::vector<uint8_t> store(WeightFormat format, std::vector<float>& v) {
    std::vector<uint8_t> bytes;
    if (format == WeightFormat::kF32) {
        bytes.resize(v.size() * 4);
        std::memcpy(bytes.data(), v.data(), bytes.size());
        return bytes;
    }
    bytes.resize(v.size() * 2);
    auto* h = reinterpret_cast<uint16_t*>(bytes.data());
    for (size_t i = 0; i < v.size(); ++i) {
        h[i] = f32_to_bf16(v[i]);
        v[i] = bf16_to_f32(h[i]);
    }
    return bytes;
}

void make_expert(WeightFormat format, int64_t in, int64_t inter, int64_t out, std::mt19937& rng,
                 Expert* e) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto fill = [&](std::vector<float>& v, int64_t n, int64_t fan_in) {
        v.resize(static_cast<size_t>(n));
        for (float& x : v) {
            x = normal(rng) / std::sqrt(static_cast<float>(fan_in));
        }
    };
    fill(e->gate, inter * in, in);
    fill(e->up, inter * in, in);
    fill(e->down, out * inter, inter);
    e->gate_bytes = store(format, e->gate);
    e->up_bytes = store(format, e->up);
    e->down_bytes = store(format, e->down);
    e->g = {format, inter, in, e->gate_bytes.data(), nullptr};
    e->u = {format, inter, in, e->up_bytes.data(), nullptr};
    e->d = {format, out, inter, e->down_bytes.data(), nullptr};
}

std::vector<Isa> isas_for_cpu() {
    std::vector<Isa> out = {Isa::kScalar};
    const Isa best = detect_isa();
    if (best != Isa::kScalar) {
        out.push_back(Isa::kAvx2);
    }
    if (best == Isa::kAvx512 || has_avx512_bf16(best)) {
        out.push_back(Isa::kAvx512);
    }
    if (has_avx512_bf16(best)) {
        out.push_back(Isa::kAvx512Bf16);
    }
    if (best == Isa::kAmxBf16) {
        out.push_back(Isa::kAmxBf16);
    }
    return out;
}

void check_swiglu(Isa isa, WeightFormat format, int64_t in, int64_t inter, int64_t out,
                  const std::vector<int64_t>& tokens, int threads) {
    std::mt19937 rng(static_cast<uint32_t>(in * 7 + inter * 13 + out + tokens.size()));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<Expert> experts(tokens.size());
    int64_t rows = 0;
    for (size_t e = 0; e < tokens.size(); ++e) {
        make_expert(format, in, inter, out, rng, &experts[e]);
        rows += tokens[e];
    }
    std::vector<float> x(static_cast<size_t>(rows * in));
    for (float& v : x) {
        v = normal(rng);
    }
    const int64_t ldy = out + 5;  // Wider than a row: the gap must stay untouched.
    std::vector<float> got(static_cast<size_t>(rows * ldy), -7.0f);
    std::vector<SwiGluJob> jobs;
    int64_t r0 = 0;
    for (size_t e = 0; e < tokens.size(); ++e) {
        jobs.push_back({&experts[e].g, &experts[e].u, &experts[e].d, x.data() + r0 * in, tokens[e],
                        got.data() + r0 * ldy, ldy});
        r0 += tokens[e];
    }
    ThreadPool pool(threads);
    swiglu_batch(pool, isa, jobs);

    quant::MatmulKernel ref_kernel =
        format == WeightFormat::kF32 ? matmul_f32_scalar : matmul_bf16_scalar;
    r0 = 0;
    for (size_t e = 0; e < tokens.size(); ++e) {
        const int64_t n = tokens[e];
        const Expert& ex = experts[e];
        std::vector<float> g(static_cast<size_t>(n * inter)), u(g.size()), act(g.size());
        std::vector<float> want(static_cast<size_t>(n * out));
        ref_kernel(ex.g, x.data() + r0 * in, n, g.data(), inter, 0, inter);
        ref_kernel(ex.u, x.data() + r0 * in, n, u.data(), inter, 0, inter);
        silu_mul_scalar(g.data(), u.data(), n * inter, act.data());
        ref_kernel(ex.d, act.data(), n, want.data(), out, 0, out);
        for (int64_t t = 0; t < n; ++t) {
            for (int64_t r = 0; r < ldy; ++r) {
                const float v = got[static_cast<size_t>((r0 + t) * ldy + r)];
                if (r >= out) {
                    CHECK(v == -7.0f);
                    continue;
                }
                double mag = 0.0;
                for (int64_t c = 0; c < inter; ++c) {
                    const double w = std::fabs(ex.down[static_cast<size_t>(r * inter + c)]);
                    mag += w * (std::fabs(act[static_cast<size_t>(t * inter + c)]) + 1.0);
                }
                INFO(isa_name(isa)
                     << " in " << in << " inter " << inter << " out " << out << " expert " << e
                     << " n " << n << " t " << t << " r " << r << " threads " << threads);
                CHECK(std::fabs(v - want[static_cast<size_t>(t * out + r)]) <= 1e-4 * mag + 1e-5);
            }
        }
        r0 += n;
    }
}

TEST_CASE("swiglu_batch equals gate, up, SiLU and down through the scalar kernels") {
    const std::vector<int64_t> many = {1, 2, 3, 4, 5, 6, 7, 8, 9, 4, 2};
    for (Isa isa : isas_for_cpu()) {
        for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kF32}) {
            for (int threads : {1, 3}) {
                // One task per expert (many jobs), odd widths.
                check_swiglu(isa, f, 70, 37, 45, many, threads);
                check_swiglu(isa, f, 256, 96, 256, many, threads);
                // Few jobs: the row-split form; a token count past one 64-token group.
                check_swiglu(isa, f, 130, 64, 100, {70}, threads);
                check_swiglu(isa, f, 33, 40, 31, {3, 1}, threads);
            }
        }
    }
}

TEST_CASE("paged attention with SIMD head dims equals contiguous attention to rounding") {
    // Multiples of 8 (AVX2) and of 16 (AVX-512): through paged_attention_gqa (whichever form this
    // CPU runs) and through each form this CPU can run, called directly. Head counts past the
    // four one pass takes, contexts that end inside a block and blocks of 4 and 16 tokens.
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    for (int32_t bt : {4, 16}) {
        for (int32_t hd : {8, 16, 24, 64, 128}) {
            std::mt19937 rng(static_cast<uint32_t>(hd));
            std::normal_distribution<float> dist;
            const int32_t n = 41;
            RandomKvSlot kv = random_kv_slot(hd, bt, n, int64_t{1} << 22, rng);
            KvCache& c = *kv.cache;
            const int32_t slot = kv.slot;
            const std::vector<float>& keys = kv.keys;
            const std::vector<float>& values = kv.values;
            using Attend = void (*)(const detail::KvSeqView&, int32_t, int32_t, const float*,
                                    int64_t, int64_t, float, float*, float*);
            std::vector<std::pair<const char*, Attend>> forms;
            if (avx2 && hd % 8 == 0) {
                forms.emplace_back("avx2", &detail::attend_avx2);
            }
            if (avx512 && hd % 16 == 0) {
                forms.emplace_back("avx512", &detail::attend_avx512);
            }
            for (int64_t n_q : {1, 3, 4, 6, 9}) {
                for (int64_t ctx : {1, 5, 16, 17, 41}) {
                    std::vector<float> q(static_cast<size_t>(n_q * hd));
                    for (float& x : q) {
                        x = dist(rng);
                    }
                    std::vector<float> want(q.size()), scores(static_cast<size_t>(n_q * ctx));
                    attention_gqa(q.data(), n_q, hd, keys.data(), values.data(), hd, ctx, 0.125f,
                                  scores.data(), want.data());
                    auto check = [&](const char* form, const std::vector<float>& got) {
                        for (size_t i = 0; i < want.size(); ++i) {
                            INFO(form << " block " << bt << " head_dim " << hd << " n_q " << n_q
                                      << " ctx " << ctx << " i " << i);
                            CHECK(std::fabs(got[i] - want[i]) <= 1e-5 * (1.0 + std::fabs(want[i])));
                        }
                    };
                    std::vector<float> got(q.size(), -1.0f);
                    paged_attention_gqa(c, slot, 0, 1, q.data(), n_q, ctx, 0.125f, scores.data(),
                                        got.data());
                    check("dispatched", got);
                    for (const auto& [name, fn] : forms) {
                        std::fill(got.begin(), got.end(), -1.0f);
                        fn(detail::kv_seq_view(c, slot), 0, 1, q.data(), n_q, ctx, 0.125f,
                           scores.data(), got.data());
                        check(name, got);
                    }
                }
            }
        }
    }
}

}  // namespace
}  // namespace edge::engine::cpu
