#include "routing/selection/selector.h"

#include <doctest/doctest.h>

#include <map>
#include <memory>

#include "common/clock.h"
#include "routing/health/outlier_detector.h"
#include "routing/selection/route_table.h"

using namespace edge::routing::selection;
namespace mb = edge::routing::membership;

namespace {

RouteCandidate cand(std::string member, double total_s, bool local = false,
                    std::string version = "v1", mb::PoolState state = mb::PoolState::kServing,
                    bool saturated = false) {
    RouteCandidate c;
    c.member = member;
    c.site_id = "site-" + member;
    c.model = "m";
    c.version_digest = std::move(version);
    c.state = state;
    c.is_local = local;
    c.cost.total_s = total_s;
    c.cost.queue_s = saturated ? 2.0 : 0.0;
    c.cost.saturated = saturated;
    return c;
}

RouteTable table_of(std::vector<RouteCandidate> cands) {
    RouteTable t;
    t.local_member = "local";
    for (RouteCandidate& c : cands) {
        t.add(std::move(c));
    }
    t.seal();
    return t;
}

}  // namespace

TEST_CASE("selector: rejections say why") {
    SelectionConfig cfg;
    std::mt19937_64 rng(1);
    RouteTable empty;
    CHECK(choose(empty, {"m", ""}, cfg, rng).rejection == Rejection::kNoPoolServesModel);

    RouteTable draining = table_of({cand("a", 0.1, false, "v1", mb::PoolState::kDraining),
                                    cand("b", 0.1, false, "v1", mb::PoolState::kLoading)});
    CHECK(choose(draining, {"m", ""}, cfg, rng).rejection == Rejection::kNoPoolServesModel);
    CHECK(choose(draining, {"other", ""}, cfg, rng).rejection == Rejection::kNoPoolServesModel);

    RouteTable versions = table_of({cand("a", 0.1, false, "v1"), cand("b", 0.1, false, "v2")});
    CHECK(choose(versions, {"m", "v3"}, cfg, rng).rejection == Rejection::kVersionPinUnmatched);
    RouteChoice pinned = choose(versions, {"m", "v2"}, cfg, rng);
    REQUIRE(pinned.chosen != nullptr);
    CHECK(pinned.chosen->member == "b");
    CHECK(pinned.reason == ChoiceReason::kOnlyCandidate);

    RouteTable full = table_of({cand("a", 0.1, false, "v1", mb::PoolState::kServing, true),
                                cand("b", 0.1, true, "v1", mb::PoolState::kServing, true)});
    RouteChoice sat = choose(full, {"m", ""}, cfg, rng);
    CHECK(sat.chosen == nullptr);
    CHECK(sat.rejection == Rejection::kAllSaturated);
    CHECK(sat.retry_after_s == doctest::Approx(2.0));
    CHECK(rejection_name(sat.rejection) == "all_saturated");
}

TEST_CASE("selector: the only candidate within the margin is taken") {
    SelectionConfig cfg;  // margin max(5 ms, 10%)
    std::mt19937_64 rng(7);
    RouteTable t = table_of({cand("a", 0.100), cand("b", 0.200), cand("c", 0.111)});
    for (int i = 0; i < 20; ++i) {
        RouteChoice c = choose(t, {"m", ""}, cfg, rng);
        REQUIRE(c.chosen != nullptr);
        CHECK(c.chosen->member == "a");
        CHECK(c.reason == ChoiceReason::kOnlyCandidate);
    }
}

TEST_CASE("selector: power of two choices spreads over the near-best and never the far") {
    SelectionConfig cfg;
    std::mt19937_64 rng(42);
    // Four within 10% of 0.100 (<= 0.110), one outside.
    const std::map<std::string, double> cost = {
        {"a", 0.100}, {"b", 0.104}, {"c", 0.108}, {"d", 0.1099}};
    RouteTable t = table_of({cand("a", cost.at("a")), cand("b", cost.at("b")),
                             cand("c", cost.at("c")), cand("d", cost.at("d")), cand("e", 0.300)});
    std::map<std::string, int> hits;
    constexpr int kDraws = 8000;
    for (int i = 0; i < kDraws; ++i) {
        RouteChoice c = choose(t, {"m", ""}, cfg, rng);
        REQUIRE(c.chosen != nullptr);
        CHECK(c.reason == ChoiceReason::kPowerOfTwo);
        ++hits[c.chosen->member];
    }
    CHECK(hits["e"] == 0);
    // Each of the 6 pairs equally likely; within a pair, each wins with probability the other's
    // cost over their sum. Costs within 10% of each other: every pool gets close to a quarter
    // (the costliest in the margin too: it got none when the cheaper of two always won), the
    // cheaper ones a little more.
    for (const auto& [i, ci] : cost) {
        double p = 0.0;
        for (const auto& [j, cj] : cost) {
            if (i != j) {
                p += cj / (ci + cj) / 6.0;
            }
        }
        CAPTURE(i);
        CHECK(hits[i] == doctest::Approx(p * kDraws).epsilon(0.06));
        CHECK(hits[i] > kDraws / 5);
    }
}

