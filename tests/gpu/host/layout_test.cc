// Index math shared by the CUDA kernels and the host: the paged KV layout and element access into
// the stored weight formats, checked against the CPU's own dequantization.

#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "engine/cuda/host/paged_kv_layout.h"
#include "engine/cuda/host/quant_layout.h"
#include "engine/quant/fp8.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine::cuda {
namespace {

TEST_CASE("paged KV layout: 16-token blocks through the table, every entry distinct") {
    PagedKvLayout L{3, 2, 8, 10};
    CHECK(L.block_floats() == 2 * 16 * 8);
    CHECK(L.plane_floats() == 10 * 2 * 16 * 8);
    CHECK(L.pool_floats() == 2 * 3 * L.plane_floats());
    CHECK(L.plane_offset(2, 1) == 5 * L.plane_floats());
    CHECK(kv_blocks_for(0) == 0);
    CHECK(kv_blocks_for(16) == 1);
    CHECK(kv_blocks_for(17) == 2);
    // Two sequences over shuffled blocks: positions map to (table[p / 16], p % 16).
    const std::vector<int32_t> table = {7, 2, 9, 0, 4, 1};  // 3 blocks per sequence.
    CHECK(L.position_offset(table.data(), 1, 0) == L.row_offset(7, 1, 0));
    CHECK(L.position_offset(table.data(), 0, 17) == L.row_offset(2, 0, 1));
    CHECK(L.position_offset(table.data() + 3, 1, 47) == L.row_offset(1, 1, 15));
    std::set<int64_t> seen;
    for (int s = 0; s < 2; ++s) {
        for (int32_t h = 0; h < L.kv_heads; ++h) {
            for (int32_t p = 0; p < 48; ++p) {
                const int64_t at = L.position_offset(table.data() + 3 * s, h, p);
                CHECK(at >= 0);
                CHECK(at + L.head_dim <= L.plane_floats());
                CHECK(seen.insert(at).second);  // No two (seq, head, pos) share a row.
            }
        }
    }
}

TEST_CASE("check_block_table rejects blocks outside the pool and short tables") {
    PagedKvLayout L{1, 1, 8, 4};
    const std::vector<int32_t> table = {0, 1, 3, 2, -1, 9};
    const std::vector<int32_t> ok_lengths = {32, 16};
    CHECK(check_block_table(L, table, 3, ok_lengths).ok());
    const std::vector<int32_t> uses_bad = {32, 33};  // Sequence 1 reaches entry 2 (block 9).
    Status s = check_block_table(L, table, 3, uses_bad);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("sequence 1") != std::string::npos);
    const std::vector<int32_t> too_long = {49};
    CHECK_FALSE(check_block_table(L, table, 3, too_long).ok());
    const std::vector<int32_t> three = {1, 1, 1};
    CHECK_FALSE(check_block_table(L, table, 3, three).ok());
}

TEST_CASE("fp8_e4m3_value decodes all 256 bytes as quant::fp8_e4m3_decode") {
    for (int b = 0; b < 256; ++b) {
        CAPTURE(b);
        const float want = quant::fp8_e4m3_decode(static_cast<uint8_t>(b));
        const float got = fp8_e4m3_value(static_cast<uint8_t>(b));
        if (std::isnan(want)) {
            CHECK(std::isnan(got));
        } else {
            CHECK(got == want);
        }
    }
}

TEST_CASE("element access helpers reproduce quant::dequantize_row for every quantized format") {
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<float> d(-2.0f, 2.0f);
    const int64_t rows = 130, cols = 384;
    std::vector<float> src(rows * cols);
    for (float& v : src) {
        v = d(rng);
    }
    for (WeightFormat f : {WeightFormat::kFP8E4M3Block128, WeightFormat::kInt4G32,
                           WeightFormat::kInt4G128, WeightFormat::kInt8Row}) {
        CAPTURE(quant::weight_format_name(f));
        auto q = quant::quantize(quant::SourceMatrix::f32(src.data(), rows, cols), f);
        REQUIRE(q.ok());
        const Weight& w = q->view();
        const uint8_t* bytes = static_cast<const uint8_t*>(w.data);
        std::vector<float> row(cols);
        int mismatches = 0;
        for (int64_t r : {int64_t{0}, int64_t{127}, int64_t{128}, rows - 1}) {
            quant::dequantize_row(w, r, row.data());
            for (int64_t c = 0; c < cols; ++c) {
                float got = 0.0f;
                if (f == WeightFormat::kFP8E4M3Block128) {
                    got = fp8_e4m3_value(bytes[r * cols + c]) * w.scales[fp8_scale_index(r, c, cols)];
                } else if (f == WeightFormat::kInt8Row) {
                    got = static_cast<float>(static_cast<int8_t>(bytes[r * cols + c])) *
                          w.scales[r];
                } else {
                    const int64_t g = quant::int4_group_size(f);
                    got = static_cast<float>(int4_value(bytes[int4_byte_index(r, c, cols)], c)) *
                          w.scales[int4_scale_index(r, c, cols, g)];
                }
                mismatches += got == row[c] ? 0 : 1;
            }
        }
        CHECK(mismatches == 0);
    }
}

TEST_CASE("bf16_value widens the stored bits") {
    CHECK(bf16_value(0x3F80) == 1.0f);
    CHECK(bf16_value(0xC000) == -2.0f);
    CHECK(bf16_value(0x0000) == 0.0f);
}

}  // namespace
}  // namespace edge::engine::cuda
