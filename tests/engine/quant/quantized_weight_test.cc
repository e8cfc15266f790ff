#include "engine/quant/quantized_weight.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "engine/quant/checkpoint_formats.h"
#include "engine/quant/fp8.h"
#include "engine/quant/quant_kernels.h"
#include "engine/quant/row_tiles.h"

namespace edge::engine::quant {
namespace {

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> m(static_cast<size_t>(rows * cols));
    for (float& v : m) {
        v = normal(rng);
    }
    // A few outliers and exact zeros, as real checkpoints have.
    m[0] = 0.9f;
    m[m.size() / 2] = 0.0f;
    m.back() = -0.7f;
    return m;
}

// Largest violation of |w - dequant(w)| <= bound(r, c), scanning every element; 0 when none.
template <typename Bound>
double worst_excess(const QuantizedWeight& q, const std::vector<float>& src, Bound bound) {
    const Weight& w = q.view();
    std::vector<float> row(static_cast<size_t>(w.cols));
    double worst = 0.0;
    for (int64_t r = 0; r < w.rows; ++r) {
        dequantize_row(w, r, row.data());
        for (int64_t c = 0; c < w.cols; ++c) {
            const double err = std::fabs(static_cast<double>(row[c]) - src[r * w.cols + c]);
            worst = std::max(worst, err - bound(r, c));
        }
    }
    return worst;
}

TEST_CASE("fp8 block128 round trip stays within half an ulp of a 3-bit mantissa") {
    // 200 x 300: partial edge blocks in both dimensions (200 = 128 + 72, 300 = 2*128 + 44).
    const int64_t rows = 200;
    const int64_t cols = 300;
    const std::vector<float> src = random_matrix(rows, cols, 1);
    auto q = quantize_fp8_block(SourceMatrix::f32(src.data(), rows, cols), "w");
    REQUIRE(q.ok());
    const Weight& w = q->view();
    CHECK(w.format == WeightFormat::kFP8E4M3Block128);
    CHECK(q->scales().size() == 2 * 3);
    CHECK(q->size_bytes() == rows * cols + 6 * 4);
    // Each block's scale is max|w| / 448 of exactly that block.
    for (int64_t br = 0; br < 2; ++br) {
        for (int64_t bc = 0; bc < 3; ++bc) {
            float amax = 0.0f;
            for (int64_t r = br * 128; r < std::min<int64_t>(rows, br * 128 + 128); ++r) {
                for (int64_t c = bc * 128; c < std::min<int64_t>(cols, bc * 128 + 128); ++c) {
                    amax = std::max(amax, std::fabs(src[r * cols + c]));
                }
            }
            CHECK(w.scales[br * 3 + bc] == doctest::Approx(amax / 448.0f).epsilon(1e-6));
        }
    }
    // Normal range: relative error <= 2^-4 (half an ulp of a 3-bit mantissa). Subnormal range
    // (|w / scale| < 2^-6): absolute error <= 2^-10 * scale (half the subnormal step 2^-9).
    // A 1e-6 relative slack covers the f32 division and multiplication by the scale.
    const double excess = worst_excess(*q, src, [&](int64_t r, int64_t c) {
        const double s = w.scales[(r / 128) * 3 + c / 128];
        const double v = std::fabs(src[r * cols + c]);
        return std::max(v * 0.0625, s * std::ldexp(1.0, -10)) * (1 + 1e-6) + 1e-12;
    });
    CHECK(excess <= 0.0);
}

TEST_CASE("int8 row round trip error is at most scale / 2") {
    const int64_t rows = 37;
    const int64_t cols = 101;
    const std::vector<float> src = random_matrix(rows, cols, 2);
    auto q = quantize_int8_row(SourceMatrix::f32(src.data(), rows, cols));
    REQUIRE(q.ok());
    const Weight& w = q->view();
    CHECK(q->scales().size() == rows);
    const auto* data = static_cast<const int8_t*>(w.data);
    CHECK(*std::min_element(data, data + rows * cols) >= -127);
    const double excess =
        worst_excess(*q, src, [&](int64_t r, int64_t) { return w.scales[r] * 0.5 * (1 + 1e-5); });
    CHECK(excess <= 0.0);
    // The row maximum is exact.
    std::vector<float> row(static_cast<size_t>(cols));
    dequantize_row(w, 0, row.data());
    CHECK(row[0] == doctest::Approx(0.9f).epsilon(1e-6));
}

TEST_CASE("int4 group round trip error is at most scale / 2, for g32 and g128") {
    for (int64_t group : {32, 128}) {
        CAPTURE(group);
        const int64_t rows = 19;
        const int64_t cols = 512;
        const std::vector<float> src = random_matrix(rows, cols, 3);
        auto q = quantize_int4_group(SourceMatrix::f32(src.data(), rows, cols), group);
        REQUIRE(q.ok());
        const Weight& w = q->view();
        CHECK(w.format == (group == 32 ? WeightFormat::kInt4G32 : WeightFormat::kInt4G128));
        CHECK(q->size_bytes() == rows * cols / 2 + rows * (cols / group) * 4);
        const int64_t groups = cols / group;
        const double excess = worst_excess(*q, src, [&](int64_t r, int64_t c) {
            return w.scales[r * groups + c / group] * 0.5 * (1 + 1e-5);
        });
        CHECK(excess <= 0.0);
        // Stored nibbles are q + 8 with q in [-7, 7]: never 0 (which would be -8).
        const auto* bytes = static_cast<const uint8_t*>(w.data);
        bool saw_zero_nibble = false;
        for (int64_t i = 0; i < rows * cols / 2; ++i) {
            saw_zero_nibble |= (bytes[i] & 0xF) == 0 || (bytes[i] >> 4) == 0;
        }
        CHECK_FALSE(saw_zero_nibble);
    }
}

TEST_CASE("bf16 sources quantize like their f32 values") {
    const int64_t rows = 8;
    const int64_t cols = 128;
    std::vector<float> f = random_matrix(rows, cols, 4);
    std::vector<uint16_t> b(f.size());
    for (size_t i = 0; i < f.size(); ++i) {
        b[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(f[i]) >> 16);
        f[i] = std::bit_cast<float>(static_cast<uint32_t>(b[i]) << 16);  // Exactly the bf16 value.
    }
    for (WeightFormat format : {WeightFormat::kFP8E4M3Block128, WeightFormat::kInt8Row,
                                WeightFormat::kInt4G32, WeightFormat::kInt4G128}) {
        const std::string format_name = weight_format_name(format);
        CAPTURE(format_name);
        auto from_f32 = quantize(SourceMatrix::f32(f.data(), rows, cols), format);
        auto from_bf16 = quantize(SourceMatrix::bf16(b.data(), rows, cols), format);
        REQUIRE(from_f32.ok());
        REQUIRE(from_bf16.ok());
        const int64_t bytes = weight_data_bytes(format, rows, cols);
        CHECK(std::equal(static_cast<const uint8_t*>(from_f32->view().data),
                         static_cast<const uint8_t*>(from_f32->view().data) + bytes,
                         static_cast<const uint8_t*>(from_bf16->view().data)));
        CHECK(std::equal(from_f32->scales().begin(), from_f32->scales().end(),
                         from_bf16->scales().begin()));
    }
}

TEST_CASE("quantize rejects NaN and Inf with the tensor name and position") {
    std::vector<float> m(4 * 32, 0.5f);
    m[2 * 32 + 5] = std::numeric_limits<float>::quiet_NaN();
    for (WeightFormat format :
         {WeightFormat::kFP8E4M3Block128, WeightFormat::kInt8Row, WeightFormat::kInt4G32}) {
        auto q = quantize(SourceMatrix::f32(m.data(), 4, 32), format, "layers.0.mlp.up_proj");
        REQUIRE_FALSE(q.ok());
        CHECK(q.status().code() == StatusCode::kInvalidArgument);
        CHECK(q.status().message().find("layers.0.mlp.up_proj") != std::string::npos);
        CHECK(q.status().message().find("NaN at [2, 5]") != std::string::npos);
    }
    m[2 * 32 + 5] = -std::numeric_limits<float>::infinity();
    auto q = quantize_int8_row(SourceMatrix::f32(m.data(), 4, 32), "x");
    REQUIRE_FALSE(q.ok());
    CHECK(q.status().message().find("Inf at [2, 5]") != std::string::npos);
}

TEST_CASE("quantize refuses scales above kMaxScale, and every kernel computes the largest") {
    // Weights whose scale would pass 2^64 (a finite BF16 weight of 2^80) were quantized on load,
    // which the loader refuses in a checkpoint: the AVX2 FP8 kernel (scale x 2^56) made inf of
    // a row the scalar kernel computed as 3.6e16.
    const int64_t rows = 4, cols = 128;
    std::vector<float> m(rows * cols, 0.5f);
    m[1 * cols + 70] = 0x1p80f;
    const struct {
        WeightFormat format;
        const char* where;
        float max_q;
    } cases[] = {{WeightFormat::kFP8E4M3Block128, "scale 0 (block [0, 0])", kFp8E4M3Max},
                 {WeightFormat::kInt8Row, "scale 1 (row 1)", 127.0f},
                 {WeightFormat::kInt4G32, "scale 6 (row 1, group 2)", 7.0f},
                 {WeightFormat::kInt4G128, "scale 1 (row 1, group 0)", 7.0f}};
    for (const auto& c : cases) {
        const std::string format_name = weight_format_name(c.format);
        CAPTURE(format_name);
        auto q = quantize(SourceMatrix::f32(m.data(), rows, cols), c.format, "l.0.q_proj.weight");
        REQUIRE_FALSE(q.ok());
        CHECK(q.status().code() == StatusCode::kInvalidArgument);
        const std::string msg = q.status().message();
        CAPTURE(msg);
        CHECK(msg.find("tensor 'l.0.q_proj.weight': quantized to " + format_name) !=
              std::string::npos);
        CHECK(msg.find(c.where) != std::string::npos);
        CHECK(msg.find("must be in 0..2^64") != std::string::npos);

        // The largest weights taken get scale kMaxScale, which every kernel computes.
        std::vector<float> big(rows * cols);
        for (size_t i = 0; i < big.size(); ++i) {
            big[i] = c.max_q * kMaxScale * (i % 3 == 0 ? -1.0f : 0.25f * static_cast<float>(i % 4));
        }
        auto ok = quantize(SourceMatrix::f32(big.data(), rows, cols), c.format);
        REQUIRE(ok.ok());
        CHECK(ok->scales()[0] == kMaxScale);
        std::vector<float> x(cols);
        for (int64_t i = 0; i < cols; ++i) {
            x[i] = 1.0f + static_cast<float>(i % 5) * 0.125f;
        }
        const std::vector<KernelVariant> variants = matmul_kernel_variants(c.format);
        std::vector<float> reference(rows);
        variants.front().kernel(ok->view(), x.data(), 1, reference.data(), rows, 0, rows);
        for (const KernelVariant& v : variants) {
            const std::string variant = v.name;
            CAPTURE(variant);
            std::vector<float> y(rows);
            v.kernel(ok->view(), x.data(), 1, y.data(), rows, 0, rows);
            for (int64_t r = 0; r < rows; ++r) {
                CHECK(std::isfinite(y[r]));
                CHECK(std::fabs(y[r] - reference[r]) <= 0.02f * std::fabs(reference[r]));
            }
        }
    }

    // Requantizing FP8 at the limit (448 x 2^64) to INT8 or INT4 would need a larger scale.
    AlignedBytes codes(static_cast<size_t>(rows * cols), kFp8E4M3MaxBits);
    QuantizedWeight fp8(WeightFormat::kFP8E4M3Block128, rows, cols, std::move(codes),
                        std::vector<float>{kMaxScale});
    for (WeightFormat target : {WeightFormat::kInt8Row, WeightFormat::kInt4G32}) {
        auto q = requantize(fp8.view(), target, "e.0.up_proj.weight");
        REQUIRE_FALSE(q.ok());
        CHECK(q.status().message().find("tensor 'e.0.up_proj.weight': quantized to") !=
              std::string::npos);
    }
}

TEST_CASE("quantize rejects bad shapes and formats") {
    std::vector<float> m(4 * 48, 0.5f);
    auto g32 = quantize_int4_group(SourceMatrix::f32(m.data(), 4, 48), 32, "w");
    REQUIRE_FALSE(g32.ok());
    CHECK(g32.status().message().find("not a multiple of the int4 group 32") != std::string::npos);
    CHECK_FALSE(quantize_int4_group(SourceMatrix::f32(m.data(), 4, 48), 16).ok());
    CHECK_FALSE(quantize(SourceMatrix::f32(m.data(), 4, 48), WeightFormat::kBF16).ok());
    CHECK_FALSE(quantize_int8_row(SourceMatrix::f32(nullptr, 4, 48)).ok());
    CHECK_FALSE(quantize_int8_row(SourceMatrix::f32(m.data(), 0, 48)).ok());
}

TEST_CASE("all-zero blocks, and blocks of only tiny subnormals, quantize to zeros, not NaN") {
    // Tiny subnormals: amax / 448 (or / 127, / 7) underflowed to a 0 scale, so FP8 stored
    // 0 / 0 = NaN codes and every token multiplied by that row came out NaN; INT8 and INT4 cast
    // a NaN to an integer. Both kinds of block now get a unit scale.
    std::vector<float> zeros(16 * 32, 0.0f);
    std::vector<float> tiny = zeros;
    tiny[3 * 32] = 0x1p-148f;
    tiny[3 * 32 + 5] = -0x1p-149f;
    for (const std::vector<float>* m : {&zeros, &tiny}) {
        for (WeightFormat format :
             {WeightFormat::kFP8E4M3Block128, WeightFormat::kInt8Row, WeightFormat::kInt4G32}) {
            auto q = quantize(SourceMatrix::f32(m->data(), 16, 32), format);
            REQUIRE(q.ok());
            std::vector<float> row(32, 1.0f);
            dequantize_row(q->view(), 3, row.data());
            CHECK(std::all_of(row.begin(), row.end(), [](float v) { return v == 0.0f; }));
            CHECK(q->scales()[0] == 1.0f);
        }
    }
}

TEST_CASE("subnormal scales keep the round-trip error bounds") {
    // A row or group whose largest magnitude is below max_q x 2^-126 gets a subnormal scale of few
    // significant bits; rounded down, amax / scale passed max_q by whole codes, which the clamp
    // (INT8, INT4) or saturation (FP8) turned into errors of several scales: INT4 stored 10 x
    // 2^-149 as 7 x 2^-149, INT8 300 x 2^-149 as 254 x 2^-149, FP8 1000 x 2^-149 as 896 x 2^-149.
    for (int steps : {10, 11, 13, 200, 300, 700, 1000, 5000, 100000, 1 << 20}) {
        CAPTURE(steps);
        const int64_t cols = 128;
        std::vector<float> src(cols);
        for (int64_t c = 0; c < cols; ++c) {
            const auto k = static_cast<float>(steps * (c % 17) / 16);
            src[c] = std::ldexp(c % 2 == 0 ? k : -k, -149);
        }
        src[0] = std::ldexp(static_cast<float>(steps), -149);  // The largest magnitude.
        const SourceMatrix m = SourceMatrix::f32(src.data(), 1, cols);
        for (WeightFormat format :
             {WeightFormat::kInt8Row, WeightFormat::kInt4G32, WeightFormat::kInt4G128}) {
            const std::string format_name = weight_format_name(format);
            CAPTURE(format_name);
            auto q = quantize(m, format);
            REQUIRE(q.ok());
            const int64_t group = format == WeightFormat::kInt8Row ? cols : int4_group_size(format);
            const double excess = worst_excess(*q, src, [&](int64_t, int64_t c) {
                return q->scales()[c / group] * 0.5 * (1 + 1e-5);
            });
            CHECK(excess <= 0.0);
        }
        auto q = quantize_fp8_block(m);
        REQUIRE(q.ok());
        const double s = q->scales()[0];
        // Plus one f32 subnormal step: decode(byte) x scale rounds to a multiple of 2^-149.
        const double excess = worst_excess(*q, src, [&](int64_t, int64_t c) {
            return std::max(std::fabs(src[c]) * 0.0625, s * std::ldexp(1.0, -10)) * (1 + 1e-6) +
                   std::ldexp(1.0, -149);
        });
        CHECK(excess <= 0.0);
    }
}

TEST_CASE("a moved QuantizedWeight keeps its view valid") {
    std::vector<float> m = random_matrix(4, 64, 5);
    auto q = quantize_int8_row(SourceMatrix::f32(m.data(), 4, 64));
    REQUIRE(q.ok());
    const void* data = q->view().data;
    QuantizedWeight moved = std::move(q).value();
    CHECK(moved.view().data == data);
    CHECK(moved.view().scales == moved.scales().data());
}

TEST_CASE("owned quantized data starts on a 64-byte boundary, row-major and in row tiles") {
    // The kernels load 64 bytes at a time: a buffer 16 bytes past a line (where malloc puts a
    // vector) would make every load straddle two cache lines.
    std::vector<float> m = random_matrix(37, 256, 6);
    for (WeightFormat f : {WeightFormat::kFP8E4M3Block128, WeightFormat::kInt8Row,
                           WeightFormat::kInt4G32, WeightFormat::kInt4G128}) {
        CAPTURE(weight_format_name(f));
        auto q = quantize(SourceMatrix::f32(m.data(), 37, 256), f);
        REQUIRE(q.ok());
        CHECK(reinterpret_cast<uintptr_t>(q->view().data) % 64 == 0);
        if (row_tiles_support(f, 256)) {
            auto tiled = tile_rows(q->view());
            REQUIRE(tiled.ok());
            CHECK(reinterpret_cast<uintptr_t>(tiled->view().data) % 64 == 0);
        }
    }
}

}  // namespace
}  // namespace edge::engine::quant
