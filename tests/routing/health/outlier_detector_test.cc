#include "routing/health/outlier_detector.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace edge::routing::health;
using edge::ManualClock;
using std::chrono::seconds;

namespace {

// Ten pools so the default 10% limit allows exactly one ejection.
void add_pools(OutlierDetector& d, int n) {
    for (int i = 0; i < n; ++i) {
        d.add_pool("p" + std::to_string(i));
    }
}

}  // namespace

TEST_CASE("outlier: five consecutive failures eject, a success in between resets") {
    ManualClock clock;
    OutlierDetector d(OutlierConfig{}, clock);
    add_pools(d, 10);
    for (int i = 0; i < 4; ++i) {
        d.report_failure("p0", FailureKind::kHttp5xx);
    }
    d.report_success("p0");
    for (int i = 0; i < 4; ++i) {
        d.report_failure("p0", FailureKind::kConnect);
    }
    CHECK(!d.is_ejected("p0"));
    d.report_failure("p0", FailureKind::kHttp5xx);
    CHECK(d.is_ejected("p0"));
    CHECK(d.ejections_total() == 1);
    const auto views = d.pools();
    REQUIRE(views.size() == 10);
    CHECK(views[0].pool == "p0");
    CHECK(views[0].cause == EjectionCause::kConsecutiveFailures);
    CHECK(views[0].times_ejected == 1);
}

TEST_CASE("outlier: ejection lasts base x count, capped, and the count decays when healthy") {
    ManualClock clock;
    OutlierConfig cfg;  // interval 10 s, base 30 s, max 300 s
    OutlierDetector d(cfg, clock);
    add_pools(d, 10);
    auto eject = [&] {
        for (int i = 0; i < 5; ++i) {
            d.report_failure("p1", FailureKind::kHttp5xx);
        }
        REQUIRE(d.is_ejected("p1"));
    };
    auto advance_ticks = [&](int n) {
        for (int i = 0; i < n; ++i) {
            clock.advance(seconds(10));
            d.tick();
        }
    };
    eject();  // 1st: 30 s
    advance_ticks(2);
    CHECK(d.is_ejected("p1"));
    advance_ticks(1);
    CHECK(!d.is_ejected("p1"));

    eject();  // 2nd right away: 60 s
    advance_ticks(5);
    CHECK(d.is_ejected("p1"));
    advance_ticks(1);
    CHECK(!d.is_ejected("p1"));
    CHECK(d.pools()[1].times_ejected == 2);

    // Two healthy intervals bring the count back to zero; the next ejection is 30 s again.
    advance_ticks(2);
    CHECK(d.pools()[1].times_ejected == 0);
    eject();
    advance_ticks(3);
    CHECK(!d.is_ejected("p1"));

    // Repeat ejections are capped at max_ejection_time.
    OutlierConfig short_cap = cfg;
    short_cap.max_ejection_time = seconds(40);
    OutlierDetector c(short_cap, clock);
    add_pools(c, 10);
    for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < 5; ++i) {
            c.report_failure("p2", FailureKind::kConnect);
        }
        REQUIRE(c.is_ejected("p2"));
        const auto until = c.pools()[2].ejected_until;
        CHECK(until - clock.now() <= seconds(40));
        while (c.is_ejected("p2")) {
            clock.advance(seconds(10));
            c.tick();
        }
    }
}

TEST_CASE("outlier: never more than max_ejection_percent, but at least one") {
    ManualClock clock;
    OutlierDetector d(OutlierConfig{}, clock);
    add_pools(d, 10);  // 10% of 10 = 1
    for (int p = 0; p < 3; ++p) {
        for (int i = 0; i < 5; ++i) {
            d.report_failure("p" + std::to_string(p), FailureKind::kHttp5xx);
        }
    }
    CHECK(d.is_ejected("p0"));
    CHECK(!d.is_ejected("p1"));
    CHECK(!d.is_ejected("p2"));

    OutlierDetector small(OutlierConfig{}, clock);
    add_pools(small, 3);  // 10% of 3 rounds to 0: one is still allowed
    for (int i = 0; i < 5; ++i) {
        small.report_failure("p0", FailureKind::kHttp5xx);
        small.report_failure("p1", FailureKind::kHttp5xx);
    }
    CHECK(small.is_ejected("p0"));
    CHECK(!small.is_ejected("p1"));

    // Removing the ejected pool frees the slot.
    small.remove_pool("p0");
    for (int i = 0; i < 5; ++i) {
        small.report_failure("p1", FailureKind::kHttp5xx);
    }
    CHECK(small.is_ejected("p1"));
}

