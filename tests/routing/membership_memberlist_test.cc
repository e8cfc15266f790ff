// Memberlist driven message by message through the single-member harness (memberlist_fixture.h):
// any sequence of messages (stale, reordered, replayed) fed in, and exactly what it concludes and
// what it tells others checked.

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>

#include "routing/membership/memberlist.h"
#include "tests/routing/memberlist_fixture.h"

namespace edge::routing::membership {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// SWIM's rule: only a higher incarnation refutes. An alive at the incarnation that was accused
// (or that left) was sent before the accusation, whatever it carries; arriving late (reordered,
// or replayed by push-pull or gossip), it must not bring the member back or clear a suspicion.
TEST_CASE(
    "memberlist: an alive at the same incarnation does not undo a suspicion, death or leave") {
    Member a;
    Memberlist& ml = a.ml();

    // Dead at 6: its own alive(6) with a newer state version arrives late.
    a.receive(AliveMsg{5, "X", "10.0.0.9:7946", 5, site_bytes("X", 5)});
    a.receive(SuspectMsg{6, "X", "B"});
    a.receive(DeadMsg{6, "X", "B"});
    REQUIRE(ml.state_of("X") == NodeState::kDead);
    const size_t live = ml.num_live();
    a.events.clear();
    a.receive(AliveMsg{6, "X", "10.0.0.9:7946", 6, site_bytes("X", 6)});
    CHECK(ml.state_of("X") == NodeState::kDead);
    CHECK(ml.num_live() == live);
    CHECK(a.events.empty());
    // The death is still what it gossips about X, not the stale alive (same broadcast key).
    auto queued = a.queued_about("X");
    REQUIRE(queued.size() == 1);
    CHECK(std::holds_alternative<DeadMsg>(queued[0]));

    // Suspected at 11: its alive(11) stays a suspect; the newer state it carries is taken.
    a.receive(AliveMsg{10, "Y", "10.0.0.8:7946", 10, site_bytes("Y", 10)});
    a.receive(SuspectMsg{11, "Y", "B"});
    REQUIRE(ml.state_of("Y") == NodeState::kSuspect);
    a.events.clear();
    a.receive(AliveMsg{11, "Y", "10.0.0.8:7946", 11, site_bytes("Y", 11)});
    CHECK(ml.state_of("Y") == NodeState::kSuspect);
    CHECK(ml.site_version_of("Y") == 11);
    for (const MemberEvent& e : a.events) {
        CHECK(e.kind == MemberEventKind::kUpdate);
    }
    queued = a.queued_about("Y");
    REQUIRE(queued.size() == 1);
    CHECK(std::holds_alternative<SuspectMsg>(queued[0]));

    // Left at 21: its alive(21) does not bring it back.
    a.receive(AliveMsg{20, "Z", "10.0.0.7:7946", 20, site_bytes("Z", 20)});
    a.receive(DeadMsg{21, "Z", "Z"});
    REQUIRE(ml.state_of("Z") == NodeState::kLeft);
    a.events.clear();
    a.receive(AliveMsg{21, "Z", "10.0.0.7:7946", 21, site_bytes("Z", 21)});
    CHECK(ml.state_of("Z") == NodeState::kLeft);
    CHECK(a.events.empty());

    // The same states from a peer's push-pull change nothing either.
    PushPullMsg pp;
    pp.nodes.push_back(PushPullNode{"X", "10.0.0.9:7946", 6, NodeState::kAlive, 7,
                                    site_bytes("X", 7), std::nullopt});
    pp.nodes.push_back(PushPullNode{"Y", "10.0.0.8:7946", 11, NodeState::kAlive, 11,
                                    site_bytes("Y", 11), std::nullopt});
    pp.nodes.push_back(PushPullNode{"Z", "10.0.0.7:7946", 21, NodeState::kAlive, 22,
                                    site_bytes("Z", 22), std::nullopt});
    std::vector<std::vector<uint8_t>> framed{encode_message(pp)};
    a.events.clear();
    auto reply =
        ml.handle_stream("10.0.0.2:7946", Keyring{}.seal("", encode_packet(framed)).value());
    CHECK(reply.ok());
    CHECK(ml.state_of("X") == NodeState::kDead);
    CHECK(ml.state_of("Y") == NodeState::kSuspect);
    CHECK(ml.state_of("Z") == NodeState::kLeft);
    // A member that is gone keeps the state it went with.
    CHECK(ml.site_version_of("X") == 5);
    CHECK(ml.site_version_of("Z") == 20);
    CHECK(a.events.empty());
    CHECK(ml.num_live() == live + 1);  // A and the suspect Y

    // A higher incarnation still refutes, as ever.
    a.receive(AliveMsg{7, "X", "10.0.0.9:7946", 1, site_bytes("X", 1)});
    CHECK(ml.state_of("X") == NodeState::kAlive);
    a.receive(AliveMsg{12, "Y", "10.0.0.8:7946", 12, site_bytes("Y", 12)});
    CHECK(ml.state_of("Y") == NodeState::kAlive);
}

// A failed round ends when the next one is due: its end timer and the next probe tick share one
// deadline. Concluding it must not cost that next round, or a member probes at half rate exactly
// when members stop answering.
TEST_CASE("memberlist: failed probes do not slow the probe rate") {
    MembershipConfig c = lan_profile();
    c.tcp_fallback_probe = false;
    c.awareness_max_multiplier = 1;  // failed probes would otherwise stretch the interval
    c.suspicion_mult = 1000;         // the silent members stay suspects for the whole run
    Member a(c);
    for (const char* n : {"W", "X", "Y", "Z"}) {
        a.receive(AliveMsg{1, n, std::string(n) + ":7946", 0, std::nullopt});
    }
    a.transport().sent.clear();
    const TimePoint start = a.clock().now();
    a.ml().start();
    a.run_until(start + seconds(10));

    std::vector<TimePoint> pings;
    for (const auto& s : a.transport().sent) {
        if (std::holds_alternative<PingMsg>(s.msg)) {
            pings.push_back(s.at);
        }
    }
    // The first round starts at a random phase within the first interval.
    CHECK(pings.size() >= 10);
    CHECK(pings.size() <= 11);
    for (size_t i = 1; i < pings.size(); ++i) {
        CAPTURE(i);
        CHECK(pings[i] - pings[i - 1] == c.probe_interval);
    }
    CHECK(a.ml().stats().probe_failures.load() >= 9);
    CHECK(a.ml().state_of("W") == NodeState::kSuspect);
}

// The decoder refuses Lamport times at or above kMaxEventLtime; the clock may still reach the
// last one below it by witnessing (here from its first push-pull, which may jump), and then it
// must not send (and so wrap, or be refused by every receiver) but say so.
TEST_CASE("memberlist: a user event Lamport clock at its cap refuses to send, it never wraps") {
    Member a;
    std::vector<uint64_t> delivered;
    a.ml().set_user_event_callback([&](const UserEventMsg& e) { delivered.push_back(e.ltime); });
    PushPullMsg pp;
    pp.event_ltime = kMaxEventLtime - 3;
    REQUIRE(a.push_pull(pp).ok());
    a.receive(UserEventMsg{kMaxEventLtime - 2, "rollout", {1}});
    REQUIRE(delivered == std::vector<uint64_t>{kMaxEventLtime - 2});
    REQUIRE(a.ml().send_user_event("rollout", {2}).ok());
    CHECK(delivered.back() == kMaxEventLtime - 1);
    const Status s = a.ml().send_user_event("rollout", {3});
    CHECK(s.code() == StatusCode::kResourceExhausted);
    CHECK(s.message().find("Lamport") != std::string::npos);
    CHECK(delivered.size() == 2);
}

TEST_CASE("memberlist: a stream is one request, more messages in it are refused, not answered") {
    Member a;
    PushPullMsg pp;
    std::vector<std::vector<uint8_t>> framed{encode_message(pp), encode_message(pp),
                                             encode_message(pp)};
    // Each push-pull would be answered with the whole cluster's state.
    auto reply =
        a.ml().handle_stream("10.0.0.2:7946", Keyring{}.seal("", encode_packet(framed)).value());
    REQUIRE_FALSE(reply.ok());
    CHECK(reply.status().message().find("carries 3 messages") != std::string::npos);
    framed.resize(1);
    CHECK(a.ml()
              .handle_stream("10.0.0.2:7946", Keyring{}.seal("", encode_packet(framed)).value())
              .ok());
    // A packet of more messages than any real one holds is refused whole.
    std::vector<std::vector<uint8_t>> many(kMaxMessagesPerPacket + 1, encode_message(NackMsg{1}));
    auto decoded = decode_packet(encode_packet(many));
    REQUIRE_FALSE(decoded.ok());
    CHECK(decoded.status().message().find("more than 8192 messages") != std::string::npos);
    many.resize(kMaxMessagesPerPacket);
    CHECK(decode_packet(encode_packet(many)).ok());
}

TEST_CASE("memberlist: a state learnt by push-pull too large for a packet is gossiped without it") {
    MembershipConfig c = lan_profile();
    Member a(c);
    PushPullMsg pp;
    SiteState big;
    big.site_id = "X";
    for (int i = 0; i < 40; ++i) {
        PoolInfo p;
        p.model = "model-with-a-long-name-" + std::to_string(i);
        p.version_digest = std::string(64, 'a');
        big.pools.push_back(p);
    }
    const std::vector<uint8_t> bytes = encode_site_state(big);
    REQUIRE(bytes.size() > c.mtu);
    pp.nodes.push_back(
        PushPullNode{"X", "10.0.0.9:7946", 3, NodeState::kAlive, 3, bytes, std::nullopt});
    std::vector<std::vector<uint8_t>> framed{encode_message(pp)};
    REQUIRE(a.ml()
                .handle_stream("10.0.0.2:7946", Keyring{}.seal("", encode_packet(framed)).value())
                .ok());
    CHECK(a.ml().site_version_of("X") == 3);  // Taken here...
    auto queued = a.queued_about("X");
    REQUIRE(queued.size() == 1);
    const auto* alive = std::get_if<AliveMsg>(&queued[0]);
    REQUIRE(alive != nullptr);
    CHECK(alive->incarnation == 3);
    CHECK(alive->state_version == 3);
    CHECK_FALSE(alive->state.has_value());  // ...passed on bare: others fetch it from X.
}

TEST_CASE("memberlist: an incarnation implausibly far past the known one is dropped") {
    Member a;
    Memberlist& ml = a.ml();
    a.receive(AliveMsg{5, "X", "10.0.0.9:7946", 5, site_bytes("X", 5)});
    REQUIRE(ml.state_of("X") == NodeState::kAlive);
    // A suspicion (or death) near the cap: taken, X could never refute it (its alive would tie).
    a.receive(SuspectMsg{kMaxIncarnation - 1, "X", "B"});
    a.receive(DeadMsg{kMaxIncarnation - 1, "X", "B"});
    CHECK(ml.state_of("X") == NodeState::kAlive);
    a.receive(AliveMsg{kMaxIncarnation - 1, "X", "10.6.6.6:7946", 9, site_bytes("X", 9)});
    CHECK(ml.site_version_of("X") == 5);
    // The same about this member itself: no refutation up to the cap.
    a.receive(SuspectMsg{kMaxIncarnation - 1, "A", "B"});
    auto ours = a.queued_about("A");
    for (const Message& m : ours) {
        if (const auto* alive = std::get_if<AliveMsg>(&m)) {
            CHECK(alive->incarnation < 100);
        }
    }
    CHECK(ml.stats().implausible_dropped.load() == 4);
    // An ordinary newer incarnation still refutes and suspects as ever.
    a.receive(SuspectMsg{6, "X", "B"});
    CHECK(ml.state_of("X") == NodeState::kSuspect);
    a.receive(AliveMsg{7, "X", "10.0.0.9:7946", 7, site_bytes("X", 7)});
    CHECK(ml.state_of("X") == NodeState::kAlive);
}

// A member not known yet has no incarnation to be implausibly far past, but no life of a site
// starts at or rises to one past 2^32 (it starts below 2^32 and adds one a publish or
// refutation). Taken, a forged alive near the cap for a site not yet known (new, or reaped after
// it left) held it at the forged address: the site's own alives were older, and its handlers
// drop the forged incarnation as implausible, so it could not refute and ended dead for
// dead_reclaim_time.
TEST_CASE("memberlist: a new member's alive at an incarnation no life reaches is dropped") {
    Member a;
    Memberlist& ml = a.ml();
    a.receive(AliveMsg{kMaxIncarnation - 1, "X", "10.6.6.6:7946", 9, site_bytes("X", 9)});
    CHECK_FALSE(ml.state_of("X").has_value());
    CHECK(ml.stats().implausible_dropped.load() == 1);
    // The same from a push-pull entry, just past the bound.
    PushPullMsg pp;
    pp.nodes.push_back(PushPullNode{"X", "10.6.6.6:7946", (uint64_t{1} << 32) + 1,
                                    NodeState::kAlive, 9, site_bytes("X", 9), std::nullopt});
    REQUIRE(a.push_pull(pp).ok());
    CHECK_FALSE(ml.state_of("X").has_value());
    CHECK(ml.stats().implausible_dropped.load() == 2);
    // The real site, at a life's incarnation (the wall-clock second), is taken as ever.
    a.receive(AliveMsg{1'800'000'000, "X", "10.0.0.9:7946", 3, site_bytes("X", 3)});
    CHECK(ml.state_of("X") == NodeState::kAlive);
    CHECK(ml.snapshot()->find("X")->addr == "10.0.0.9:7946");
    CHECK(ml.site_version_of("X") == 3);
    // So is one at the bound: a site at 0 still refutes an accusation there.
    a.receive(AliveMsg{uint64_t{1} << 32, "Y", "10.0.0.8:7946", 1, std::nullopt});
    CHECK(ml.state_of("Y") == NodeState::kAlive);
    CHECK(ml.stats().implausible_dropped.load() == 2);
}

// The alives `a` sent to `addr`.
std::vector<AliveMsg> alives_sent_to(Member& a, const std::string& addr) {
    std::vector<AliveMsg> alives;
    for (const auto& s : a.transport().sent) {
        if (const auto* alive = std::get_if<AliveMsg>(&s.msg); alive && s.to == addr) {
            alives.push_back(*alive);
        }
    }
    return alives;
}

// Hands `a` a packet holding `m` from `addr`.
void receive_from(Member& a, const std::string& addr, const Message& m) {
    std::vector<std::vector<uint8_t>> framed{encode_message(m)};
    a.ml().handle_packet(addr, Keyring{}.seal("", encode_packet(framed)).value());
}

// A packet's source is not authenticated: a captured stale suspect or dead, replayed with the
// source spoofed to some address, had every member send that address an alive per replay.
TEST_CASE("memberlist: a stale accusation is answered directly only at a member's address") {
    Member a;
    Memberlist& ml = a.ml();
    a.receive(AliveMsg{5, "X", "10.0.0.9:7946", 5, site_bytes("X", 5)});
    const std::string victim = "192.0.2.99:53";
    a.transport().sent.clear();
    receive_from(a, victim, SuspectMsg{4, "X", "Z"});
    receive_from(a, victim, DeadMsg{4, "X", "Z"});
    receive_from(a, victim, SuspectMsg{0, "A", "Z"});  // About this member, stale too.
    CHECK(alives_sent_to(a, victim).empty());
    CHECK(a.transport().sent.empty());
    CHECK(ml.state_of("X") == NodeState::kAlive);

    // A member's address (B's, where the fixture's packets come from) is answered: by the
    // accuser, or by a member passing the accusation on.
    a.receive(AliveMsg{3, "B", "10.0.0.2:7946", 0, std::nullopt});
    for (const std::string accuser : {"B", "Z"}) {
        CAPTURE(accuser);
        a.transport().sent.clear();
        a.receive(SuspectMsg{4, "X", accuser});
        const auto alives = alives_sent_to(a, "10.0.0.2:7946");
        REQUIRE_FALSE(alives.empty());  // The correction first, then gossip riding along.
        CHECK(alives[0].node == "X");
        CHECK(alives[0].incarnation == 5);
    }
}

// The source was compared with members' addresses as strings: a site bound to `::` sees an IPv4
// peer's packets come from [::ffff:a.b.c.d]:port, a site behind NAT or a published port sends
// from a port other than the one it advertises, and an IPv6 advertise_address is gossiped as
// written. None was ever answered, which left a stale accusation to run out its timer.
TEST_CASE("memberlist: a stale accusation is answered only at the member at its source") {
    Member a;
    Memberlist& ml = a.ml();
    a.receive(AliveMsg{5, "X", "10.0.0.9:7946", 5, site_bytes("X", 5)});
    a.receive(AliveMsg{3, "B", "10.0.0.2:7946", 0, std::nullopt});
    a.receive(AliveMsg{3, "C", "[2001:db8::5]:7946", 0, std::nullopt});
    auto from = [&](const std::string& addr, const Message& m) {
        a.transport().sent.clear();
        receive_from(a, addr, m);
    };
    // The correction first, then gossip riding along.
    auto corrected = [&](const std::string& addr) {
        const auto alives = alives_sent_to(a, addr);
        return !alives.empty() && alives[0].node == "X" && alives[0].incarnation == 5;
    };

    // B's address as a dual-stack socket reports it, the accuser unknown: B is told, at the
    // address it advertises.
    from("[::ffff:10.0.0.2]:7946", SuspectMsg{4, "X", "Z"});
    CHECK(corrected("10.0.0.2:7946"));
    // C's IPv6 address spelled as the kernel writes a source.
    from("[2001:db8:0::5]:7946", DeadMsg{4, "X", "Z"});
    CHECK(corrected("[2001:db8::5]:7946"));
    // The accuser B from a source no member is at (NAT, a published port, or a replay from any
    // host): nothing is sent, to the source or to B; a replayer would otherwise drive every
    // member's packets at B, each spending a transmit of the queued gossip.
    for (const std::string source : {"10.0.0.2:17946", "192.0.2.99:53"}) {
        CAPTURE(source);
        for (int i = 0; i < 20; ++i) {
            from(source, SuspectMsg{4, "X", "B"});
            CHECK(a.transport().sent.empty());
        }
    }
    // Neither the accuser nor the source a member: nothing is sent.
    from("10.0.0.2:17946", SuspectMsg{4, "X", "Z"});
    CHECK(a.transport().sent.empty());
    // This site named as the accuser is not told its own news, nor is the source.
    from("192.0.2.99:53", SuspectMsg{4, "X", "A"});
    CHECK(a.transport().sent.empty());
    // A dead accuser is not told at its address from a source elsewhere.
    a.receive(SuspectMsg{3, "B", "A"});
    a.receive(DeadMsg{3, "B", "A"});
    REQUIRE(ml.state_of("B") == NodeState::kDead);
    from("192.0.2.99:53", SuspectMsg{4, "X", "B"});
    CHECK(a.transport().sent.empty());
}

TEST_CASE("memberlist: forged new names stop at max_members, fetches at max_fetches_in_flight") {
    MembershipConfig c = lan_profile();
    c.max_members = 50;
    c.max_fetches_in_flight = 4;
    Member a(c);
    // Each new name with a newer state than known (none inline) asks for a fetch from its owner.
    for (int i = 0; i < 100; ++i) {
        a.receive(
            AliveMsg{1, "forged" + std::to_string(i),
                     "10.9." + std::to_string(i / 250) + "." + std::to_string(i % 250) + ":7946", 1,
                     std::nullopt});
    }
    CHECK(a.ml().num_live() == 50);  // This member and 49 others.
    CHECK(a.ml().stats().members_refused.load() == 51);
    CHECK(a.ml().stats().push_pulls.load() == 4);  // The rest wait for a free fetch.
}

TEST_CASE("memberlist: a relay's nack reaches the prober before its round ends") {
    // lan: probe every 1 s, direct wait 500 ms. The prober asks for an indirect probe at 500 ms
    // and concludes at 1 s; the relay's nack must come before that (at 4/5 of the 500 ms left),
    // and an ack the target sends after the nack is still passed on until probe_timeout.
    Member a;
    a.transport().sent.clear();
    const TimePoint start = a.clock().now();
    a.receive(IndirectPingMsg{7, "T", "10.0.0.5:7946", "P", "10.0.0.4:7946", true});
    uint64_t relayed = 0;
    for (const auto& s : a.transport().sent) {
        if (const auto* ping = std::get_if<PingMsg>(&s.msg);
            ping != nullptr && s.to == "10.0.0.5:7946") {
            relayed = ping->seq;
        }
    }
    REQUIRE(relayed != 0);
    a.transport().sent.clear();
    a.run_until(start + milliseconds(400));
    REQUIRE(a.transport().sent.size() == 1);
    CHECK(a.transport().sent[0].to == "10.0.0.4:7946");
    const auto* nack = std::get_if<NackMsg>(&a.transport().sent[0].msg);
    REQUIRE(nack != nullptr);
    CHECK(nack->seq == 7);
    a.transport().sent.clear();
    a.run_until(start + milliseconds(450));
    a.receive(AckMsg{relayed, std::nullopt});
    REQUIRE(a.transport().sent.size() == 1);
    CHECK(std::holds_alternative<AckMsg>(a.transport().sent[0].msg));
    CHECK(std::get<AckMsg>(a.transport().sent[0].msg).seq == 7);
    // One nack only, and past probe_timeout nothing is relayed.
    a.transport().sent.clear();
    a.receive(IndirectPingMsg{8, "T", "10.0.0.5:7946", "P", "10.0.0.4:7946", true});
    a.run_until(a.clock().now() + milliseconds(600));
    size_t nacks = 0;
    for (const auto& s : a.transport().sent) {
        nacks += std::holds_alternative<NackMsg>(s.msg) ? 1 : 0;
    }
    CHECK(nacks == 1);
}

TEST_CASE("memberlist: a site state too large to inline is fetched alone, not by two tables") {
    // Every other member fetches such a state each time it changes (up to once a second, with
    // load): the request names the member and carries no table, the answer its entry only.
    Member a;
    a.receive(AliveMsg{1, "B", "10.0.0.2:7946", 1, site_bytes("B", 1)});
    a.receive(AliveMsg{1, "C", "10.0.0.3:7946", 1, site_bytes("C", 1)});
    a.transport().streams.clear();
    a.receive(AliveMsg{2, "C", "10.0.0.3:7946", 2, std::nullopt});  // Newer, not inline.
    REQUIRE(a.transport().streams.size() == 1);
    CHECK(a.transport().streams[0].to == "10.0.0.3:7946");
    const auto* request = std::get_if<PushPullMsg>(&a.transport().streams[0].msg);
    REQUIRE(request != nullptr);
    CHECK(request->fetch == "C");
    CHECK(request->nodes.empty());
    CHECK(request->events.empty());

    // Answering one: the entry asked for, alone; a name it does not know, nothing.
    auto answer = [&](const std::string& wanted) {
        PushPullMsg pp;
        pp.fetch = wanted;
        std::vector<std::vector<uint8_t>> framed{encode_message(pp)};
        auto reply = a.ml().handle_stream("10.0.0.3:7946",
                                          Keyring{}.seal("", encode_packet(framed)).value());
        REQUIRE(reply.ok());
        auto msgs = decode_packet(Keyring{}.open("", *reply).value());
        REQUIRE(msgs.ok());
        REQUIRE(msgs->size() == 1);
        return std::get<PushPullMsg>(msgs->front());
    };
    const PushPullMsg b = answer("B");
    REQUIRE(b.nodes.size() == 1);
    CHECK(b.nodes[0].name == "B");
    CHECK(b.nodes[0].site_state == site_bytes("B", 1));
    CHECK(b.events.empty());
    const PushPullMsg self = answer("A");
    REQUIRE(self.nodes.size() == 1);
    CHECK(self.nodes[0].name == "A");
    CHECK_FALSE(self.nodes[0].site_state.empty());
    CHECK(answer("nobody").nodes.empty());
    CHECK(a.ml().num_live() == 3);  // A fetch request adds and changes nobody.
}

TEST_CASE("memberlist: a member's site state names its own site or is refused") {
    Member a;
    Memberlist& ml = a.ml();
    a.receive(AliveMsg{5, "X", "10.0.0.9:7946", 5, site_bytes("X", 5)});
    REQUIRE(ml.site_version_of("X") == 5);
    // X speaking for Y: routing files pool health and forwarding outcomes by site id, so it
    // could blame (or vouch for) Y's pools.
    a.receive(AliveMsg{6, "X", "10.0.0.9:7946", 6, site_bytes("Y", 6)});
    CHECK(ml.site_version_of("X") == 5);
    CHECK(ml.stats().decode_failures.load() == 1);
    a.receive(AliveMsg{7, "X", "10.0.0.9:7946", 7, site_bytes("", 7)});
    CHECK(ml.site_version_of("X") == 5);
    CHECK(ml.stats().decode_failures.load() == 2);
    const auto snapshot = ml.snapshot();
    const MemberView* x = snapshot->find("X");
    REQUIRE(x != nullptr);
    REQUIRE(x->site != nullptr);
    CHECK(x->site->site_id == "X");
    CHECK(x->site->pools.at(0).capacity == 5);

    // This member's own state carries its name whatever the caller put there.
    SiteState mine;
    mine.site_id = "not-A";
    mine.region = "eu";
    ml.update_site_state(mine);
    const MemberView* self = ml.snapshot()->find("A");
    REQUIRE(self != nullptr);
    REQUIRE(self->site != nullptr);
    CHECK(self->site->site_id == "A");
    CHECK(self->site->region == "eu");

    // And a member created with another site's state is refused.
    ManualClock clock;
    RecordingTransport transport(clock);
    MembershipConfig c = lan_profile();
    c.name = "B";
    c.advertise_addr = "10.0.0.2:7946";
    SiteState other;
    other.site_id = "C";
    auto refused = Memberlist::create(c, Keyring{}, clock, transport, other);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().message().find("'C' is not the member name 'B'") != std::string::npos);
    auto unnamed = Memberlist::create(c, Keyring{}, clock, transport, SiteState{});
    REQUIRE(unnamed.ok());
    CHECK((*unnamed)->snapshot()->find("B")->site->site_id == "B");
}

// A process that crashed and came back can be at the incarnation and version its previous life
// had (both start at 1): the state bytes are all that tell the lives apart. Gossip or a push-pull
// that still carries the previous life's state about this member must be refuted above it, or
// the cluster keeps that state for good.
TEST_CASE("memberlist: an alive about this member at its incarnation with other state is refuted") {
    Member a;
    Memberlist& ml = a.ml();
    const std::vector<uint8_t> mine = encode_site_state(*ml.snapshot()->find("A")->site);
    REQUIRE(ml.snapshot()->find("A")->incarnation == 1);
    a.receive(AliveMsg{1, "A", "10.0.0.1:7946", 1, site_bytes("A", 9)});
    CHECK(ml.stats().refutations.load() == 1);
    auto queued = a.queued_about("A");
    REQUIRE(queued.size() == 1);
    const auto* alive = std::get_if<AliveMsg>(&queued[0]);
    REQUIRE(alive != nullptr);
    CHECK(alive->incarnation == 2);
    CHECK(alive->state == mine);

    // Its own alive coming back is not refuted; it is the same state.
    a.receive(AliveMsg{2, "A", "10.0.0.1:7946", 1, mine});
    CHECK(ml.stats().refutations.load() == 1);

    // The entry for this member in a peer's push-pull, likewise.
    PushPullMsg pp;
    pp.nodes.push_back(PushPullNode{"A", "10.0.0.1:7946", 2, NodeState::kAlive, 1,
                                    site_bytes("A", 9), std::nullopt});
    std::vector<std::vector<uint8_t>> framed{encode_message(pp)};
    REQUIRE(
        ml.handle_stream("10.0.0.2:7946", Keyring{}.seal("", encode_packet(framed)).value()).ok());
    CHECK(ml.stats().refutations.load() == 2);
    CHECK(ml.snapshot()->find("A")->incarnation == 3);
    CHECK(ml.snapshot()->find("A")->site->pools.empty());
}

// probe_timeout == probe_interval passed validation, but a failed round ends when the next probe
// is due, before the direct wait runs out: indirect and TCP probes were never sent, and one lost
// ping made a suspect.
TEST_CASE("memberlist: probe_timeout must be less than probe_interval") {
    for (MembershipConfig c : {lan_profile(), wan_profile(), local_profile()}) {
        c.name = "A";
        c.advertise_addr = "10.0.0.1:7946";
        CHECK(c.validate().ok());
    }
    MembershipConfig c = lan_profile();
    c.name = "A";
    c.advertise_addr = "10.0.0.1:7946";
    c.probe_timeout = c.probe_interval;
    const Status s = c.validate();
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("probe_timeout (1000 ms) must be less than probe_interval (1000 ms)") !=
          std::string::npos);
    c.probe_timeout = std::chrono::milliseconds(999);
    CHECK(c.validate().ok());
    ManualClock clock;
    RecordingTransport transport(clock);
    c.probe_timeout = c.probe_interval;
    CHECK_FALSE(Memberlist::create(c, Keyring{}, clock, transport, SiteState{}).ok());
}

// Lifeguard: any ack is a successful probe and lowers the local health score. An ack relayed by a
// helper after the direct wait raised it instead, so a member that reached a peer only indirectly
// (a lossy direct path) stretched its probe interval toward the cap and never recovered.
TEST_CASE("memberlist: an ack relayed by a helper lowers the awareness score") {
    MembershipConfig c = lan_profile();
    c.tcp_fallback_probe = false;
    Member a(c);
    for (const char* n : {"W", "X", "Y", "Z"}) {
        a.receive(AliveMsg{1, n, std::string(n) + ":7946", 0, std::nullopt});
    }
    a.receive(SuspectMsg{1, "A", "B"});  // Refuted: the score rises to 1.
    REQUIRE(a.ml().awareness_score() == 1);
    a.transport().sent.clear();
    a.ml().start();
    const PingMsg* ping = nullptr;
    TimePoint sent{};
    for (int step = 0; step < 300 && ping == nullptr; ++step) {
        a.run_until(a.clock().now() + milliseconds(10));
        for (const auto& s : a.transport().sent) {
            if ((ping = std::get_if<PingMsg>(&s.msg)) != nullptr) {
                sent = s.at;
                break;
            }
        }
    }
    REQUIRE(ping != nullptr);
    const uint64_t seq = ping->seq;
    const std::string target = ping->target;
    a.run_until(sent + c.probe_timeout + milliseconds(10));  // The direct wait runs out...
    size_t helpers = 0;
    for (const auto& s : a.transport().sent) {
        helpers += std::holds_alternative<IndirectPingMsg>(s.msg) ? 1 : 0;
    }
    REQUIRE(helpers == 3);
    a.receive(AckMsg{seq, std::nullopt});  // ...and a helper relays the target's ack.
    CHECK(a.ml().awareness_score() == 0);
    CHECK(a.ml().stats().probe_failures.load() == 0);
    CHECK(a.ml().state_of(target) == NodeState::kAlive);
}

// A coordinate only steers routing: an ack carrying one this version cannot use (here valid while
// the limit was 1000 s) was refused whole, so the probe failed and the member that sent it, alive
// and answering, was suspected round after round. The ack counts; the coordinate is left out.
TEST_CASE("memberlist: an ack with a coordinate out of range still answers the probe") {
    MembershipConfig c = lan_profile();
    c.tcp_fallback_probe = false;
    Member a(c);
    a.receive(AliveMsg{1, "B", "10.0.0.2:7946", 0, std::nullopt});
    a.transport().sent.clear();
    a.ml().start();
    const PingMsg* ping = nullptr;
    for (int step = 0; step < 300 && ping == nullptr; ++step) {
        a.run_until(a.clock().now() + milliseconds(10));
        for (const auto& s : a.transport().sent) {
            if ((ping = std::get_if<PingMsg>(&s.msg)) != nullptr) {
                break;
            }
        }
    }
    REQUIRE(ping != nullptr);
    coords::Coordinate far;
    far.vec[0] = coords::kCoordinateLimit + 5.0;
    a.receive(AckMsg{ping->seq, far});
    a.run_until(a.clock().now() + c.probe_interval);
    CHECK(a.ml().stats().probe_failures.load() == 0);
    CHECK(a.ml().state_of("B") == NodeState::kAlive);
    CHECK_FALSE(a.ml().snapshot()->find("B")->coord.has_value());
}

// The handlers drop an incarnation implausibly far past the known one, but a push-pull entry's
// site state was taken apart from them: held under that incarnation, it outranked every state the
// member published from then on, and the cluster kept the forged one for good.
TEST_CASE("memberlist: a push-pull entry's state at an incarnation the handlers dropped is refused") {
    Member a;
    Memberlist& ml = a.ml();
    a.receive(AliveMsg{5, "X", "10.0.0.9:7946", 5, site_bytes("X", 5)});
    REQUIRE(ml.site_version_of("X") == 5);
    const uint64_t forged = 5 + (uint64_t{1} << 33);
    for (NodeState state : {NodeState::kAlive, NodeState::kSuspect}) {
        CAPTURE(node_state_name(state));
        PushPullMsg pp;
        pp.nodes.push_back(PushPullNode{"X", "10.0.0.9:7946", forged, state, 9, site_bytes("X", 9),
                                        std::nullopt});
        REQUIRE(a.push_pull(pp).ok());
        CHECK(ml.state_of("X") == NodeState::kAlive);
        CHECK(ml.site_version_of("X") == 5);
    }
    CHECK(ml.stats().implausible_dropped.load() == 2);
    // X's own next state is taken as ever.
    a.receive(AliveMsg{6, "X", "10.0.0.9:7946", 6, site_bytes("X", 6)});
    CHECK(ml.site_version_of("X") == 6);
    CHECK(ml.snapshot()->find("X")->site->pools.at(0).capacity == 6);
    // A push-pull entry at a plausible newer incarnation still brings its state.
    PushPullMsg pp;
    pp.nodes.push_back(PushPullNode{"X", "10.0.0.9:7946", 7, NodeState::kAlive, 7,
                                    site_bytes("X", 7), std::nullopt});
    REQUIRE(a.push_pull(pp).ok());
    CHECK(ml.site_version_of("X") == 7);
}

// A mixed-version rollout: a newer member's table holds a node state and a pool state this
// version does not know. Either one made the member drop the whole push-pull (or the whole site
// state), so one newer member stopped full-state sync for every older one.
TEST_CASE("memberlist: a newer peer's push-pull is taken but for its unknown states") {
    Member a;
    Memberlist& ml = a.ml();
    SiteState b_site;
    b_site.site_id = "B";
    PoolInfo serving{"m", "v", PoolState::kServing, 8, {}};
    PoolInfo newer{"n", "v", static_cast<PoolState>(4), 8, {}};
    b_site.pools = {newer, serving};
    PushPullMsg pp;
    pp.nodes.push_back(PushPullNode{"B", "10.0.0.2:7946", 1, NodeState::kAlive, 1,
                                    encode_site_state(b_site), std::nullopt});
    pp.nodes.push_back(PushPullNode{"C", "10.0.0.3:7946", 1, static_cast<NodeState>(6), 1, {},
                                    std::nullopt});
    pp.nodes.push_back(PushPullNode{"D", "10.0.0.4:7946", 1, NodeState::kAlive, 1,
                                    site_bytes("D", 2), std::nullopt});
    pp.event_ltime = 4;
    pp.events.push_back(UserEventMsg{4, "rollout", {1}});
    auto answer = a.push_pull(pp);
    REQUIRE(answer.ok());
    CHECK(ml.stats().decode_failures.load() == 0);
    CHECK(ml.state_of("B") == NodeState::kAlive);
    CHECK(ml.state_of("D") == NodeState::kAlive);
    CHECK_FALSE(ml.state_of("C").has_value());
    const auto snapshot = ml.snapshot();
    const MemberView* b = snapshot->find("B");
    REQUIRE(b != nullptr);
    REQUIRE(b->site != nullptr);
    REQUIRE(b->site->pools.size() == 1);  // Pool "n" is never routed to.
    CHECK(b->site->pools[0] == serving);
    CHECK(ml.site_version_of("D") == 1);
    // B's state is passed on as B sent it, so newer members still learn pool "n" from this one.
    auto msgs = decode_packet(Keyring{}.open("", *answer).value());
    REQUIRE(msgs.ok());
    bool relayed = false;
    for (const PushPullNode& n : std::get<PushPullMsg>(msgs->at(0)).nodes) {
        relayed = relayed || (n.name == "B" && n.site_state == encode_site_state(b_site));
    }
    CHECK(relayed);
}

// Gossip reaches the recently dead so one that is alive learns it must refute; a member that left
// has nothing to refute, yet it took a gossip_nodes slot each round for gossip_to_the_dead_time,
// so updates reached the live members more slowly (memberlist skips it).
TEST_CASE("memberlist: gossip goes to recently dead members, not to members that left") {
    Member a;
    for (const char* n : {"B", "C", "D", "L"}) {
        a.receive(AliveMsg{1, n, std::string(n) + ":7946", 0, std::nullopt});
    }
    a.receive(DeadMsg{1, "D", "B"});
    a.receive(DeadMsg{1, "L", "L"});
    REQUIRE(a.ml().state_of("D") == NodeState::kDead);
    REQUIRE(a.ml().state_of("L") == NodeState::kLeft);
    a.transport().sent.clear();
    a.ml().start();
    const Duration round = a.ml().config().gossip_interval;
    for (uint64_t i = 1; i <= 20; ++i) {
        a.receive(UserEventMsg{i, "rollout", {}});  // Something to gossip every round.
        a.run_until(a.clock().now() + round);
    }
    std::set<std::string> reached;
    for (const auto& s : a.transport().sent) {
        reached.insert(s.to);
    }
    CHECK(reached.count("D:7946") == 1);
    CHECK(reached.count("L:7946") == 0);
}

// The event clock of a push-pull's answer: what this member's clock is now.
uint64_t answered_clock(Member& a) {
    auto answer = a.push_pull(PushPullMsg{});
    REQUIRE(answer.ok());
    auto msgs = decode_packet(Keyring{}.open("", *answer).value());
    REQUIRE(msgs.ok());
    return std::get<PushPullMsg>(msgs->at(0)).event_ltime;
}

// One Lamport time just under the decoder's cap, witnessed, carried every member's clock there by
// push-pull, and from then on no member could send a rollout. Like an incarnation, a time far
// past this member's clock is dropped and counted, and the clock stays where it was.
TEST_CASE("memberlist: a user event or push-pull clock implausibly far ahead is dropped") {
    Member a;
    std::vector<uint64_t> delivered;
    a.ml().set_user_event_callback([&](const UserEventMsg& e) { delivered.push_back(e.ltime); });
    // Gossip never jumps the clock, not even before the first push-pull.
    a.receive(UserEventMsg{kMaxEventLtime - 1, "rollout", {1}});
    CHECK(delivered.empty());
    CHECK(a.ml().stats().implausible_dropped.load() == 1);

    PushPullMsg sync;
    sync.event_ltime = 10;
    REQUIRE(a.push_pull(sync).ok());
    REQUIRE(a.ml().event_clock_synced());
    REQUIRE(answered_clock(a) == 10);

    a.receive(UserEventMsg{kMaxEventLtime - 2, "rollout", {2}});
    PushPullMsg forged;
    forged.event_ltime = kMaxEventLtime - 1;
    forged.events.push_back(UserEventMsg{kMaxEventLtime - 1, "rollout", {3}});
    forged.nodes.push_back(
        PushPullNode{"B", "10.0.0.2:7946", 1, NodeState::kAlive, 0, {}, std::nullopt});
    REQUIRE(a.push_pull(forged).ok());
    CHECK(delivered.empty());
    CHECK(a.ml().stats().implausible_dropped.load() == 4);  // The event, the clock, its event.
    CHECK(answered_clock(a) == 10);
    CHECK(a.ml().state_of("B") == NodeState::kAlive);  // The rest of the push-pull is taken.
    REQUIRE(a.ml().send_user_event("rollout", {4}).ok());
    CHECK(delivered == std::vector<uint64_t>{11});

    // Up to 2^32 past the clock is still taken, as gossip and as a push-pull's clock.
    const uint64_t far = 11 + (uint64_t{1} << 32);
    a.receive(UserEventMsg{far, "rollout", {5}});
    CHECK(delivered.back() == far);
    PushPullMsg ahead;
    ahead.event_ltime = far + (uint64_t{1} << 32);
    REQUIRE(a.push_pull(ahead).ok());
    CHECK(answered_clock(a) == ahead.event_ltime);
    CHECK(a.ml().stats().implausible_dropped.load() == 4);
}

// A member starts with its clock at 0 and the cluster's may be legitimately far past the step:
// its first full state (the answer to its join, or a push-pull it is sent) still brings its
// clock up, and the events in it are delivered. Once synced it is bounded like any member.
TEST_CASE("memberlist: a new member takes a legitimately high clock from its first push-pull") {
    const uint64_t cluster = uint64_t{1} << 40;
    PushPullMsg state;
    state.nodes.push_back(
        PushPullNode{"B", "10.0.0.2:7946", 1, NodeState::kAlive, 0, {}, std::nullopt});
    state.event_ltime = cluster;
    state.events.push_back(UserEventMsg{cluster - 1, "rollout", {1}});
    state.events.push_back(UserEventMsg{cluster, "rollout", {2}});

    SUBCASE("from the answer to its join") {
        Member a;
        std::vector<uint64_t> delivered;
        a.ml().set_user_event_callback(
            [&](const UserEventMsg& e) { delivered.push_back(e.ltime); });
        a.ml().join({"10.0.0.2:7946"});
        REQUIRE(a.transport().streams.size() == 1);
        std::vector<std::vector<uint8_t>> framed{encode_message(state)};
        // The join is the member's first stream: id 1.
        a.ml().handle_stream_response(1, Keyring{}.seal("", encode_packet(framed)).value());
        CHECK(a.ml().event_clock_synced());
        CHECK(delivered == std::vector<uint64_t>{cluster - 1, cluster});
        CHECK(a.ml().stats().implausible_dropped.load() == 0);
        REQUIRE(a.ml().send_user_event("rollout", {3}).ok());
        CHECK(delivered.back() == cluster + 1);
        // Synced: the jump is not taken twice.
        PushPullMsg forged;
        forged.event_ltime = kMaxEventLtime - 1;
        REQUIRE(a.push_pull(forged).ok());
        CHECK(a.ml().stats().implausible_dropped.load() == 1);
        CHECK(answered_clock(a) == cluster + 1);
    }
    SUBCASE("from a push-pull it is sent") {
        Member a;
        REQUIRE(a.push_pull(state).ok());
        CHECK(answered_clock(a) == cluster);
        CHECK(a.ml().stats().implausible_dropped.load() == 0);
    }
}

// A push-pull is capped at what an honest member sends: its table (max_members) and the events it
// remembers (user_event_buffer). A 32 MiB stream frame of minimal event records decoded into
// about 16.7 million events (1 GiB), and entries were capped only at 2^20. A site whose own caps
// are lower than the cluster's still syncs: it keeps what its caps allow (refused whole, such a
// site never synced).
TEST_CASE("memberlist: a push-pull over the site's caps is merged up to them, over the bound refused") {
    MembershipConfig c = lan_profile();
    c.max_members = 8;
    c.user_event_buffer = 4;
    Member a(c);
    PushPullMsg events;
    for (uint64_t i = 1; i <= 5; ++i) {
        events.events.push_back(UserEventMsg{i, "rollout", {}});
    }
    events.event_ltime = 5;
    PushPullMsg nodes;
    for (int i = 0; i < 9; ++i) {
        nodes.nodes.push_back(PushPullNode{"N" + std::to_string(i),
                                           "10.0.1." + std::to_string(i) + ":7946", 1,
                                           NodeState::kAlive, 0, {}, std::nullopt});
    }
    CHECK(a.push_pull(events).ok());
    // The push-pull's clock first: at 5, the window of 4 holds times 2..5, and 1 lies below it.
    CHECK(a.ml().stats().user_events_delivered.load() == 4);
    CHECK(answered_clock(a) == 5);
    CHECK(a.push_pull(nodes).ok());
    CHECK(a.ml().num_live() == 8);  // This site and the first seven: the table is full.
    CHECK(a.ml().stats().members_refused.load() == 2);
    CHECK(a.ml().stats().decode_failures.load() == 0);
    // Over the decoder's bound (the defaults, lan_profile()'s), refused whole as it is decoded.
    auto decoded = [](const PushPullMsg& pp) {
        return decode_packet(encode_packet(std::vector<std::vector<uint8_t>>{encode_message(pp)}));
    };
    PushPullMsg big;
    big.events.assign(513, UserEventMsg{1, "e", {}});
    auto r = decoded(big);
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK(r.status().message().find("more than 512 user events (user_event_buffer)") !=
          std::string::npos);
    big.events.resize(512);
    CHECK(decoded(big).ok());
    MembershipConfig wide = lan_profile();
    wide.user_event_buffer = 1024;  // A site that remembers more reads more.
    Member b(wide);
    big.events.assign(600, UserEventMsg{1, "e", {}});
    CHECK(b.push_pull(big).ok());
    big.events.assign(1025, UserEventMsg{1, "e", {}});
    auto refused = b.push_pull(big);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().message().find("more than 1024 user events") != std::string::npos);
    CHECK(b.ml().stats().decode_failures.load() == 1);
}

