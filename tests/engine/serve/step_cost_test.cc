#include "engine/sched/step_cost.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>

namespace edge::engine::sched {
namespace {

// A pool whose steps take a + b * prefill + c * decode seconds.
struct Pool {
    double a = 0.004;
    double b = 1.0 / 20000.0;  // 20000 prompt tokens/s at the margin.
    double c = 2e-4;

    double seconds(int64_t prefill, int64_t decode) const {
        return a + b * static_cast<double>(prefill) + c * static_cast<double>(decode);
    }
    // Tokens/s of a decode-only step of n sequences.
    double decode_speed(int64_t n) const {
        return static_cast<double>(n) / (a + c * static_cast<double>(n));
    }
};

// Deterministic mixed load: every step decodes 8-63 sequences and prefills a chunk of 64-2047
// prompt tokens beside them (never a step of one kind alone).
struct MixedLoad {
    uint64_t state = 12345;

    uint64_t next() {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return state >> 33;
    }
    int64_t prefill() { return 64 + static_cast<int64_t>(next() % 1984); }
    int64_t decode() { return 8 + static_cast<int64_t>(next() % 56); }
    // A factor in [1 - spread, 1 + spread].
    double noise(double spread) {
        return 1.0 + spread * (2.0 * static_cast<double>(next() % 1000001) / 1e6 - 1.0);
    }
};

void run_mixed(StepCost* cost, const Pool& pool, MixedLoad* load, int steps,
               double noise = 0.0) {
    for (int i = 0; i < steps; ++i) {
        const int64_t p = load->prefill();
        const int64_t d = load->decode();
        cost->observe(p, d, pool.seconds(p, d) * load->noise(noise));
    }
}

// What the figures must never be: NaN, negative, infinite or past what gossip carries.
void check_sane(const StepCost& cost) {
    for (double v : {cost.prefill_tokens_per_s(), cost.decode_tokens_per_s(1),
                     cost.decode_tokens_per_s(32), cost.decode_tokens_per_s(1 << 20)}) {
        CHECK(std::isfinite(v));
        CHECK(v >= 0.0);
        CHECK(v <= StepCost::kMaxTokensPerS);
    }
    for (double v : {cost.a(), cost.b(), cost.c()}) {
        CHECK(std::isfinite(v));
        CHECK(v >= 0.0);
    }
}

TEST_CASE("step cost: mixed steps alone give the prefill speed and the decode-only speed") {
    const Pool pool;
    StepCost cost;
    MixedLoad load;
    run_mixed(&cost, pool, &load, 4);
    // Too few steps to tell the terms apart: the caller keeps its own figures.
    CHECK(cost.prefill_tokens_per_s() == 0.0);
    CHECK(cost.decode_tokens_per_s(32) == 0.0);
    run_mixed(&cost, pool, &load, 60);
    CHECK(cost.prefill_tokens_per_s() == doctest::Approx(20000.0).epsilon(0.02));
    CHECK(cost.decode_tokens_per_s(32) == doctest::Approx(pool.decode_speed(32)).epsilon(0.02));
    CHECK(cost.decode_tokens_per_s(8) == doctest::Approx(pool.decode_speed(8)).epsilon(0.02));
    CHECK(cost.a() == doctest::Approx(pool.a).epsilon(0.02));
    CHECK(cost.c() == doctest::Approx(pool.c).epsilon(0.02));
    // Decode tokens over a whole mixed step's time are far from it (what was advertised).
    CHECK(32.0 / pool.seconds(1024, 32) < 0.25 * pool.decode_speed(32));
    check_sane(cost);
}

TEST_CASE("step cost: timing noise of 2% gives the prefill speed within 3%") {
    // The decode-only speed is an extrapolation to steps without prefill, which these steps
    // never come near (prefill 64-2047 tokens): its error is larger.
    const Pool pool;
    StepCost cost;
    MixedLoad load;
    run_mixed(&cost, pool, &load, 100, 0.02);
    for (int i = 0; i < 300; ++i) {
        run_mixed(&cost, pool, &load, 1, 0.02);
        CAPTURE(i);
        CHECK(cost.prefill_tokens_per_s() == doctest::Approx(20000.0).epsilon(0.03));
        CHECK(cost.decode_tokens_per_s(32) ==
              doctest::Approx(pool.decode_speed(32)).epsilon(0.1));
    }
    check_sane(cost);
}

TEST_CASE("step cost: a pool whose prefill gets twice as slow is followed within 200 steps") {
    Pool pool;
    StepCost cost;
    MixedLoad load;
    run_mixed(&cost, pool, &load, 100);
    REQUIRE(cost.prefill_tokens_per_s() == doctest::Approx(20000.0).epsilon(0.02));
    pool.b *= 2.0;
    run_mixed(&cost, pool, &load, 200);
    CHECK(cost.prefill_tokens_per_s() == doctest::Approx(10000.0).epsilon(0.03));
    CHECK(cost.decode_tokens_per_s(32) == doctest::Approx(pool.decode_speed(32)).epsilon(0.03));
    // And back.
    pool.b /= 2.0;
    run_mixed(&cost, pool, &load, 200);
    CHECK(cost.prefill_tokens_per_s() == doctest::Approx(20000.0).epsilon(0.03));
    check_sane(cost);
}

TEST_CASE("step cost: steps all alike tell no prefill speed, nor a decode-only one they miss") {
    StepCost cost;
    for (int i = 0; i < 500; ++i) {
        cost.observe(512, 16, 0.05);
    }
    CHECK(cost.prefill_tokens_per_s() == 0.0);
    CHECK(cost.decode_tokens_per_s(16) == 0.0);
    check_sane(cost);
    // Decode-only steps all alike give their own speed, and no prefill speed.
    StepCost decoding;
    for (int i = 0; i < 500; ++i) {
        decoding.observe(0, 16, 0.02);
    }
    CHECK(decoding.prefill_tokens_per_s() == 0.0);
    CHECK(decoding.decode_tokens_per_s(16) == doctest::Approx(800.0).epsilon(0.01));
    check_sane(decoding);
}

TEST_CASE("step cost: prefill and decode tokens that always fill the budget are not told apart") {
    // Every step computes 2048 tokens: the prefill tokens' cost cannot be told from the decode
    // tokens' it displaces, nor a step's fixed cost from a decode token's.
    const Pool pool;
    StepCost cost;
    MixedLoad load;
    for (int i = 0; i < 500; ++i) {
        const int64_t d = load.decode();
        cost.observe(2048 - d, d, pool.seconds(2048 - d, d));
    }
    CHECK(cost.prefill_tokens_per_s() == 0.0);
    CHECK(cost.decode_tokens_per_s(32) == 0.0);
    check_sane(cost);
}

TEST_CASE("step cost: a step time that does not depend on the work gives no prefill speed") {
    // A clock that moves one second a step whatever it computes (as the scheduler tests' fake
    // clocks): prefill looks free, which is no speed to advertise; a step of n decodes gives n/s.
    StepCost cost;
    MixedLoad load;
    for (int i = 0; i < 500; ++i) {
        cost.observe(load.prefill(), load.decode(), 1.0);
    }
    CHECK(cost.prefill_tokens_per_s() == 0.0);
    CHECK(cost.decode_tokens_per_s(2) == doctest::Approx(2.0));
    check_sane(cost);
}

TEST_CASE("step cost: no time, no tokens and times that are not numbers are ignored") {
    StepCost cost;
    const double nan = std::nan("");
    for (int i = 0; i < 100; ++i) {
        cost.observe(100, 10, 0.0);
        cost.observe(100, 10, -1.0);
        cost.observe(100, 10, nan);
        cost.observe(100, 10, HUGE_VAL);
        cost.observe(0, 0, 1.0);
        cost.observe(-5, 10, 1.0);
    }
    CHECK(cost.prefill_tokens_per_s() == 0.0);
    CHECK(cost.decode_tokens_per_s(10) == 0.0);
    CHECK(cost.a() == 0.0);
    check_sane(cost);
    // A fitted model is untouched by them.
    const Pool pool;
    MixedLoad load;
    run_mixed(&cost, pool, &load, 100);
    const double before = cost.prefill_tokens_per_s();
    cost.observe(100, 10, nan);
    cost.observe(100, 10, 0.0);
    cost.observe(0, 0, 5.0);
    CHECK(cost.prefill_tokens_per_s() == before);
    check_sane(cost);
}

TEST_CASE("step cost: huge outliers do not give nonsense, and the fit recovers") {
    const Pool pool;
    SUBCASE("amid a fitted model") {
        StepCost cost;
        MixedLoad load;
        run_mixed(&cost, pool, &load, 100);
        for (double stall : {1000.0, 1e-9, 3000.0, 1e9, 1e300}) {
            cost.observe(512, 32, stall);
            check_sane(cost);
            run_mixed(&cost, pool, &load, 3);
            check_sane(cost);
        }
        // A stall is taken as at most kClip times the prediction: the figures hold near.
        CHECK(cost.prefill_tokens_per_s() == doctest::Approx(20000.0).epsilon(0.3));
        run_mixed(&cost, pool, &load, 150);
        CHECK(cost.prefill_tokens_per_s() == doctest::Approx(20000.0).epsilon(0.03));
        CHECK(cost.decode_tokens_per_s(32) ==
              doctest::Approx(pool.decode_speed(32)).epsilon(0.03));
    }
    SUBCASE("on the first step (a warm-up)") {
        StepCost cost;
        MixedLoad load;
        cost.observe(2048, 1, 600.0);
        for (int i = 0; i < 2000; ++i) {
            run_mixed(&cost, pool, &load, 1);
            check_sane(cost);
            const double prefill = cost.prefill_tokens_per_s();
            // Nothing at all while the stall dominates; once a figure comes, a right one.
            if (prefill != 0.0) {
                CAPTURE(i);
                CHECK(prefill == doctest::Approx(20000.0).epsilon(0.1));
            }
        }
        CHECK(cost.prefill_tokens_per_s() == doctest::Approx(20000.0).epsilon(0.03));
    }
}

TEST_CASE("step cost: once known, the prefill speed holds through decode-only spells") {
    const Pool pool;
    StepCost cost;
    MixedLoad load;
    run_mixed(&cost, pool, &load, 100);
    const double known = cost.prefill_tokens_per_s();
    REQUIRE(known == doctest::Approx(20000.0).epsilon(0.02));
    for (int i = 0; i < 1000; ++i) {
        const int64_t d = load.decode();
        cost.observe(0, d, pool.seconds(0, d));
    }
    CHECK(cost.prefill_tokens_per_s() == doctest::Approx(known).epsilon(0.02));
    CHECK(cost.decode_tokens_per_s(32) == doctest::Approx(pool.decode_speed(32)).epsilon(0.01));
    check_sane(cost);
}

TEST_CASE("step cost: one slow first prefill among decode-only steps is not the prefill speed") {
    // A pool's first step prefills its first prompts ten times slower than it will (warming up),
    // then decodes a shrinking batch: that one prefill fitted b exactly, the decode steps' small
    // noise made it look certain, and 1932 tokens/s was advertised for a 20000 tokens/s pool,
    // held until many mixed steps outweighed it.
    const Pool pool;
    StepCost cost;
    cost.observe(2048, 0, 10.0 * pool.seconds(2048, 0));
    for (int i = 0; i < 40; ++i) {
        const int64_t d = 4 - i / 10;
        cost.observe(0, d, pool.seconds(0, d));
    }
    CHECK(cost.prefill_tokens_per_s() == 0.0);  // Not known yet: the caller keeps its own.
    // Steps that prefill again tell it, once the slow one is forgotten.
    MixedLoad load;
    run_mixed(&cost, pool, &load, 400);
    CHECK(cost.prefill_tokens_per_s() == doctest::Approx(20000.0).epsilon(0.03));
    check_sane(cost);
}

}  // namespace
}  // namespace edge::engine::sched
