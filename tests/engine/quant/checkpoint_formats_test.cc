#include "engine/quant/checkpoint_formats.h"

#include <doctest/doctest.h>

#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include "engine/quant/fp8.h"

namespace edge::engine::quant {
namespace {

template <typename T>
TensorRef ref(std::string_view name, TensorDType dtype, std::vector<int64_t> shape,
              const std::vector<T>& v) {
    return TensorRef{name, dtype, std::move(shape), v.data(),
                     static_cast<int64_t>(v.size() * sizeof(T))};
}

bool contains(const Status& s, std::string_view text) {
    return s.message().find(text) != std::string::npos;
}

TEST_CASE("compressed-tensors packing matches hand-computed int32 words") {
    // Nibble i of word j holds column 8j + i as q + 8, lowest nibble first.
    const std::vector<int8_t> q = {-8, -7, -1, 0, 1, 2, 6, 7,   // -> 0xFEA98710
                                   0,  0,  0,  0, 0, 0, 0, 0};  // -> 0x88888888
    auto words = pack_int4_to_int32(q.data(), 2, 8);
    REQUIRE(words.ok());
    REQUIRE(words->size() == 2);
    CHECK(static_cast<uint32_t>((*words)[0]) == 0xFEA98710u);
    CHECK(static_cast<uint32_t>((*words)[1]) == 0x88888888u);
    // A partial word is padded with 0 nibbles after offsetting, as compressed-tensors does.
    const std::vector<int8_t> three = {1, -1, 0};
    auto padded = pack_int4_to_int32(three.data(), 1, 3);
    REQUIRE(padded.ok());
    CHECK(static_cast<uint32_t>((*padded)[0]) == 0x00000879u);

    auto back = unpack_int32_to_int4(words->data(), 2, 2, 8);
    REQUIRE(back.ok());
    CHECK(*back == q);
    auto back3 = unpack_int32_to_int4(padded->data(), 1, 1, 3);
    REQUIRE(back3.ok());
    CHECK(*back3 == three);

    const std::vector<int8_t> bad = {9};
    CHECK_FALSE(pack_int4_to_int32(bad.data(), 1, 1).ok());
    CHECK_FALSE(unpack_int32_to_int4(words->data(), 1, 2, 8).ok());
}

TEST_CASE("compressed-tensors triple is viewed in place and agrees with the unpacked values") {
    const int64_t rows = 3;
    const int64_t cols = 64;
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> dist(-8, 7);
    std::vector<int8_t> q(rows * cols);
    for (auto& v : q) {
        v = static_cast<int8_t>(dist(rng));
    }
    auto packed = pack_int4_to_int32(q.data(), rows, cols);
    REQUIRE(packed.ok());
    // bf16 scales 0.5, 0.25, ... per group of 32.
    std::vector<uint16_t> scale_bf16(rows * 2);
    for (size_t i = 0; i < scale_bf16.size(); ++i) {
        const float s = std::ldexp(1.0f, -static_cast<int>(i) - 1);
        scale_bf16[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(s) >> 16);
    }
    const std::vector<int64_t> shape = {rows, cols};
    auto w = from_compressed_tensors(
        ref("m.weight_packed", TensorDType::kI32, {rows, cols / 8}, *packed),
        ref("m.weight_scale", TensorDType::kBF16, {rows, 2}, scale_bf16),
        ref("m.weight_shape", TensorDType::kI64, {2}, shape), 32);
    REQUIRE(w.ok());
    CHECK(w->view().format == WeightFormat::kInt4G32);
    CHECK(w->view().data == packed->data());  // No copy of the weights.
    CHECK_FALSE(w->owns_data());
    std::vector<float> row(cols);
    for (int64_t r = 0; r < rows; ++r) {
        dequantize_row(w->view(), r, row.data());
        for (int64_t c = 0; c < cols; ++c) {
            const float s = std::ldexp(1.0f, -static_cast<int>(r * 2 + c / 32) - 1);
            REQUIRE(row[c] == static_cast<float>(q[r * cols + c]) * s);
        }
    }
}

TEST_CASE("compressed-tensors bad input gets clear errors") {
    const int64_t rows = 4;
    const int64_t cols = 64;
    std::vector<int32_t> packed(rows * cols / 8, 0x11111111);
    std::vector<float> scales(rows * cols / 32, 1.0f);
    const std::vector<int32_t> shape = {rows, cols};
    auto packed_ref = ref("e.weight_packed", TensorDType::kI32, {rows, cols / 8}, packed);
    auto scale_ref = ref("e.weight_scale", TensorDType::kF32, {rows, cols / 32}, scales);
    auto shape_ref = ref("e.weight_shape", TensorDType::kI32, {2}, shape);
    REQUIRE(from_compressed_tensors(packed_ref, scale_ref, shape_ref, 32).ok());

    SUBCASE("scale tensor of the wrong shape") {
        auto bad = scale_ref;
        bad.shape = {rows, cols / 128};
        auto r = from_compressed_tensors(packed_ref, bad, shape_ref, 32);
        REQUIRE_FALSE(r.ok());
        CHECK(contains(r.status(), "e.weight_scale"));
        CHECK(contains(r.status(), "shape [4, 0], expected [4, 2]"));
        // Scales for group 128 given with group 32 in the config.
        CHECK_FALSE(from_compressed_tensors(packed_ref, scale_ref, shape_ref, 128).ok());
    }
    SUBCASE("packed tensor shorter than weight_shape implies") {
        const std::vector<int32_t> bigger = {rows, cols * 2};
        auto r = from_compressed_tensors(packed_ref, scale_ref,
                                         ref("e.weight_shape", TensorDType::kI32, {2}, bigger), 32);
        REQUIRE_FALSE(r.ok());
        CHECK(contains(r.status(), "e.weight_packed"));
        CHECK(contains(r.status(), "expected [4, 16]"));
        // Given the shape the architecture wants, a disagreeing weight_shape is named as such.
        auto arch = from_compressed_tensors(packed_ref, scale_ref,
                                            ref("e.weight_shape", TensorDType::kI32, {2}, bigger),
                                            32, rows, cols);
        REQUIRE_FALSE(arch.ok());
        CHECK(contains(arch.status(), "tensor 'e.weight_shape' is [4, 128], but the model's "
                                      "config wants [4, 64]"));
        CHECK(from_compressed_tensors(packed_ref, scale_ref, shape_ref, 32, rows, cols).ok());
        auto truncated = packed_ref;
        truncated.size_bytes -= 4;
        auto t = from_compressed_tensors(truncated, scale_ref, shape_ref, 32);
        REQUIRE_FALSE(t.ok());
        CHECK(t.status().code() == StatusCode::kDataLoss);
        CHECK(contains(t.status(), "124 bytes"));
    }
    SUBCASE("wrong dtypes, bad shapes, bad scales, unsupported groups") {
        auto as_i8 = packed_ref;
        as_i8.dtype = TensorDType::kI8;
        CHECK(contains(from_compressed_tensors(as_i8, scale_ref, shape_ref, 32).status(),
                       "dtype I8, expected I32"));
        const std::vector<int32_t> negative = {-4, cols};
        CHECK_FALSE(from_compressed_tensors(packed_ref, scale_ref,
                                            ref("e.weight_shape", TensorDType::kI32, {2}, negative),
                                            32)
                        .ok());
        const std::vector<int32_t> odd_cols = {rows, 60};
        CHECK(contains(
            from_compressed_tensors(packed_ref, scale_ref,
                                    ref("e.weight_shape", TensorDType::kI32, {2}, odd_cols), 32)
                .status(),
            "not a multiple of group_size 32"));
        CHECK_FALSE(from_compressed_tensors(packed_ref, scale_ref, shape_ref, 64).ok());
        std::vector<float> nan_scales = scales;
        nan_scales[3] = std::nanf("");
        auto r = from_compressed_tensors(
            packed_ref, ref("e.weight_scale", TensorDType::kF32, {rows, cols / 32}, nan_scales),
            shape_ref, 32);
        REQUIRE_FALSE(r.ok());
        CHECK(contains(r.status(), "scale 3"));
    }
}

TEST_CASE("fp8 block checkpoint validation") {
    const int64_t rows = 130;  // Two block rows, the second partial.
    const int64_t cols = 256;
    std::vector<uint8_t> weight(rows * cols, 0x38);  // 1.0
    std::vector<float> scale_inv = {0.5f, 2.0f, 0.25f, 4.0f};
    auto wref = ref("l.weight", TensorDType::kF8E4M3, {rows, cols}, weight);
    auto sref = ref("l.weight_scale_inv", TensorDType::kF32, {2, 2}, scale_inv);
    auto ok = from_fp8_block(wref, sref, true);
    REQUIRE(ok.ok());
    CHECK(ok->view().data == weight.data());
    std::vector<float> row(cols);
    dequantize_row(ok->view(), 129, row.data());
    CHECK(row[0] == 0.25f);
    CHECK(row[200] == 4.0f);

    auto bad_scale = sref;
    bad_scale.shape = {1, 2};
    auto s = read_fp8_block_scales(wref, bad_scale, false).status();
    CHECK(contains(s, "l.weight_scale_inv"));
    CHECK(contains(s, "expected [2, 2]"));

    auto short_weight = wref;
    short_weight.size_bytes -= 1;
    CHECK(read_fp8_block_scales(short_weight, sref, false).status().code() ==
          StatusCode::kDataLoss);

    auto int_scale = sref;
    int_scale.dtype = TensorDType::kI32;
    CHECK(contains(read_fp8_block_scales(wref, int_scale, false).status(),
                   "expected BF16, F16 or F32"));

    auto not_fp8 = wref;
    not_fp8.dtype = TensorDType::kBF16;
    CHECK_FALSE(read_fp8_block_scales(not_fp8, sref, false).ok());

    auto three_d = wref;
    three_d.shape = {1, rows, cols};
    CHECK(contains(read_fp8_block_scales(three_d, sref, false).status(), "2-D"));

    weight[5 * cols + 7] = 0xFF;
    CHECK(read_fp8_block_scales(wref, sref, false).ok());  // No scan requested.
    auto nan = read_fp8_block_scales(wref, sref, true).status();
    CHECK(contains(nan, "NaN (byte 0xFF) at [5, 7]"));
}

}  // namespace
}  // namespace edge::engine::quant