// Each distinct user event is queued for rebroadcast without a key, so nothing replaced it: a
// flood of packets full of small events with fresh Lamport times grew the queue without end.
TEST_CASE("memberlist: the broadcast queue stays bounded under a flood of distinct user events") {
    Member a;
    uint64_t ltime = 0;
    for (int packet = 0; packet < 20; ++packet) {
        std::vector<std::vector<uint8_t>> framed;
        for (int i = 0; i < 1000; ++i) {
            framed.push_back(encode_message(UserEventMsg{++ltime, "e", {}}));
        }
        a.ml().handle_packet("10.0.0.2:7946", Keyring{}.seal("", encode_packet(framed)).value());
    }
    CHECK(a.ml().stats().user_events_delivered.load() == 20000);
    CHECK(a.ml().broadcasts_queued() <= a.ml().config().user_event_buffer + 1);
    // The newest are the ones kept: the next message sent carries the latest event.
    a.transport().sent.clear();
    a.receive(PingMsg{1, "A", "B", "10.0.0.2:7946"});
    uint64_t newest = 0;
    for (const auto& s : a.transport().sent) {
        if (const auto* e = std::get_if<UserEventMsg>(&s.msg)) {
            newest = std::max(newest, e->ltime);
        }
    }
    CHECK(newest == ltime);
}

