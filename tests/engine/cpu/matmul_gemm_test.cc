// The multi-token BF16 path on CPUs with AVX512_BF16 (groups of 16 to 64 tokens: register blocks
// over row panels, 3 rows x 8 tokens with bf16 activations and 4 rows x 6 tokens with hi + lo;
// fewer: four row streams; activations prepared once per call and shared by the pool's row
// ranges). Against the scalar references within the kernels' stated bounds (hi + lo: 2e-5 *
// sum_c |w * x| + 1e-6; single bf16: 1e-5 * sum_c |w * bf16(x)| + 1e-6), in both precisions, over
// shapes with remainders of every block (rows not a multiple of 3 or 4 or of the 48-row panel,
// tokens not a multiple of 8 or 6, columns not a multiple of 32); the prepared
// entry equals the per-call kernel bit for bit, and so does any split of the rows over the pool
// (each output's sum does not depend on where its block or panel starts); matmul_batch with jobs
// sharing one input (q/k/v) equals separate calls. Skipped with a message without AVX512_BF16.
// With AMX tiles: BF16 weights against the same references, and quantized weights (FP8, INT8,
// INT4 decoded to bf16 per 16-row block) against the product of their dequantized values within
// the bounds matmul_kernels.h states, bit for bit across threads and row splits.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu/convert.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/cpu/thread_pool.h"
#include "engine/quant/quantized_weight.h"
#include "tests/engine/cpu/bf16_test_weights.h"

namespace edge::engine::cpu {
namespace {

bool have_bf16() {
    if (!has_avx512_bf16(detect_isa())) {
        MESSAGE("no AVX512_BF16 on this CPU: the multi-token BF16 path has nothing to test");
        return false;
    }
    return true;
}

bool have_amx() {
    if (detect_isa() != Isa::kAmxBf16) {
        MESSAGE("no AMX-BF16 (or no tile permission) here: the AMX path has nothing to test");
        return false;
    }
    return true;
}

using testing::Bf16Weight;
using testing::make_weight;
using testing::random_x;

// sum_c |w[r][c] * x[t][c]| with x as the mode carries it (rounded to bf16 in kBf16).
double magnitude(const Bf16Weight& w, const std::vector<float>& x, int64_t t, int64_t r,
                 ActivationPrecision precision) {
    const int64_t k = w.w.cols;
    double m = 0.0;
    for (int64_t c = 0; c < k; ++c) {
        float xv = x[static_cast<size_t>(t * k + c)];
        if (precision == ActivationPrecision::kBf16) {
            xv = bf16_to_f32(f32_to_bf16(xv));
        }
        m += std::fabs(static_cast<double>(w.values[static_cast<size_t>(r * k + c)]) * xv);
    }
    return m;
}

// Runs `kernel` over all rows into *got (ldy-wide rows, padding -9) and returns the worst error
// against the scalar reference of `precision` in units of its bound (hi + lo: 2e-5 * sum_c
// |w * x| + 1e-6; single bf16: 1e-5 * ...). The padding columns must stay unwritten.
double worst_over_bound(const Bf16Weight& w, const std::vector<float>& x, int64_t n, int64_t ldy,
                        ActivationPrecision precision, quant::MatmulKernel kernel,
                        std::vector<float>* got) {
    const bool exact = precision == ActivationPrecision::kExact;
    const int64_t rows = w.w.rows;
    std::vector<float> want(static_cast<size_t>(n * ldy), 0.0f);
    got->assign(want.size(), -9.0f);
    (exact ? matmul_bf16_scalar : matmul_bf16_scalar_bf16act)(w.w, x.data(), n, want.data(), ldy,
                                                             0, rows);
    kernel(w.w, x.data(), n, got->data(), ldy, 0, rows);
    double worst = 0.0;
    for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
            const size_t i = static_cast<size_t>(t * ldy + r);
            const double bound =
                (exact ? 2e-5 : 1e-5) * magnitude(w, x, t, r, precision) + 1e-6;
            worst = std::max(worst, std::fabs(static_cast<double>((*got)[i]) - want[i]) / bound);
        }
        for (int64_t r = rows; r < ldy; ++r) {
            CHECK((*got)[static_cast<size_t>(t * ldy + r)] == -9.0f);
        }
    }
    return worst;
}

