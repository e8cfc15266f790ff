// What the systemd watchdog ping vouches for: I/O threads that run a posted probe, and an engine
// that steps while its batch holds sequences. Time is passed in; the I/O threads are a queue the
// test drains (or not).

#include "daemon/liveness.h"

#include <doctest/doctest.h>

#include <deque>

using namespace edge;
using namespace std::chrono_literals;

namespace {

struct Fake {
    std::deque<std::function<void()>> io;  // Posted, not yet run.
    std::vector<engine::ServingStats> stats{engine::ServingStats{}};
    daemon::Liveness liveness{[this](std::function<void()> fn) { io.push_back(std::move(fn)); },
                              [this] { return stats; }};
    void run_io() {
        while (!io.empty()) {
            io.front()();
            io.pop_front();
        }
    }
    // check() `at` after t0 with a 1 s stall bound, then the I/O threads run their probe.
    std::string check_at(std::chrono::milliseconds at) {
        std::string stuck = liveness.check(t0 + at, 1000ms);
        run_io();
        return stuck;
    }
    const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
};

}  // namespace

TEST_CASE("liveness: a probe the I/O threads do not run within the stall names io") {
    Fake f;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(f.liveness.check(t0, 1000ms).empty());
    REQUIRE(f.io.size() == 1);
    f.run_io();
    CHECK(f.liveness.check(t0 + 1s, 1000ms).empty());  // A new probe goes out.
    REQUIRE(f.io.size() == 1);
    // Nobody runs it: alive until the stall has passed, one probe outstanding at a time.
    CHECK(f.liveness.check(t0 + 1500ms, 1000ms).empty());
    CHECK(f.liveness.check(t0 + 2000ms, 1000ms).empty());
    CHECK(f.liveness.check(t0 + 2001ms, 1000ms) == "io");
    CHECK(f.io.size() == 1);
    // The threads catch up: alive again.
    f.run_io();
    CHECK(f.liveness.check(t0 + 3s, 1000ms).empty());
}

TEST_CASE("liveness: an engine that stops stepping with sequences in its batch names engine") {
    Fake f;
    CHECK(f.check_at(0ms).empty());
    // Idle (empty batch, steps unchanged) for long: alive.
    CHECK(f.check_at(5000ms).empty());
    f.stats[0].batch_sequences = 4;
    f.stats[0].steps = 10;
    CHECK(f.check_at(6000ms).empty());
    f.stats[0].steps = 50;
    CHECK(f.check_at(6900ms).empty());
    // No step since 6.9 s.
    CHECK(f.check_at(7900ms).empty());
    CHECK(f.check_at(7901ms) == "engine");
    f.stats[0].steps = 51;
    CHECK(f.check_at(8000ms).empty());
    // A second model appears (stats grow): tracked from now.
    f.stats.push_back(engine::ServingStats{});
    f.stats[1].batch_sequences = 1;
    CHECK(f.check_at(8500ms).empty());
    f.stats[0].steps = 52;
    CHECK(f.check_at(9600ms) == "engine");
}

TEST_CASE("liveness: one step longer than the stall is alive while its layers keep finishing") {
    Fake f;
    f.stats[0].batch_sequences = 1;
    f.stats[0].steps = 3;
    CHECK(f.check_at(0ms).empty());
    // A 48-layer prefill chunk taking 4.8 s: no step ends, a layer ends every 100 ms.
    for (int layer = 1; layer <= 48; ++layer) {
        f.stats[0].layers_run = layer;
        CHECK_MESSAGE(f.check_at(std::chrono::milliseconds(100 * layer)).empty(), layer);
    }
    // Stuck inside a layer (a kernel or a collective that never returns): named after the stall.
    CHECK(f.check_at(5800ms).empty());
    CHECK(f.check_at(5801ms) == "engine");
}

TEST_CASE("liveness: the first step after an idle check is timed from the check that sees it") {
    // The scheduler publishes its batch before the step's first layer ends: the first check after
    // an idle spell sees sequences and no progress yet. Timed from the idle check, a whole
    // interval (the stall bound) earlier, it named engine and the ping was withheld.
    Fake f;
    CHECK(f.check_at(0ms).empty());
    CHECK(f.check_at(1001ms).empty());  // Idle.
    f.stats[0].batch_sequences = 1;     // A request, its first layer still running.
    CHECK(f.check_at(2002ms).empty());
    // Stuck for real: named a stall after the check that first saw it.
    CHECK(f.check_at(3002ms).empty());
    CHECK(f.check_at(3003ms) == "engine");
}