// A second process with a live member's name (site.id copied to another machine) out-bids it
// from another address: taking the address with each newer incarnation made every member flip
// it between the two, beginning a new life (state dropped) at each flip. As memberlist's
// aliveNode: a live member keeps its address; one dead or left may come back on a new one.
TEST_CASE("memberlist: a live member's address is not taken over by another address") {
    Member a;
    Memberlist& ml = a.ml();
    const std::string other = "10.0.0.8:7946";
    a.receive(AliveMsg{7, "X", "10.0.0.9:7946", 7, site_bytes("X", 1)});
    const uint64_t life = ml.snapshot()->find("X")->life;

    for (const bool suspected : {false, true}) {
        CAPTURE(suspected);
        if (suspected) {
            a.receive(SuspectMsg{7, "X", "B"});
            REQUIRE(ml.state_of("X") == NodeState::kSuspect);
        }
        a.receive(AliveMsg{9, "X", other, 1, site_bytes("X", 2)});
        PushPullMsg pp;
        pp.nodes.push_back(
            PushPullNode{"X", other, 7, NodeState::kAlive, 8, site_bytes("X", 3), std::nullopt});
        REQUIRE(a.push_pull(pp).ok());
        const auto x_snap = ml.snapshot();  // Held: find() points into it.
        const MemberView* x = x_snap->find("X");
        REQUIRE(x != nullptr);
        CHECK(x->addr == "10.0.0.9:7946");
        CHECK(x->incarnation == 7);
        CHECK(x->life == life);
        REQUIRE(x->site != nullptr);
        CHECK(x->site->pools.at(0).capacity == 1);
        for (const Message& q : a.queued_about("X")) {  // Nor is the claim passed on.
            const auto* alive = std::get_if<AliveMsg>(&q);
            CHECK((alive == nullptr || alive->addr != other));
        }
    }

    // Found dead, it may come back on a new address (a restart on another host).
    a.receive(DeadMsg{7, "X", "B"});
    REQUIRE(ml.state_of("X") == NodeState::kDead);
    a.receive(AliveMsg{9, "X", other, 1, site_bytes("X", 2)});
    CHECK(ml.state_of("X") == NodeState::kAlive);
    CHECK(ml.snapshot()->find("X")->addr == other);
    CHECK(ml.snapshot()->find("X")->life != life);
    CHECK(ml.snapshot()->find("X")->site->pools.at(0).capacity == 2);
}