TEST_CASE("matmul gemm: 16+ tokens equal the scalar references in both precisions") {
    if (!have_bf16()) {
        return;
    }
    std::mt19937 rng(5);
    struct Shape {
        int64_t rows, cols, n;
    };
    // 101 rows: two 48-row panels and a 5-row one (3- and 4-row blocks and 1- and 2-row
    // remainders); 103 and 51: 3 rows past the last 4-row block; 160 and 1000 columns: a masked
    // last step; 16, 17, 19, 32, 70 tokens: whole and partial groups of 8 and of 6 (70: a group of
    // 64, then 6 through the four streams); 9 tokens: the four streams.
    const Shape shapes[] = {{101, 160, 16}, {101, 1000, 17}, {50, 96, 9},    {97, 256, 32},
                            {48, 1024, 32}, {13, 200, 70},   {103, 160, 19}, {51, 64, 23}};
    for (const Shape& s : shapes) {
        Bf16Weight w;
        make_weight(s.rows, s.cols, rng, &w);
        const std::vector<float> x = random_x(s.n, s.cols, rng);
        const int64_t ldy = s.rows + 3;  // Output rows wider than the weight's.
        for (ActivationPrecision precision :
             {ActivationPrecision::kExact, ActivationPrecision::kBf16}) {
            const bool exact = precision == ActivationPrecision::kExact;
            std::vector<float> got;
            const double worst = worst_over_bound(
                w, x, s.n, ldy, precision,
                exact ? matmul_bf16_avx512bf16 : matmul_bf16_avx512bf16_bf16act, &got);
            INFO("rows " << s.rows << " cols " << s.cols << " tokens " << s.n << " exact "
                         << exact << " worst error / bound " << worst);
            CHECK(worst <= 1.0);

            // The prepared entry over row ranges (as the pool splits them) equals the whole
            // call bit for bit.
            std::vector<uint16_t> scratch(
                static_cast<size_t>(bf16_activation_elements(s.n, s.cols, precision)));
            const Bf16Activations a =
                prepare_bf16_activations(x.data(), s.n, s.cols, precision, scratch.data());
            CHECK((a.lo != nullptr) == exact);
            std::vector<float> parts(got.size(), -9.0f);
            testing::in_three_row_ranges(s.rows, 16, 64, [&](int64_t r0, int64_t r1) {
                matmul_bf16_avx512bf16_prepared(w.w, a, parts.data(), ldy, r0, r1);
            });
            CHECK(std::memcmp(parts.data(), got.data(), got.size() * sizeof(float)) == 0);

            // matmul() on two threads (activations prepared once, rows split by the pool).
            for (int threads : {1, 2}) {
                ThreadPool pool(threads);
                std::vector<float> pooled(got.size(), -9.0f);
                matmul(pool, Isa::kAvx512Bf16, w.w, x.data(), s.n, pooled.data(), ldy,
                       precision);
                INFO("threads " << threads);
                CHECK(std::memcmp(pooled.data(), got.data(), got.size() * sizeof(float)) == 0);
            }
        }
    }
}

// x (n tokens of k) prepared for the tiles as matmul() prepares it, in *storage.
Bf16Activations amx_activations(const std::vector<float>& x, int64_t n, int64_t k,
                                ActivationPrecision precision, std::vector<uint16_t>* storage) {
    const int64_t row_elems = bf16_activation_elements(n, k, precision);
    storage->assign(static_cast<size_t>(row_elems + 2 * amx_activation_elements(n, k)), 0);
    Bf16Activations a = prepare_bf16_activations(x.data(), n, k, precision, storage->data());
    uint16_t* tiles = storage->data() + row_elems;
    to_amx_layout(a.hi, n, a.kp, tiles);
    a.amx_hi = tiles;
    if (precision == ActivationPrecision::kExact) {
        to_amx_layout(a.lo, n, a.kp, tiles + amx_activation_elements(n, k));
        a.amx_lo = tiles + amx_activation_elements(n, k);
    }
    return a;
}

