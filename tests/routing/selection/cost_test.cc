#include "routing/selection/cost.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

using namespace edge::routing::selection;
using edge::routing::coords::Coordinate;

namespace {

Coordinate coord_at(double x_seconds, double error) {
    Coordinate c;
    c.vec[0] = x_seconds;
    c.error = error;
    c.height = 0.0;
    c.adjustment = 0.0;
    return c;
}

}  // namespace

TEST_CASE("great-circle distance: Frankfurt to Singapore is about 10,260 km") {
    const double d = great_circle_m(50.11, 8.68, 1.35, 103.82);
    CHECK(d == doctest::Approx(10'260'000.0).epsilon(0.01));
    CHECK(great_circle_m(10.0, 20.0, 10.0, 20.0) == doctest::Approx(0.0));
    // Antipodes: half the circumference.
    CHECK(great_circle_m(0, 0, 0, 180) == doctest::Approx(M_PI * kEarthRadiusM));
}

TEST_CASE("fibre rtt: 1000 km at 2/3 c with inflation 1.5 is 15 ms") {
    // there and back 2000 km * 1.5 = 3000 km at 199,861,638.7 m/s.
    CHECK(fibre_rtt_s(1'000'000.0, 1.5) == doctest::Approx(3'000'000.0 / (kLightSpeedMps * 2 / 3)));
    CHECK(fibre_rtt_s(1'000'000.0, 1.5) == doctest::Approx(0.0150104).epsilon(1e-4));
}