// This member's name claimed from another address: its previous life elsewhere (below this
// life's first incarnation, out-ranked already) or a second live process with the name. Bidding
// against the latter never ends (each out-bids the other), so neither is refuted; the same
// address still is (this member's previous life there).
TEST_CASE("memberlist: a claim of this member's name from another address is not out-bid") {
    MembershipConfig c = lan_profile();
    c.initial_incarnation = 100;
    Member a(c);
    Memberlist& ml = a.ml();
    REQUIRE(ml.snapshot()->find("A")->incarnation == 101);
    a.receive(AliveMsg{50, "A", "10.0.0.8:7946", 9, site_bytes("A", 9)});   // Previous life.
    a.receive(AliveMsg{101, "A", "10.0.0.8:7946", 2, site_bytes("A", 9)});  // Another process.
    a.receive(AliveMsg{300, "A", "10.0.0.8:7946", 1, site_bytes("A", 9)});
    PushPullMsg pp;
    pp.nodes.push_back(PushPullNode{"A", "10.0.0.8:7946", 400, NodeState::kAlive, 1,
                                    site_bytes("A", 9), std::nullopt});
    REQUIRE(a.push_pull(pp).ok());
    CHECK(ml.stats().refutations.load() == 0);
    CHECK(ml.snapshot()->find("A")->incarnation == 101);
    CHECK(ml.snapshot()->find("A")->addr == "10.0.0.1:7946");
    CHECK(ml.awareness_score() == 0);
    CHECK(a.queued_about("A").empty());

    // At this member's own address, a newer incarnation is still out-bid.
    a.receive(AliveMsg{300, "A", "10.0.0.1:7946", 1, site_bytes("A", 9)});
    CHECK(ml.stats().refutations.load() == 1);
    CHECK(ml.snapshot()->find("A")->incarnation == 301);
    // And so is a suspicion or death by name, whichever address the others hold: this is how a
    // life restarted on a new address out-bids its previous life once that is found dead.
    a.receive(DeadMsg{400, "A", "B"});
    CHECK(ml.stats().refutations.load() == 2);
    CHECK(ml.snapshot()->find("A")->incarnation == 401);
}

