#include "engine/quant/quant_kernels.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/quant/fp8.h"
#include "engine/quant/quantized_weight.h"
#include "engine/quant/row_tiles.h"

namespace edge::engine::quant {
namespace {

// Tolerances, relative to sum_c |W[r][c] * x[c]| of the output:
//  - kernels multiplying dequantized f32 weights: 1e-5 (f32 accumulation in a different order
//    than the reference; rows here are at most ~1000 columns);
//  - VNNI kernels round activations to int8 per group of KernelVariant::activation_group columns,
//    adding at most sum_g (max_{c in g} |x_c| / 254) * sum_{c in g} |W[r][c]| (half a step of
//    x's int8 grid), computed below per output from the actual weights and activations;
//  - AVX512_BF16 kernels use x as hi + lo bf16 (KernelVariant::activation_rel_error = 2^-17) or
//    as one rounded bf16 (2^-8, kBf16RoundRelError), adding that times the magnitude. The weights
//    are compared here after dequantization, so the weight error (FP8: up to 2^-4 of each value)
//    is not in this bound; the model-level bounds against BF16 (quant_load_test.cc) hold both.
constexpr double kFloatRelTol = 1e-5;

struct Case {
    int64_t rows;
    int64_t cols;
    int64_t n_tokens;
};

std::vector<float> random_vector(size_t n, std::mt19937& rng, float stddev) {
    std::normal_distribution<float> normal(0.0f, stddev);
    std::vector<float> v(n);
    for (float& f : v) {
        f = normal(rng);
    }
    return v;
}

void check_variants(WeightFormat format, const Case& c, uint32_t seed, float x_scale = 1.0f) {
    const std::string format_name = weight_format_name(format);
    CAPTURE(format_name);
    CAPTURE(c.rows);
    CAPTURE(c.cols);
    CAPTURE(c.n_tokens);
    std::mt19937 rng(seed);
    const std::vector<float> wsrc = random_vector(c.rows * c.cols, rng, 0.05f);
    std::vector<float> x = random_vector(c.n_tokens * c.cols, rng, 1.0f);
    x[0] = 6.0f;  // An activation outlier, as in real models.
    for (float& v : x) {
        v *= x_scale;
    }
    auto q = quantize(SourceMatrix::f32(wsrc.data(), c.rows, c.cols), format);
    REQUIRE(q.ok());
    const Weight& w = q->view();

    // Exact reference in double from the dequantized weights, and the f32 error scale.
    std::vector<double> exact(c.n_tokens * c.rows), magnitude(exact.size());
    std::vector<float> dequantized(c.rows * c.cols);
    for (int64_t r = 0; r < c.rows; ++r) {
        const float* row = dequantized.data() + r * c.cols;
        dequantize_row(w, r, dequantized.data() + r * c.cols);
        for (int64_t t = 0; t < c.n_tokens; ++t) {
            const float* xt = x.data() + t * c.cols;
            double sum = 0.0, mag = 0.0;
            for (int64_t i = 0; i < c.cols; ++i) {
                sum += static_cast<double>(row[i]) * xt[i];
                mag += std::fabs(static_cast<double>(row[i]) * xt[i]);
            }
            exact[t * c.rows + r] = sum;
            magnitude[t * c.rows + r] = mag;
        }
    }
    // The activation-rounding bound of a kernel quantizing x per `group` columns (0: none).
    auto activation_bound = [&](int64_t group, int64_t t, int64_t r) {
        if (group == 0) {
            return 0.0;
        }
        const float* xt = x.data() + t * c.cols;
        const float* row = dequantized.data() + r * c.cols;
        double bound = 0.0;
        for (int64_t g0 = 0; g0 < c.cols; g0 += group) {
            double amax = 0.0, wsum = 0.0;
            for (int64_t i = g0; i < std::min(c.cols, g0 + group); ++i) {
                amax = std::max(amax, std::fabs(static_cast<double>(xt[i])));
                wsum += std::fabs(static_cast<double>(row[i]));
            }
            bound += amax / 254.0 * wsum;
        }
        return bound;
    };

    const std::vector<KernelVariant> variants = matmul_kernel_variants(format);
    REQUIRE(!variants.empty());
    CHECK(std::string(variants.front().name) == "scalar");
    CHECK((matmul_kernel_for(format) == variants.back().kernel));
    // Rows [rb, re) of `kw` into a y with padding, to check the range and ldy are honoured.
    const int64_t ldy = c.rows + 3;
    auto check = [&](const Weight& kw, const KernelVariant& v, int64_t rb, int64_t re) {
        const std::string variant = v.name;
        CAPTURE(variant);
        CAPTURE(rb);
        CAPTURE(re);
        std::vector<float> y(c.n_tokens * ldy, -12345.0f);
        v.kernel(kw, x.data(), c.n_tokens, y.data(), ldy, rb, re);
        int bad = 0, untouched_changed = 0;
        double worst = 0.0;
        for (int64_t t = 0; t < c.n_tokens; ++t) {
            for (int64_t r = 0; r < ldy; ++r) {
                const float got = y[t * ldy + r];
                if (r < rb || r >= re) {
                    untouched_changed += got != -12345.0f;
                    continue;
                }
                const size_t i = t * c.rows + r;
                const double tol = (kFloatRelTol + v.activation_rel_error) * magnitude[i] +
                                   1e-6 * x_scale +
                                   activation_bound(v.activation_group, t, r) * (1 + 1e-4);
                const double err = std::fabs(got - exact[i]);
                worst = std::max(worst, err / tol);
                bad += !(err <= tol);
            }
        }
        CAPTURE(worst);
        CHECK(bad == 0);
        CHECK(untouched_changed == 0);
    };
    const int64_t rb = c.rows > 2 ? 1 : 0;
    const int64_t re = c.rows > 2 ? c.rows - 1 : c.rows;
    for (const KernelVariant& v : variants) {
        check(w, v, rb, re);
    }
    // The row-tile kernels on a tiled copy of the same weights, over ranges that cut tiles.
    if (row_tiles_support(format, c.cols)) {
        auto tiled = tile_rows(w);
        REQUIRE(tiled.ok());
        for (const KernelVariant& v : matmul_kernel_variants(format, WeightLayout::kRowTiles16)) {
            check(tiled->view(), v, 0, c.rows);
            check(tiled->view(), v, rb, re);
            check(tiled->view(), v, std::min<int64_t>(17, c.rows), c.rows);
        }
    }
}

TEST_CASE("fp8 and int8 kernels equal the reference on ragged shapes") {
    // One token over 64+ rows reads FP8 as four row streams: 203 rows (ranges of 201, four
    // streams of 50 plus one row left) span two 128-row scale blocks; 200 columns end in a
    // 72-column block (two 32-column steps, no 16-column step, 8 columns through the table), 264
    // in an 8-column one, 1008 in a 112-column one (three 32-column steps and a 16-column one).
    const Case cases[] = {{1, 1, 1},     {3, 17, 1},   {5, 33, 2},     {130, 257, 1},
                          {129, 300, 5}, {64, 512, 4}, {7, 1000, 9},   {40, 63, 3},
                          {203, 200, 1}, {66, 264, 1}, {257, 1008, 1}, {131, 256, 1}};
    uint32_t seed = 10;
    for (const Case& c : cases) {
        check_variants(WeightFormat::kFP8E4M3Block128, c, seed++);
        check_variants(WeightFormat::kInt8Row, c, seed++);
    }
    // {131, 256, 1}: the INT8 streams (columns a multiple of 64). The FP8 kernel decodes through
    // F16 when max|x| of any token leaves [2^-60, 2^60).
    for (float x_scale : {0x1p61f, 0x1p-62f, 0x1p58f, 0x1p-58f}) {
        CAPTURE(x_scale);
        check_variants(WeightFormat::kFP8E4M3Block128, {203, 200, 1}, seed++, x_scale);
        check_variants(WeightFormat::kFP8E4M3Block128, {40, 63, 3}, seed++, x_scale);
        check_variants(WeightFormat::kFP8E4M3Block128, {129, 300, 5}, seed++, x_scale);
    }
}

TEST_CASE("int4 kernels equal the reference on ragged shapes") {
    // {131, 256, 1}, {131, 384, 1} and {70, 1024, 1}: one token over 64+ rows with columns a
    // multiple of 128 (the shapes a four-stream INT4 kernel would take).
    const Case g32[] = {{1, 32, 1},   {3, 64, 1},    {5, 96, 2},    {9, 160, 5},  {33, 224, 4},
                        {64, 512, 1}, {17, 1056, 9}, {131, 256, 1}, {70, 1024, 1}};
    const Case g128[] = {{1, 128, 1},   {6, 384, 3},   {65, 640, 1},
                         {11, 1024, 6}, {131, 384, 1}, {70, 1024, 1}};
    uint32_t seed = 100;
    for (const Case& c : g32) {
        check_variants(WeightFormat::kInt4G32, c, seed++);
    }
    for (const Case& c : g128) {
        check_variants(WeightFormat::kInt4G128, c, seed++);
    }
}

TEST_CASE("row-major and row-tiled kernels on shapes around the 16-row tiles") {
    const Case g32[] = {{15, 64, 2}, {17, 96, 9}, {33, 160, 5}, {40, 224, 3}, {23, 1056, 8}};
    const Case g128[] = {{18, 384, 4}, {31, 1024, 7}};
    const Case i8[] = {{1, 4, 1},   {15, 60, 2},  {17, 100, 9}, {40, 256, 3},
                       {33, 68, 5}, {64, 512, 1}, {23, 1000, 8}};
    uint32_t seed = 200;
    for (const Case& c : g32) {
        check_variants(WeightFormat::kInt4G32, c, seed++);
    }
    for (const Case& c : g128) {
        check_variants(WeightFormat::kInt4G128, c, seed++);
    }
    for (const Case& c : i8) {
        check_variants(WeightFormat::kInt8Row, c, seed++);
    }
}

TEST_CASE("int4 kernels handle all-zero activation groups") {
    const int64_t rows = 4, cols = 128;
    std::vector<float> wsrc(rows * cols, 0.01f);
    auto q = quantize_int4_group(SourceMatrix::f32(wsrc.data(), rows, cols), 32);
    REQUIRE(q.ok());
    std::vector<float> x(cols, 0.0f);
    x[100] = 2.0f;  // Only the fourth group is non-zero.
    for (const KernelVariant& v : matmul_kernel_variants(WeightFormat::kInt4G32)) {
        const std::string variant = v.name;
        CAPTURE(variant);
        std::vector<float> y(rows, 0.0f);
        v.kernel(q->view(), x.data(), 1, y.data(), rows, 0, rows);
        for (float f : y) {
            CHECK(f == doctest::Approx(0.02).epsilon(1e-5));
        }
    }
}

TEST_CASE("fp8 kernels decode every E4M3 code exactly") {
    // 64 rows (one token over 64 rows reads four row streams) of all 256 codes, row r rotated by
    // r columns, the two NaN codes (rejected on load) replaced by zero, scale 1; a one-hot
    // activation of a power of two picks one weight of each row, exactly, in every kernel (bf16
    // rounding of a power of two is exact, and so is each product): every code at every column
    // position of the 32-byte steps, in each stream.
    const int64_t rows = 64;
    const int64_t cols = 256;
    AlignedBytes codes(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
            const auto code = static_cast<uint8_t>((c + r) % 256);
            codes[r * cols + c] = code == 0x7F || code == 0xFF ? 0 : code;
        }
    }
    QuantizedWeight q(WeightFormat::kFP8E4M3Block128, rows, cols, std::move(codes),
                      std::vector<float>{1.0f, 1.0f});
    const auto* stored = static_cast<const uint8_t*>(q.view().data);
    for (const KernelVariant& v : matmul_kernel_variants(WeightFormat::kFP8E4M3Block128)) {
        const std::string variant = v.name;
        CAPTURE(variant);
        int bad = 0;
        for (int64_t c = 0; c < cols; ++c) {
            for (float one : {1.0f, -0.25f}) {
                std::vector<float> x(cols, 0.0f);
                x[c] = one;
                std::vector<float> y(rows, -1.0f);
                v.kernel(q.view(), x.data(), 1, y.data(), rows, 0, rows);
                for (int64_t r = 0; r < rows; ++r) {
                    bad += y[r] != fp8_e4m3_decode(stored[r * cols + c]) * one;
                }
            }
        }
        CHECK(bad == 0);
    }
}

TEST_CASE("quantized kernels: every token count up to 12 equals one token at a time") {
    // Tiles of several tokens must give each token what a one-token call gives (up to f32
    // summation order), for row ranges that are not multiples of the four-row reductions or of
    // the 16-row tiles; row-major weights and, where a format has them, row tiles.
    std::mt19937 rng(7);
    const int64_t rows = 23, cols = 384;
    const std::vector<float> wsrc = random_vector(rows * cols, rng, 0.05f);
    const std::vector<float> x = random_vector(12 * cols, rng, 1.0f);
    for (WeightFormat format : {WeightFormat::kFP8E4M3Block128, WeightFormat::kInt8Row,
                                WeightFormat::kInt4G32, WeightFormat::kInt4G128}) {
        auto q = quantize(SourceMatrix::f32(wsrc.data(), rows, cols), format);
        REQUIRE(q.ok());
        std::vector<QuantizedWeight> layouts;
        layouts.push_back(std::move(*q));
        if (row_tiles_support(format, cols)) {
            auto tiled = tile_rows(layouts[0].view());
            REQUIRE(tiled.ok());
            layouts.push_back(std::move(*tiled));
        }
        for (const QuantizedWeight& qw : layouts) {
            const Weight& w = qw.view();
            for (const KernelVariant& v : matmul_kernel_variants(format, w.layout)) {
                const std::string variant = std::string(weight_format_name(format)) + "/" +
                                            v.name;
                CAPTURE(variant);
                std::vector<float> single(12 * rows);
                for (int64_t t = 0; t < 12; ++t) {
                    v.kernel(w, x.data() + t * cols, 1, single.data() + t * rows, rows, 2, rows);
                }
                for (int64_t n = 2; n <= 12; ++n) {
                    CAPTURE(n);
                    std::vector<float> y(n * rows);
                    v.kernel(w, x.data(), n, y.data(), rows, 2, rows);
                    int bad = 0;
                    for (int64_t t = 0; t < n; ++t) {
                        for (int64_t r = 2; r < rows; ++r) {
                            const float a = y[t * rows + r], b = single[t * rows + r];
                            bad += !(std::fabs(a - b) <= 1e-5f * (1.0f + std::fabs(b)));
                        }
                    }
                    CHECK(bad == 0);
                }
            }
        }
    }
}

TEST_CASE("float formats have no quant kernel") {
    CHECK((matmul_kernel_for(WeightFormat::kF32) == nullptr));
    CHECK((matmul_kernel_for(WeightFormat::kBF16) == nullptr));
    CHECK(matmul_kernel_variants(WeightFormat::kF16).empty());
    CHECK((matmul_kernel_for(WeightFormat::kInt4G128) != nullptr));
}

}  // namespace
}  // namespace edge::engine::quant