TEST_CASE("selector: near-equal pools split the traffic, a clearly cheaper one gets more") {
    // Two remote pools 1 ms apart: the cheaper of the two took every request until its gossiped
    // load caught up, then the other took them all (herding).
    SelectionConfig cfg;
    std::mt19937_64 rng(2024);
    RouteTable near = table_of({cand("a", 0.100), cand("b", 0.101), cand("far", 0.200)});
    std::map<std::string, int> hits;
    constexpr int kDraws = 10000;
    for (int i = 0; i < kDraws; ++i) {
        RouteChoice c = choose(near, {"m", ""}, cfg, rng);
        REQUIRE(c.chosen != nullptr);
        CHECK(c.reason == ChoiceReason::kPowerOfTwo);
        ++hits[c.chosen->member];
    }
    // P(a) = 0.101 / 0.201 = 0.5025: 5025 expected, a standard deviation of 50.
    CHECK(hits["a"] == doctest::Approx(5025).epsilon(0.04));
    CHECK(hits["b"] == doctest::Approx(4975).epsilon(0.04));
    CHECK(hits["far"] == 0);

    // A wide margin holds a pool at half the cost of another: it wins 2 in 3 (0.2 / 0.3), the
    // other still 1 in 3; one outside the margin, none.
    cfg.margin_fraction = 1.5;  // Up to 0.250.
    RouteTable wide = table_of({cand("a", 0.100), cand("b", 0.200), cand("far", 0.300)});
    hits.clear();
    for (int i = 0; i < kDraws; ++i) {
        RouteChoice c = choose(wide, {"m", ""}, cfg, rng);
        REQUIRE(c.chosen != nullptr);
        ++hits[c.chosen->member];
    }
    CHECK(hits["a"] == doctest::Approx(kDraws * 2.0 / 3.0).epsilon(0.04));
    CHECK(hits["b"] == doctest::Approx(kDraws / 3.0).epsilon(0.06));
    CHECK(hits["far"] == 0);
}

TEST_CASE("selector: the same seed gives the same choices") {
    SelectionConfig cfg;
    RouteTable t = table_of({cand("a", 0.100), cand("b", 0.101), cand("c", 0.102)});
    std::mt19937_64 r1(5);
    std::mt19937_64 r2(5);
    for (int i = 0; i < 50; ++i) {
        CHECK(choose(t, {"m", ""}, cfg, r1).chosen == choose(t, {"m", ""}, cfg, r2).chosen);
    }
}

TEST_CASE("selector: hysteresis keeps the local pool until it is clearly worse") {
    SelectionConfig cfg;
    cfg.local_hysteresis_s = 0.010;
    std::mt19937_64 rng(3);
    RouteTable near = table_of({cand("remote", 0.100), cand("local", 0.109, true)});
    RouteChoice c = choose(near, {"m", ""}, cfg, rng);
    REQUIRE(c.chosen != nullptr);
    CHECK(c.chosen->member == "local");
    CHECK(c.reason == ChoiceReason::kLocalHysteresis);

    RouteTable far = table_of({cand("remote", 0.100), cand("local", 0.200, true)});
    c = choose(far, {"m", ""}, cfg, rng);
    REQUIRE(c.chosen != nullptr);
    CHECK(c.chosen->member == "remote");

    // A saturated local pool is never preferred.
    RouteTable sat = table_of(
        {cand("remote", 0.100), cand("local", 0.001, true, "v1", mb::PoolState::kServing, true)});
    c = choose(sat, {"m", ""}, cfg, rng);
    REQUIRE(c.chosen != nullptr);
    CHECK(c.chosen->member == "remote");
}

