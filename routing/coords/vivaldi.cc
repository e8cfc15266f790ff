#include "routing/coords/vivaldi.h"

#include <algorithm>
#include <cmath>

namespace edge::routing::coords {
namespace {

constexpr double kZeroThreshold = 1.0e-6;

double raw_distance(const Coordinate& a, const Coordinate& b) {
    double sum = 0.0;
    for (size_t i = 0; i < kDimensions; ++i) {
        const double d = a.vec[i] - b.vec[i];
        sum += d * d;
    }
    return std::sqrt(sum) + a.height + b.height;
}

}  // namespace

bool Coordinate::is_valid() const {
    // std::fabs(NaN) <= limit is false: NaN and infinities fail too.
    auto bounded = [](double v) { return std::fabs(v) <= kCoordinateLimit; };
    for (double v : vec) {
        if (!bounded(v)) {
            return false;
        }
    }
    return bounded(error) && bounded(adjustment) && bounded(height) && error >= 0.0 &&
           height >= 0.0;
}

double Coordinate::distance_to(const Coordinate& other) const {
    const double dist = raw_distance(*this, other);
    const double adjusted = dist + adjustment + other.adjustment;
    // The adjustment terms may only refine a positive estimate, never make it negative.
    return adjusted > 0.0 ? adjusted : dist;
}

Coordinate make_origin(const VivaldiConfig& config) {
    Coordinate c;
    c.error = config.error_max;
    c.height = config.height_min;
    return c;
}

std::chrono::nanoseconds estimate_rtt(const Coordinate& a, const Coordinate& b) {
    return std::chrono::nanoseconds(static_cast<int64_t>(a.distance_to(b) * 1e9));
}

VivaldiClient::VivaldiClient(VivaldiConfig config, uint64_t seed)
    : config_(config),
      coord_(make_origin(config)),
      origin_(make_origin(config)),
      adjustment_samples_(config.adjustment_window, 0.0),
      rng_(seed) {}

Status VivaldiClient::update(const std::string& node, const Coordinate& other, Duration rtt) {
    if (!other.is_valid()) {
        return invalid_argument_error("vivaldi: coordinate of " + node +
                                      " is not finite or out of range");
    }
    const double rtt_seconds = to_seconds(rtt);
    if (!(rtt_seconds >= 0.0) || rtt_seconds > 10.0) {
        return invalid_argument_error("vivaldi: rtt to " + node + " out of range: " +
                                      std::to_string(rtt_seconds) + " s");
    }
    // Numerical trouble must never poison the state: an update whose result is invalid is
    // undone whole, the peer's latency filter and the adjustment window included.
    const Coordinate before = coord_;
    const auto filter = filters_.find(node);
    const bool had_filter = filter != filters_.end();
    const std::deque<double> filter_before = had_filter ? filter->second : std::deque<double>{};
    const std::vector<double> samples_before = adjustment_samples_;
    const size_t index_before = adjustment_index_;
    const double filtered = filtered_rtt(node, rtt_seconds);
    // The spring and gravity share one observation's budget of movement (kMaxStep, the RTT).
    const double step = std::min(kMaxStep, std::max(filtered, kZeroThreshold));
    const double moved = update_vivaldi(other, filtered, step);
    update_adjustment(other, filtered);
    update_gravity(std::max(0.0, step - moved));
    if (!coord_.is_valid()) {
        coord_ = before.is_valid() ? before : make_origin(config_);
        adjustment_samples_ = samples_before;
        adjustment_index_ = index_before;
        if (had_filter) {
            filters_[node] = filter_before;
        } else {
            filters_.erase(node);
        }
        return internal_error("vivaldi: update of " + node +
                              " produced an invalid coordinate; undone");
    }
    ++updates_;
    return ok_status();
}

double VivaldiClient::filtered_rtt(const std::string& node, double rtt_seconds) {
    auto& samples = filters_[node];
    samples.push_back(rtt_seconds);
    while (samples.size() > std::max<size_t>(1, config_.latency_filter_size)) {
        samples.pop_front();
    }
    std::vector<double> sorted(samples.begin(), samples.end());
    std::sort(sorted.begin(), sorted.end());
    return sorted[sorted.size() / 2];
}

double VivaldiClient::update_vivaldi(const Coordinate& other, double rtt_seconds, double max_move) {
    rtt_seconds = std::max(rtt_seconds, kZeroThreshold);
    const double dist = coord_.distance_to(other);
    const double wrongness = std::abs(dist - rtt_seconds) / rtt_seconds;
    const double total_error = std::max(coord_.error + other.error, kZeroThreshold);
    const double weight = coord_.error / total_error;
    coord_.error = config_.ce * weight * wrongness + coord_.error * (1.0 - config_.ce * weight);
    coord_.error = std::min(coord_.error, config_.error_max);
    const double force =
        std::clamp(config_.cc * weight * (rtt_seconds - dist), -max_move, max_move);
    return apply_force(force, other, max_move);
}

void VivaldiClient::update_adjustment(const Coordinate& other, double rtt_seconds) {
    if (config_.adjustment_window == 0) {
        return;
    }
    adjustment_samples_[adjustment_index_] = rtt_seconds - raw_distance(coord_, other);
    adjustment_index_ = (adjustment_index_ + 1) % config_.adjustment_window;
    double sum = 0.0;
    for (double s : adjustment_samples_) {
        sum += s;
    }
    coord_.adjustment = sum / (2.0 * static_cast<double>(config_.adjustment_window));
}

void VivaldiClient::update_gravity(double max_move) {
    const double dist = origin_.distance_to(coord_);
    const double ratio = dist / config_.gravity_rho;
    apply_force(-1.0 * ratio * ratio, origin_, max_move);
}

double VivaldiClient::apply_force(double force, const Coordinate& other, double max_move) {
    std::array<double, kDimensions> unit{};
    double mag = 0.0;
    for (size_t i = 0; i < kDimensions; ++i) {
        unit[i] = coord_.vec[i] - other.vec[i];
        mag += unit[i] * unit[i];
    }
    mag = std::sqrt(mag);
    if (mag > kZeroThreshold) {
        for (double& u : unit) {
            u /= mag;
        }
    } else {
        // Two coincident points: push in a random direction so they can separate.
        std::normal_distribution<double> normal(0.0, 1.0);
        double norm = 0.0;
        for (double& u : unit) {
            u = normal(rng_);
            norm += u * u;
        }
        norm = std::sqrt(norm);
        for (double& u : unit) {
            u = norm > kZeroThreshold ? u / norm : 0.0;
        }
        mag = 0.0;
    }
    // Serf moves the height by (h + other.h) * force / mag: the height part of the direction is
    // taken against the vector distance alone, so two points close together (mag just above
    // the threshold) gave the height many times the force (1 ms -> 2.3 s for a peer 2 us away).
    // The move keeps serf's direction but is scaled so that vector and height together move at
    // most max_move: no estimate from this coordinate changes by more than that.
    const double height_step =
        mag > kZeroThreshold ? (coord_.height + other.height) * force / mag : 0.0;
    const double move = std::fabs(force) + std::fabs(height_step);
    const double scale = move > max_move ? max_move / move : 1.0;
    for (size_t i = 0; i < kDimensions; ++i) {
        coord_.vec[i] += unit[i] * force * scale;
    }
    if (mag > kZeroThreshold) {
        coord_.height = std::max(coord_.height + height_step * scale, config_.height_min);
    }
    return move * scale;
}

}  // namespace edge::routing::coords
