// Gossip figures from the in-process simulator (fake network, manual clock) for N = 10, 100 and
// 1000 members with memberlist's LAN timers: gossip rounds and simulated seconds until a state
// update reaches everyone (bound: retransmit_limit(N) rounds), time until every member declares a
// killed member dead (bound: 2 probe intervals + suspicion max + retransmit rounds), bytes sent
// per member per second in steady state (bound: memberlist's 3 * MTU per gossip interval plus
// one probe exchange per probe interval, a ping sent and an ack sent of at most an MTU each),
// and dead declarations of healthy members over two minutes at 10% packet loss (goal 0).
// Readable table, then one JSON line. A spread or detection that does not complete within its
// time limit prints null for its figures and the bench exits 1.
//
//   bench_gossip_sim [max_n]     (default 1000)

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "routing/membership/config.h"
#include "routing/membership/timing.h"
#include "tests/testing/gossip_sim.h"

using namespace edge;
using namespace edge::routing::membership;
using edge::testing::GossipSim;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

struct Row {
    size_t n = 0;
    double join_s = 0;
    bool spread_ok = false;  // The update reached every member within the limit.
    double rounds = 0;
    double dissem_s = 0;
    int round_bound = 0;
    bool detect_ok = false;  // Every live member saw the victim dead within the limit.
    double detect_s = 0;
    double detect_bound_s = 0;
    double bytes_per_member_s = 0;
    double bytes_bound = 0;
    uint64_t false_positives = 0;
    double wall_s = 0;
};

std::string fixed(double v, int digits) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
    return buf;
}

// A figure for the JSON line: null when its measurement did not complete.
std::string json_or_null(bool ok, double v, int digits) { return ok ? fixed(v, digits) : "null"; }

void latency(edge::testing::FakeNetwork& net) {
    net.set_latency([](const std::string& a, const std::string& b) {
        const size_t h = std::hash<std::string>{}(a < b ? a + b : b + a);
        return Duration(milliseconds(1 + static_cast<int64_t>(h % 5)));
    });
}

Row run(size_t n) {
    const auto wall0 = std::chrono::steady_clock::now();
    const MembershipConfig c = lan_profile();
    Row row;
    row.n = n;
    GossipSim sim(n, c, 42 + n);
    latency(sim.net());
    sim.start_all(milliseconds(2));
    const TimePoint t0 = sim.net().now();
    if (!sim.run_until([&] { return sim.converged(); }, seconds(300), milliseconds(100))) {
        std::fprintf(stderr, "N=%zu did not converge\n", n);
        std::exit(1);
    }
    row.join_s = to_seconds(sim.net().now() - t0);
    sim.net().run_for(seconds(30));  // let join traffic drain

    // Steady-state bandwidth over 30 s.
    const uint64_t bytes0 = sim.net().total_bytes();
    sim.net().run_for(seconds(30));
    row.bytes_per_member_s =
        static_cast<double>(sim.net().total_bytes() - bytes0) / 30.0 / static_cast<double>(n);
    // Members send gossip only while updates are queued, and a ping and the ack to another's
    // ping each probe interval: the steady-state traffic is mostly probes.
    row.bytes_bound = 3.0 * static_cast<double>(c.mtu) / to_seconds(c.gossip_interval) +
                      2.0 * static_cast<double>(c.mtu) / to_seconds(c.probe_interval);

    // Dissemination of a state change from member 0.
    Memberlist& origin = sim.node(0);
    SiteState s = *origin.snapshot()->find(origin.name())->site;
    PoolInfo p;
    p.model = "kimi-k2";
    p.version_digest = "sha256:v2";
    p.state = PoolState::kServing;
    s.pools = {p};
    origin.update_site_state(s);
    const uint64_t version = *origin.site_version_of(origin.name());
    const TimePoint u0 = sim.net().now();
    row.spread_ok = sim.run_until([&] { return sim.count_with_version(0, version) == n; },
                                  seconds(60), milliseconds(5));
    row.dissem_s = to_seconds(sim.net().now() - u0);
    row.rounds = row.dissem_s / to_seconds(c.gossip_interval);
    row.round_bound = retransmit_limit(c.retransmit_mult, n);

    // Failure detection.
    const size_t victim = n / 2;
    sim.kill(victim);
    const TimePoint k0 = sim.net().now();
    const Duration min = suspicion_timeout(c.suspicion_mult, n, c.probe_interval);
    const Duration bound = 2 * c.probe_interval + min * c.suspicion_max_timeout_mult +
                           c.gossip_interval * row.round_bound;
    row.detect_ok = sim.run_until([&] { return sim.count_seeing_dead(victim) == n - 1; }, bound * 2,
                                  milliseconds(10));
    row.detect_s = to_seconds(sim.net().now() - k0);
    row.detect_bound_s = to_seconds(bound);

    // False positives under 10% loss for two minutes.
    sim.net().set_loss(0.10);
    sim.net().run_for(seconds(120));
    row.false_positives = sim.false_deaths();
    row.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return row;
}

}  // namespace

