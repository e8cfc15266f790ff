// Vivaldi accuracy on known latency matrices, with the bounds serf's coordinate/performance_test.go
// asserts for the same matrices, node counts and cycle counts.

#include "routing/coords/vivaldi.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace edge::routing::coords {
namespace {

using Matrix = std::vector<std::vector<double>>;  // seconds

struct Stats {
    double avg = 0.0;
    double max = 0.0;
};

Matrix line(size_t n, double spacing) {
    Matrix m(n, std::vector<double>(n, 0.0));
    for (size_t i = 0; i < n; ++i) {
        for (size_t j = i + 1; j < n; ++j) {
            m[i][j] = m[j][i] = static_cast<double>(j - i) * spacing;
        }
    }
    return m;
}

Matrix grid(size_t n, double spacing) {
    const size_t side = static_cast<size_t>(std::sqrt(static_cast<double>(n)));
    Matrix m(n, std::vector<double>(n, 0.0));
    for (size_t i = 0; i < n; ++i) {
        for (size_t j = i + 1; j < n; ++j) {
            const double dx = static_cast<double>(i % side) - static_cast<double>(j % side);
            const double dy = static_cast<double>(i / side) - static_cast<double>(j / side);
            m[i][j] = m[j][i] = std::sqrt(dx * dx + dy * dy) * spacing;
        }
    }
    return m;
}

Matrix split(size_t n, double lan, double wan) {
    Matrix m(n, std::vector<double>(n, 0.0));
    const size_t half = n / 2;
    for (size_t i = 0; i < n; ++i) {
        for (size_t j = i + 1; j < n; ++j) {
            m[i][j] = m[j][i] = ((i <= half) == (j <= half)) ? lan : wan;
        }
    }
    return m;
}

Matrix random_matrix(size_t n, double mean, double deviation, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    Matrix m(n, std::vector<double>(n, 0.0));
    for (size_t i = 0; i < n; ++i) {
        for (size_t j = i + 1; j < n; ++j) {
            m[i][j] = m[j][i] = mean + deviation * normal(rng);
        }
    }
    return m;
}

Stats simulate(const Matrix& truth, size_t cycles, uint64_t seed) {
    const size_t n = truth.size();
    std::vector<VivaldiClient> clients;
    for (size_t i = 0; i < n; ++i) {
        clients.emplace_back(VivaldiConfig{}, seed + i);
    }
    std::mt19937_64 rng(seed);
    for (size_t cycle = 0; cycle < cycles; ++cycle) {
        for (size_t i = 0; i < n; ++i) {
            const size_t j = rng() % n;
            if (j == i) {
                continue;
            }
            const Coordinate other = clients[j].coordinate();
            const auto rtt = std::chrono::nanoseconds(static_cast<int64_t>(truth[i][j] * 1e9));
            const Status st = clients[i].update("node" + std::to_string(j), other, rtt);
            REQUIRE_MESSAGE(st.ok(), st.to_string());
        }
    }
    Stats stats;
    size_t count = 0;
    for (size_t i = 0; i < n; ++i) {
        for (size_t j = i + 1; j < n; ++j) {
            const double est = clients[i].coordinate().distance_to(clients[j].coordinate());
            const double err = std::abs(est - truth[i][j]) / truth[i][j];
            stats.avg += err;
            stats.max = std::max(stats.max, err);
            ++count;
        }
    }
    stats.avg /= static_cast<double>(count);
    return stats;
}

TEST_CASE("vivaldi: line of 10 nodes 10 ms apart within serf's bounds") {
    const Stats s = simulate(line(10, 0.010), 1000, 1);
    MESSAGE("line avg " << s.avg << " max " << s.max);
    CHECK(s.avg <= 0.0018);
    CHECK(s.max <= 0.0092);
}

TEST_CASE("vivaldi: 5x5 grid 10 ms apart within serf's bounds") {
    const Stats s = simulate(grid(25, 0.010), 1000, 2);
    MESSAGE("grid avg " << s.avg << " max " << s.max);
    CHECK(s.avg <= 0.0015);
    CHECK(s.max <= 0.022);
}

TEST_CASE("vivaldi: two clusters far apart within serf's bounds") {
    const Stats s = simulate(split(25, 0.001, 0.010), 1000, 3);
    MESSAGE("split avg " << s.avg << " max " << s.max);
    CHECK(s.avg <= 0.000060);
    CHECK(s.max <= 0.00048);
}

TEST_CASE("vivaldi: random 100 +- 10 ms within serf's bounds") {
    const Stats s = simulate(random_matrix(25, 0.100, 0.010, 4), 1000, 4);
    MESSAGE("random avg " << s.avg << " max " << s.max);
    CHECK(s.avg <= 0.075);
    CHECK(s.max <= 0.33);
}

TEST_CASE("vivaldi: bad input is rejected and never moves the coordinate") {
    VivaldiClient client;
    Coordinate bad;
    bad.vec[0] = std::nan("");
    CHECK_FALSE(client.update("x", bad, std::chrono::milliseconds(10)).ok());
    CHECK_FALSE(client.update("x", Coordinate{}, std::chrono::nanoseconds(-1)).ok());
    CHECK_FALSE(client.update("x", Coordinate{}, std::chrono::seconds(11)).ok());
    // Finite but far out: its RTT estimate overflowed to a huge negative one (a site that
    // always won the routing), and an update with it dragged ours out too.
    Coordinate far;
    far.adjustment = 1e12;
    CHECK_FALSE(far.is_valid());
    CHECK_FALSE(client.update("x", far, std::chrono::milliseconds(10)).ok());
    far = Coordinate{};
    far.vec[1] = -(kCoordinateLimit + 1);
    CHECK_FALSE(far.is_valid());
    far.vec[1] = -kCoordinateLimit;
    CHECK(far.is_valid());
    CHECK(estimate_rtt(far, Coordinate{}).count() > 0);
    CHECK(client.coordinate().vec[0] == 0.0);
    CHECK(client.updates() == 0);
    // The estimate between identical coordinates is twice the minimum height.
    CHECK(estimate_rtt(client.coordinate(), client.coordinate()).count() == 20'000);
}

TEST_CASE("vivaldi: a peer lying about its coordinate moves its prober a little, no one else") {
    // Eight sites a few tens of ms apart converge; then a peer at the edge of the valid range
    // with error 0 (full weight), 20 ms away, is probed by site 0 once every eight rounds. Each
    // of its updates dragged site 0 hundreds of seconds, and through site 0 every site: all
    // errors at the maximum (coordinate routing off everywhere) for ~1000 rounds after it left.
    constexpr size_t kSites = 8;
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> place(0.0, 0.05);
    std::vector<std::array<double, 2>> pos(kSites);
    for (auto& p : pos) {
        p = {place(rng), place(rng)};
    }
    auto rtt = [&](size_t a, size_t b) {
        return std::hypot(pos[a][0] - pos[b][0], pos[a][1] - pos[b][1]) + 0.001;
    };
    std::vector<VivaldiClient> sites;
    for (size_t i = 0; i < kSites; ++i) {
        sites.emplace_back(VivaldiConfig{}, i + 1);
    }
    auto round = [&](size_t r) {
        for (size_t i = 0; i < kSites; ++i) {
            const size_t j = (i + 1 + r % (kSites - 1)) % kSites;
            (void)sites[i].update(
                std::to_string(j), sites[j].coordinate(),
                std::chrono::duration_cast<Duration>(std::chrono::duration<double>(rtt(i, j))));
        }
    };
    // The worst estimate of a real RTT, and how many sites' errors are past 0.5.
    auto worst = [&] {
        double estimate = 0.0;
        int lost = 0;
        for (size_t i = 0; i < kSites; ++i) {
            lost += sites[i].coordinate().error > 0.5 ? 1 : 0;
            for (size_t j = 0; j < kSites; ++j) {
                if (i != j) {
                    estimate = std::max(
                        estimate,
                        std::fabs(sites[i].coordinate().distance_to(sites[j].coordinate()) -
                                  rtt(i, j)));
                }
            }
        }
        return std::make_pair(estimate, lost);
    };
    for (size_t r = 0; r < 2000; ++r) {
        round(r);
    }
    REQUIRE(worst().second == 0);
    Coordinate liar;
    liar.vec.fill(kCoordinateLimit);
    liar.error = 0.0;
    liar.height = 0.0;
    REQUIRE(liar.is_valid());
    for (size_t r = 0; r < 200; ++r) {
        round(r);
        if (r % kSites == 0) {
            CHECK(sites[0].update("liar", liar, std::chrono::milliseconds(20)).ok());
        }
        const auto [estimate, lost] = worst();
        CHECK(estimate < 0.1);
        CHECK(lost <= 1);  // Site 0 alone.
    }
    for (size_t r = 0; r < 200; ++r) {
        round(r);
    }
    CHECK(worst().second == 0);
    CHECK(worst().first < 0.01);
}

// Eight sites on a plane a few tens of ms apart (RTT: the distance plus 1 ms of access links),
// each probing the next ones in turn, converged over 2000 rounds.
std::vector<VivaldiClient> converged_plane_sites() {
    constexpr size_t kSites = 8;
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> place(0.0, 0.05);
    std::vector<std::array<double, 2>> pos(kSites);
    for (auto& p : pos) {
        p = {place(rng), place(rng)};
    }
    std::vector<VivaldiClient> sites;
    for (size_t i = 0; i < kSites; ++i) {
        sites.emplace_back(VivaldiConfig{}, i + 1);
    }
    for (size_t r = 0; r < 2000; ++r) {
        for (size_t i = 0; i < kSites; ++i) {
            const size_t j = (i + 1 + r % (kSites - 1)) % kSites;
            const double rtt = std::hypot(pos[i][0] - pos[j][0], pos[i][1] - pos[j][1]) + 0.001;
            REQUIRE(sites[i]
                        .update(std::to_string(j), sites[j].coordinate(),
                                std::chrono::duration_cast<Duration>(
                                    std::chrono::duration<double>(rtt)))
                        .ok());
        }
    }
    return sites;
}

// How far a coordinate moved, seconds: the vector's step plus the height's, the most any RTT
// estimate from it can have changed (the adjustment term aside).
double moved(const Coordinate& a, const Coordinate& b) {
    double sum = 0.0;
    for (size_t i = 0; i < kDimensions; ++i) {
        sum += (a.vec[i] - b.vec[i]) * (a.vec[i] - b.vec[i]);
    }
    return std::sqrt(sum) + std::fabs(a.height - b.height);
}

TEST_CASE("vivaldi: a peer right next to a coordinate moves its height no more than the RTT") {
    // Serf's height step is (h + other.h) * force / |vector distance|: against a peer a few µs
    // away it was hundreds of times the force, far past the bound on the vector's step.
    const std::vector<VivaldiClient> sites = converged_plane_sites();
    const Coordinate before = sites[0].coordinate();
    MESSAGE("converged height " << before.height << " s, error " << before.error);
    REQUIRE(before.error < 0.5);

    // A peer (buggy or lying) gossips a coordinate 2 µs from ours, height 0, error 0 (full
    // weight), and answers in 20 ms: the height grew by h * force / 2 µs, several times the RTT
    // here (1 ms to 2.3 s for a height of 1 ms), the error still trusted.
    VivaldiClient probed = sites[0];
    Coordinate next_door = before;
    next_door.vec[0] += 2e-6;
    next_door.height = 0.0;
    next_door.error = 0.0;
    next_door.adjustment = 0.0;
    REQUIRE(probed.update("next-door", next_door, std::chrono::milliseconds(20)).ok());
    MESSAGE("height after a 20 ms probe " << probed.coordinate().height << " s");
    CHECK(moved(before, probed.coordinate()) <= 0.020 + 1e-12);

    // Honest: a metro peer 0.1 ms away, its height and ours adding up to 1 ms, and one 50 ms
    // spike (the first sample from it, which the latency filter passes): the height rose 61 ms,
    // the vector 6 ms.
    probed = sites[0];
    Coordinate metro = before;
    metro.vec[0] += 0.1e-3;
    metro.height = 1e-3 - before.height;
    REQUIRE(probed.update("metro", metro, std::chrono::milliseconds(50)).ok());
    MESSAGE("height after a 50 ms spike " << probed.coordinate().height << " s");
    CHECK(moved(before, probed.coordinate()) <= 0.050 + 1e-12);

    // An RTT beyond kMaxStep moves it kMaxStep at most.
    probed = sites[0];
    REQUIRE(probed.update("next-door", next_door, std::chrono::seconds(2)).ok());
    CHECK(moved(before, probed.coordinate()) <= kMaxStep + 1e-12);
}

}  // namespace
}  // namespace edge::routing::coords
