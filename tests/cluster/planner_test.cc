// ClusterRoutePlanner on synthetic snapshots with a manual clock: the cheapest pool wins, load
// spills to the next, pins and target versions are honoured, draining pools get nothing, suspect
// and ejected pools are penalized, ejections expire, rejections say why.

#include "daemon/cluster/planner.h"

#include <doctest/doctest.h>

#include <map>
#include <set>

#include "daemon/cluster/admin_views.h"
#include "daemon/cluster/cluster.h"
#include "daemon/metrics.h"

using namespace edge;
using namespace edge::daemon::cluster;
namespace membership = edge::routing::membership;

namespace {

struct Site {
    std::string name;
    double lat;
    double lon;
};
// Frankfurt (local), Amsterdam (~360 km), Singapore (~10 000 km).
const Site kFra{"fra", 50.1, 8.7};
const Site kAms{"ams", 52.4, 4.9};
const Site kSin{"sin", 1.35, 103.8};

membership::PoolInfo pool(const std::string& version = "v1",
                          membership::PoolState state = membership::PoolState::kServing,
                          uint32_t queue = 0, uint32_t running = 0) {
    membership::PoolInfo p;
    p.model = "m";
    p.version_digest = version;
    p.state = state;
    p.capacity = 8;
    p.load.queue_depth = queue;
    p.load.running = running;
    p.load.tokens_per_s = 100.0;
    return p;
}

// A cluster picture as the local site "fra" sees it.
class World {
public:
    World() {
        snap_ = std::make_shared<membership::MembershipSnapshot>();
        snap_->local_name = kFra.name;
        add(kFra, {});
    }

    void add(const Site& s, std::vector<membership::PoolInfo> pools,
             membership::NodeState state = membership::NodeState::kAlive,
             std::string peer = "auto") {
        auto site = std::make_shared<membership::SiteState>();
        site->site_id = s.name;
        site->latitude = s.lat;
        site->longitude = s.lon;
        site->peer_addr =
            peer == "auto" ? "127.0.0.1:" + std::to_string(7000 + next_port_++) : peer;
        site->admin_addr = "127.0.0.1:9000";
        site->pools = std::move(pools);
        membership::MemberView m;
        m.name = s.name;
        m.addr = "127.0.0.1:1";
        m.state = state;
        m.site = site;
        m.is_local = s.name == snap_->local_name;
        std::erase_if(snap_->members, [&](const auto& v) { return v.name == s.name; });
        snap_->members.push_back(m);
        std::sort(snap_->members.begin(), snap_->members.end(),
                  [](const auto& a, const auto& b) { return a.name < b.name; });
        // A new snapshot object, as the membership service publishes one per change.
        snap_ = std::make_shared<membership::MembershipSnapshot>(*snap_);
    }

    // The incarnation, state version and life number (MemberView::life: the memberlist's
    // verdict on them) gossip holds for a member already added.
    void set_life(const std::string& name, uint64_t incarnation, uint64_t state_version,
                  uint64_t life) {
        for (membership::MemberView& m : snap_->members) {
            if (m.name == name) {
                m.incarnation = incarnation;
                m.state_version = state_version;
                m.life = life;
            }
        }
        snap_ = std::make_shared<membership::MembershipSnapshot>(*snap_);
    }

    std::shared_ptr<const membership::MembershipSnapshot> snapshot() const { return snap_; }

private:
    std::shared_ptr<membership::MembershipSnapshot> snap_;
    int next_port_ = 0;
};

struct Fixture {
    ManualClock clock;
    World world;
    RolloutBook rollouts;
    daemon::Metrics metrics;
    std::unique_ptr<ClusterRoutePlanner> planner;

    explicit Fixture(PlannerConfig config = {}, int max_ejection_percent = 100) {
        config.outlier.consecutive_failures = 3;
        config.outlier.base_ejection_time = std::chrono::seconds(30);
        config.outlier.max_ejection_percent = max_ejection_percent;
        planner = std::make_unique<ClusterRoutePlanner>(
            config, clock, [this] { return world.snapshot(); }, rollouts, &metrics);
    }

    std::string first(std::string_view pin = "") {
        RoutePlan p = planner->plan("m", pin);
        return p.targets.empty() ? "rejected" : p.targets[0].site_id;
    }
};

}  // namespace