// What a snapshot shows of a member (MemberView: incarnation, address, state version) changes
// only with change_count(), which is when MembershipService publishes a new snapshot.
TEST_CASE("memberlist: every change a snapshot shows of a member bumps the change count") {
    Member a;
    Memberlist& ml = a.ml();
    a.receive(AliveMsg{7, "X", "10.0.0.9:7946", 7, site_bytes("X", 1)});
    auto bumped = [&](const auto& step) {
        const uint64_t before = ml.change_count();
        step();
        return ml.change_count() > before;
    };
    // A refuted suspicion seen only as the newer alive, without a state.
    CHECK(bumped([&] { a.receive(AliveMsg{8, "X", "10.0.0.9:7946", 7, std::nullopt}); }));
    CHECK(ml.snapshot()->find("X")->incarnation == 8);
    // A newer state announced, not inline.
    CHECK(bumped([&] { a.receive(AliveMsg{8, "X", "10.0.0.9:7946", 9, std::nullopt}); }));
    CHECK(ml.snapshot()->find("X")->state_version == 9);
    CHECK(bumped([&] { a.receive(SuspectMsg{8, "X", "B"}); }));
    // Suspected anew at a newer incarnation (it refuted, and we missed the alive).
    CHECK(bumped([&] { a.receive(SuspectMsg{9, "X", "B"}); }));
    CHECK(ml.snapshot()->find("X")->incarnation == 9);
    // This member refuting a suspicion of itself.
    CHECK(bumped([&] { a.receive(SuspectMsg{1, "A", "B"}); }));
    CHECK(ml.snapshot()->find("A")->incarnation == 2);
    // Nothing new: no bump.
    CHECK_FALSE(bumped([&] { a.receive(AliveMsg{7, "X", "10.0.0.9:7946", 7, std::nullopt}); }));
}