TEST_CASE("matmul gemm: AMX tiles equal the scalar references, and any row split the whole call") {
    if (!have_amx()) {
        return;
    }
    std::mt19937 rng(11);
    struct Shape {
        int64_t rows, cols, n;
    };
    // Rows: whole and partial 16-row blocks, an odd count of blocks, fewer than 16; columns: a
    // multiple of 32 and not (the last chunk from a padded copy); tokens: one group, a partial
    // second, an odd count of groups, a mostly empty group (9 and 5 tokens: tiles with exact
    // activations, the AVX512_BF16 kernels with bf16 ones) and below both thresholds (3).
    // (Full 16-row blocks with a last chunk past the columns: 101 x 1000, 64 x 33.)
    const Shape shapes[] = {{64, 256, 16},  {101, 160, 17}, {13, 1000, 33},  {48, 96, 70},
                            {200, 512, 48}, {50, 96, 9},    {101, 1000, 17}, {64, 33, 32},
                            {40, 200, 5},   {33, 64, 3}};
    for (const Shape& s : shapes) {
        Bf16Weight w;
        make_weight(s.rows, s.cols, rng, &w);
        const std::vector<float> x = random_x(s.n, s.cols, rng);
        const int64_t ldy = s.rows + 3;
        for (ActivationPrecision precision :
             {ActivationPrecision::kExact, ActivationPrecision::kBf16}) {
            const bool exact = precision == ActivationPrecision::kExact;
            std::vector<float> got;
            const double worst = worst_over_bound(
                w, x, s.n, ldy, precision, exact ? matmul_bf16_amx : matmul_bf16_amx_bf16act,
                &got);
            INFO("rows " << s.rows << " cols " << s.cols << " tokens " << s.n << " exact "
                         << exact << " worst error / bound " << worst);
            CHECK(worst <= 1.0);
            // matmul() on the pool (activations laid out once, rows split) gives the same bits.
            for (int threads : {1, 2}) {
                ThreadPool pool(threads);
                std::vector<float> pooled(got.size(), -9.0f);
                matmul(pool, Isa::kAmxBf16, w.w, x.data(), s.n, pooled.data(), ldy, precision);
                INFO("threads " << threads);
                CHECK(std::memcmp(pooled.data(), got.data(), got.size() * sizeof(float)) == 0);
            }
            if (s.n >= amx_min_tokens(WeightFormat::kBF16, precision)) {
                std::vector<float> parts(got.size(), -9.0f);
                std::vector<uint16_t> storage;
                const Bf16Activations a = amx_activations(x, s.n, s.cols, precision, &storage);
                // Ranges that split 16-row blocks: each row's sum is the same.
                testing::in_three_row_ranges(s.rows, 7, 37, [&](int64_t r0, int64_t r1) {
                    matmul_bf16_amx_prepared(w.w, a, parts.data(), ldy, r0, r1);
                });
                CHECK(std::memcmp(parts.data(), got.data(), got.size() * sizeof(float)) == 0);
            }
        }
    }
}

