#pragma once

// OutlierDetector is passive health checking of pools (one pool = one member's model): the
// request path reports each forwarded request's outcome, and a pool that fails too often is
// ejected (routing adds the ejected penalty, see selection/cost.h) for a time that grows with
// each repeat ejection. Two detectors, as in Envoy's outlier detection, with Envoy's defaults:
//  - consecutive failures: the Nth 5xx or connect failure in a row ejects at once;
//  - success rate: every interval, among pools with enough requests in that interval (and only
//    when enough such pools exist), a pool whose success rate is below
//    mean - stdev_factor * stdev is ejected.
// An ejected pool returns after base_ejection_time * (times ejected), capped at
// max(base, max_ejection_time); the count stops growing once that product reaches the cap and
// decays by one per interval spent healthy. Never more than max_ejection_percent of the pools
// are ejected at once (but at least one may be).
// Time comes from the injected Clock; tick() runs the interval work (call it from a timer).
// Thread contract: every method takes an internal mutex; safe from any thread.

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"

namespace edge::routing::health {

struct OutlierConfig {
    // Consecutive failures (5xx or connect) that eject a pool; 0 disables.
    uint32_t consecutive_failures = 5;
    // Interval between success-rate evaluations and un-ejection sweeps.
    Duration interval = std::chrono::seconds(10);
    // Ejection time per ejection so far.
    Duration base_ejection_time = std::chrono::seconds(30);
    // Upper bound of one ejection's length (raised to base_ejection_time if smaller).
    Duration max_ejection_time = std::chrono::seconds(300);
    // Most pools ejected at once, percent of all pools (at least one may always be ejected).
    uint32_t max_ejection_percent = 10;
    // Success-rate detector: pools needing at least this many requests in the interval.
    uint32_t success_rate_request_volume = 100;
    // ... and at least this many such pools for the statistics to mean anything.
    uint32_t success_rate_minimum_hosts = 5;
    // Ejection threshold in standard deviations below the mean (Envoy's 1900 / 1000).
    double success_rate_stdev_factor = 1.9;

    bool operator==(const OutlierConfig&) const = default;
};

// The name of a pool in the detector: "<member>/<model>" (member names never contain '/').
std::string pool_key(std::string_view member, std::string_view model);

enum class FailureKind : uint8_t { kHttp5xx, kConnect };

enum class EjectionCause : uint8_t { kNone, kConsecutiveFailures, kSuccessRate };
std::string_view ejection_cause_name(EjectionCause c);

struct PoolHealthView {
    std::string pool;
    bool ejected = false;
    EjectionCause cause = EjectionCause::kNone;
    // Ejections in a row, counted up to the one whose length reaches the cap.
    uint32_t times_ejected = 0;
    uint32_t consecutive_failures = 0;
    // When the current ejection ends (meaningful while ejected).
    TimePoint ejected_until{};
};

class OutlierDetector {
  public:
    OutlierDetector(OutlierConfig config, Clock& clock);

    // Pools come and go with the gossip snapshot; unknown pools are added on first report.
    void add_pool(std::string_view pool);
    void remove_pool(std::string_view pool);

    // Called with a pool's name as it is ejected, under the detector's mutex (it must not call
    // the detector). Set before the detector is shared.
    void set_on_ejection(std::function<void(std::string_view pool)> callback) {
        on_ejection_ = std::move(callback);
    }
    void report_success(std::string_view pool);
    void report_failure(std::string_view pool, FailureKind kind);

    // Runs every interval that has elapsed since the last: success-rate ejection, un-ejection.
    void tick();

    bool is_ejected(std::string_view pool) const;
    std::vector<PoolHealthView> pools() const;
    uint64_t ejections_total() const;

  private:
    struct Pool {
        bool ejected = false;
        EjectionCause cause = EjectionCause::kNone;
        uint32_t times_ejected = 0;
        uint32_t consecutive_failures = 0;
        TimePoint ejected_until{};
        uint64_t interval_success = 0;
        uint64_t interval_failure = 0;
    };

    Pool& pool_locked(std::string_view name);
    bool may_eject_locked() const;
    void eject_locked(std::string_view name, Pool& p, EjectionCause cause);
    void evaluate_interval_locked();

    const OutlierConfig config_;
    Clock& clock_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, Pool> pools_;
    size_t ejected_count_ = 0;
    uint64_t ejections_total_ = 0;
    TimePoint next_interval_;
    std::function<void(std::string_view pool)> on_ejection_;
};

}  // namespace edge::routing::health
