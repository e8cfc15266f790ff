// Every SIMD matmul kernel equals its scalar reference on random shapes, including sizes that are
// not multiples of the vector width. Tolerance: |simd - scalar| <= tol * sum_c |w*x| + 1e-6 with
// tol = 1e-5 for the f32-FMA kernels (f32 rounding of a reordered sum) and 2e-5 for the AVX512_BF16
// kernel (activations carried as bf16 hi + lo: about 2^-17 relative per product).

#include "engine/cpu/matmul.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/cpu/convert.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/cpu/ops.h"
#include "engine/cpu/thread_pool.h"
#include "engine/quant/quant_kernels.h"
#include "engine/quant/quantized_weight.h"
#include "tests/engine/cpu/bf16_test_weights.h"

namespace edge::engine::cpu {
namespace {

struct Case {
    WeightFormat format;
    quant::MatmulKernel scalar;
    quant::MatmulKernel simd;
    const char* name;
    double tol = 1e-5;
};

std::vector<Case> cases_for_cpu() {
    std::vector<Case> out;
    Isa isa = detect_isa();
    if (isa == Isa::kAmxBf16) {
        out.push_back({WeightFormat::kBF16, matmul_bf16_scalar, matmul_bf16_amx, "bf16 amx", 2e-5});
    }
    if (has_avx512_bf16(isa)) {
        out.push_back({WeightFormat::kBF16, matmul_bf16_scalar, matmul_bf16_avx512bf16,
                       "bf16 avx512_bf16", 2e-5});
        isa = Isa::kAvx512;
    }
    if (isa == Isa::kAvx512) {
        out.push_back({WeightFormat::kF32, matmul_f32_scalar, matmul_f32_avx512, "f32 avx512"});
        out.push_back({WeightFormat::kBF16, matmul_bf16_scalar, matmul_bf16_avx512, "bf16 avx512"});
        out.push_back({WeightFormat::kF16, matmul_f16_scalar, matmul_f16_avx512, "f16 avx512"});
    }
    if (isa == Isa::kAvx512 || isa == Isa::kAvx2) {
        out.push_back({WeightFormat::kF32, matmul_f32_scalar, matmul_f32_avx2, "f32 avx2"});
        out.push_back({WeightFormat::kBF16, matmul_bf16_scalar, matmul_bf16_avx2, "bf16 avx2"});
        out.push_back({WeightFormat::kF16, matmul_f16_scalar, matmul_f16_avx2, "f16 avx2"});
    }
    return out;
}

// Stores `values` in `format`, returning the bytes and the values as stored (rounded).
std::vector<uint8_t> store(WeightFormat format, std::vector<float>& values) {
    std::vector<uint8_t> bytes;
    if (format == WeightFormat::kF32) {
        bytes.resize(values.size() * 4);
        std::memcpy(bytes.data(), values.data(), bytes.size());
        return bytes;
    }
    bytes.resize(values.size() * 2);
    auto* h = reinterpret_cast<uint16_t*>(bytes.data());
    for (size_t i = 0; i < values.size(); ++i) {
        if (format == WeightFormat::kBF16) {
            h[i] = f32_to_bf16(values[i]);
            values[i] = bf16_to_f32(h[i]);
        } else {
            // f16 via F16C-free rounding: round through bf16-free path using the hardware-neutral
            // trick of storing small integers/2^k, which f16 holds exactly.
            float v = std::round(values[i] * 256.0f) / 256.0f;
            v = std::fmax(-8.0f, std::fmin(8.0f, v));
            int32_t q = static_cast<int32_t>(v * 256.0f);
            // Build f16 bits for q / 256 exactly.
            uint16_t sign = q < 0 ? 0x8000 : 0;
            uint32_t a = static_cast<uint32_t>(std::abs(q));
            uint16_t bits = sign;
            if (a != 0) {
                int e = 31 - __builtin_clz(a);  // a = 1.m * 2^e, value = a * 2^-8.
                uint32_t mant = (a << (10 - e)) & 0x3ff;  // e <= 11 since |v| <= 8.
                if (e > 10) {
                    mant = (a >> (e - 10)) & 0x3ff;
                }
                bits |= static_cast<uint16_t>((e - 8 + 15) << 10 | mant);
            }
            h[i] = bits;
            values[i] = f16_to_f32(bits);
        }
    }
    return bytes;
}

TEST_CASE("SIMD matmul kernels equal the scalar reference") {
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // {67, 96, 2} and {130, 100, 6}: the AVX512_BF16 kernel's four-stream blocks (64 rows or
    // more) with a two-token group, first and later, and rows left over past 4 * (rows / 4). The
    // last four: the AVX2 kernel's four streams (64 rows or more) with rows past 4q and ragged
    // columns. Every call of 2 or more tokens takes the AVX2 kernel's groups of up to 6 packed
    // tokens (2-6 tokens, and 7 on in groups as equal as possible: {9, 70, 67} is 12 groups) over
    // tiles of up to four 4-row blocks; {37, 24, 13} (three groups, two tiles and a row left
    // over, 8 columns past 16), {68, 7, 11} (no 16-column block), {100, 50, 2} (four streams of
    // 25 rows: tiles of 4, 4, 4, 4, 4, 4 and 1 block) and {260, 40, 32} take its tile edges.
    const int64_t shapes[][3] = {
        {1, 1, 1},   {3, 7, 1},     {4, 16, 1},     {5, 17, 2},   {13, 31, 3},  {8, 32, 4},
        {9, 33, 5},  {17, 100, 7},  {64, 128, 1},   {33, 257, 9}, {7, 1000, 4}, {128, 64, 32},
        {6, 63, 1},  {11, 65, 2},   {5, 1023, 1},   {2, 2048, 3}, {9, 70, 67},  {5, 40, 130},
        {67, 96, 2}, {130, 100, 6}, {257, 1000, 1}, {100, 33, 3}, {71, 64, 4},  {66, 17, 5},
        {70, 41, 7}, {75, 72, 8},   {6, 23, 8},     {7, 19, 6},   {65, 48, 9},  {37, 24, 13},
        {68, 7, 11}, {100, 50, 2},  {260, 40, 32}};
    for (const Case& c : cases_for_cpu()) {
        for (const auto& shape : shapes) {
            const int64_t rows = shape[0], cols = shape[1], n = shape[2];
            std::vector<float> wv(rows * cols);
            for (float& v : wv) {
                v = normal(rng);
            }
            std::vector<uint8_t> bytes = store(c.format, wv);
            std::vector<float> x(n * cols);
            for (float& v : x) {
                v = normal(rng);
            }
            Weight w{c.format, rows, cols, bytes.data(), nullptr};
            const int64_t ldy = rows + 3;  // A row stride wider than rows, as in attention.
            std::vector<float> ref(n * ldy, -7.0f), got(n * ldy, -7.0f);
            c.scalar(w, x.data(), n, ref.data(), ldy, 0, rows);
            c.simd(w, x.data(), n, got.data(), ldy, 0, rows);
            // `out` holds the scalar reference's output (within the kernel's tolerance).
            auto near_ref = [&](const std::vector<float>& out, int64_t t, int64_t r) {
                double mag = 0.0;
                for (int64_t k = 0; r < rows && k < cols; ++k) {
                    mag += std::fabs(wv[r * cols + k] * x[t * cols + k]);
                }
                return std::fabs(out[t * ldy + r] - ref[t * ldy + r]) <= c.tol * mag + 1e-6;
            };
            for (int64_t t = 0; t < n; ++t) {
                for (int64_t r = 0; r < ldy; ++r) {
                    INFO(c.name << " rows " << rows << " cols " << cols << " n " << n << " t " << t
                                << " r " << r);
                    CHECK(near_ref(got, t, r));
                }
            }
            // A partial row range (as the pool hands out) writes its rows, as the whole call
            // did, and none before or after it.
            const int64_t r0 = rows / 3, r1 = rows - rows / 4;
            std::vector<float> part(n * ldy, -7.0f);
            c.simd(w, x.data(), n, part.data(), ldy, r0, r1);
            for (int64_t t = 0; t < n; ++t) {
                for (int64_t r = 0; r < ldy; ++r) {
                    INFO(c.name << " rows " << rows << " cols " << cols << " n " << n << " range "
                                << r0 << ".." << r1 << " t " << t << " r " << r);
                    if (r >= r0 && r < r1) {
                        CHECK(near_ref(part, t, r));
                    } else {
                        CHECK(part[t * ldy + r] == -7.0f);
                    }
                }
            }
        }
    }
}

TEST_CASE("engine.cpu_kernels caps the quantized kernels as it caps the float ones") {
    const Isa best = detect_isa();
    struct Expected {
        WeightFormat format;
        // The variant each level picks: the first of these names this CPU has.
        std::vector<std::string_view> avx2, avx512;
    };
    const Expected expected[] = {
        {WeightFormat::kFP8E4M3Block128, {"avx2"}, {"avx512"}},
        {WeightFormat::kInt8Row, {"avx2-i8dot"}, {"avx512-vnni", "avx512"}},
        {WeightFormat::kInt4G32, {"avx2-i8dot"}, {"avx512-vnni-gfni", "avx512-vnni", "avx512"}},
    };
    for (const Expected& e : expected) {
        const std::vector<quant::KernelVariant> variants = quant::matmul_kernel_variants(e.format);
        REQUIRE(!variants.empty());
        auto first_present = [&](const std::vector<std::string_view>& names) {
            for (std::string_view name : names) {
                for (const quant::KernelVariant& v : variants) {
                    if (name == v.name) {
                        return v.kernel;
                    }
                }
            }
            return quant::MatmulKernel{nullptr};
        };
        INFO(std::string(quant::weight_format_name(e.format)));
        CHECK((matmul_kernel(e.format, Isa::kScalar) == first_present({"scalar"})));
        if (static_cast<int>(best) >= static_cast<int>(Isa::kAvx2)) {
            CHECK((matmul_kernel(e.format, Isa::kAvx2) == first_present(e.avx2)));
        }
        if (static_cast<int>(best) >= static_cast<int>(Isa::kAvx512)) {
            CHECK((matmul_kernel(e.format, Isa::kAvx512) == first_present(e.avx512)));
        }
        CHECK((matmul_kernel(e.format, best) == variants.back().kernel));
    }
    // Row tiles have AVX-512 VNNI kernels only: none below, so the backend does not build them.
    CHECK((matmul_kernel(Weight{WeightFormat::kInt8Row, 16, 64, nullptr, nullptr,
                                WeightLayout::kRowTiles16},
                         Isa::kAvx2) == nullptr));
}

TEST_CASE("kernel scratch: independent slots per thread that keep their size") {
    auto* a = static_cast<uint8_t*>(kernel_scratch(0, 1000));
    auto* b = static_cast<uint8_t*>(kernel_scratch(1, 1000));
    std::memset(a, 1, 1000);
    std::memset(b, 2, 1000);
    CHECK(a != b);
    CHECK(a[999] == 1);  // Writing slot 1 left slot 0 alone.
    // A smaller request keeps the buffer; a larger one gets at least its bytes.
    CHECK(kernel_scratch(0, 10) == a);
    auto* big = static_cast<uint8_t*>(kernel_scratch(0, 1 << 20));
    std::memset(big, 3, size_t{1} << 20);
    CHECK(reinterpret_cast<uintptr_t>(big) % alignof(float) == 0);
    // Another thread has its own.
    void* other = nullptr;
    std::thread([&] { other = kernel_scratch(0, 1 << 20); }).join();
    CHECK(other != big);
}

TEST_CASE("scalar bf16 and f16 conversions") {
    CHECK(bf16_to_f32(0x3f80) == 1.0f);
    CHECK(bf16_to_f32(f32_to_bf16(-2.5f)) == -2.5f);
    CHECK(f32_to_bf16(1.00390625f) == 0x3f80);  // Halfway rounds to even.
    CHECK(f16_to_f32(0x3c00) == 1.0f);
    CHECK(f16_to_f32(0xc000) == -2.0f);
    CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
    CHECK(std::isinf(f16_to_f32(0x7c00)));
    CHECK(std::isnan(f16_to_f32(0x7e00)));
}

TEST_CASE("matmul splits rows over the pool and equals one thread") {
    std::mt19937 rng(99);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t rows = 301, cols = 259, n = 6;
    std::vector<float> wv(rows * cols), x(n * cols);
    for (float& v : wv) {
        v = normal(rng);
    }
    for (float& v : x) {
        v = normal(rng);
    }
    std::vector<uint8_t> bytes = store(WeightFormat::kBF16, wv);
    Weight w{WeightFormat::kBF16, rows, cols, bytes.data(), nullptr};
    ThreadPool one(1), three(3);
    std::vector<float> a(n * rows), b(n * rows);
    matmul(one, detect_isa(), w, x.data(), n, a.data(), rows);
    matmul(three, detect_isa(), w, x.data(), n, b.data(), rows);
    CHECK(a == b);
    for (int i = 0; i < 50; ++i) {  // Many back-to-back dispatches: no lost wake-ups.
        matmul(three, detect_isa(), w, x.data(), n, b.data(), rows);
    }
    CHECK(a == b);
}

// A weight of `format` with N(0,1)/sqrt(cols) values, its bytes kept alive beside it.
struct TestWeight {
    std::vector<uint8_t> bytes;
    Weight w;
};

TestWeight random_weight(WeightFormat format, int64_t rows, int64_t cols, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (float& e : v) {
        e = normal(rng) / std::sqrt(static_cast<float>(cols));
    }
    TestWeight t{store(format, v), {}};
    t.w = Weight{format, rows, cols, t.bytes.data(), nullptr};
    return t;
}

quant::MatmulKernel avx2_kernel(WeightFormat format) {
    return format == WeightFormat::kF32    ? matmul_f32_avx2
           : format == WeightFormat::kBF16 ? matmul_bf16_avx2
                                           : matmul_f16_avx2;
}

// The AVX2 float kernels' multi-token activations are packed once per call of matmul() /
// matmul_batch() / per expert (gate and up share theirs) and shared by every row range. Each
// output's sum does not depend on where its block, tile or row range starts, so all of these equal
// the per-call kernel bit for bit; jobs that share an input but not a format must not share its
// packing (BF16 packs even and odd columns apart, F32 and F16 in order).
TEST_CASE("AVX2: packed activations, shared by row ranges, jobs and gate/up, equal the kernel") {
    if (detect_isa() == Isa::kScalar) {
        MESSAGE("no AVX2 on this CPU: the packed AVX2 path has nothing to test");
        return;
    }
    std::mt19937 rng(77);
    const WeightFormat formats[] = {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kF16};
    struct Shape {
        int64_t rows, cols, n;
    };
    const Shape shapes[] = {{301, 259, 6}, {100, 1000, 32}, {70, 40, 13}, {5, 17, 2}, {64, 9, 3}};
    for (WeightFormat format : formats) {
        for (const Shape& s : shapes) {
            const TestWeight w = random_weight(format, s.rows, s.cols, rng);
            const std::vector<float> x = testing::random_x(s.n, s.cols, rng);
            const int64_t ldy = s.rows + 3;
            std::vector<float> want(static_cast<size_t>(s.n * ldy), -9.0f);
            avx2_kernel(format)(w.w, x.data(), s.n, want.data(), ldy, 0, s.rows);

            // {64, 9, 3} packs nothing (no 16-column block): an empty scratch.
            std::vector<float> scratch(static_cast<size_t>(packed_activation_floats(s.n, s.cols)));
            const PackedActivations a =
                pack_activations_avx2(format, x.data(), s.n, s.cols, scratch.data());
            std::vector<float> parts(want.size(), -9.0f);
            testing::in_three_row_ranges(s.rows, 16, 68, [&](int64_t r0, int64_t r1) {
                matmul_avx2_packed(w.w, a, parts.data(), ldy, r0, r1);
            });
            INFO("format " << static_cast<int>(format) << " rows " << s.rows << " cols " << s.cols
                           << " tokens " << s.n);
            CHECK(parts == want);
            for (int threads : {1, 2}) {
                ThreadPool pool(threads);
                std::vector<float> pooled(want.size(), -9.0f);
                matmul(pool, Isa::kAvx2, w.w, x.data(), s.n, pooled.data(), ldy);
                CHECK(pooled == want);
            }
        }
    }

    // matmul_batch: q and k share x and BF16; v shares x but is F32; o is F16 with 3 tokens of
    // its own; a one-token job.
    const int64_t cols = 200, n = 9;
    const TestWeight q = random_weight(WeightFormat::kBF16, 96, cols, rng);
    const TestWeight k = random_weight(WeightFormat::kBF16, 40, cols, rng);
    const TestWeight v = random_weight(WeightFormat::kF32, 40, cols, rng);
    const TestWeight o = random_weight(WeightFormat::kF16, 24, 48, rng);
    const TestWeight one = random_weight(WeightFormat::kBF16, 30, cols, rng);
    const std::vector<float> x = testing::random_x(n, cols, rng);
    const std::vector<float> x3 = testing::random_x(3, 48, rng);
    const MatmulJob jobs[] = {{&q.w, x.data(), n, nullptr, 96},
                              {&k.w, x.data(), n, nullptr, 40},
                              {&v.w, x.data(), n, nullptr, 40},
                              {&o.w, x3.data(), 3, nullptr, 24},
                              {&one.w, x.data(), 1, nullptr, 30}};
    std::vector<std::vector<float>> got, want;
    std::vector<MatmulJob> run(std::begin(jobs), std::end(jobs));
    for (MatmulJob& j : run) {
        got.emplace_back(static_cast<size_t>(j.n * j.ldy), -9.0f);
        want.emplace_back(static_cast<size_t>(j.n * j.ldy), -9.0f);
        j.y = got.back().data();
    }
    ThreadPool pool(2);
    matmul_batch(pool, Isa::kAvx2, run, ActivationPrecision::kExact);
    for (size_t i = 0; i < run.size(); ++i) {
        const MatmulJob& j = run[i];
        avx2_kernel(j.w->format)(*j.w, j.x, j.n, want[i].data(), j.ldy, 0, j.w->rows);
        INFO("job " << i);
        CHECK(got[i] == want[i]);
    }

    // swiglu_batch, one task per expert (more jobs than twice the pool): gate BF16 and up F32
    // (one input, two packings), down F16; and an all-BF16 expert.
    const int64_t in = 72, inter = 40, out = 56;
    std::vector<TestWeight> weights;
    std::vector<std::vector<float>> inputs;
    std::vector<SwiGluJob> experts;
    std::vector<std::vector<float>> ys;
    for (int e = 0; e < 6; ++e) {
        const bool mixed = e % 2 == 0;
        weights.push_back(random_weight(WeightFormat::kBF16, inter, in, rng));
        weights.push_back(random_weight(mixed ? WeightFormat::kF32 : WeightFormat::kBF16, inter,
                                        in, rng));
        weights.push_back(random_weight(mixed ? WeightFormat::kF16 : WeightFormat::kBF16, out,
                                        inter, rng));
        inputs.push_back(testing::random_x(2 + e, in, rng));
        ys.emplace_back(static_cast<size_t>((2 + e) * out), -9.0f);
    }
    for (int e = 0; e < 6; ++e) {
        experts.push_back({&weights[3 * e].w, &weights[3 * e + 1].w, &weights[3 * e + 2].w,
                           inputs[e].data(), 2 + e, ys[e].data(), out});
    }
    swiglu_batch(pool, Isa::kAvx2, experts, ActivationPrecision::kExact);
    for (const SwiGluJob& j : experts) {
        std::vector<float> g(static_cast<size_t>(j.n * inter)), u(g.size()), act(g.size());
        std::vector<float> y(static_cast<size_t>(j.n * out));
        avx2_kernel(j.gate->format)(*j.gate, j.x, j.n, g.data(), inter, 0, inter);
        avx2_kernel(j.up->format)(*j.up, j.x, j.n, u.data(), inter, 0, inter);
        silu_mul(g.data(), u.data(), j.n * inter, act.data());
        avx2_kernel(j.down->format)(*j.down, act.data(), j.n, y.data(), out, 0, out);
        INFO("expert of " << j.n << " tokens, up format " << static_cast<int>(j.up->format));
        CHECK(std::memcmp(y.data(), j.y, y.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("thread pool - thousands of back-to-back jobs / more workers than cores") {
    ThreadPool pool(5);
    std::vector<int64_t> out(64);
    for (int round = 0; round < 3000; ++round) {
        pool.parallel_for(64, 1, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                out[i] = round + i;
            }
        });
        if (round % 2 == 0) {
            pool.for_each_task(7, [&](int64_t t, int worker) { out[t] += 0 * worker; });
        }
        for (int64_t i = 0; i < 64; ++i) {
            REQUIRE(out[i] == round + i);
        }
    }
}

TEST_CASE("thread pool covers every index exactly once") {
    ThreadPool pool(4);
    for (int64_t n : {1, 5, 64, 1001}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for(n, 8, [&](int64_t b, int64_t e) {
            CHECK(b % 8 == 0);
            for (int64_t i = b; i < e; ++i) {
                hits[i]++;
            }
        });
        std::vector<std::atomic<int>> tasks(n);
        pool.for_each_task(n, [&](int64_t i, int worker) {
            CHECK(worker >= 0);
            CHECK(worker < 4);
            tasks[i]++;
        });
        for (int64_t i = 0; i < n; ++i) {
            CHECK(hits[i] == 1);
            CHECK(tasks[i] == 1);
        }
    }
}

}  // namespace
}  // namespace edge::engine::cpu
