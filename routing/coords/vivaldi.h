#pragma once

// Vivaldi network coordinates (Dabek et al., with the height and adjustment extensions serf uses):
// every site keeps a point in an 8-dimensional Euclidean space plus a height (the access-link
// delay) and an error estimate, and moves it a little on each measured round-trip time, so the
// distance between two coordinates estimates the RTT between the sites without sending a packet.
// VivaldiClient is not synchronized: the membership strand owns it and updates it from the RTTs
// that SWIM probes measure. Coordinate is a plain value, safe to copy between threads.

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace edge::routing::coords {

inline constexpr size_t kDimensions = 8;

// Tunables; defaults are serf's (coordinate/config.go).
struct VivaldiConfig {
    // Upper bound of a coordinate's error estimate (dimensionless, relative error).
    double error_max = 1.5;
    // Tuning factor for how fast the error estimate follows new observations (0..1).
    double ce = 0.25;
    // Tuning factor for how far a coordinate moves per observation (0..1).
    double cc = 0.25;
    // Number of samples in the adjustment term's moving window; 0 disables the adjustment.
    size_t adjustment_window = 20;
    // Smallest height a coordinate may have, in seconds (10 µs).
    double height_min = 10.0e-6;
    // Per-peer RTT filter: the median of the last this-many samples is used.
    size_t latency_filter_size = 3;
    // Gravity tuning factor (dimensionless, serf's GravityRho = 150): each update pulls the
    // coordinate toward the origin by (distance_to_origin_seconds / gravity_rho)^2 seconds, which
    // keeps the whole system from drifting away without distorting it.
    double gravity_rho = 150.0;
};

// A point in the Vivaldi space. Distances are in seconds.
struct Coordinate {
    std::array<double, kDimensions> vec{};
    double error = 1.5;
    double adjustment = 0.0;
    double height = 10.0e-6;

    // True when every component is finite and within kCoordinateLimit of the origin (error
    // and height not negative). Coordinates from the network must be checked: one far out
    // would give a negative or overflowing RTT estimate, and drag ours along.
    bool is_valid() const;
    // Estimated RTT to `other`, in seconds.
    double distance_to(const Coordinate& other) const;
};

// A fresh coordinate at the origin with the maximum error.
Coordinate make_origin(const VivaldiConfig& config);

// Seconds: the largest magnitude a valid coordinate's components (and its error) may have.
// RTTs are at most 10 s (update() refuses more), so a real coordinate stays far inside it.
inline constexpr double kCoordinateLimit = 20.0;

// Seconds: the most one observation may move a coordinate, and never more than the RTT it
// measured. A peer that gossips a coordinate far from where it is (a bug, or a lie) at error 0
// would otherwise drag its prober the whole distance in one step, and through it every site.
// The move is the vector's plus the height's (so no RTT estimate changes by more, the adjustment
// term aside), the spring toward the peer and the pull of gravity together.
inline constexpr double kMaxStep = 0.5;

// Estimated round-trip time between two coordinates (0 .. a few kCoordinateLimit for valid
// ones).
std::chrono::nanoseconds estimate_rtt(const Coordinate& a, const Coordinate& b);

class VivaldiClient {
public:
    explicit VivaldiClient(VivaldiConfig config = {}, uint64_t seed = 1);

    const Coordinate& coordinate() const { return coord_; }

    // Folds one RTT observation to the peer `node` whose coordinate is `other` into our
    // coordinate. An invalid coordinate or an RTT outside [0, 10 s] is rejected; an update
    // whose result would be invalid leaves everything (coordinate, filters) as it was.
    [[nodiscard]] Status update(const std::string& node, const Coordinate& other, Duration rtt);

    // Forgets a peer's latency filter (when it leaves the cluster).
    void forget(const std::string& node) { filters_.erase(node); }

    uint64_t updates() const { return updates_; }

private:
    double filtered_rtt(const std::string& node, double rtt_seconds);
    // A move, taken as a bound or returned, is |vector step| + |height step|, in seconds.
    double update_vivaldi(const Coordinate& other, double rtt_seconds, double max_move);
    void update_adjustment(const Coordinate& other, double rtt_seconds);
    void update_gravity(double max_move);
    double apply_force(double force, const Coordinate& other, double max_move);

    VivaldiConfig config_;
    Coordinate coord_;
    Coordinate origin_;
    std::vector<double> adjustment_samples_;
    size_t adjustment_index_ = 0;
    std::unordered_map<std::string, std::deque<double>> filters_;
    std::mt19937_64 rng_;
    uint64_t updates_ = 0;
};

}  // namespace edge::routing::coords