TEST_CASE("outlier: success-rate ejection needs volume and enough pools") {
    ManualClock clock;
    OutlierConfig cfg;
    cfg.consecutive_failures = 0;  // only the success-rate detector
    cfg.max_ejection_percent = 50;
    OutlierDetector d(cfg, clock);
    add_pools(d, 6);
    auto interval = [&](int bad_successes, int volume) {
        for (int p = 0; p < 6; ++p) {
            const std::string name = "p" + std::to_string(p);
            const int ok = p == 5 ? bad_successes : volume;
            for (int i = 0; i < volume; ++i) {
                if (i < ok) {
                    d.report_success(name);
                } else {
                    d.report_failure(name, FailureKind::kHttp5xx);
                }
            }
        }
        clock.advance(seconds(10));
        d.tick();
    };
    // Too few requests per pool: no statistics.
    interval(0, 50);
    CHECK(!d.is_ejected("p5"));
    // p5 at 50% against five at 100%: mean 0.917, stdev 0.186, threshold 0.563.
    interval(50, 100);
    CHECK(d.is_ejected("p5"));
    CHECK(d.pools()[5].cause == EjectionCause::kSuccessRate);
    for (int p = 0; p < 5; ++p) {
        CHECK(!d.is_ejected("p" + std::to_string(p)));
    }

    // Only four pools with volume (< minimum hosts 5): no ejection even for a bad one.
    OutlierDetector few(cfg, clock);
    for (int p = 0; p < 4; ++p) {
        for (int i = 0; i < 100; ++i) {
            if (p == 3 && i % 2 == 0) {
                few.report_failure("q" + std::to_string(p), FailureKind::kHttp5xx);
            } else {
                few.report_success("q" + std::to_string(p));
            }
        }
    }
    clock.advance(seconds(10));
    few.tick();
    CHECK(!few.is_ejected("q3"));
}

TEST_CASE("outlier: a day of missed 1 ms intervals is caught up at once, with the same decay") {
    ManualClock clock;
    OutlierConfig cfg;
    cfg.interval = std::chrono::milliseconds(1);
    cfg.base_ejection_time = std::chrono::milliseconds(3);
    cfg.max_ejection_time = std::chrono::milliseconds(100);
    OutlierDetector d(cfg, clock);
    OutlierDetector stepped(cfg, clock);
    add_pools(d, 10);
    add_pools(stepped, 10);
    // p1 ejected four times (its count 4, the last ejection 12 ms), p2 once (3 ms).
    for (OutlierDetector* x : {&d, &stepped}) {
        for (int round = 0; round < 4; ++round) {
            for (int i = 0; i < 5; ++i) {
                x->report_failure("p1", FailureKind::kConnect);
            }
            REQUIRE(x->is_ejected("p1"));
            if (round < 3) {
                clock.advance(std::chrono::milliseconds(4 * (round + 1)));
                d.tick();
                stepped.tick();
                REQUIRE_FALSE(x->is_ejected("p1"));
            }
        }
    }
    // `stepped` ticks every interval for 10 ms: the reference. `d` sees one tick after 10 ms.
    for (int i = 0; i < 10; ++i) {
        clock.advance(std::chrono::milliseconds(1));
        stepped.tick();
        if (i == 6) {
            // Part way, the two agree after d's single catch-up tick.
            d.tick();
            CHECK(d.pools()[1].times_ejected == stepped.pools()[1].times_ejected);
            CHECK(d.is_ejected("p1") == stepped.is_ejected("p1"));
        }
    }
    d.tick();
    CHECK(d.pools()[1].times_ejected == stepped.pools()[1].times_ejected);
    CHECK(d.is_ejected("p1") == stepped.is_ejected("p1"));
    // A day without a tick at a 1 ms interval: one call (86.4 million intervals).
    clock.advance(std::chrono::hours(24));
    d.tick();
    CHECK_FALSE(d.is_ejected("p1"));
    CHECK(d.pools()[1].times_ejected == 0);
    // And the next interval boundary is in the future, not a day behind.
    for (int i = 0; i < 5; ++i) {
        d.report_failure("p3", FailureKind::kConnect);
    }
    REQUIRE(d.is_ejected("p3"));
    clock.advance(std::chrono::milliseconds(4));
    d.tick();
    CHECK_FALSE(d.is_ejected("p3"));
}

