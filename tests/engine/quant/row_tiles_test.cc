#include "engine/quant/row_tiles.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/quant/quant_kernels.h"
#include "engine/quant/quantized_weight.h"
#include "engine/quant/weight_arena.h"

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
            // Padding rows decode as zeros, and hold zero weights (INT4 nibbles store q + 8):
            // the tiles are written without a fill first.
            if (padded > rows) {
                std::vector<float> pad(cols, 1.0f);
                dequantize_row(t, padded - 1, pad.data());
                CHECK(std::all_of(pad.begin(), pad.end(), [](float f) { return f == 0.0f; }));
                std::vector<uint8_t> bytes(weight_data_bytes(format, 1, cols));
                std::vector<float> scales(weight_scale_count(format, 1, cols), 1.0f);
                untile_row(t, padded - 1, bytes.data(), scales.data());
                const uint8_t zero = format == WeightFormat::kInt8Row ? 0x00 : 0x88;
                CHECK(std::all_of(bytes.begin(), bytes.end(),
                                  [&](uint8_t b) { return b == zero; }));
            }
            // The same tiles in an arena's memory.
            WeightArena arena;
            auto in_arena = tile_rows(q.view(), &arena);
            REQUIRE(in_arena.ok());
            CHECK(in_arena->view().data != t.data);
            CHECK(std::memcmp(in_arena->view().data, t.data,
                              static_cast<size_t>(weight_data_bytes(format, padded, cols))) == 0);
            CHECK((dequantize_all(in_arena->view()) == dequantize_all(q.view())));
        }
    }
}

TEST_CASE("weight arena: 64-byte aligned, disjoint, 2 MiB-aligned chunks, large requests alone") {
    WeightArena arena(size_t{4} << 20);
    CHECK(arena.reserved_bytes() == 0);
    std::vector<std::pair<uint8_t*, size_t>> got;
    for (size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{100}, size_t{3} << 20,
                     size_t{3} << 20, size_t{9} << 20, size_t{5}}) {
        uint8_t* p = arena.allocate(n);
        REQUIRE(p != nullptr);
        CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
        std::memset(p, 0xab, n);  // Writable, all of it.
        got.emplace_back(p, n);
    }
    // The first allocation starts a chunk, which starts on a 2 MiB boundary.
    CHECK(reinterpret_cast<uintptr_t>(got[0].first) % (size_t{2} << 20) == 0);
    for (size_t i = 0; i < got.size(); ++i) {
        for (size_t j = i + 1; j < got.size(); ++j) {
            const bool apart = got[i].first + got[i].second <= got[j].first ||
                               got[j].first + got[j].second <= got[i].first;
            CHECK(apart);
        }
    }
    // 4 MiB chunks: the small ones and the first 3 MiB share one, the second 3 MiB takes
    // another, 9 MiB gets its own (10 MiB rounded to huge pages), the last 5 bytes fit in the
    // second chunk.
    CHECK(arena.reserved_bytes() == (size_t{4} + 4 + 10) << 20);
    CHECK(got.back().first == got[5].first + (size_t{3} << 20));
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

}  // namespace
}  // namespace edge::engine::quant
