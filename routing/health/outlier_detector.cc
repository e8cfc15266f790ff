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

void OutlierDetector::eject_locked(Pool& p, EjectionCause cause) {
    if (p.ejected || !may_eject_locked()) {
        return;
    }
    p.ejected = true;
    p.cause = cause;
    ++p.times_ejected;
    const Duration cap = std::max(config_.base_ejection_time, config_.max_ejection_time);
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
        eject_locked(p, EjectionCause::kConsecutiveFailures);
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
    std::vector<std::pair<Pool*, double>> rates;
    for (auto& [name, p] : pools_) {
        const uint64_t total = p.interval_success + p.interval_failure;
        if (!p.ejected && total >= config_.success_rate_request_volume && total > 0) {
            rates.emplace_back(
                &p, static_cast<double>(p.interval_success) / static_cast<double>(total));
        }
    }
    if (!rates.empty() && rates.size() >= config_.success_rate_minimum_hosts) {
        double sum = 0.0;
        for (const auto& [p, r] : rates) {
            sum += r;
        }
        const double mean = sum / static_cast<double>(rates.size());
        double var = 0.0;
        for (const auto& [p, r] : rates) {
            var += (r - mean) * (r - mean);
        }
        const double stdev = std::sqrt(var / static_cast<double>(rates.size()));
        const double threshold = mean - config_.success_rate_stdev_factor * stdev;
        // Worst first, so the ejection limit removes the worst pools.
        std::sort(rates.begin(), rates.end(),
                  [](const auto& a, const auto& b) { return a.second < b.second; });
        for (const auto& [p, r] : rates) {
            if (r < threshold) {
                eject_locked(*p, EjectionCause::kSuccessRate);
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
    while (now >= next_interval_) {
        evaluate_interval_locked();
        next_interval_ += config_.interval;
    }
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
