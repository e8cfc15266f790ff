#include "routing/health/outlier_detector.h"

#include <doctest/doctest.h>

#include <string>

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