TEST_CASE("planner: the lowest-cost pool wins and the rest follow as fallbacks by cost") {
    Fixture f;
    f.world.add(kSin, {pool()});
    f.world.add(kAms, {pool()});
    RoutePlan p = f.planner->plan("m", "");
    REQUIRE(p.targets.size() == 2);
    CHECK(p.rejection == RouteRejection::kNone);
    CHECK(p.targets[0].site_id == "ams");
    CHECK_FALSE(p.targets[0].local);
    CHECK(p.targets[0].model == "m");
    CHECK(p.targets[0].peer_addr.starts_with("127.0.0.1:"));
    CHECK(p.targets[1].site_id == "sin");
    CHECK(p.targets[0].cost_s < p.targets[1].cost_s);
    // Singapore is ~10 000 km away: > 100 ms more than Amsterdam by fibre.
    CHECK(p.targets[1].cost_s - p.targets[0].cost_s > 0.1);

    // A local pool within the hysteresis of the best stays local.
    f.world.add(kFra, {pool()});
    RoutePlan local = f.planner->plan("m", "");
    REQUIRE_FALSE(local.targets.empty());
    CHECK(local.targets[0].local);
    CHECK(local.targets[0].peer_addr.empty());
    CHECK(local.targets[0].site_id == "fra");
    CHECK(f.metrics.serialize().find(
              "edgeserve_route_decisions_total{outcome=\"local\",site=\"fra\"} 1") !=
          std::string::npos);
    CHECK(f.metrics.serialize().find(
              "edgeserve_route_decisions_total{outcome=\"forwarded\",site=\"ams\"} 1") !=
          std::string::npos);
}

TEST_CASE("planner: a loaded pool spills to the next, a saturated cluster rejects with retry") {
    Fixture f;
    f.world.add(kAms, {pool("v1", membership::PoolState::kServing, 0, 2)});
    f.world.add(kSin, {pool()});
    CHECK(f.first() == "ams");
    // 6 queued at 100 tokens/s * 256 tokens each: seconds of wait, far more than the RTT gap.
    f.world.add(kAms, {pool("v1", membership::PoolState::kServing, 6, 8)});
    CHECK(f.first() == "sin");
    // Saturated (queue >= 4 per slot) is not even a fallback.
    f.world.add(kAms, {pool("v1", membership::PoolState::kServing, 40, 8)});
    RoutePlan p = f.planner->plan("m", "");
    REQUIRE(p.targets.size() == 1);
    CHECK(p.targets[0].site_id == "sin");
    f.world.add(kSin, {pool("v1", membership::PoolState::kServing, 40, 8)});
    RoutePlan r = f.planner->plan("m", "");
    CHECK(r.targets.empty());
    CHECK(r.rejection == RouteRejection::kAllSaturated);
    CHECK(r.retry_after_seconds >= 1);
    CHECK(r.message == "every pool serving model 'm' is saturated");
}

TEST_CASE("planner: a pool whose queue is at its engine's bound is passed over, as saturated") {
    // deploy/cluster-demo's fra: 4 slots, engine.max_queue 4. With its queue full its engine
    // answers 503 "queue full", far below 4 queued per slot (16); ams is busier but has room.
    Fixture f;
    membership::PoolInfo full = pool("v1", membership::PoolState::kServing, 4, 4);
    full.capacity = 4;
    full.load.max_queue = 4;
    membership::PoolInfo busy = pool("v1", membership::PoolState::kServing, 8, 8);
    busy.load.max_queue = 1024;
    f.world.add(kFra, {full});
    f.world.add(kAms, {busy});
    RoutePlan p = f.planner->plan("m", "");
    REQUIRE(p.targets.size() == 1);  // fra is not even a fallback.
    CHECK(p.targets[0].site_id == "ams");
    // Both full: the cluster is saturated, not sent to an engine that would refuse.
    busy.load.queue_depth = 1024;
    f.world.add(kAms, {busy});
    CHECK(f.planner->plan("m", "").rejection == RouteRejection::kAllSaturated);

    // The pools view shows each pool's bound and prefill rate ("-": not advertised).
    full.load.prefill_tokens_per_s = 5120.0;
    f.world.add(kFra, {full});
    f.world.add(kAms, {pool()});
    const auto snap = f.world.snapshot();
    const routing::selection::RouteTable t = routing::selection::build_route_table(*snap, {});
    const std::string text = pools_text(t, *snap, {});
    CHECK(text.find("MAXQ") != std::string::npos);
    CHECK(text.find("PREFILL/S") != std::string::npos);
    CHECK(text.find("5120") != std::string::npos);
    const std::string json = pools_json(t, *snap, {});
    CHECK(json.find("\"max_queue\":4") != std::string::npos);
    CHECK(json.find("\"max_queue\":0") != std::string::npos);
    CHECK(json.find("\"prefill_tokens_per_s\":5120") != std::string::npos);
}