TEST_CASE("matmul gemm: AMX tiles with quantized weights decoded to bf16 stay within bounds") {
    if (!have_amx()) {
        return;
    }
    std::mt19937 rng(12);
    struct Shape {
        WeightFormat format;
        int64_t rows, cols, n;
    };
    // FP8: partial 128-column and 128-row blocks (300 columns: a last 32-column step of 12;
    // 200 rows: two row blocks of scales); INT8: columns not a multiple of 16 or 32; INT4: both
    // group sizes. Rows: a partial 16-row block and an odd count of blocks; tokens: one group, a
    // partial second, below the threshold (matmul() then runs the format's own kernel).
    const Shape shapes[] = {{WeightFormat::kFP8E4M3Block128, 200, 300, 17},
                            {WeightFormat::kFP8E4M3Block128, 48, 256, 16},
                            {WeightFormat::kInt8Row, 101, 200, 33},
                            {WeightFormat::kInt8Row, 13, 77, 16},
                            {WeightFormat::kInt4G32, 64, 160, 48},
                            {WeightFormat::kInt4G128, 101, 384, 20},
                            {WeightFormat::kInt4G32, 40, 96, 9}};
    for (const Shape& s : shapes) {
        std::normal_distribution<float> normal(0.0f, 0.05f);
        std::vector<float> source(static_cast<size_t>(s.rows * s.cols));
        for (float& v : source) {
            v = normal(rng);
        }
        auto q = quant::quantize(quant::SourceMatrix::f32(source.data(), s.rows, s.cols),
                                 s.format);
        REQUIRE(q.ok());
        const Weight& w = q->view();
        CHECK(quant::decodes_to_bf16(w));
        std::vector<float> dequantized(source.size());
        for (int64_t r = 0; r < s.rows; ++r) {
            quant::dequantize_row(w, r, dequantized.data() + r * s.cols);
        }
        const std::vector<float> x = random_x(s.n, s.cols, rng);
        const int64_t ldy = s.rows + 3;
        for (ActivationPrecision precision :
             {ActivationPrecision::kExact, ActivationPrecision::kBf16}) {
            const bool exact = precision == ActivationPrecision::kExact;
            std::vector<float> got(static_cast<size_t>(s.n * ldy), -9.0f);
            ThreadPool pool(2);
            matmul(pool, Isa::kAmxBf16, w, x.data(), s.n, got.data(), ldy, precision);
            // Exact: 4 * 2^-17 from the splits and the dropped lo x lo, plus f32 sums; kBf16:
            // 2^-7 + 2^-16 (weights and activations each rounded to one bf16). Tokens below the
            // threshold run the format's kernel (VNNI's int8 activations for INT8 / INT4): only
            // its own test's bound.
            const bool tiles = s.n >= amx_min_tokens(s.format, precision);
            const double rel = exact ? 4e-5 : 1.0 / 128 + 1.0 / 65536 + 1e-5;
            double worst = 0.0;
            for (int64_t t = 0; t < s.n && tiles; ++t) {
                for (int64_t r = 0; r < s.rows; ++r) {
                    double want = 0.0, magnitude = 0.0;
                    for (int64_t c = 0; c < s.cols; ++c) {
                        const double p = static_cast<double>(dequantized[r * s.cols + c]) *
                                         x[static_cast<size_t>(t * s.cols + c)];
                        want += p;
                        magnitude += std::fabs(p);
                    }
                    const double err = std::fabs(got[static_cast<size_t>(t * ldy + r)] - want);
                    worst = std::max(worst, err / (rel * magnitude + 1e-6));
                }
            }
            INFO(quant::weight_format_name(s.format) << " rows " << s.rows << " cols " << s.cols
                                                     << " tokens " << s.n << " exact " << exact
                                                     << " worst error / bound " << worst);
            CHECK(worst <= 1.0);
            for (int64_t t = 0; t < s.n; ++t) {
                for (int64_t r = s.rows; r < ldy; ++r) {
                    CHECK(got[static_cast<size_t>(t * ldy + r)] == -9.0f);
                }
            }
            if (!tiles) {
                continue;
            }
            // One thread, and ranges that split 16-row blocks: the same bits.
            ThreadPool one(1);
            std::vector<float> single(got.size(), -9.0f);
            matmul(one, Isa::kAmxBf16, w, x.data(), s.n, single.data(), ldy, precision);
            CHECK(std::memcmp(single.data(), got.data(), got.size() * sizeof(float)) == 0);
            std::vector<uint16_t> storage;
            const Bf16Activations a = amx_activations(x, s.n, s.cols, precision, &storage);
            std::vector<float> parts(got.size(), -9.0f);
            testing::in_three_row_ranges(s.rows, 7, 37, [&](int64_t r0, int64_t r1) {
                matmul_quant_amx_prepared(w, a, parts.data(), ldy, r0, r1);
            });
            CHECK(std::memcmp(parts.data(), got.data(), got.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("matmul gemm: matmul_batch with a shared input equals separate calls") {
    if (!have_bf16()) {
        return;
    }
    std::mt19937 rng(8);
    const int64_t cols = 288, n = 32;
    Bf16Weight q, k, v, other;
    make_weight(128, cols, rng, &q);
    make_weight(40, cols, rng, &k);
    make_weight(40, cols, rng, &v);
    make_weight(24, 96, rng, &other);
    const std::vector<float> x = random_x(n, cols, rng);
    const std::vector<float> x2 = random_x(3, 96, rng);  // A job of 3 tokens: four-stream path.
    for (ActivationPrecision precision :
         {ActivationPrecision::kExact, ActivationPrecision::kBf16}) {
        ThreadPool pool(2);
        std::vector<float> yq(n * 128), yk(n * 40), yv(n * 40), yo(3 * 24);
        const MatmulJob jobs[] = {{&q.w, x.data(), n, yq.data(), 128},
                                  {&k.w, x.data(), n, yk.data(), 40},
                                  {&v.w, x.data(), n, yv.data(), 40},
                                  {&other.w, x2.data(), 3, yo.data(), 24}};
        matmul_batch(pool, Isa::kAvx512Bf16, jobs, precision);
        const bool exact = precision == ActivationPrecision::kExact;
        auto kernel = exact ? matmul_bf16_avx512bf16 : matmul_bf16_avx512bf16_bf16act;
        std::vector<float> wq(yq.size()), wk(yk.size()), wv(yv.size()), wo(yo.size());
        kernel(q.w, x.data(), n, wq.data(), 128, 0, 128);
        kernel(k.w, x.data(), n, wk.data(), 40, 0, 40);
        kernel(v.w, x.data(), n, wv.data(), 40, 0, 40);
        kernel(other.w, x2.data(), 3, wo.data(), 24, 0, 24);
        INFO("exact " << exact);
        CHECK(yq == wq);
        CHECK(yk == wk);
        CHECK(yv == wv);
        // The 3-token job splits its rows over the pool in the four-stream kernel, whose sums do
        // not depend on the split either (one row's products, in column order, per block).
        CHECK(yo == wo);
    }
}

}  // namespace
}  // namespace edge::engine::cpu