// The formula, spelled out: one row per term, each with its expected value in seconds.
TEST_CASE("cost table: each term of the formula") {
    CostConfig cfg;  // defaults: prompt 512, mean output 256, default prefill 4000 tok/s,
                     // kv soft 0.8, kv full 1 s, sat 4 per slot / kv 0.98, penalties .5/30/.2
    struct Row {
        const char* name;
        CostInput in;
        double rtt, queue, prefill, kv, penalty;
        bool saturated;
    };
    const double fra_sin = fibre_rtt_s(great_circle_m(50.11, 8.68, 1.35, 103.82), 1.5);
    auto base = [] {
        CostInput in;
        in.capacity = 8;
        in.running = 2;
        in.decode_tokens_per_s = 1000.0;
        in.prefill_tokens_per_s = 5120.0;
        return in;
    };
    std::vector<Row> rows;
    {
        CostInput in = base();
        in.is_local = true;
        rows.push_back({"local idle: rtt 0, prefill 512/5120", in, 0, 0, 0.1, 0, 0, false});
    }
    {
        CostInput in = base();
        in.local_lat = 50.11, in.local_lon = 8.68, in.remote_lat = 1.35, in.remote_lon = 103.82;
        rows.push_back({"remote no coords: great circle", in, fra_sin, 0, 0.1, 0, 0, false});
    }
    {
        CostInput in = base();
        in.local_lat = 50.11, in.local_lon = 8.68, in.remote_lat = 1.35, in.remote_lon = 103.82;
        in.local_coord = coord_at(0.0, 1.5);
        in.remote_coord = coord_at(0.040, 0.2);
        rows.push_back({"local coord error high: great circle", in, fra_sin, 0, 0.1, 0, 0, false});
    }
    {
        CostInput in = base();
        in.local_lat = 50.11, in.local_lon = 8.68, in.remote_lat = 1.35, in.remote_lon = 103.82;
        in.local_coord = coord_at(0.0, 0.3);
        in.remote_coord = coord_at(0.040, 0.2);
        rows.push_back({"converged coords: vivaldi 40 ms", in, 0.040, 0, 0.1, 0, 0, false});
    }
    {
        CostInput in = base();
        in.is_local = true;
        in.running = 8;  // full: one slot must free
        in.queue_depth = 3;
        rows.push_back({"full, 3 queued: (3+1)*256/1000", in, 0, 1.024, 0.1, 0, 0, false});
    }
    {
        CostInput in = base();
        in.is_local = true;
        in.prefill_tokens_per_s = 0.0;  // default 4000
        in.decode_tokens_per_s = 0.0;   // floor 1 tok/s
        in.running = 7;
        in.queue_depth = 1;  // 1 + 7 + 1 - 8 = 1 ahead
        rows.push_back({"no rates advertised", in, 0, 256.0, 0.128, 0, 0, false});
    }
    {
        CostInput in = base();
        in.is_local = true;
        in.running = 4;
        in.queue_depth = 3;  // 3 + 4 + 1 <= 8: a slot is free for it
        rows.push_back({"4 running, 3 queued of 8: free slots, no wait", in, 0, 0, 0.1, 0, 0, false});
    }
    {
        CostInput in = base();
        in.is_local = true;
        in.running = 6;
        in.queue_depth = 4;  // 4 + 6 + 1 - 8 = 3 must finish first
        rows.push_back({"6 running, 4 queued of 8: 3*256/1000", in, 0, 0.768, 0.1, 0, 0, false});
    }
    {
        CostInput in = base();
        in.is_local = true;
        in.kv_use = 0.9;
        rows.push_back({"kv 0.9: (0.9-0.8)/0.2 * 1 s", in, 0, 0, 0.1, 0.5, 0, false});
    }
    {
        CostInput in = base();
        in.is_local = true;
        in.kv_use = 0.99;
        rows.push_back({"kv 0.99: saturated", in, 0, 0, 0.1, 0.95, 0, true});
    }
    {
        CostInput in = base();
        in.is_local = true;
        in.running = 8;
        in.queue_depth = 32;
        rows.push_back({"queue 32 = 4 per slot: saturated", in, 0, 8.448, 0.1, 0, 0, true});
    }
    {
        CostInput in = base();
        in.is_local = true;
        in.suspect = true;
        rows.push_back({"suspect", in, 0, 0, 0.1, 0, 0.5, false});
    }
    {
        CostInput in = base();
        in.is_local = true;
        in.ejected = true;
        in.degraded = true;
        rows.push_back({"ejected + degraded", in, 0, 0, 0.1, 0, 30.2, false});
    }
    {
        CostInput in = base();
        in.local_lat = NAN;
        rows.push_back({"bad position: half the planet", in, fibre_rtt_s(M_PI * kEarthRadiusM, 1.5),
                        0, 0.1, 0, 0, false});
    }
    for (const Row& r : rows) {
        CAPTURE(r.name);
        const CostTerms t = compute_cost(r.in, cfg);
        CHECK(t.rtt_s == doctest::Approx(r.rtt).epsilon(1e-6));
        CHECK(t.queue_s == doctest::Approx(r.queue));
        CHECK(t.prefill_s == doctest::Approx(r.prefill));
        CHECK(t.kv_s == doctest::Approx(r.kv));
        CHECK(t.penalty_s == doctest::Approx(r.penalty));
        CHECK(t.total_s == doctest::Approx(r.rtt + r.queue + r.prefill + r.kv + r.penalty));
        CHECK(t.saturated == r.saturated);
    }
}

TEST_CASE("cost: a queue at the pool's advertised bound is saturated, 0 = no bound") {
    CostInput in;
    in.capacity = 4;
    in.running = 4;
    in.queue_depth = 4;
    in.decode_tokens_per_s = 1000.0;
    const CostConfig cfg;  // 4 per slot: 16 queued
    CHECK_FALSE(compute_cost(in, cfg).saturated);  // Not advertised: the per-slot rule only.
    in.max_queue = 4;
    CHECK(compute_cost(in, cfg).saturated);
    in.max_queue = 5;
    CHECK_FALSE(compute_cost(in, cfg).saturated);
    in.max_queue = 64;  // Beyond 4 per slot: that rule comes first.
    in.queue_depth = 16;
    CHECK(compute_cost(in, cfg).saturated);
}

TEST_CASE("cost: rtt source is reported") {
    CostConfig cfg;
    CostInput in;
    in.is_local = true;
    CHECK(compute_cost(in, cfg).rtt_source == RttSource::kLocal);
    in.is_local = false;
    CHECK(compute_cost(in, cfg).rtt_source == RttSource::kGreatCircle);
    in.local_coord = coord_at(0, 0.1);
    in.remote_coord = coord_at(0.01, 0.1);
    CHECK(compute_cost(in, cfg).rtt_source == RttSource::kVivaldi);
    CHECK(rtt_source_name(RttSource::kVivaldi) == "vivaldi");
}