TEST_CASE("planner: a pinned version is honoured or rejected with the reason") {
    Fixture f;
    f.world.add(kAms, {pool("v1")});
    f.world.add(kSin, {pool("v2")});
    CHECK(f.first() == "ams");
    RoutePlan p = f.planner->plan("m", "v2");
    REQUIRE(p.targets.size() == 1);  // No fallback of another version for a pin.
    CHECK(p.targets[0].site_id == "sin");
    RoutePlan r = f.planner->plan("m", "v3");
    CHECK(r.targets.empty());
    CHECK(r.rejection == RouteRejection::kVersionPinUnmatched);
    CHECK(r.message == "no pool serves version 'v3' of model 'm'");
    RoutePlan none = f.planner->plan("other", "");
    CHECK(none.rejection == RouteRejection::kNoPoolServesModel);
    CHECK(none.message == "no pool in the cluster serves model 'other'");
}

TEST_CASE("planner: the target version is preferred, others only as configured fallback") {
    Fixture f;
    f.world.add(kAms, {pool("v1")});
    f.world.add(kSin, {pool("v2")});
    CHECK(f.rollouts.apply({"m", "v2", 5}) == RolloutBook::Applied::kTarget);
    CHECK(f.rollouts.apply({"m", "v1", 4}) == RolloutBook::Applied::kStale);  // Older loses.
    RoutePlan p = f.planner->plan("m", "");
    REQUIRE(p.targets.size() == 2);
    CHECK(p.targets[0].site_id == "sin");  // Target version although farther.
    CHECK(p.targets[1].site_id == "ams");  // Other version as the fallback after it.
    // The target's pool drains: the fallback version serves.
    f.world.add(kSin, {pool("v2", membership::PoolState::kDraining)});
    CHECK(f.first() == "ams");
    VersionChoice v;
    auto d = f.planner->explain("m", "", &v);
    CHECK(v.source == "fallback");
    REQUIRE(d.chosen);
    CHECK(d.chosen->site_id == "ams");

    PlannerConfig strict;
    strict.version_fallback = false;
    Fixture g(strict);
    g.world.add(kAms, {pool("v1")});
    g.world.add(kSin, {pool("v2")});
    (void)g.rollouts.apply({"m", "v2", 1});
    RoutePlan q = g.planner->plan("m", "");
    REQUIRE(q.targets.size() == 1);
    CHECK(q.targets[0].site_id == "sin");
    g.world.add(kSin, {pool("v2", membership::PoolState::kDraining)});
    RoutePlan r = g.planner->plan("m", "");
    CHECK(r.rejection == RouteRejection::kVersionPinUnmatched);
    CHECK(r.message == "no pool serves version 'v2' of model 'm' (the cluster's target version)");
}

TEST_CASE("planner: ejected pools of the target version leave the request to another version") {
    // A rollout whose new version fails everywhere: its pools are ejected, and the healthy
    // old version (here this site's own) serves; only the ejected pools were planned before.
    Fixture f({}, 100);
    f.world.add(kFra, {pool("v1")});
    f.world.add(kAms, {pool("v2")});
    f.world.add(kSin, {pool("v2")});
    (void)f.rollouts.apply({"m", "v2", 1});
    CHECK(f.first() == "ams");
    for (const char* site : {"ams", "sin"}) {
        RouteTarget t{false, site, "127.0.0.1:1", 0.0, "m"};
        for (int i = 0; i < 3; ++i) {
            f.planner->report(t, false, std::chrono::milliseconds(1));
        }
    }
    REQUIRE(f.planner->outliers().is_ejected("ams/m"));
    REQUIRE(f.planner->outliers().is_ejected("sin/m"));
    // Each counted once, for its own site.
    const std::string metrics = f.metrics.serialize();
    CHECK(metrics.find("edgeserve_route_ejections_total{site=\"ams\"} 1") != std::string::npos);
    CHECK(metrics.find("edgeserve_route_ejections_total{site=\"sin\"} 1") != std::string::npos);
    RoutePlan p = f.planner->plan("m", "");
    REQUIRE_FALSE(p.targets.empty());
    CHECK(p.targets[0].site_id == "fra");
    CHECK(p.targets[0].local);
    VersionChoice v;
    (void)f.planner->explain("m", "", &v);
    CHECK(v.source == "fallback");
    // Every pool ejected: the target version's still serve, as last resort (either: both within
    // the margin, the 30 s penalty on each).
    f.world.add(kFra, {});
    const std::string last_resort = f.first();
    CHECK((last_resort == "ams" || last_resort == "sin"));
    (void)f.planner->explain("m", "", &v);
    CHECK(v.source == "target");
}

TEST_CASE("planner: passing /readyz checks do not hide a pool whose requests all fail") {
    // /readyz answers for the whole site; a model that fails every forwarded request between
    // two passing checks is still ejected after consecutive_failures of them.
    Fixture f;
    f.world.add(kAms, {pool()});
    f.world.add(kSin, {pool()});
    RouteTarget ams{false, "ams", "127.0.0.1:1", 0.0, "m"};
    for (int i = 0; i < 3; ++i) {
        f.planner->report(ams, false, std::chrono::milliseconds(1));
        f.planner->report_active("ams", ClusterRoutePlanner::Readiness::kReady);
    }
    CHECK(f.planner->outliers().is_ejected("ams/m"));
    CHECK(f.first() == "sin");
}