// The application's anti-entropy state rides on every full-state push-pull (a fetch's answer is
// one member's entry, without it), merged with the sender's clock once that clock is taken: user
// events alone reach a member that joins later only as the newest user_event_buffer of them.
TEST_CASE("memberlist: application state rides on push-pull, merged with the sender's clock") {
    Member a;
    a.ml().set_local_state([] { return std::vector<uint8_t>{7, 8, 9}; });
    std::vector<std::pair<std::vector<uint8_t>, uint64_t>> merged;
    a.ml().set_merge_remote_state([&](std::span<const uint8_t> state, uint64_t ltime) {
        merged.emplace_back(std::vector<uint8_t>(state.begin(), state.end()), ltime);
    });
    PushPullMsg pp;
    pp.event_ltime = 5;
    pp.app_state = {1, 2};
    auto answer = a.push_pull(pp);
    REQUIRE(answer.ok());
    REQUIRE(merged.size() == 1);
    CHECK(merged[0].first == std::vector<uint8_t>{1, 2});
    CHECK(merged[0].second == 5);
    auto msgs = decode_packet(Keyring{}.open("", *answer).value());
    REQUIRE(msgs.ok());
    CHECK(std::get<PushPullMsg>(msgs->at(0)).app_state == std::vector<uint8_t>{7, 8, 9});

    // A fetch carries none and its answer neither.
    PushPullMsg fetch;
    fetch.fetch = "A";
    fetch.app_state = {3};
    answer = a.push_pull(fetch);
    REQUIRE(answer.ok());
    CHECK(merged.size() == 1);
    msgs = decode_packet(Keyring{}.open("", *answer).value());
    CHECK(std::get<PushPullMsg>(msgs->at(0)).app_state.empty());
    // Nor is the state of a sender whose clock is refused as implausibly far ahead merged.
    PushPullMsg forged;
    forged.event_ltime = kMaxEventLtime - 1;
    forged.app_state = {4};
    REQUIRE(a.push_pull(forged).ok());
    CHECK(merged.size() == 1);

    // The decoder bounds the field.
    PushPullMsg big;
    big.app_state.assign(kMaxPushPullAppState + 1, 0);
    auto refused = a.push_pull(big);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().message().find("application state") != std::string::npos);
    big.app_state.pop_back();
    CHECK(a.push_pull(big).ok());
    CHECK(merged.size() == 2);
}

