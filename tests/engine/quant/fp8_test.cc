#include "engine/quant/fp8.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace edge::engine::quant {
namespace {

TEST_CASE("fp8 e4m3 exact bit patterns") {
    CHECK(fp8_e4m3_encode(0.0f) == 0x00);
    CHECK(fp8_e4m3_encode(-0.0f) == 0x80);
    CHECK(fp8_e4m3_encode(1.0f) == 0x38);  // exponent 7 (bias 7), mantissa 0.
    CHECK(fp8_e4m3_encode(-2.0f) == 0xC0);
    CHECK(fp8_e4m3_encode(448.0f) == 0x7E);  // Largest finite.
    CHECK(fp8_e4m3_encode(-448.0f) == 0xFE);
    CHECK(fp8_e4m3_encode(0.015625f) == 0x08);             // Smallest normal 2^-6.
    CHECK(fp8_e4m3_encode(std::ldexp(1.0f, -9)) == 0x01);  // Smallest subnormal 2^-9.
    CHECK(fp8_e4m3_encode(std::ldexp(7.0f, -9)) == 0x07);  // Largest subnormal.
    CHECK(fp8_e4m3_encode(-std::ldexp(3.0f, -9)) == 0x83);
    CHECK(fp8_e4m3_encode(0.875f * 0.015625f) == 0x07);

    CHECK(fp8_e4m3_decode(0x00) == 0.0f);
    CHECK(std::signbit(fp8_e4m3_decode(0x80)));
    CHECK(fp8_e4m3_decode(0x7E) == 448.0f);
    CHECK(fp8_e4m3_decode(0xFE) == -448.0f);
    CHECK(fp8_e4m3_decode(0x01) == std::ldexp(1.0f, -9));
    CHECK(fp8_e4m3_decode(0x08) == 0.015625f);
    CHECK(fp8_e4m3_decode(0x3F) == 1.875f);
    CHECK(std::isnan(fp8_e4m3_decode(0x7F)));
    CHECK(std::isnan(fp8_e4m3_decode(0xFF)));
    CHECK(fp8_e4m3_is_nan(0x7F));
    CHECK(fp8_e4m3_is_nan(0xFF));
    CHECK_FALSE(fp8_e4m3_is_nan(0x7E));
}

TEST_CASE("fp8 e4m3 rounding ties go to even") {
    // Between 1.0 (0x38, mantissa 0) and 1.125 (0x39): the tie 1.0625 goes to the even 0x38.
    CHECK(fp8_e4m3_encode(1.0625f) == 0x38);
    // Between 1.125 (0x39) and 1.25 (0x3A): the tie 1.1875 goes to the even 0x3A.
    CHECK(fp8_e4m3_encode(1.1875f) == 0x3A);
    CHECK(fp8_e4m3_encode(std::nextafter(1.0625f, 2.0f)) == 0x39);
    // Mantissa overflow carries into the exponent: 1.9375 ties between 1.875 (odd) and 2.0.
    CHECK(fp8_e4m3_encode(1.9375f) == 0x40);
    // Subnormal ties: 0.5 * 2^-9 -> 0 (even), 1.5 * 2^-9 -> 2 * 2^-9, 2.5 * 2^-9 -> 2 * 2^-9.
    CHECK(fp8_e4m3_encode(std::ldexp(0.5f, -9)) == 0x00);
    CHECK(fp8_e4m3_encode(std::ldexp(1.5f, -9)) == 0x02);
    CHECK(fp8_e4m3_encode(std::ldexp(2.5f, -9)) == 0x02);
    // The largest subnormal rounds up across into the smallest normal: 7.5 * 2^-9 -> 0x08.
    CHECK(fp8_e4m3_encode(std::ldexp(7.5f, -9)) == 0x08);
    // Below half the smallest subnormal -> zero, with sign.
    CHECK(fp8_e4m3_encode(-std::ldexp(0.25f, -9)) == 0x80);
}

TEST_CASE("fp8 e4m3 saturates above 448 instead of producing NaN") {
    // 464 is the tie between 448 and the (non-existent) 480; OCP's non-saturating cast would give
    // NaN. We saturate, so a block scale's rounding can never create a NaN weight.
    CHECK(fp8_e4m3_encode(460.0f) == 0x7E);
    CHECK(fp8_e4m3_encode(464.0f) == 0x7E);
    CHECK(fp8_e4m3_encode(1.0e6f) == 0x7E);
    CHECK(fp8_e4m3_encode(-1.0e6f) == 0xFE);
    CHECK(fp8_e4m3_encode(std::numeric_limits<float>::infinity()) == 0x7E);
    CHECK(fp8_e4m3_is_nan(fp8_e4m3_encode(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("fp8 e4m3 every finite code round-trips and every float rounds to nearest") {
    for (int b = 0; b < 256; ++b) {
        const auto bits = static_cast<uint8_t>(b);
        if (fp8_e4m3_is_nan(bits)) {
            continue;
        }
        CHECK(fp8_e4m3_encode(fp8_e4m3_decode(bits)) == bits);
    }
    // Exhaustive nearest check on a dense sweep: no other finite code is strictly closer.
    int not_nearest = 0;
    for (int i = -40000; i <= 40000; ++i) {
        const float v = static_cast<float>(i) * 0.01137f;
        const float target = std::clamp(v, -448.0f, 448.0f);
        const float err = std::fabs(fp8_e4m3_decode(fp8_e4m3_encode(v)) - target);
        for (int b = 0; b < 256; ++b) {
            if (!fp8_e4m3_is_nan(static_cast<uint8_t>(b)) &&
                std::fabs(fp8_e4m3_decode(static_cast<uint8_t>(b)) - target) < err) {
                ++not_nearest;
            }
        }
    }
    CHECK(not_nearest == 0);
}

}  // namespace
}  // namespace edge::engine::quant