TEST_CASE("planner: a pool that failed is degraded and pays the degraded penalty for a while") {
    // routing.degraded_penalty_ms applied to nothing: the planner only ever said healthy or
    // ejected. A pool whose last request (or its site's /readyz check) failed is degraded until
    // a success, or for one outlier interval (10 s) without another failure.
    namespace sel = routing::selection;
    Fixture f;
    f.world.add(kAms, {pool()});
    f.world.add(kSin, {pool()});
    const auto rebuilt = std::chrono::milliseconds(300);  // Past the 250 ms rebuild interval.
    auto ams_pool = [&] {
        sel::RouteCandidate out;
        for (const sel::RouteCandidate& c : f.planner->table()->find("m")->candidates) {
            if (c.member == "ams") {
                out = c;
            }
        }
        CHECK(out.member == "ams");
        return out;
    };
    CHECK(f.first() == "ams");
    CHECK(ams_pool().health == sel::PoolHealth::kHealthy);
    CHECK(ams_pool().cost.penalty_s == 0.0);

    RouteTarget ams{false, "ams", "127.0.0.1:1", 0.0, "m"};
    f.planner->report(ams, false, std::chrono::milliseconds(1));
    CHECK_FALSE(f.planner->outliers().is_ejected("ams/m"));  // One failure of three.
    f.clock.advance(rebuilt);
    RoutePlan p = f.planner->plan("m", "");
    REQUIRE(p.targets.size() == 2);
    CHECK(p.targets[0].site_id == "sin");  // +200 ms outweighs ~150 ms of distance.
    CHECK(p.targets[1].site_id == "ams");  // Still a fallback.
    CHECK(ams_pool().health == sel::PoolHealth::kDegraded);
    CHECK(ams_pool().cost.penalty_s == doctest::Approx(0.2));

    // A success lifts it.
    f.planner->report(ams, true, std::chrono::milliseconds(1));
    f.clock.advance(rebuilt);
    CHECK(f.first() == "ams");
    CHECK(ams_pool().health == sel::PoolHealth::kHealthy);

    // A failed /readyz check degrades the site's serving pools until it answers one again.
    using Readiness = ClusterRoutePlanner::Readiness;
    f.planner->report_active("ams", Readiness::kFailed);
    f.clock.advance(rebuilt);
    CHECK(f.first() == "sin");
    f.planner->report_active("ams", Readiness::kReady);
    f.clock.advance(rebuilt);
    CHECK(f.first() == "ams");

    // A failed request is not lifted by a passing check; an interval without another failure
    // lifts it, though no request went there to succeed.
    f.planner->report(ams, false, std::chrono::milliseconds(1));
    f.planner->report_active("ams", Readiness::kReady);
    f.clock.advance(rebuilt);
    CHECK(f.first() == "sin");
    f.clock.advance(std::chrono::seconds(9));
    CHECK(f.first() == "sin");
    CHECK(ams_pool().health == sel::PoolHealth::kDegraded);
    f.clock.advance(std::chrono::seconds(1));
    CHECK(f.first() == "ams");
    CHECK(ams_pool().health == sel::PoolHealth::kHealthy);
    CHECK_FALSE(f.planner->outliers().is_ejected("ams/m"));
    f.planner->report(ams, true, std::chrono::milliseconds(1));  // Its failure count starts over.

    // The penalty is the configured one.
    PlannerConfig smaller = f.planner->config();
    smaller.cost.degraded_penalty_s = 0.05;
    CHECK(f.planner->reload(smaller));
    f.planner->report(ams, false, std::chrono::milliseconds(1));
    f.clock.advance(rebuilt);
    CHECK(f.first() == "ams");  // 50 ms does not outweigh the distance.
    CHECK(ams_pool().health == sel::PoolHealth::kDegraded);
    CHECK(ams_pool().cost.penalty_s == doctest::Approx(0.05));
}

TEST_CASE("planner: a draining pool gets nothing, not even as a fallback") {
    Fixture f;
    f.world.add(kFra, {pool("v1", membership::PoolState::kDraining)});
    f.world.add(kAms, {pool("v1", membership::PoolState::kDraining)});
    f.world.add(kSin, {pool()});
    for (int i = 0; i < 20; ++i) {
        RoutePlan p = f.planner->plan("m", "");
        REQUIRE(p.targets.size() == 1);
        CHECK(p.targets[0].site_id == "sin");
    }
    f.world.add(kSin, {pool("v1", membership::PoolState::kLoading)});
    CHECK(f.planner->plan("m", "").rejection == RouteRejection::kNoPoolServesModel);
}