TEST_CASE("selector: explain lists every candidate with a verdict and matches choose") {
    SelectionConfig cfg;
    RouteTable t = table_of(
        {cand("a", 0.100), cand("b", 0.300), cand("c", 0.1, false, "v1", mb::PoolState::kDraining),
         cand("d", 0.1, false, "v2"), cand("e", 0.1, false, "v1", mb::PoolState::kServing, true)});
    std::mt19937_64 r1(9);
    std::mt19937_64 r2(9);
    RouteDecision d = explain(t, {"m", "v1"}, cfg, r1);
    RouteChoice c = choose(t, {"m", "v1"}, cfg, r2);
    REQUIRE(d.chosen.has_value());
    CHECK(d.chosen->member == c.chosen->member);
    REQUIRE(d.candidates.size() == 5);
    CHECK(d.candidates[0].verdict == "chosen");
    CHECK(d.candidates[1].verdict == "outside margin");
    CHECK(d.candidates[2].verdict == "not serving (draining)");
    CHECK(d.candidates[3].verdict == "version pin unmatched");
    CHECK(d.candidates[4].verdict == "saturated");
    REQUIRE(d.reasons.size() == 1);
    CHECK(d.reasons[0].find("pool at site site-a chosen") == 0);
    const std::string json = route_decision_json(d);
    CHECK(json.find("\"outcome\":\"forward\"") != std::string::npos);
    CHECK(json.find("\"verdict\":\"saturated\"") != std::string::npos);
    CHECK(json.find("\"total_ms\":100.000") != std::string::npos);

    RouteDecision rej = explain(t, {"m", "nope"}, cfg, r1);
    CHECK(!rej.chosen);
    CHECK(rej.rejection == Rejection::kVersionPinUnmatched);
    CHECK(route_decision_json(rej).find("\"rejection\":\"version_pin_unmatched\"") !=
          std::string::npos);
}

TEST_CASE("route table: built from a snapshot with costs, health and member states") {
    mb::MembershipSnapshot snap;
    snap.local_name = "fra";
    auto site = [](std::string id, double lat, double lon, std::vector<mb::PoolInfo> pools) {
        auto s = std::make_shared<mb::SiteState>();
        s->site_id = std::move(id);
        s->latitude = lat;
        s->longitude = lon;
        s->pools = std::move(pools);
        return s;
    };
    mb::PoolInfo pool;
    pool.model = "m";
    pool.version_digest = "v1";
    pool.state = mb::PoolState::kServing;
    pool.capacity = 4;
    pool.load.tokens_per_s = 1000.0;

    auto member = [](std::string name, mb::NodeState state,
                     std::shared_ptr<mb::SiteState> site_state, bool is_local) {
        mb::MemberView m;
        m.name = std::move(name);
        m.state = state;
        m.site = std::move(site_state);
        m.is_local = is_local;
        return m;
    };
    mb::MemberView fra =
        member("fra", mb::NodeState::kAlive, site("fra", 50.11, 8.68, {pool}), true);
    mb::MemberView sin =
        member("sin", mb::NodeState::kSuspect, site("sin", 1.35, 103.82, {pool}), false);
    mb::MemberView gru =
        member("gru", mb::NodeState::kAlive, site("gru", -23.55, -46.63, {pool}), false);
    mb::MemberView dead = member("old", mb::NodeState::kDead, site("old", 0, 0, {pool}), false);
    mb::MemberView unknown = member("zzz", mb::NodeState::kAlive, nullptr, false);
    snap.members = {fra, gru, dead, sin, unknown};

    CostConfig cfg;
    RouteTable t = build_route_table(snap, cfg, [](std::string_view member, std::string_view) {
        return member == "gru" ? PoolHealth::kEjected : PoolHealth::kHealthy;
    });
    const auto* pools = t.find("m");
    REQUIRE(pools != nullptr);
    const auto* list = &pools->candidates;
    REQUIRE(list->size() == 3);
    CHECK(t.size() == 3);
    CHECK((*list)[0].member == "fra");
    CHECK((*list)[0].is_local);
    CHECK((*list)[0].cost.rtt_s == 0.0);
    CHECK((*list)[1].member == "gru");
    CHECK((*list)[1].cost.penalty_s == doctest::Approx(cfg.ejected_penalty_s));
    CHECK((*list)[1].health == PoolHealth::kEjected);
    CHECK((*list)[2].member == "sin");
    CHECK((*list)[2].cost.rtt_source == RttSource::kGreatCircle);
    CHECK((*list)[2].cost.rtt_s ==
          doctest::Approx(fibre_rtt_s(great_circle_m(50.11, 8.68, 1.35, 103.82), 1.5)));
    CHECK((*list)[2].cost.penalty_s == doctest::Approx(cfg.suspect_penalty_s));

    std::mt19937_64 rng(1);
    RouteChoice c = choose(t, {"m", ""}, SelectionConfig{}, rng);
    REQUIRE(c.chosen != nullptr);
    CHECK(c.chosen->member == "fra");
}

