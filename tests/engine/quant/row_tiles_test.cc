#include "engine/quant/row_tiles.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/quant/quant_kernels.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine::quant {
namespace {

constexpr WeightFormat kTiledFormats[] = {WeightFormat::kInt4G32, WeightFormat::kInt4G128,
                                          WeightFormat::kInt8Row};

std::vector<float> random_vector(size_t n, std::mt19937& rng, float stddev) {
    std::normal_distribution<float> normal(0.0f, stddev);
    std::vector<float> v(n);
    for (float& f : v) {
        f = normal(rng);
    }
    return v;
}

QuantizedWeight make_weight(WeightFormat format, int64_t rows, int64_t cols, std::mt19937& rng) {
    const std::vector<float> src = random_vector(rows * cols, rng, 0.05f);
    auto q = quantize(SourceMatrix::f32(src.data(), rows, cols), format);
    REQUIRE(q.ok());
    return std::move(*q);
}

// The row-major dequantization of every row.
std::vector<float> dequantize_all(const Weight& w) {
    std::vector<float> out(w.rows * w.cols);
    for (int64_t r = 0; r < w.rows; ++r) {
        dequantize_row(w, r, out.data() + r * w.cols);
    }
    return out;
}

TEST_CASE("row tiles: dequantize_row of the tiles equals the row-major rows exactly") {
    std::mt19937 rng(3);
    for (WeightFormat format : kTiledFormats) {
        for (int64_t rows : {1, 15, 16, 17, 40}) {
            const int64_t cols = format == WeightFormat::kInt4G128 ? 384 : 96;
            const std::string name = weight_format_name(format);
            CAPTURE(name);
            CAPTURE(rows);
            const QuantizedWeight q = make_weight(format, rows, cols, rng);
            auto tiled = tile_rows(q.view());
            REQUIRE(tiled.ok());
            const Weight& t = tiled->view();
            CHECK((t.layout == WeightLayout::kRowTiles16));
            CHECK(t.rows == rows);
            CHECK(t.cols == cols);
            CHECK((dequantize_all(t) == dequantize_all(q.view())));
            // The padding rows count: ceil(rows / 16) * 16 rows' data and scales.
            const int64_t padded = (rows + 15) / 16 * 16;
            CHECK(tiled->size_bytes() == weight_data_bytes(format, padded, cols) +
                                             weight_scale_count(format, padded, cols) * 4);
            // Padding rows decode as zeros.
            if (padded > rows) {
                std::vector<float> pad(cols, 1.0f);
                dequantize_row(t, padded - 1, pad.data());
                CHECK(std::all_of(pad.begin(), pad.end(), [](float f) { return f == 0.0f; }));
            }
        }
    }
}

TEST_CASE("row tiles: formats and shapes without a tiled layout are refused") {
    std::mt19937 rng(4);
    const QuantizedWeight fp8 = make_weight(WeightFormat::kFP8E4M3Block128, 16, 128, rng);
    CHECK(!row_tiles_support(WeightFormat::kFP8E4M3Block128, 128));
    CHECK(!tile_rows(fp8.view()).ok());
    CHECK(!row_tiles_support(WeightFormat::kInt8Row, 30));  // Not a multiple of 4 columns.
    CHECK(!row_tiles_support(WeightFormat::kBF16, 64));
    const QuantizedWeight i4 = make_weight(WeightFormat::kInt4G32, 16, 64, rng);
    auto tiled = tile_rows(i4.view());
    REQUIRE(tiled.ok());
    CHECK(!tile_rows(tiled->view()).ok());  // Already tiled.
}

TEST_CASE("row tiles: kernels are chosen by format and layout") {
    for (WeightFormat format : kTiledFormats) {
        const std::vector<KernelVariant> tiles =
            matmul_kernel_variants(format, WeightLayout::kRowTiles16);
        const std::vector<KernelVariant> rows = matmul_kernel_variants(format);
        for (const KernelVariant& t : tiles) {
            for (const KernelVariant& r : rows) {
                CHECK((t.kernel != r.kernel));
            }
        }
        CHECK((matmul_kernel_for(format) == rows.back().kernel));
        CHECK((matmul_kernel_for(format, WeightLayout::kRowTiles16) ==
               (tiles.empty() ? nullptr : tiles.back().kernel)));
    }
    CHECK(
        matmul_kernel_variants(WeightFormat::kFP8E4M3Block128, WeightLayout::kRowTiles16).empty());
}

struct Case {
    int64_t rows;
    int64_t cols;
    int64_t n_tokens;
};

// The tiled kernels against the exact product of the dequantized weights, with the activation
// rounding bound of quant_kernels_test.cc, over row ranges that cut tiles and y with ldy > rows.
void check_tiled(WeightFormat format, const Case& c, uint32_t seed) {
    const std::string name = weight_format_name(format);
    CAPTURE(name);
    CAPTURE(c.rows);
    CAPTURE(c.cols);
    CAPTURE(c.n_tokens);
    std::mt19937 rng(seed);
    const QuantizedWeight q = make_weight(format, c.rows, c.cols, rng);
    std::vector<float> x = random_vector(c.n_tokens * c.cols, rng, 1.0f);
    x[0] = 6.0f;  // An activation outlier.
    auto tiled = tile_rows(q.view());
    REQUIRE(tiled.ok());
    const std::vector<float> deq = dequantize_all(q.view());
    const std::vector<KernelVariant> variants =
        matmul_kernel_variants(format, WeightLayout::kRowTiles16);
    const int64_t ldy = c.rows + 5;
    const std::pair<int64_t, int64_t> ranges[] = {{0, c.rows},
                                                  {1, std::max<int64_t>(1, c.rows - 1)},
                                                  {std::min<int64_t>(17, c.rows), c.rows}};
    for (const KernelVariant& v : variants) {
        const std::string variant = v.name;
        CAPTURE(variant);
        for (const auto& [rb, re] : ranges) {
            CAPTURE(rb);
            CAPTURE(re);
            std::vector<float> y(c.n_tokens * ldy, -12345.0f);
            v.kernel(tiled->view(), x.data(), c.n_tokens, y.data(), ldy, rb, re);
            int bad = 0, untouched_changed = 0;
            for (int64_t t = 0; t < c.n_tokens; ++t) {
                const float* xt = x.data() + t * c.cols;
                for (int64_t r = 0; r < ldy; ++r) {
                    const float got = y[t * ldy + r];
                    if (r < rb || r >= re) {
                        untouched_changed += got != -12345.0f;
                        continue;
                    }
                    const float* row = deq.data() + r * c.cols;
                    double exact = 0.0, mag = 0.0, bound = 0.0;
                    for (int64_t i = 0; i < c.cols; ++i) {
                        exact += static_cast<double>(row[i]) * xt[i];
                        mag += std::fabs(static_cast<double>(row[i]) * xt[i]);
                    }
                    for (int64_t g0 = 0; g0 < c.cols; g0 += v.activation_group) {
                        double amax = 0.0, wsum = 0.0;
                        for (int64_t i = g0; i < std::min(c.cols, g0 + v.activation_group); ++i) {
                            amax = std::max(amax, std::fabs(static_cast<double>(xt[i])));
                            wsum += std::fabs(static_cast<double>(row[i]));
                        }
                        bound += amax / 254.0 * wsum;
                    }
                    const double tol = 1e-5 * mag + 1e-6 + bound * (1 + 1e-4);
                    bad += !(std::fabs(got - exact) <= tol);
                }
            }
            CHECK(bad == 0);
            CHECK(untouched_changed == 0);
        }
    }
}

TEST_CASE("row tiles: tiled kernels equal the exact product on ragged shapes") {
    const Case g32[] = {{1, 32, 1},   {15, 64, 2},  {17, 96, 9},  {33, 160, 5},
                        {40, 224, 3}, {64, 512, 1}, {23, 1056, 8}};
    const Case g128[] = {{1, 128, 1}, {18, 384, 4}, {65, 640, 1}, {31, 1024, 7}};
    const Case i8[] = {{1, 4, 1},   {15, 60, 2},  {17, 100, 9}, {40, 256, 3},
                       {33, 68, 5}, {64, 512, 1}, {23, 1000, 8}};
    uint32_t seed = 200;
    for (const Case& c : g32) {
        check_tiled(WeightFormat::kInt4G32, c, seed++);
    }
    for (const Case& c : g128) {
        check_tiled(WeightFormat::kInt4G128, c, seed++);
    }
    for (const Case& c : i8) {
        check_tiled(WeightFormat::kInt8Row, c, seed++);
    }
}

}  // namespace
}  // namespace edge::engine::quant
