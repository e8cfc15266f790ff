// A member that restarts (back after a death or a leave, or counting its state versions from 1
// again) with a site state too large to travel inline: until the new life's state is fetched,
// routing must not see the previous life's pools, which the new process may not serve yet. A
// suspect that refutes is the same life and keeps its state. Driven message by message through
// the single-member harness (memberlist_fixture.h), whose fetches are never answered.

#include <doctest/doctest.h>

#include "routing/membership/memberlist.h"
#include "routing/selection/route_table.h"
#include "tests/routing/memberlist_fixture.h"

namespace edge::routing::membership {
namespace {

constexpr const char* kAddrB = "10.0.0.2:7946";

// Whether the member's routing table has a pool of model "m" (what site_bytes() serves).
bool routes_model_m(Memberlist& ml) {
    return selection::build_route_table(*ml.snapshot(), selection::CostConfig{}).find("m") !=
           nullptr;
}

// Whether the member asked B for its state by a fetch.
bool fetched_b(Member& a) {
    for (const auto& s : a.transport().streams) {
        const auto* pp = std::get_if<PushPullMsg>(&s.msg);
        if (pp != nullptr && pp->fetch == "B" && s.to == kAddrB) {
            return true;
        }
    }
    return false;
}

// B's state of its life at incarnation 9 (version `version`, a pool of capacity 3), pushed to
// `a`: it is taken, and routes model "m" again.
void check_new_life_state_applies(Member& a, uint64_t version) {
    Memberlist& ml = a.ml();
    PushPullMsg fresh;
    fresh.nodes.push_back(PushPullNode{"B", kAddrB, 9, NodeState::kAlive, version,
                                       site_bytes("B", 3), std::nullopt});
    REQUIRE(a.push_pull(fresh).ok());
    CHECK(ml.site_version_of("B") == version);
    REQUIRE(ml.snapshot()->find("B")->site != nullptr);
    CHECK(ml.snapshot()->find("B")->site->pools.at(0).capacity == 3);
    CHECK(routes_model_m(ml));
}

TEST_CASE("memberlist: a member back after a death or leave keeps no previous life's state") {
    for (const bool left : {false, true}) {
        CAPTURE(left);
        Member a;
        Memberlist& ml = a.ml();
        const std::vector<uint8_t> old_bytes = site_bytes("B", 1);
        a.receive(AliveMsg{7, "B", kAddrB, 7, old_bytes});
        REQUIRE(routes_model_m(ml));
        a.receive(DeadMsg{7, "B", left ? "B" : "C"});
        REQUIRE(ml.state_of("B") == (left ? NodeState::kLeft : NodeState::kDead));

        // The new process: a higher incarnation, its state too large to inline.
        a.transport().streams.clear();
        a.receive(AliveMsg{9, "B", kAddrB, 1, std::nullopt});
        CHECK(ml.state_of("B") == NodeState::kAlive);
        CHECK(fetched_b(a));
        CHECK(ml.snapshot()->find("B")->site == nullptr);
        CHECK(ml.site_version_of("B") == 0);
        CHECK_FALSE(routes_model_m(ml));

        // The previous life's state arriving late, by gossip or by push-pull, is still refused.
        a.receive(AliveMsg{7, "B", kAddrB, 7, old_bytes});
        PushPullMsg stale;
        stale.nodes.push_back(
            PushPullNode{"B", kAddrB, 7, NodeState::kAlive, 7, old_bytes, std::nullopt});
        REQUIRE(a.push_pull(stale).ok());
        CHECK(ml.snapshot()->find("B")->site == nullptr);

        // The new life's state, once it arrives, routes again.
        check_new_life_state_applies(a, 1);
    }
}

TEST_CASE("memberlist: a restart seen before any death, by versions counted anew, drops state") {
    // Killed and restarted faster than it is found dead: the new life's alive reaches us while
    // we hold the member alive or suspect, and only its version, below the previous life's,
    // tells the lives apart.
    for (const bool suspected : {false, true}) {
        CAPTURE(suspected);
        Member a;
        Memberlist& ml = a.ml();
        a.receive(AliveMsg{7, "B", kAddrB, 7, site_bytes("B", 1)});
        if (suspected) {
            a.receive(SuspectMsg{7, "B", "C"});
            REQUIRE(ml.state_of("B") == NodeState::kSuspect);
        }
        a.transport().streams.clear();
        a.receive(AliveMsg{9, "B", kAddrB, 1, std::nullopt});
        CHECK(ml.state_of("B") == NodeState::kAlive);
        CHECK(fetched_b(a));
        CHECK(ml.snapshot()->find("B")->site == nullptr);
        CHECK_FALSE(routes_model_m(ml));
    }
}

TEST_CASE("memberlist: a refuted suspicion or a newer state being fetched keeps the state held") {
    Member a;
    Memberlist& ml = a.ml();
    a.receive(AliveMsg{7, "B", kAddrB, 7, site_bytes("B", 1)});
    // Refuting a suspicion lifts the incarnation, not the version: the same life.
    a.receive(SuspectMsg{7, "B", "C"});
    REQUIRE(ml.state_of("B") == NodeState::kSuspect);
    a.receive(AliveMsg{8, "B", kAddrB, 7, std::nullopt});
    CHECK(ml.state_of("B") == NodeState::kAlive);
    CHECK(ml.site_version_of("B") == 7);
    CHECK(routes_model_m(ml));
    // A newer state too large to inline: the one held routes while it is fetched.
    a.receive(AliveMsg{9, "B", kAddrB, 8, std::nullopt});
    CHECK(fetched_b(a));
    CHECK(ml.site_version_of("B") == 7);
    CHECK(ml.snapshot()->find("B")->site->pools.at(0).capacity == 1);
    CHECK(routes_model_m(ml));
}

TEST_CASE("memberlist: a push-pull missing the restart brings back no previous life's state") {
    // We hold B's state at (7,7) and miss its last one, (8,8). B dies at 8 and restarts at 9; a
    // peer that has not heard of the restart pushes its entry for B at 8, with the (8,8) state.
    // That entry's alive or suspicion is stale, and its state, above the key kept at the new
    // life, must not be taken either: it is the previous life's.
    for (const bool dead : {false, true}) {
        CAPTURE(dead);
        Member a;
        Memberlist& ml = a.ml();
        a.receive(AliveMsg{7, "B", kAddrB, 7, site_bytes("B", 1)});
        REQUIRE(routes_model_m(ml));
        a.receive(DeadMsg{8, "B", "C"});
        REQUIRE(ml.state_of("B") == NodeState::kDead);
        a.transport().streams.clear();
        a.receive(AliveMsg{9, "B", kAddrB, 1, std::nullopt});
        REQUIRE(fetched_b(a));
        REQUIRE(ml.snapshot()->find("B")->site == nullptr);

        const NodeState pushed = dead ? NodeState::kDead : NodeState::kAlive;
        PushPullMsg stale;
        stale.nodes.push_back(
            PushPullNode{"B", kAddrB, 8, pushed, 8, site_bytes("B", 2), std::nullopt});
        REQUIRE(a.push_pull(stale).ok());
        CHECK(ml.state_of("B") == NodeState::kAlive);
        CHECK(ml.snapshot()->find("B")->site == nullptr);
        CHECK(ml.site_version_of("B") == 0);
        CHECK_FALSE(routes_model_m(ml));
        // The new life's fetch is still the one pending: B's next state starts no other.
        a.transport().streams.clear();
        a.receive(AliveMsg{9, "B", kAddrB, 2, std::nullopt});
        CHECK_FALSE(fetched_b(a));

        // The new life's state still applies.
        check_new_life_state_applies(a, 2);
    }
}

TEST_CASE("memberlist: a member first heard of takes no state from below that incarnation") {
    // Heard of anew (or again, after its dead entry was reclaimed) at 9, its state being
    // fetched: an entry at 8 from a peer may be a previous life's, so it is not taken.
    Member a;
    Memberlist& ml = a.ml();
    a.receive(AliveMsg{9, "B", kAddrB, 1, std::nullopt});
    REQUIRE(fetched_b(a));
    PushPullMsg stale;
    stale.nodes.push_back(
        PushPullNode{"B", kAddrB, 8, NodeState::kAlive, 8, site_bytes("B", 2), std::nullopt});
    REQUIRE(a.push_pull(stale).ok());
    CHECK(ml.snapshot()->find("B")->site == nullptr);
    CHECK_FALSE(routes_model_m(ml));
    check_new_life_state_applies(a, 1);
}

// The router starts a life's outlier records afresh when MemberView::life changes: it must
// change at every new life handle_alive finds, and at nothing else.
TEST_CASE("memberlist: a member's life number changes exactly when it begins a new life") {
    Member a;
    Memberlist& ml = a.ml();
    auto life = [&] { return ml.snapshot()->find("B")->life; };
    a.receive(AliveMsg{7, "B", kAddrB, 7, site_bytes("B", 1)});
    const uint64_t first = life();
    CHECK(first != ml.snapshot()->find("A")->life);

    // Within one life: a newer state, a suspicion and its refutation (a higher incarnation,
    // versions not gone down), and stale or replayed alives.
    a.receive(AliveMsg{7, "B", kAddrB, 8, site_bytes("B", 2)});
    a.receive(SuspectMsg{7, "B", "C"});
    REQUIRE(ml.state_of("B") == NodeState::kSuspect);
    CHECK(life() == first);
    a.receive(AliveMsg{8, "B", kAddrB, 8, std::nullopt});
    REQUIRE(ml.state_of("B") == NodeState::kAlive);
    a.receive(AliveMsg{7, "B", kAddrB, 1, std::nullopt});
    a.receive(AliveMsg{8, "B", kAddrB, 8, std::nullopt});
    CHECK(life() == first);

    // Restarted before any death: a newer incarnation whose versions count from 1 again.
    a.receive(AliveMsg{9, "B", kAddrB, 1, site_bytes("B", 3)});
    const uint64_t second = life();
    CHECK(second != first);
    a.receive(AliveMsg{9, "B", kAddrB, 2, site_bytes("B", 3)});
    a.receive(AliveMsg{10, "B", kAddrB, 2, std::nullopt});
    CHECK(life() == second);

    // Back after a death, and after a leave: each a new life, the same one while it lasts.
    a.receive(DeadMsg{10, "B", "C"});
    REQUIRE(ml.state_of("B") == NodeState::kDead);
    CHECK(life() == second);
    a.receive(AliveMsg{11, "B", kAddrB, 3, std::nullopt});
    const uint64_t third = life();
    CHECK(third != second);
    CHECK(third != first);
    a.receive(DeadMsg{11, "B", "B"});
    REQUIRE(ml.state_of("B") == NodeState::kLeft);
    a.receive(AliveMsg{12, "B", kAddrB, 4, std::nullopt});
    CHECK(life() != third);
    CHECK(life() != second);
    CHECK(life() != first);
}

}  // namespace
}  // namespace edge::routing::membership