TEST_CASE("planner: suspect members and ejected pools are penalized, ejection expires") {
    Fixture f;
    f.world.add(kAms, {pool()});
    f.world.add(kSin, {pool()});
    CHECK(f.first() == "ams");
    f.world.add(kAms, {pool()}, membership::NodeState::kSuspect);
    CHECK(f.first() == "sin");  // +500 ms suspect penalty outweighs ~150 ms of distance.
    f.world.add(kAms, {pool()}, membership::NodeState::kAlive);
    CHECK(f.first() == "ams");

    RouteTarget ams{false, "ams", "127.0.0.1:1", 0.0, "m"};
    f.planner->report(ams, false, std::chrono::milliseconds(1));
    f.planner->report(ams, false, std::chrono::milliseconds(1));
    CHECK(f.first() == "ams");  // Two failures: not yet.
    f.planner->report(ams, false, std::chrono::milliseconds(1));
    CHECK(f.planner->outliers().is_ejected("ams/m"));
    RoutePlan p = f.planner->plan("m", "");
    REQUIRE(p.targets.size() == 2);
    CHECK(p.targets[0].site_id == "sin");
    CHECK(p.targets[1].site_id == "ams");  // Last resort, after every healthy pool.
    CHECK(f.metrics.serialize().find("edgeserve_route_ejections_total{site=\"ams\"} 1") !=
          std::string::npos);

    f.clock.advance(std::chrono::seconds(29));
    CHECK(f.first() == "sin");
    f.clock.advance(std::chrono::seconds(12));  // Past 30 s and the next detector interval.
    CHECK(f.first() == "ams");  // Planning runs the detector's interval work first.
    CHECK_FALSE(f.planner->outliers().is_ejected("ams/m"));

    // Active checks count like requests: three failed /readyz eject again.
    for (int i = 0; i < 3; ++i) {
        f.planner->report_active("ams", ClusterRoutePlanner::Readiness::kFailed);
    }
    CHECK(f.first() == "sin");
}

TEST_CASE("planner: a site that says it is not ready is not ejected, and leaves the cap free") {
    Fixture f({}, 50);  // One ejection at a time: 50% of two pools.
    using Readiness = ClusterRoutePlanner::Readiness;
    // ams loads its model: /readyz answers 503 and gossip says loading, for a minute.
    f.world.add(kAms, {pool("v1", membership::PoolState::kLoading)});
    f.world.add(kSin, {pool()});
    CHECK(f.first() == "sin");
    for (int i = 0; i < 30; ++i) {
        f.planner->report_active("ams", Readiness::kNotReady);
        f.clock.advance(std::chrono::seconds(2));
        CHECK(f.first() == "sin");
    }
    // A check that failed outright while gossip still says loading says nothing of the pool.
    for (int i = 0; i < 3; ++i) {
        f.planner->report_active("ams", Readiness::kFailed);
    }
    CHECK_FALSE(f.planner->outliers().is_ejected("ams/m"));
    // ams serves; sin fails every forwarded request: sin is the one ejected, ams takes it all.
    f.world.add(kAms, {pool()});
    f.planner->report_active("ams", Readiness::kReady);
    CHECK(f.first() == "ams");
    RouteTarget sin{false, "sin", "127.0.0.1:1", 0.0, "m"};
    for (int i = 0; i < 3; ++i) {
        f.planner->report(sin, false, std::chrono::milliseconds(1));
    }
    CHECK(f.planner->outliers().is_ejected("sin/m"));
    CHECK_FALSE(f.planner->outliers().is_ejected("ams/m"));
    RoutePlan p = f.planner->plan("m", "");
    REQUIRE_FALSE(p.targets.empty());
    CHECK(p.targets[0].site_id == "ams");
}

TEST_CASE("planner: a remote site without a peer listener is never a target") {
    Fixture f;
    f.world.add(kAms, {pool()}, membership::NodeState::kAlive, "");
    f.world.add(kSin, {pool()});
    RoutePlan p = f.planner->plan("m", "");
    REQUIRE(p.targets.size() == 1);
    CHECK(p.targets[0].site_id == "sin");
    f.world.add(kSin, {pool()}, membership::NodeState::kAlive, "");
    RoutePlan r = f.planner->plan("m", "");
    CHECK(r.targets.empty());
    CHECK(r.rejection == RouteRejection::kNoPoolServesModel);
}

