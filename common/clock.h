#pragma once

// Clock is the one source of time for components that have timers or timeouts, so tests can drive
// them with ManualClock instead of sleeping. Time points are monotonic (steady_clock); wall time for
// logs comes from wall_now(). SystemClock is thread-safe and stateless; ManualClock is thread-safe
// (an atomic) and only moves when advance() or set() is called.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace edge {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::steady_clock::time_point;

class Clock {
public:
    virtual ~Clock() = default;
    virtual TimePoint now() const = 0;
    // Wall-clock time in microseconds since the Unix epoch (for logs and certificate expiry).
    virtual int64_t wall_now_us() const = 0;
};

class SystemClock final : public Clock {
public:
    TimePoint now() const override { return std::chrono::steady_clock::now(); }
    int64_t wall_now_us() const override;

    // The process-wide instance.
    static SystemClock& instance();
};

class ManualClock final : public Clock {
public:
    explicit ManualClock(TimePoint start = TimePoint(std::chrono::hours(1)))
        : now_ns_(start.time_since_epoch().count()) {}

    TimePoint now() const override { return TimePoint(Duration(now_ns_.load())); }
    int64_t wall_now_us() const override { return 1'700'000'000'000'000 + now_ns_.load() / 1000; }

    void advance(Duration d) { now_ns_.fetch_add(d.count()); }
    void set(TimePoint t) { now_ns_.store(t.time_since_epoch().count()); }

private:
    std::atomic<int64_t> now_ns_;
};

inline double to_seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace edge