// Load and positions come from the network: a NaN total would break the strict weak ordering
// the route table's sort needs.
TEST_CASE("cost: NaN and infinite inputs give a finite cost") {
    const CostConfig cfg;
    const double inf = std::numeric_limits<double>::infinity();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    auto base = [] {
        CostInput in;
        in.local_lat = 50.11, in.local_lon = 8.68, in.remote_lat = 1.35, in.remote_lon = 103.82;
        in.capacity = 8;
        in.running = 8;
        in.queue_depth = 3;  // 3 + 8 + 1 - 8 = 4 ahead
        in.decode_tokens_per_s = 1000.0;
        in.prefill_tokens_per_s = 5120.0;
        return in;
    };
    const double fra_sin = fibre_rtt_s(great_circle_m(50.11, 8.68, 1.35, 103.82), 1.5);
    const double far_side = fibre_rtt_s(M_PI * kEarthRadiusM, 1.5);
    for (double bad : {nan, inf, -inf}) {
        CAPTURE(bad);
        CostInput in = base();
        in.decode_tokens_per_s = bad;  // Not advertised: the 1 tok/s floor.
        CostTerms t = compute_cost(in, cfg);
        CHECK(t.queue_s == doctest::Approx(4 * 256.0));
        CHECK(t.total_s == doctest::Approx(fra_sin + 4 * 256.0 + 0.1));

        in = base();
        in.prefill_tokens_per_s = bad;  // Not advertised: the default 4000 tok/s.
        t = compute_cost(in, cfg);
        CHECK(t.prefill_s == doctest::Approx(0.128));
        CHECK(t.total_s == doctest::Approx(fra_sin + 1.024 + 0.128));

        in = base();
        in.kv_use = bad;  // Taken as a full cache.
        t = compute_cost(in, cfg);
        CHECK(t.kv_s == doctest::Approx(1.0));
        CHECK(t.saturated);
        CHECK(std::isfinite(t.total_s));

        for (double* position : {&in.local_lat, &in.local_lon, &in.remote_lat, &in.remote_lon}) {
            in = base();
            *position = bad;
            t = compute_cost(in, cfg);
            CHECK(t.rtt_s == doctest::Approx(far_side));
            CHECK(std::isfinite(t.total_s));
        }

        in = base();
        in.local_coord = coord_at(0.0, 0.1);
        in.remote_coord = coord_at(bad, 0.1);
        t = compute_cost(in, cfg);
        CHECK(t.rtt_source == RttSource::kGreatCircle);
        CHECK(t.rtt_s == doctest::Approx(fra_sin));
        in.remote_coord = coord_at(0.04, bad);
        CHECK(compute_cost(in, cfg).rtt_source == RttSource::kGreatCircle);
        in.remote_coord = coord_at(0.04, 0.1);
        in.remote_coord->height = bad;
        CHECK(compute_cost(in, cfg).rtt_source == RttSource::kGreatCircle);
    }

    // A config outside the ranges the config file allows: the pool is not used, and its total
    // still sorts (after every real cost).
    for (double floor : {nan, 0.0, -inf}) {
        CAPTURE(floor);
        CostConfig broken;
        broken.min_rate = floor;
        for (double rate : {0.0, nan}) {
            CostInput in = base();
            in.decode_tokens_per_s = rate;
            in.prefill_tokens_per_s = rate;
            in.queue_depth = 0;  // 0 ahead: 0 / 0 without a guard.
            const CostTerms t = compute_cost(in, broken);
            CHECK(t.total_s == kUnusableCostS);
            CHECK(t.saturated);
        }
    }
    CostConfig broken;
    broken.kv_full_penalty_s = inf;
    CostInput in = base();
    in.kv_use = 0.9;
    CHECK(compute_cost(in, broken).total_s == kUnusableCostS);
    CHECK(compute_cost(in, broken).saturated);
}