int main(int argc, char** argv) {
    const size_t max_n = static_cast<size_t>(edge::bench::positional_count(
        argc, argv,
        "usage: bench_gossip_sim [MAX_N]   (10..1000, default 1000): the simulated cluster "
        "sizes 10, 100, 1000 up to MAX_N",
        1000, 10, 1000));
    std::vector<Row> rows;
    for (size_t n : {size_t{10}, size_t{100}, size_t{1000}}) {
        if (n <= max_n) {
            rows.push_back(run(n));
        }
    }
    std::printf("%6s %8s %8s %8s %6s %9s %9s %12s %12s %5s %7s\n", "N", "join_s", "rounds",
                "dissem_s", "bound", "detect_s", "bound_s", "B/s/member", "bound_B/s", "FP",
                "wall_s");
    bool complete = true;
    for (const Row& r : rows) {
        // A measurement that timed out has no figure: "-" here, null in the JSON.
        const std::string rounds = r.spread_ok ? fixed(r.rounds, 2) : "-";
        const std::string dissem = r.spread_ok ? fixed(r.dissem_s, 2) : "-";
        const std::string detect = r.detect_ok ? fixed(r.detect_s, 2) : "-";
        std::printf("%6zu %8.2f %8s %8s %6d %9s %9.2f %12.0f %12.0f %5llu %7.2f\n", r.n, r.join_s,
                    rounds.c_str(), dissem.c_str(), r.round_bound, detect.c_str(), r.detect_bound_s,
                    r.bytes_per_member_s, r.bytes_bound,
                    static_cast<unsigned long long>(r.false_positives), r.wall_s);
        if (!r.spread_ok) {
            std::fprintf(stderr, "N=%zu: the update did not reach every member in 60 s\n", r.n);
        }
        if (!r.detect_ok) {
            std::fprintf(stderr, "N=%zu: the kill was not detected by all within %.1f s\n", r.n,
                         2 * r.detect_bound_s);
        }
        complete = complete && r.spread_ok && r.detect_ok;
    }
    std::string json = "{\"bench\":\"gossip_sim\",\"rows\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        char buf[512];
        std::snprintf(buf, sizeof(buf),
                      "%s{\"n\":%zu,\"rounds\":%s,\"round_bound\":%d,\"rounds_ratio\":%s,"
                      "\"dissem_s\":%s,\"detect_s\":%s,\"detect_bound_s\":%.3f,"
                      "\"detect_ratio\":%s,\"bytes_per_member_s\":%.1f,"
                      "\"bytes_ratio\":%.4f,\"false_positives\":%llu}",
                      i ? "," : "", r.n, json_or_null(r.spread_ok, r.rounds, 3).c_str(),
                      r.round_bound, json_or_null(r.spread_ok, r.rounds / r.round_bound, 3).c_str(),
                      json_or_null(r.spread_ok, r.dissem_s, 3).c_str(),
                      json_or_null(r.detect_ok, r.detect_s, 3).c_str(), r.detect_bound_s,
                      json_or_null(r.detect_ok, r.detect_s / r.detect_bound_s, 3).c_str(),
                      r.bytes_per_member_s, r.bytes_per_member_s / r.bytes_bound,
                      static_cast<unsigned long long>(r.false_positives));
        json += buf;
    }
    json += "]}";
    std::printf("%s\n", json.c_str());
    return complete ? 0 : 1;
}