TEST_CASE("planner: a site without a peer listener shapes no choice, hysteresis nor rejection") {
    // Local "fra" busy for 16 ms (one generation of 256 tokens at 16000 tokens/s); "ams"
    // (5.5 ms away, no peer listener) is more than the 10 ms hysteresis cheaper, London (9.6 ms
    // away) is not: the local pool keeps the request.
    const Site lon{"lon", 51.5, -0.13};
    Fixture f;
    membership::PoolInfo busy = pool("v1", membership::PoolState::kServing, 0, 8);
    busy.load.tokens_per_s = 16000.0;
    f.world.add(kFra, {busy});
    f.world.add(kAms, {pool()}, membership::NodeState::kAlive, "");
    f.world.add(lon, {pool()});
    for (int i = 0; i < 20; ++i) {
        RoutePlan p = f.planner->plan("m", "");
        REQUIRE(p.targets.size() == 2);
        CHECK(p.targets[0].site_id == "fra");
        CHECK(p.targets[1].site_id == "lon");
    }
    auto d = f.planner->explain("m", "", nullptr);
    REQUIRE(d.chosen.has_value());
    CHECK(d.chosen->site_id == "fra");

    // Every pool that can take the request saturated: retry later, not "no pool serves it".
    f.world.add(kFra, {pool("v1", membership::PoolState::kServing, 40, 8)});
    f.world.add(lon, {pool("v1", membership::PoolState::kServing, 40, 8)});
    RoutePlan r = f.planner->plan("m", "");
    CHECK(r.targets.empty());
    CHECK(r.rejection == RouteRejection::kAllSaturated);
    CHECK(r.retry_after_seconds >= 1);
    // Only the unreachable pool serves: the message says why none is reachable.
    f.world.add(kFra, {});
    f.world.add(lon, {});
    RoutePlan none = f.planner->plan("m", "");
    CHECK(none.rejection == RouteRejection::kNoPoolServesModel);
    CHECK(none.message ==
          "no reachable pool serves model 'm': the pools that do take no forwarded requests");
    // Nor does /v1/models offer what only such a site serves.
    CHECK(f.planner->cluster_models().empty());
    f.world.add(lon, {pool()});
    CHECK(f.planner->cluster_models() == std::vector<std::string>{"m"});
}

TEST_CASE("planner: advertised models hold pools in any state, on members found dead too") {
    // A model whose only site drains for a restart, loads, or was found dead is not served
    // now (cluster_models) but exists (advertised_models): the API's 503, not its 404.
    Fixture f;
    membership::PoolInfo draining = pool("v1", membership::PoolState::kDraining);
    draining.model = "drained";
    f.world.add(kAms, {draining});
    membership::PoolInfo gone = pool();
    gone.model = "on-a-dead-site";
    f.world.add(kSin, {gone}, membership::NodeState::kDead);
    CHECK(f.planner->cluster_models().empty());
    CHECK(f.planner->advertised_models() ==
          std::vector<std::string>{"drained", "on-a-dead-site"});
    // The site that drained left and was dropped from the member list while it restarts (its
    // models load before it rejoins): its model stays advertised for a while, then is gone.
    f.world.add(kAms, {});
    f.clock.advance(ClusterRoutePlanner::kRememberAdvertised - std::chrono::seconds(1));
    CHECK(f.planner->advertised_models() ==
          std::vector<std::string>{"drained", "on-a-dead-site"});
    f.clock.advance(std::chrono::seconds(2));
    CHECK(f.planner->advertised_models() == std::vector<std::string>{"on-a-dead-site"});
}

TEST_CASE("planner: the table is cached until the snapshot changes or it goes stale") {
    Fixture f;
    f.world.add(kAms, {pool()});
    auto a = f.planner->table();
    auto b = f.planner->table();
    CHECK(a.get() == b.get());
    f.clock.advance(std::chrono::seconds(1));
    auto c = f.planner->table();
    CHECK(c.get() != b.get());
    f.world.add(kSin, {pool()});
    auto d = f.planner->table();
    CHECK(d.get() != c.get());
    CHECK(d->size() == 2);
}

TEST_CASE("admin views: route text shows each cost term and the verdicts") {
    Fixture f;
    f.world.add(kAms, {pool()});
    f.world.add(kSin, {pool("v1", membership::PoolState::kDraining)});
    VersionChoice v;
    auto d = f.planner->explain("m", "", &v);
    const std::string text = route_text(d, v);
    CHECK(text.find("RTT_MS") != std::string::npos);
    CHECK(text.find("QUEUE_MS") != std::string::npos);
    CHECK(text.find("PENALTY_MS") != std::string::npos);
    CHECK(text.find("chosen") != std::string::npos);
    CHECK(text.find("not serving (draining)") != std::string::npos);
    const std::string json = route_json(d, v);
    CHECK(json.find("\"version_source\":\"none\"") != std::string::npos);
    CHECK(json.find("\"rtt_ms\"") != std::string::npos);
    const std::string members = members_text(*f.world.snapshot(), f.planner->config().cost);
    CHECK(members.find("fra *") != std::string::npos);
    CHECK(members.find("great_circle") != std::string::npos);
    // A member whose site state has not come yet has no position: its RTT is unknown, not a
    // great-circle distance to (0, 0).
    membership::MembershipSnapshot fresh = *f.world.snapshot();
    membership::MemberView newcomer;
    newcomer.name = "new";
    newcomer.addr = "127.0.0.1:2";
    newcomer.state = membership::NodeState::kAlive;
    fresh.members.push_back(newcomer);
    const std::string json_members = members_json(fresh, f.planner->config().cost);
    CHECK(json_members.find("\"name\":\"new\"") != std::string::npos);
    CHECK(json_members.find("\"rtt_ms\":null,\"rtt_source\":\"unknown\"") != std::string::npos);
    CHECK(members_text(fresh, f.planner->config().cost).find("unknown") != std::string::npos);
}