TEST_CASE("selector: sparse usable pools inside the margin are still found exactly") {
    SelectionConfig cfg;
    std::vector<RouteCandidate> cands;
    for (int i = 0; i < 200; ++i) {
        // Same cost, wrong version: inside the margin but not usable under the pin.
        cands.push_back(cand("x" + std::to_string(i), 0.1003, false, "old"));
    }
    cands.push_back(cand("p", 0.1001, false, "new"));
    cands.push_back(cand("q", 0.1002, false, "new"));
    RouteTable two = table_of(cands);
    std::mt19937_64 rng(11);
    std::map<std::string, int> hits;
    for (int i = 0; i < 200; ++i) {
        RouteChoice c = choose(two, {"m", "new"}, cfg, rng);
        REQUIRE(c.chosen != nullptr);
        CHECK(c.reason == ChoiceReason::kPowerOfTwo);
        ++hits[c.chosen->member];
    }
    // With two usable, P2C always compares both, found among the 200 unusable: 0.1 ms apart,
    // they share the requests about evenly (the cheaper of two once took every one).
    CHECK(hits["p"] + hits["q"] == 200);
    CHECK(hits["p"] == doctest::Approx(100).epsilon(0.25));
    CHECK(hits["q"] == doctest::Approx(100).epsilon(0.25));

    cands.pop_back();
    RouteTable one = table_of(cands);
    RouteChoice c = choose(one, {"m", "new"}, cfg, rng);
    REQUIRE(c.chosen != nullptr);
    CHECK(c.chosen->member == "p");
    CHECK(c.reason == ChoiceReason::kOnlyCandidate);
}

TEST_CASE("route table: an outlier-ejected pool carries the penalty and loses the choice") {
    edge::ManualClock clock;
    edge::routing::health::OutlierDetector detector({}, clock);
    mb::MembershipSnapshot snap;
    snap.local_name = "a";
    for (const char* name : {"a", "b"}) {
        mb::PoolInfo pool;
        pool.model = "m";
        pool.state = mb::PoolState::kServing;
        pool.capacity = 4;
        pool.load.tokens_per_s = 1000.0;
        auto site = std::make_shared<mb::SiteState>();
        site->site_id = name;
        site->pools = {pool};
        mb::MemberView m;
        m.name = name;
        m.site = site;
        m.is_local = std::string(name) == "a";
        snap.members.push_back(m);
        detector.add_pool(edge::routing::health::pool_key(name, "m"));
    }
    const PoolHealthFn health = [&](std::string_view member, std::string_view model) {
        return detector.is_ejected(edge::routing::health::pool_key(member, model))
                   ? PoolHealth::kEjected
                   : PoolHealth::kHealthy;
    };
    std::mt19937_64 rng(1);
    RouteTable before = build_route_table(snap, CostConfig{}, health);
    CHECK(choose(before, {"m", ""}, SelectionConfig{}, rng).chosen->member == "a");
    for (int i = 0; i < 5; ++i) {
        detector.report_failure("a/m", edge::routing::health::FailureKind::kHttp5xx);
    }
    RouteTable after = build_route_table(snap, CostConfig{}, health);
    RouteChoice c = choose(after, {"m", ""}, SelectionConfig{}, rng);
    REQUIRE(c.chosen != nullptr);
    CHECK(c.chosen->member == "b");
    CHECK(after.find("m")->candidates[0].cost.penalty_s == doctest::Approx(30.0));
}

