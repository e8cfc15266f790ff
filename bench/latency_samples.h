#pragma once

// Latency samples of streamed requests for the serving benches (bench_tenancy): time to first
// token (TTFT) and inter-token latency (ITL) taken inside a measuring window, and their summary
// (sample count, p50, p99). A request contributes as its tokens arrive, not when it finishes: a
// run that ends with requests still streaming would otherwise keep only the ones that finished
// fast, and a low-weight tenant, whose requests wait longest, would be left with a handful of
// samples biased towards its quick ones. An empty list has no percentile (not 0 s, which reads as
// measured), and a p99 of fewer than kMinP99Samples samples is not given: it would be the largest
// of a few.
//
// Threading: none; one bench thread owns every object. Header-only; bench code, not part of a
// library.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace edge::bench {

// Fewest samples a p99 is given for: below 100 the nearest-rank p99 is the maximum.
inline constexpr size_t kMinP99Samples = 100;

// The nearest-rank `q` quantile (0 < q <= 1) of `v`; nothing for an empty list.
inline std::optional<double> quantile(std::vector<double> v, double q) {
    if (v.empty()) {
        return std::nullopt;
    }
    std::sort(v.begin(), v.end());
    const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

// What a latency figure reports: its sample count, and its p50 and p99 where they mean something.
struct LatencySummary {
    size_t n = 0;                // Samples.
    std::optional<double> p50;   // Seconds; none without samples.
    std::optional<double> p99;   // Seconds; none with fewer than kMinP99Samples samples.
};

inline LatencySummary summarize(const std::vector<double>& seconds) {
    LatencySummary s;
    s.n = seconds.size();
    s.p50 = quantile(seconds, 0.5);
    if (s.n >= kMinP99Samples) {
        s.p99 = quantile(seconds, 0.99);
    }
    return s;
}

// The samples of one group of requests (a tenant), in seconds.
struct LatencySamples {
    std::vector<double> ttft;  // Submission to first token, one per request.
    std::vector<double> itl;   // Between consecutive tokens of one request.

    void clear() {
        ttft.clear();
        itl.clear();
    }
};

// One request's token arrivals as the bench observes them between steps. observe() takes the
// arrival times seen so far (they only grow) and adds to `out` what it has not taken yet: the
// TTFT once the first token has arrived, when the request was submitted at or after
// `window_start` (one submitted earlier carries the time before the window in its wait), and
// every new gap between two tokens that both arrived at or after `window_start`. Returns the
// number of tokens new since the last call.
class RequestLatency {
  public:
    using Clock = std::chrono::steady_clock;

    explicit RequestLatency(Clock::time_point submitted) : submitted_(submitted) {}

    int64_t observe(const std::vector<Clock::time_point>& times, Clock::time_point window_start,
                    LatencySamples* out) {
        const size_t n = times.size();
        for (size_t k = taken_; k < n; ++k) {
            if (k == 0) {
                if (submitted_ >= window_start) {
                    out->ttft.push_back(seconds(submitted_, times[0]));
                }
            } else if (times[k - 1] >= window_start) {
                out->itl.push_back(seconds(times[k - 1], times[k]));
            }
        }
        const auto added = static_cast<int64_t>(n > taken_ ? n - taken_ : 0);
        taken_ = std::max(taken_, n);
        return added;
    }

    Clock::time_point submitted() const { return submitted_; }

  private:
    static double seconds(Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double>(b - a).count();
    }

    Clock::time_point submitted_;
    size_t taken_ = 0;  // Arrivals already taken.
};

}  // namespace edge::bench