TEST_CASE("rollout events: encode, decode, and untrusted payloads are refused") {
    auto bytes = encode_rollout("kimi", "abc");
    Result<RolloutIntent> r = decode_rollout(bytes, 7);
    REQUIRE(r.ok());
    CHECK(r->model == "kimi");
    CHECK(r->version == "abc");
    CHECK(r->ltime == 7);
    auto bad = [](std::string s) {
        std::vector<uint8_t> b(s.begin(), s.end());
        return decode_rollout(b, 1).ok();
    };
    CHECK_FALSE(bad(""));
    CHECK_FALSE(bad("kimi"));
    CHECK_FALSE(bad("\nabc"));
    CHECK_FALSE(bad("kimi\n"));
    CHECK_FALSE(bad("kimi\nab\nc"));
    CHECK_FALSE(bad(std::string(300, 'a') + "\nb"));
    using Applied = RolloutBook::Applied;
    RolloutBook book;
    CHECK(book.apply({"m", "b", 3}) == Applied::kTarget);
    CHECK(book.apply({"m", "a", 3}) == Applied::kStale);  // Tie: the larger version wins.
    CHECK(book.apply({"m", "c", 3}) == Applied::kTarget);
    CHECK(book.target("m")->version == "c");
    CHECK_FALSE(book.target("x"));
    // Events naming ever new models stop at the cap; the models held still move.
    for (size_t i = 1; i < RolloutBook::kMaxModels; ++i) {
        REQUIRE(book.apply({"flood" + std::to_string(i), "v", 1}) == Applied::kTarget);
    }
    CHECK(book.apply({"one-more", "v", 9}) == Applied::kFull);
    CHECK_FALSE(book.target("one-more"));
    CHECK(book.all().size() == RolloutBook::kMaxModels);
    CHECK(book.apply({"m", "d", 4}) == Applied::kTarget);
    CHECK(book.target("m")->version == "d");
}

TEST_CASE("planner: reloaded cost weights decide from the next plan, the detector keeps its own") {
    Fixture f;
    f.world.add(kAms, {pool()}, membership::NodeState::kSuspect);
    f.world.add(kSin, {pool()});
    CHECK(f.first() == "sin");  // +500 ms suspect penalty outweighs ~150 ms of distance.
    // No penalty for a suspect member: ams, nearer, wins from the next plan (no new snapshot).
    PlannerConfig lenient = f.planner->config();
    lenient.cost.suspect_penalty_s = 0.0;
    CHECK(f.planner->reload(lenient));
    CHECK(f.first() == "ams");
    CHECK(f.planner->config().cost.suspect_penalty_s == 0.0);
    // A changed outlier setting is not applied (its ejections were made under the old one).
    PlannerConfig other = f.planner->config();
    other.outlier.consecutive_failures = 50;
    CHECK_FALSE(f.planner->reload(other));
    CHECK(f.planner->config().outlier.consecutive_failures == 3);
}

TEST_CASE("planner: a lifted ejection leaves the cached table at once") {
    // A table rebuilt only every hour: a recovered pool must not wait for that.
    PlannerConfig slow;
    slow.rebuild_interval = std::chrono::hours(1);
    Fixture f(slow);
    f.world.add(kAms, {pool()});
    f.world.add(kSin, {pool()});
    CHECK(f.first() == "ams");
    RouteTarget ams{false, "ams", "127.0.0.1:1", 0.0, "m"};
    for (int i = 0; i < 3; ++i) {
        f.planner->report(ams, false, std::chrono::milliseconds(1));
    }
    CHECK(f.first() == "sin");  // The ejection rebuilt the table.
    // Past 30 s and the next detector interval: the sweep lets ams back.
    f.clock.advance(std::chrono::seconds(41));
    CHECK(f.first() == "ams");
    CHECK_FALSE(f.planner->outliers().is_ejected("ams/m"));
    auto a = f.planner->table();
    CHECK(a.get() == f.planner->table().get());  // Nothing ejected, nothing changed: cached.
}