TEST_CASE("route table: thousands of pools sorted by cost, equal costs in insertion order") {
    std::vector<RouteCandidate> cands;
    for (int i = 0; i < 5000; ++i) {
        // Costs with many ties; every 97th local; versions v0..v6; every 13th saturated.
        cands.push_back(cand("m" + std::to_string(i), 0.001 * ((i * 7919) % 211), i % 97 == 0,
                             "v" + std::to_string(i % 7), mb::PoolState::kServing, i % 13 == 0));
    }
    const RouteTable t = table_of(cands);
    const ModelPools* m = t.find("m");
    REQUIRE(m != nullptr);
    REQUIRE(m->index.size() == cands.size());
    REQUIRE(m->versions.size() == 7);
    CHECK(m->versions[0] == "v0");  // Numbered in insertion order.
    size_t locals = 0;
    for (size_t pos = 0; pos < m->index.size(); ++pos) {
        const uint32_t i = m->index[pos];
        const RouteCandidate& c = m->candidates[i];
        CHECK(m->total_s[pos] == c.cost.total_s);
        CHECK(m->versions[m->version[pos]] == c.version_digest);
        CHECK(((m->flags[pos] & ModelPools::kLocal) != 0) == c.is_local);
        CHECK(((m->flags[pos] & ModelPools::kSaturated) != 0) == c.cost.saturated);
        if (pos > 0) {
            const uint32_t prev = m->index[pos - 1];
            CHECK((m->total_s[pos - 1] < m->total_s[pos] ||
                   (m->total_s[pos - 1] == m->total_s[pos] && prev < i)));
        }
        if (c.is_local) {
            REQUIRE(locals < m->local_positions.size());
            CHECK(m->local_positions[locals++] == pos);
        }
    }
    CHECK(locals == m->local_positions.size());
}

namespace {

// Local "fra" and remote "ams" (about 360 km away, 5.5 ms there and back), one pool of "m" each.
mb::MembershipSnapshot two_sites(const mb::PoolInfo& fra_pool, const mb::PoolInfo& ams_pool,
                                 const std::string& ams_peer_addr) {
    mb::MembershipSnapshot snap;
    snap.local_name = "fra";
    auto add = [&](std::string name, double lat, double lon, const mb::PoolInfo& pool,
                   std::string peer_addr) {
        auto site = std::make_shared<mb::SiteState>();
        site->site_id = name;
        site->latitude = lat;
        site->longitude = lon;
        site->peer_addr = std::move(peer_addr);
        site->pools = {pool};
        mb::MemberView m;
        m.name = name;
        m.state = mb::NodeState::kAlive;
        m.site = site;
        m.is_local = name == "fra";
        snap.members.push_back(m);
    };
    add("ams", 52.4, 4.9, ams_pool, ams_peer_addr);
    add("fra", 50.1, 8.7, fra_pool, "10.0.0.1:8443");
    return snap;
}

mb::PoolInfo serving_pool() {
    mb::PoolInfo pool;
    pool.model = "m";
    pool.version_digest = "v1";
    pool.state = mb::PoolState::kServing;
    pool.capacity = 8;
    pool.load.tokens_per_s = 1000.0;
    return pool;
}

}  // namespace

TEST_CASE("route table: advertised prefill rates cost a long prompt, a slow local pool loses") {
    mb::PoolInfo slow = serving_pool();
    slow.load.prefill_tokens_per_s = 500.0;
    mb::PoolInfo fast = serving_pool();
    fast.load.prefill_tokens_per_s = 20000.0;
    CostConfig cfg;
    cfg.prompt_tokens = 8192.0;
    RouteTable t = build_route_table(two_sites(slow, fast, "10.0.0.2:8443"), cfg);
    const ModelPools* pools = t.find("m");
    REQUIRE(pools != nullptr);
    REQUIRE(pools->candidates.size() == 2);
    const RouteCandidate& ams = pools->candidates[0];
    const RouteCandidate& fra = pools->candidates[1];
    REQUIRE(fra.is_local);
    CHECK(fra.cost.prefill_s == doctest::Approx(8192.0 / 500.0));
    CHECK(ams.cost.prefill_s == doctest::Approx(8192.0 / 20000.0));
    std::mt19937_64 rng(1);
    RouteChoice c = choose(t, {"m", ""}, SelectionConfig{}, rng);
    REQUIRE(c.chosen != nullptr);
    CHECK(c.chosen->member == "ams");

    // A pool advertising no rate (an older member) is costed at the default.
    mb::PoolInfo unknown = serving_pool();
    RouteTable d = build_route_table(two_sites(unknown, fast, "10.0.0.2:8443"), cfg);
    CHECK(d.find("m")->candidates[1].cost.prefill_s ==
          doctest::Approx(8192.0 / cfg.default_prefill_tokens_per_s));
}

