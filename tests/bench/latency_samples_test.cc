#include "bench/latency_samples.h"

#include <doctest/doctest.h>

#include <chrono>
#include <vector>

namespace edge::bench {
namespace {

using Clock = RequestLatency::Clock;
using std::chrono::milliseconds;

TEST_CASE("latency summary of an empty list has no percentile") {
    const LatencySummary s = summarize({});
    CHECK(s.n == 0);
    CHECK_FALSE(s.p50.has_value());
    CHECK_FALSE(s.p99.has_value());
}

TEST_CASE("latency summary reports its count and gives p99 only from 100 samples") {
    std::vector<double> v;
    for (int i = 1; i <= 99; ++i) {
        v.push_back(i * 0.001);
    }
    LatencySummary s = summarize(v);
    CHECK(s.n == 99);
    REQUIRE(s.p50.has_value());
    CHECK(*s.p50 == doctest::Approx(0.050));
    CHECK_FALSE(s.p99.has_value());  // The 99th-ranked of 99 would be the maximum.
    v.push_back(0.100);
    s = summarize(v);
    CHECK(s.n == 100);
    REQUIRE(s.p99.has_value());
    CHECK(*s.p99 == doctest::Approx(0.099));  // Nearest rank: the 99th of 100.
}

TEST_CASE("a request with a first token that has not finished contributes its TTFT and gaps") {
    const Clock::time_point t0 = Clock::now();
    RequestLatency request(t0);
    LatencySamples samples;
    // Two tokens so far; the request is still streaming when the run ends.
    const std::vector<Clock::time_point> times = {t0 + milliseconds(30), t0 + milliseconds(40)};
    CHECK(request.observe(times, t0, &samples) == 2);
    REQUIRE(samples.ttft.size() == 1);
    CHECK(samples.ttft[0] == doctest::Approx(0.030));
    REQUIRE(samples.itl.size() == 1);
    CHECK(samples.itl[0] == doctest::Approx(0.010));
}

TEST_CASE("request latency takes each arrival once as tokens stream in") {
    const Clock::time_point t0 = Clock::now();
    RequestLatency request(t0);
    LatencySamples samples;
    std::vector<Clock::time_point> times;
    CHECK(request.observe(times, t0, &samples) == 0);
    CHECK(samples.ttft.empty());  // No first token yet: no TTFT, not a zero one.
    times.push_back(t0 + milliseconds(20));
    CHECK(request.observe(times, t0, &samples) == 1);
    CHECK(samples.ttft.size() == 1);
    times.push_back(t0 + milliseconds(25));
    times.push_back(t0 + milliseconds(35));
    CHECK(request.observe(times, t0, &samples) == 2);
    CHECK(request.observe(times, t0, &samples) == 0);
    CHECK(samples.ttft.size() == 1);
    REQUIRE(samples.itl.size() == 2);
    CHECK(samples.itl[0] == doctest::Approx(0.005));
    CHECK(samples.itl[1] == doctest::Approx(0.010));
}

TEST_CASE("request latency keeps only what lies in the window") {
    const Clock::time_point t0 = Clock::now();
    const Clock::time_point window = t0 + milliseconds(100);
    RequestLatency request(t0);  // Submitted before the window opened.
    LatencySamples samples;
    const std::vector<Clock::time_point> times = {t0 + milliseconds(90), t0 + milliseconds(110),
                                                  t0 + milliseconds(120)};
    CHECK(request.observe(times, window, &samples) == 3);
    CHECK(samples.ttft.empty());  // Its wait began before the window.
    // The gap 90 -> 110 straddles the window's start; 110 -> 120 lies in it.
    REQUIRE(samples.itl.size() == 1);
    CHECK(samples.itl[0] == doctest::Approx(0.010));
}

}  // namespace
}  // namespace edge::bench
