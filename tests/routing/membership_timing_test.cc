// Timer formulas against the tables in hashicorp/memberlist's own tests (util_test.go,
// suspicion_test.go, awareness_test.go), plus the Suspicion timer as confirmations arrive.

#include <doctest/doctest.h>

#include "routing/membership/awareness.h"
#include "routing/membership/suspicion.h"
#include "routing/membership/timing.h"

namespace edge::routing::membership {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST_CASE("timing: suspicion timeout scales with log10 of the cluster size") {
    struct Row {
        size_t n;
        Duration expected;
    };
    const Row rows[] = {{5, milliseconds(1000)},   {10, milliseconds(1000)},
                        {50, milliseconds(1698)},  {100, milliseconds(2000)},
                        {500, milliseconds(2698)}, {1000, milliseconds(3000)}};
    for (const Row& r : rows) {
        CAPTURE(r.n);
        CHECK(suspicion_timeout(3, r.n, seconds(1)) / 3 == r.expected);
    }
    CHECK(suspicion_timeout(4, 1, seconds(1)) == seconds(4));
}

TEST_CASE("timing: retransmit limit is mult * ceil(log10(n + 1))") {
    CHECK(retransmit_limit(3, 0) == 0);
    CHECK(retransmit_limit(3, 1) == 3);
    CHECK(retransmit_limit(3, 99) == 6);
    CHECK(retransmit_limit(4, 100) == 12);
    CHECK(retransmit_limit(4, 1000) == 16);
}

TEST_CASE("timing: remaining suspicion time falls from max to min with confirmations") {
    struct Row {
        int n;
        int k;
        Duration elapsed;
        Duration min;
        Duration max;
        Duration expected;
    };
    const Row rows[] = {
        {0, 3, seconds(0), seconds(2), seconds(30), seconds(30)},
        {1, 3, seconds(2), seconds(2), seconds(30), seconds(14)},
        {2, 3, seconds(3), seconds(2), seconds(30), milliseconds(4810)},
        {3, 3, seconds(4), seconds(2), seconds(30), seconds(-2)},
        {4, 3, seconds(5), seconds(2), seconds(30), seconds(-3)},
        {5, 3, seconds(10), seconds(2), seconds(30), seconds(-8)},
    };
    for (const Row& r : rows) {
        CAPTURE(r.n);
        CHECK(remaining_suspicion_time(r.n, r.k, r.elapsed, r.min, r.max) == r.expected);
    }
}

TEST_CASE("timing: push-pull interval grows above 32 members") {
    CHECK(push_pull_scale(seconds(30), 1) == seconds(30));
    CHECK(push_pull_scale(seconds(30), 32) == seconds(30));
    CHECK(push_pull_scale(seconds(30), 33) == seconds(60));
    CHECK(push_pull_scale(seconds(30), 64) == seconds(60));
    CHECK(push_pull_scale(seconds(30), 65) == seconds(90));
    CHECK(push_pull_scale(seconds(30), 1000) == seconds(180));
}

TEST_CASE("awareness: score clamps to [0, max-1] and scales timeouts") {
    struct Row {
        int delta;
        int score;
        Duration timeout;
    };
    const Row rows[] = {
        {0, 0, seconds(1)},  {-1, 0, seconds(1)}, {-10, 0, seconds(1)}, {1, 1, seconds(2)},
        {-1, 0, seconds(1)}, {10, 7, seconds(8)}, {-1, 6, seconds(7)},  {-1, 5, seconds(6)},
        {-1, 4, seconds(5)}, {-1, 3, seconds(4)}, {-1, 2, seconds(3)},  {-1, 1, seconds(2)},
        {-1, 0, seconds(1)}, {-1, 0, seconds(1)},
    };
    Awareness a(8);
    for (const Row& r : rows) {
        a.apply_delta(r.delta);
        CHECK(a.score() == r.score);
        CHECK(a.scale_timeout(seconds(1)) == r.timeout);
    }
}

TEST_CASE("suspicion: deadline shrinks only on new independent confirmations") {
    const TimePoint start{seconds(100)};
    Suspicion s("origin", 3, seconds(2), seconds(30), start);
    CHECK(s.deadline() == start + seconds(30));
    CHECK_FALSE(s.confirm("origin"));  // the accuser does not confirm itself
    CHECK(s.confirm("a"));
    CHECK(s.deadline() == start + seconds(16));
    CHECK_FALSE(s.confirm("a"));  // counted once
    CHECK(s.confirm("b"));
    CHECK(s.deadline() == start + milliseconds(7810));
    CHECK(s.confirm("c"));
    CHECK(s.deadline() == start + seconds(2));
    CHECK_FALSE(s.confirm("d"));  // k reached
    CHECK(s.confirmations() == 3);

    // With no confirmations wanted the timer is min from the start.
    Suspicion none("origin", 0, seconds(2), seconds(30), start);
    CHECK(none.deadline() == start + seconds(2));
}

}  // namespace
}  // namespace edge::routing::membership
