#include "routing/health/outlier_detector.h"

#include <algorithm>
#include <cmath>

namespace edge::routing::health {

std::string_view ejection_cause_name(EjectionCause c) {
    switch (c) {
        case EjectionCause::kNone:
            return "none";
        case EjectionCause::kConsecutiveFailures:
            return "consecutive_failures";
        case EjectionCause::kSuccessRate:
            return "success_rate";
    }
    return "unknown";
}

std::string pool_key(std::string_view member, std::string_view model) {
    std::string key;
    key.reserve(member.size() + 1 + model.size());
    key.append(member);
    key.push_back('/');
    key.append(model);
    return key;
}

OutlierDetector::OutlierDetector(OutlierConfig config, Clock& clock)
    : config_(config), clock_(clock), next_interval_(clock.now() + config.interval) {}

OutlierDetector::Pool& OutlierDetector::pool_locked(std::string_view name) {
    auto it = pools_.find(std::string(name));
    if (it == pools_.end()) {
        it = pools_.emplace(std::string(name), Pool{}).first;
    }
    return it->second;
}

void OutlierDetector::add_pool(std::string_view pool) {
    std::lock_guard lock(mu_);
    pool_locked(pool);
}

void OutlierDetector::remove_pool(std::string_view pool) {
    std::lock_guard lock(mu_);
    auto it = pools_.find(std::string(pool));
    if (it == pools_.end()) {
        return;
    }
    if (it->second.ejected) {
        --ejected_count_;
    }
    pools_.erase(it);
}

bool OutlierDetector::may_eject_locked() const {
    const size_t limit = std::max<size_t>(1, pools_.size() * config_.max_ejection_percent / 100);
    return ejected_count_ < limit;
}

void OutlierDetector::eject_locked(std::string_view name, Pool& p, EjectionCause cause) {
    if (p.ejected || !may_eject_locked()) {
        return;
    }
    if (on_ejection_) {
        on_ejection_(name);
    }
    p.ejected = true;
    p.cause = cause;
    const Duration cap = std::max(config_.base_ejection_time, config_.max_ejection_time);
    // Counted up to the first ejection that reaches the cap, as Envoy's backoff: past it every
    // ejection is as long, and a count that kept growing through a long outage (one per
    // ejection, for hours) took as many healthy intervals to decay, every brief failure in that
    // time ejecting the pool for the longest. Bounded, base * count cannot overflow either.
    if (config_.base_ejection_time * p.times_ejected < cap) {
        ++p.times_ejected;
    }
    const Duration length = std::min<Duration>(config_.base_ejection_time * p.times_ejected, cap);
    p.ejected_until = clock_.now() + length;
    ++ejected_count_;
    ++ejections_total_;
}

void OutlierDetector::report_success(std::string_view pool) {
    std::lock_guard lock(mu_);
    Pool& p = pool_locked(pool);
    p.consecutive_failures = 0;
    ++p.interval_success;
}

void OutlierDetector::report_failure(std::string_view pool, FailureKind /*kind*/) {
    std::lock_guard lock(mu_);
    Pool& p = pool_locked(pool);
    ++p.interval_failure;
    ++p.consecutive_failures;
    if (config_.consecutive_failures > 0 &&
        p.consecutive_failures >= config_.consecutive_failures) {
        eject_locked(pool, p, EjectionCause::kConsecutiveFailures);
        // Counting starts over whether or not the limit allowed the ejection.
        p.consecutive_failures = 0;
    }
}

void OutlierDetector::evaluate_interval_locked() {
    const TimePoint now = clock_.now();
    // Un-eject the pools whose time is up, and let healthy pools' ejection count decay.
    for (auto& [name, p] : pools_) {
        if (p.ejected) {
            if (now >= p.ejected_until) {
                p.ejected = false;
                p.cause = EjectionCause::kNone;
                p.consecutive_failures = 0;
                --ejected_count_;
            }
        } else if (p.times_ejected > 0) {
            --p.times_ejected;
        }
    }
    // Success-rate statistics over the pools with enough volume this interval.
    struct Rate {
        const std::string* name;
        Pool* pool;
        double rate;
    };
    std::vector<Rate> rates;
    for (auto& [name, p] : pools_) {
        const uint64_t total = p.interval_success + p.interval_failure;
        if (!p.ejected && total >= config_.success_rate_request_volume && total > 0) {
            rates.push_back(
                {&name, &p, static_cast<double>(p.interval_success) / static_cast<double>(total)});
        }
    }
    if (!rates.empty() && rates.size() >= config_.success_rate_minimum_hosts) {
        double sum = 0.0;
        for (const Rate& r : rates) {
            sum += r.rate;
        }
        const double mean = sum / static_cast<double>(rates.size());
        double var = 0.0;
        for (const Rate& r : rates) {
            var += (r.rate - mean) * (r.rate - mean);
        }
        const double stdev = std::sqrt(var / static_cast<double>(rates.size()));
        const double threshold = mean - config_.success_rate_stdev_factor * stdev;
        // Worst first, so the ejection limit removes the worst pools; equal rates by name, so
        // every site ejects the same one of several equally bad pools (the map's order is not
        // the same everywhere).
        std::sort(rates.begin(), rates.end(), [](const Rate& a, const Rate& b) {
            return a.rate != b.rate ? a.rate < b.rate : *a.name < *b.name;
        });
        for (const Rate& r : rates) {
            if (r.rate < threshold) {
                eject_locked(*r.name, *r.pool, EjectionCause::kSuccessRate);
            }
        }
    }
    for (auto& [name, p] : pools_) {
        p.interval_success = 0;
        p.interval_failure = 0;
    }
}

void OutlierDetector::tick() {
    std::lock_guard lock(mu_);
    const TimePoint now = clock_.now();
    if (now < next_interval_) {
        return;
    }
    // Intervals missed beyond the first (no request planned for a while, a short interval):
    // their counts are empty, so each would only decay the ejection counts by one. Done at
    // once rather than one evaluation each under the lock a request is waiting on (a day at a
    // 1 ms interval is 86 million of them).
    const int64_t behind =
        config_.interval.count() > 0 ? (now - next_interval_) / config_.interval : 0;
    evaluate_interval_locked();
    if (behind > 0) {
        for (auto& [name, p] : pools_) {
            if (p.ejected) {
                continue;
            }
            // As if ticked at each missed boundary next_interval_ + k * interval (k = 1 ..
            // behind): a pool decays at those after the first at which its ejection was over,
            // not at those it spent ejected (brought back by this tick, it may have been
            // ejected for most of them).
            int64_t back_at = 0;
            if (p.ejected_until > next_interval_) {
                back_at = (p.ejected_until - next_interval_ + config_.interval - Duration(1)) /
                          config_.interval;
            }
            if (back_at < behind) {
                p.times_ejected -= static_cast<decltype(p.times_ejected)>(
                    std::min<int64_t>(behind - back_at, static_cast<int64_t>(p.times_ejected)));
            }
        }
    }
    next_interval_ += (behind + 1) * config_.interval;
}

bool OutlierDetector::is_ejected(std::string_view pool) const {
    std::lock_guard lock(mu_);
    auto it = pools_.find(std::string(pool));
    return it != pools_.end() && it->second.ejected;
}

std::vector<PoolHealthView> OutlierDetector::pools() const {
    std::lock_guard lock(mu_);
    std::vector<PoolHealthView> out;
    out.reserve(pools_.size());
    for (const auto& [name, p] : pools_) {
        out.push_back(
            {name, p.ejected, p.cause, p.times_ejected, p.consecutive_failures, p.ejected_until});
    }
    std::sort(out.begin(), out.end(),
              [](const PoolHealthView& a, const PoolHealthView& b) { return a.pool < b.pool; });
    return out;
}

uint64_t OutlierDetector::ejections_total() const {
    std::lock_guard lock(mu_);
    return ejections_total_;
}

}  // namespace edge::routing::health