// A sender lets into an event as much as fits one gossip packet, but a receiver took any size: an
// event of megabytes on a push-pull stream was kept for user_event_buffer events and sent in
// every push-pull, each then over max_stream_bytes, so sync broke. Refused as undecodable.
TEST_CASE("memberlist: a user event larger than a sender lets into a packet is refused") {
    Member a;
    std::vector<size_t> delivered;
    a.ml().set_user_event_callback(
        [&](const UserEventMsg& e) { delivered.push_back(e.payload.size()); });
    // The largest payload send_user_event lets out.
    size_t fits = 0;
    while (a.ml().send_user_event("rollout", std::vector<uint8_t>(fits + 1)).ok()) {
        ++fits;
    }
    REQUIRE(fits > 1000);
    REQUIRE(delivered.size() == fits);
    delivered.clear();

    const uint64_t clock = a.ml().event_clock();
    PushPullMsg pp;
    pp.event_ltime = clock + 4;
    pp.events.push_back(UserEventMsg{clock + 1, "rollout", std::vector<uint8_t>(fits + 1)});
    pp.events.push_back(UserEventMsg{clock + 2, "rollout", std::vector<uint8_t>(1 << 20)});
    pp.events.push_back(UserEventMsg{clock + 3, "", {1}});
    pp.events.push_back(UserEventMsg{clock + 4, std::string(256, 'n'), {1}});
    const uint64_t failures = a.ml().stats().decode_failures.load();
    auto answer = a.push_pull(pp);
    REQUIRE(answer.ok());
    CHECK(delivered.empty());
    CHECK(a.ml().stats().decode_failures.load() == failures + 4);
    // Not kept either: the answer (and every push-pull from here on) carries none of them.
    auto msgs = decode_packet(Keyring{}.open("", *answer).value());
    REQUIRE(msgs.ok());
    for (const UserEventMsg& e : std::get<PushPullMsg>(msgs->at(0)).events) {
        CHECK(e.payload.size() <= fits);
    }
    // As large as a sender lets out is taken.
    a.receive(UserEventMsg{clock + 5, "rollout", std::vector<uint8_t>(fits)});
    CHECK(delivered == std::vector<size_t>{fits});
}