// A catch-up tick after a quiet spell (no request planned, so no tick) decayed the ejection count
// of a pool it brought back by every interval missed, those it spent ejected included: a pool
// failing again and again came back from its third ejection as if never ejected, and its next
// ejection was 30 s instead of 60 s. Only the intervals after it returned count, as when ticked.
TEST_CASE("outlier: a catch-up tick decays only the intervals a pool spent back in service") {
    ManualClock clock;
    OutlierConfig cfg;  // interval 10 s, base 30 s, max 300 s
    OutlierDetector d(cfg, clock);
    OutlierDetector stepped(cfg, clock);
    add_pools(d, 10);
    add_pools(stepped, 10);
    auto eject = [&] {
        for (OutlierDetector* x : {&d, &stepped}) {
            for (int i = 0; i < 5; ++i) {
                x->report_failure("p1", FailureKind::kConnect);
            }
            REQUIRE(x->is_ejected("p1"));
        }
    };
    for (int round = 0; round < 2; ++round) {  // 30 s, then 60 s, ticked every interval
        eject();
        while (stepped.is_ejected("p1")) {
            clock.advance(seconds(10));
            d.tick();
            stepped.tick();
        }
        REQUIRE_FALSE(d.is_ejected("p1"));
    }
    eject();  // the third: 90 s
    // `stepped` ticks every interval for 110 s: back after 90 s, then two healthy intervals.
    for (int i = 0; i < 11; ++i) {
        clock.advance(seconds(10));
        stepped.tick();
    }
    d.tick();  // one tick for the 110 s
    CHECK_FALSE(d.is_ejected("p1"));
    CHECK(stepped.pools()[1].times_ejected == 1);
    CHECK(d.pools()[1].times_ejected == stepped.pools()[1].times_ejected);
    eject();
    CHECK(stepped.pools()[1].ejected_until - clock.now() == seconds(60));
    CHECK(d.pools()[1].ejected_until == stepped.pools()[1].ejected_until);
}

TEST_CASE("outlier: of equally bad pools, the ejection cap takes the first by name") {
    // Several sets of equally bad pools, each among twenty added in scrambled order: which one
    // is ejected must not follow the detector's hash-map order (a chance pass is ~4^-5).
    const std::vector<std::vector<int>> bad_sets = {
        {3, 11, 7, 19}, {15, 2, 9, 17}, {18, 6, 13, 4}, {10, 16, 1, 12}, {14, 8, 5, 0}};
    for (const std::vector<int>& bad : bad_sets) {
        ManualClock clock;
        OutlierConfig cfg;
        cfg.consecutive_failures = 0;
        cfg.max_ejection_percent = 5;  // One of twenty.
        OutlierDetector d(cfg, clock);
        for (int i = 0; i < 20; ++i) {
            d.add_pool("p" + std::to_string(100 + (i * 7) % 20));
        }
        for (int p = 0; p < 20; ++p) {
            const std::string name = "p" + std::to_string(100 + p);
            const bool failing = std::find(bad.begin(), bad.end(), p) != bad.end();
            for (int i = 0; i < 100; ++i) {
                if (failing) {
                    d.report_failure(name, FailureKind::kHttp5xx);
                } else {
                    d.report_success(name);
                }
            }
        }
        clock.advance(seconds(10));
        d.tick();
        const int first = *std::min_element(bad.begin(), bad.end());
        for (int p : bad) {
            INFO("bad pool p" << 100 + p);
            CHECK(d.is_ejected("p" + std::to_string(100 + p)) == (p == first));
        }
    }
}

// The ejection count grew by one per ejection without bound: a peer down for hours, ejected again
// each time it came back, needed as many healthy intervals for its count to decay, and any brief
// failure in that time ejected it for the longest (300 s instead of 30 s). As Envoy's backoff, the
// count stops at the first ejection that reaches max_ejection_time.
TEST_CASE("outlier: the ejection count stops at the cap, a long outage decays like a short one") {
    ManualClock clock;
    OutlierConfig cfg;  // interval 10 s, base 30 s, max 300 s: the cap is reached at 10
    OutlierDetector d(cfg, clock);
    add_pools(d, 10);
    auto eject = [&] {
        for (int i = 0; i < 5; ++i) {
            d.report_failure("p1", FailureKind::kConnect);
        }
        REQUIRE(d.is_ejected("p1"));
    };
    for (int round = 0; round < 30; ++round) {  // Back each time its ejection ends, failing again.
        eject();
        CHECK(d.pools()[1].ejected_until - clock.now() <= seconds(300));
        while (d.is_ejected("p1")) {
            clock.advance(seconds(10));
            d.tick();
        }
    }
    CHECK(d.pools()[1].times_ejected == 10);
    // Ten healthy intervals bring it back to a first ejection's 30 s.
    for (int i = 0; i < 10; ++i) {
        clock.advance(seconds(10));
        d.tick();
    }
    CHECK(d.pools()[1].times_ejected == 0);
    eject();
    CHECK(d.pools()[1].ejected_until - clock.now() == seconds(30));
}