TEST_CASE("planner: a report for a pool that left the table does not bring it back") {
    // One ejection at a time: 50% of two pools.
    Fixture f({}, 50);
    const Site kGru{"gru", -23.5, -46.6};
    f.world.add(kAms, {pool()});
    f.world.add(kSin, {pool()});
    f.world.add(kGru, {pool()});
    CHECK(f.first() == "ams");
    // ams leaves; a forwarded request to it ends after the table dropped its pool.
    f.world.add(kAms, {pool()}, membership::NodeState::kLeft);
    const std::string after = f.first();  // gru or sin: within the margin of each other.
    CHECK((after == "gru" || after == "sin"));
    RouteTarget ams{false, "ams", "127.0.0.1:1", 0.0, "m"};
    for (int i = 0; i < 3; ++i) {
        f.planner->report(ams, false, std::chrono::milliseconds(1));
    }
    f.planner->report_active("ams", ClusterRoutePlanner::Readiness::kFailed);
    for (const routing::health::PoolHealthView& p : f.planner->outliers().pools()) {
        CHECK_MESSAGE(p.pool != "ams/m", "the departed pool is back in the detector");
    }
    CHECK(f.metrics.serialize().find("edgeserve_route_ejections_total{site=\"ams\"}") ==
          std::string::npos);
    // The cap counts the two live pools: one of them may be ejected (a stale ejected ams/m
    // took that place for good).
    RouteTarget sin{false, "sin", "127.0.0.1:1", 0.0, "m"};
    for (int i = 0; i < 3; ++i) {
        f.planner->report(sin, false, std::chrono::milliseconds(1));
    }
    CHECK(f.planner->outliers().is_ejected("sin/m"));
    RoutePlan p = f.planner->plan("m", "");
    REQUIRE(p.targets.size() == 2);
    CHECK(p.targets[1].site_id == "sin");  // Ejected: last.
}

// A member restarted between two rebuilds (never seen dead: an idle site, or a restart faster
// than gossip's failure detection) kept its previous life's ejection and backoff: the new process
// was planned as last resort for up to max_ejection_time. A refuted suspicion is the same life.
TEST_CASE("planner: a member's new life starts its pools' outlier records afresh") {
    Fixture f;
    f.world.add(kAms, {pool()});
    f.world.add(kSin, {pool()});
    f.world.set_life("ams", 3, 40, 1);
    RouteTarget ams{false, "ams", "127.0.0.1:1", 0.0, "m"};
    auto eject_ams = [&] {
        for (int i = 0; i < 3; ++i) {
            f.planner->report(ams, false, std::chrono::milliseconds(1));
        }
        REQUIRE(f.planner->outliers().is_ejected("ams/m"));
        CHECK(f.first() == "sin");
    };
    eject_ams();
    f.world.set_life("ams", 4, 41, 1);  // Refuted a suspicion: the same process.
    CHECK(f.first() == "sin");
    CHECK(f.planner->outliers().is_ejected("ams/m"));
    f.world.set_life("ams", 5, 2, 2);  // Restarted: its versions count from 1 again.
    CHECK(f.first() == "ams");
    CHECK_FALSE(f.planner->outliers().is_ejected("ams/m"));
    eject_ams();
    CHECK(f.planner->outliers().pools()[0].times_ejected == 1);  // Not the old life's second.
}

TEST_CASE("planner: reports before the first plan count for the snapshot's pools") {
    Fixture f;
    f.world.add(kAms, {pool()});
    RouteTarget ams{false, "ams", "127.0.0.1:1", 0.0, "m"};
    for (int i = 0; i < 3; ++i) {
        f.planner->report(ams, false, std::chrono::milliseconds(1));
    }
    CHECK(f.planner->outliers().is_ejected("ams/m"));
}

TEST_CASE("metrics sites: every member gossip holds but those that left") {
    World w;
    w.add(kAms, {pool()}, membership::NodeState::kDead);
    w.add(kSin, {pool()}, membership::NodeState::kLeft);
    membership::MembershipSnapshot snap = *w.snapshot();
    membership::MemberView unknown;  // Its site state has not come yet.
    unknown.name = "new";
    unknown.state = membership::NodeState::kSuspect;
    snap.members.push_back(unknown);
    // A dead member may come back: its counters stay until gossip reclaims it.
    CHECK(daemon::cluster::metric_sites(snap) == std::set<std::string>{"ams", "fra", "new"});
    std::erase_if(snap.members, [](const auto& m) { return m.name == "ams"; });  // Reclaimed.
    CHECK(daemon::cluster::metric_sites(snap) == std::set<std::string>{"fra", "new"});
}