// The window took user_event_buffer + 1 Lamport times while remembering user_event_buffer events,
// forgotten by arrival: a push-pull from a member one event behind delivered (and rebroadcast)
// again each event of its ring, and this member then forgot its newest. Remembered by time now.
TEST_CASE("memberlist: a push-pull from a member one event behind delivers nothing twice") {
    MembershipConfig c = lan_profile();
    c.user_event_buffer = 4;
    Member a(c);
    std::map<uint64_t, int> delivered;
    a.ml().set_user_event_callback([&](const UserEventMsg& e) { ++delivered[e.ltime]; });
    for (uint8_t i = 1; i <= 6; ++i) {
        a.receive(UserEventMsg{i, "rollout", {i}});
    }
    REQUIRE(delivered.size() == 6);
    // Its ring: the four newest it saw, 2..5.
    PushPullMsg behind;
    behind.event_ltime = 5;
    for (uint8_t i = 2; i <= 5; ++i) {
        behind.events.push_back(UserEventMsg{i, "rollout", {i}});
    }
    auto answer = a.push_pull(behind);
    REQUIRE(answer.ok());
    for (const auto& [ltime, times] : delivered) {
        CAPTURE(ltime);
        CHECK(times == 1);
    }
    CHECK(a.ml().stats().user_events_delivered.load() == 6);
    // The answer carries the four newest, 6 among them.
    auto msgs = decode_packet(Keyring{}.open("", *answer).value());
    REQUIRE(msgs.ok());
    std::set<uint64_t> held;
    for (const UserEventMsg& e : std::get<PushPullMsg>(msgs->at(0)).events) {
        held.insert(e.ltime);
    }
    CHECK(held == std::set<uint64_t>{3, 4, 5, 6});
}

// More than user_event_buffer events fall in the window when they share Lamport times. An event
// older than every one of a full ring was taken, reported delivered, and forgotten in the same
// call as the oldest there: the next push-pull that carried it delivered it again. It is refused
// now, as one below the window is, and stays refused; so is one at the ring's oldest time.
TEST_CASE(
    "memberlist: an event not newer than all of a full ring is refused, not delivered twice") {
    Member a;
    const size_t buffer = a.ml().config().user_event_buffer;
    REQUIRE(buffer == 512);
    std::map<std::string, int> delivered;
    a.ml().set_user_event_callback([&](const UserEventMsg& e) { ++delivered[e.name]; });
    PushPullMsg full;
    full.event_ltime = 1000;
    for (size_t i = 0; i < buffer; ++i) {
        full.events.push_back(UserEventMsg{1000, "rollout-" + std::to_string(i), {}});
    }
    REQUIRE(a.push_pull(full).ok());
    REQUIRE(delivered.size() == buffer);
    // In the window (times 489..1000), older than the whole ring.
    const UserEventMsg low{999, "low", {}};
    a.receive(low);
    CHECK(delivered["low"] == 0);
    PushPullMsg again;
    again.event_ltime = 1000;
    again.events.push_back(low);
    auto answer = a.push_pull(again);
    REQUIRE(answer.ok());
    CHECK(delivered["low"] == 0);
    CHECK(a.ml().stats().user_events_delivered.load() == buffer);
    // The ring is the one it held: the 512 events at 1000.
    auto msgs = decode_packet(Keyring{}.open("", *answer).value());
    REQUIRE(msgs.ok());
    const std::vector<UserEventMsg>& held = std::get<PushPullMsg>(msgs->at(0)).events;
    CHECK(held.size() == buffer);
    CHECK(std::all_of(held.begin(), held.end(), [](const UserEventMsg& e) {
        return e.ltime == 1000 && e.name != "low";
    }));
    // One at the ring's oldest time is refused too. Taken, it pushed out an event of that time
    // (rollout-0), which the next push-pull carrying it delivered again, pushing out another in
    // turn: two events delivered anew at every push-pull of a quiet cluster.
    a.receive(UserEventMsg{1000, "late", {}});
    CHECK(delivered["late"] == 0);
    PushPullMsg first;
    first.event_ltime = 1000;
    first.events.push_back(UserEventMsg{1000, "rollout-0", {}});
    REQUIRE(a.push_pull(first).ok());
    CHECK(delivered["rollout-0"] == 1);
    CHECK(a.ml().stats().user_events_delivered.load() == buffer);
    // A newer one gets in, the oldest going, and is delivered once.
    a.receive(UserEventMsg{1001, "next", {}});
    a.receive(UserEventMsg{1001, "next", {}});
    CHECK(delivered["next"] == 1);
    CHECK(a.ml().stats().user_events_delivered.load() == buffer + 1);
}

}  // namespace
}  // namespace edge::routing::membership