TEST_CASE("route table: a pool at its advertised queue bound is saturated, another is chosen") {
    // fra runs 4 at once and its engine refuses the 5th waiting request (engine.max_queue 4): 4
    // queued is full there, far below 4 per slot (16). ams is busier but takes requests.
    mb::PoolInfo full = serving_pool();
    full.capacity = 4;
    full.load.running = 4;
    full.load.queue_depth = 4;
    full.load.max_queue = 4;
    mb::PoolInfo busy = serving_pool();
    busy.load.running = 8;
    busy.load.queue_depth = 8;
    busy.load.max_queue = 1024;
    RouteTable t = build_route_table(two_sites(full, busy, "10.0.0.2:8443"), CostConfig{});
    const ModelPools* pools = t.find("m");
    REQUIRE(pools != nullptr);
    REQUIRE(pools->candidates.size() == 2);
    const RouteCandidate* fra = nullptr;
    const RouteCandidate* ams = nullptr;
    for (const RouteCandidate& c : pools->candidates) {
        (c.is_local ? fra : ams) = &c;
    }
    REQUIRE(fra != nullptr);
    REQUIRE(ams != nullptr);
    CHECK(fra->cost.total_s < ams->cost.total_s);  // Cheaper by cost alone,
    CHECK(fra->cost.saturated);                    // but its engine would answer 503.
    CHECK_FALSE(ams->cost.saturated);
    std::mt19937_64 rng(1);
    RouteChoice c = choose(t, {"m", ""}, SelectionConfig{}, rng);
    REQUIRE(c.chosen != nullptr);
    CHECK(c.chosen->member == "ams");

    // One below the bound, or from a member advertising none (0), fra is not saturated.
    full.load.queue_depth = 3;
    RouteTable below = build_route_table(two_sites(full, busy, "10.0.0.2:8443"), CostConfig{});
    for (const RouteCandidate& c : below.find("m")->candidates) {
        CHECK_FALSE(c.cost.saturated);
    }
    full.load.queue_depth = 4;
    full.load.max_queue = 0;
    RouteTable old = build_route_table(two_sites(full, busy, "10.0.0.2:8443"), CostConfig{});
    for (const RouteCandidate& c : old.find("m")->candidates) {
        CHECK_FALSE(c.cost.saturated);
    }
}

TEST_CASE("route table: built for forwarding, a remote pool with no peer address is never chosen") {
    // The local pool is busy (a generation's wait) and the remote idle one far cheaper; but the
    // remote site takes no forwarded requests.
    mb::PoolInfo busy = serving_pool();
    busy.load.running = 8;
    mb::PoolInfo idle = serving_pool();
    const mb::MembershipSnapshot snap = two_sites(busy, idle, "");
    std::mt19937_64 rng(1);

    RouteTable listed = build_route_table(snap, CostConfig{});  // Not for forwarding.
    CHECK(choose(listed, {"m", ""}, SelectionConfig{}, rng).chosen->member == "ams");

    RouteTable t = build_route_table(snap, CostConfig{}, {}, /*need_peer_addr=*/true);
    const ModelPools* pools = t.find("m");
    REQUIRE(pools != nullptr);
    REQUIRE(pools->candidates.size() == 2);  // Still listed, for /admin/route.
    CHECK_FALSE(pools->candidates[0].reachable);
    CHECK(pools->candidates[1].reachable);
    RouteChoice c = choose(t, {"m", ""}, SelectionConfig{}, rng);
    REQUIRE(c.chosen != nullptr);
    CHECK(c.chosen->member == "fra");
    RouteDecision d = explain(t, {"m", ""}, SelectionConfig{}, rng);
    REQUIRE(d.candidates.size() == 2);
    CHECK(d.candidates[0].verdict == "unreachable (takes no forwarded requests)");
    CHECK(d.candidates[1].verdict == "chosen");

    // The local pool saturated: every pool that could take the request is, not "no pool".
    busy.load.queue_depth = 40;
    RouteTable full =
        build_route_table(two_sites(busy, idle, ""), CostConfig{}, {}, /*need_peer_addr=*/true);
    RouteChoice r = choose(full, {"m", ""}, SelectionConfig{}, rng);
    CHECK(r.chosen == nullptr);
    CHECK(r.rejection == Rejection::kAllSaturated);
    // Only an unreachable pool serves the model: none serves it here.
    busy.state = mb::PoolState::kDraining;
    RouteTable none =
        build_route_table(two_sites(busy, idle, ""), CostConfig{}, {}, /*need_peer_addr=*/true);
    CHECK(choose(none, {"m", ""}, SelectionConfig{}, rng).rejection ==
          Rejection::kNoPoolServesModel);
}
