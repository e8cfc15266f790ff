// Wire codec, site state, keyring and broadcast queue.

#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "routing/membership/broadcast_queue.h"
#include "routing/membership/keyring.h"
#include "routing/membership/messages.h"
#include "routing/membership/site_state.h"
#include "routing/membership/wire.h"

namespace edge::routing::membership {
namespace {

GossipKey key_of(uint8_t b) {
    GossipKey k;
    k.fill(b);
    return k;
}

SiteState sample_site() {
    SiteState s;
    s.site_id = "fra1";
    s.region = "eu-central";
    s.latitude = 50.11;
    s.longitude = 8.68;
    s.admin_addr = "10.0.0.1:9090";
    s.peer_addr = "10.0.0.1:8443";
    PoolInfo p;
    p.model = "kimi-k2";
    p.version_digest = "sha256:abc";
    p.state = PoolState::kServing;
    p.capacity = 64;
    p.load = PoolLoad{3, 17, 0.42, 1234.5};
    s.pools.push_back(p);
    return s;
}

// Routing's default saturation line (routing.cost), passed where a test's loads stay clear of it.
constexpr SaturationLimits kDefaultLine{};

TEST_CASE("codec: every message round-trips through a packet") {
    coords::Coordinate c;
    c.vec[3] = 0.25;
    c.height = 0.001;
    std::vector<std::vector<uint8_t>> framed{
        encode_message(PingMsg{7, "b", "a", "a:1"}),
        encode_message(IndirectPingMsg{8, "c", "c:1", "a", "a:1", true}),
        encode_message(AckMsg{7, c}),
        encode_message(NackMsg{8}),
        encode_message(SuspectMsg{3, "c", "a"}),
        encode_message(AliveMsg{4, "d", "d:1", 9, encode_site_state(sample_site())}),
        encode_message(DeadMsg{5, "e", "e"}),
        encode_message(UserEventMsg{11, "rollout", {1, 2, 3}}),
    };
    PushPullMsg pp;
    pp.join = true;
    pp.nodes.push_back(PushPullNode{"x", "x:1", 2, NodeState::kSuspect, 3, {}, c});
    pp.event_ltime = 12;
    pp.events.push_back(UserEventMsg{11, "rollout", {9}});
    framed.push_back(encode_message(pp));
    auto msgs = decode_packet(encode_packet(framed));
    REQUIRE(msgs.ok());
    REQUIRE(msgs->size() == 9);
    CHECK(std::get<PingMsg>((*msgs)[0]).target == "b");
    CHECK(std::get<IndirectPingMsg>((*msgs)[1]).target_addr == "c:1");
    CHECK(std::get<AckMsg>((*msgs)[2]).coord->vec[3] == 0.25);
    CHECK(std::get<NackMsg>((*msgs)[3]).seq == 8);
    CHECK(std::get<SuspectMsg>((*msgs)[4]).incarnation == 3);
    const auto& alive = std::get<AliveMsg>((*msgs)[5]);
    REQUIRE(alive.state.has_value());
    CHECK(decode_site_state(*alive.state).value() == sample_site());
    CHECK(std::get<DeadMsg>((*msgs)[6]).from == "e");
    CHECK(std::get<UserEventMsg>((*msgs)[7]).payload == std::vector<uint8_t>{1, 2, 3});
    const auto& pp2 = std::get<PushPullMsg>((*msgs)[8]);
    CHECK(pp2.join);
    REQUIRE(pp2.nodes.size() == 1);
    CHECK(pp2.nodes[0].state == NodeState::kSuspect);
    CHECK(pp2.events.size() == 1);
}

TEST_CASE("codec: unknown message types and fields are skipped") {
    WireWriter body;
    body.field_uint(1, 42);
    body.field_string(99, "from the future");
    WireWriter pkt;
    pkt.put_u8(kProtocolVersion);
    pkt.put_u8(200);  // unknown message type
    pkt.put_varint(3);
    pkt.put_bytes(std::vector<uint8_t>{1, 2, 3});
    pkt.put_u8(static_cast<uint8_t>(MessageType::kNack));
    pkt.put_varint(body.bytes().size());
    pkt.put_bytes(body.bytes());
    auto msgs = decode_packet(pkt.bytes());
    REQUIRE(msgs.ok());
    REQUIRE(msgs->size() == 1);
    CHECK(std::get<NackMsg>((*msgs)[0]).seq == 42);
}

// A coordinate is a TLV body like any other: a field a newer peer adds to it (a counter, a
// string) is skipped. Every field was read as an 8-byte double, so such a field failed the whole
// packet: every ack, and every push-pull entry, from the newer peers was dropped.
TEST_CASE("codec: unknown fields inside a coordinate are skipped") {
    WireWriter coord;
    for (size_t i = 0; i < coords::kDimensions; ++i) {
        coord.field_double(1, i == 2 ? 0.125 : 0.0);
    }
    coord.field_uint(9, 3);  // from the future
    coord.field_double(2, 0.5);
    coord.field_double(3, 0.0);
    coord.field_string(10, "from the future");
    coord.field_double(4, 0.002);
    WireWriter body;
    body.field_uint(1, 7);
    body.field_bytes(2, coord.bytes());
    WireWriter pkt;
    pkt.put_u8(kProtocolVersion);
    pkt.put_u8(static_cast<uint8_t>(MessageType::kAck));
    pkt.put_varint(body.bytes().size());
    pkt.put_bytes(body.bytes());
    auto msgs = decode_packet(pkt.bytes());
    REQUIRE(msgs.ok());
    REQUIRE(msgs->size() == 1);
    const auto& ack = std::get<AckMsg>((*msgs)[0]);
    CHECK(ack.seq == 7);
    REQUIRE(ack.coord.has_value());
    CHECK(ack.coord->vec[2] == 0.125);
    CHECK(ack.coord->error == 0.5);
    CHECK(ack.coord->height == 0.002);
    // A known field of the wrong size is still refused.
    WireWriter short_height;
    for (size_t i = 0; i < coords::kDimensions; ++i) {
        short_height.field_double(1, 0.0);
    }
    short_height.field_uint(4, 1);
    WireWriter bad;
    bad.field_uint(1, 7);
    bad.field_bytes(2, short_height.bytes());
    WireWriter bad_pkt;
    bad_pkt.put_u8(kProtocolVersion);
    bad_pkt.put_u8(static_cast<uint8_t>(MessageType::kAck));
    bad_pkt.put_varint(bad.bytes().size());
    bad_pkt.put_bytes(bad.bytes());
    CHECK(decode_packet(bad_pkt.bytes()).status().code() == StatusCode::kDataLoss);
}

// One push-pull message in a packet of its own, as the stream carries it.
Result<std::vector<Message>> decode_push_pull_body(std::span<const uint8_t> body) {
    WireWriter pkt;
    pkt.put_u8(kProtocolVersion);
    pkt.put_u8(static_cast<uint8_t>(MessageType::kPushPull));
    pkt.put_varint(body.size());
    pkt.put_bytes(body);
    return decode_packet(pkt.bytes());
}

// Coordinates only steer routing (serf ignores one it cannot use): one this version cannot use
// (not finite, out of range, of another dimensionality) failed its whole packet, so every ack
// from a member gossiping one was dropped (its probes failed: suspected without end), and every
// push-pull, a join included, was refused. Now that coordinate alone is left out.
TEST_CASE("codec: a coordinate this version cannot use is left out, not its message") {
    coords::Coordinate far;
    far.vec[0] = coords::kCoordinateLimit + 5.0;  // valid while the limit was 1000 s
    coords::Coordinate nan;
    nan.height = std::nan("");
    WireWriter nine;  // a space of more dimensions
    for (size_t i = 0; i <= coords::kDimensions; ++i) {
        nine.field_double(1, 0.0);
    }
    WireWriter nine_ack;
    nine_ack.field_uint(1, 7);
    nine_ack.field_bytes(2, nine.bytes());
    WireWriter nine_pkt;
    nine_pkt.put_u8(kProtocolVersion);
    nine_pkt.put_u8(static_cast<uint8_t>(MessageType::kAck));
    nine_pkt.put_varint(nine_ack.bytes().size());
    nine_pkt.put_bytes(nine_ack.bytes());
    for (const std::vector<uint8_t>& pkt :
         {encode_packet(std::vector<std::vector<uint8_t>>{encode_message(AckMsg{7, far})}),
          encode_packet(std::vector<std::vector<uint8_t>>{encode_message(AckMsg{7, nan})}),
          nine_pkt.bytes()}) {
        auto msgs = decode_packet(pkt);
        REQUIRE_MESSAGE(msgs.ok(), msgs.status().to_string());
        const auto& ack = std::get<AckMsg>(msgs->at(0));
        CHECK(ack.seq == 7);
        CHECK_FALSE(ack.coord.has_value());
    }
    PushPullMsg pp;
    pp.nodes.push_back(PushPullNode{"x", "x:1", 2, NodeState::kAlive, 3, {}, far});
    auto msgs = decode_packet(encode_packet(std::vector<std::vector<uint8_t>>{encode_message(pp)}));
    REQUIRE_MESSAGE(msgs.ok(), msgs.status().to_string());
    const auto& got = std::get<PushPullMsg>(msgs->at(0));
    REQUIRE(got.nodes.size() == 1);
    CHECK(got.nodes[0].name == "x");
    CHECK_FALSE(got.nodes[0].coord.has_value());
}

// A newer peer may add a node state (beyond alive, suspect, dead, left). An entry in one was
// refused with the whole push-pull, so in a mixed-version rollout one newer member's table broke
// full-state sync for every older one; now that entry alone is left out.
TEST_CASE("codec: a push-pull entry in a node state a newer peer added is left out, not the rest") {
    PushPullMsg pp;
    pp.nodes.push_back(PushPullNode{"x", "x:1", 2, NodeState::kAlive, 3, {}, std::nullopt});
    pp.nodes.push_back(PushPullNode{"y", "y:1", 4, static_cast<NodeState>(5), 5, {}, std::nullopt});
    pp.nodes.push_back(PushPullNode{"z", "z:1", 6, NodeState::kLeft, 7, {}, std::nullopt});
    pp.nodes.push_back(PushPullNode{"w", "w:1", 8, static_cast<NodeState>(0), 9, {}, std::nullopt});
    pp.event_ltime = 12;
    pp.events.push_back(UserEventMsg{11, "rollout", {9}});
    auto msgs = decode_packet(encode_packet(std::vector<std::vector<uint8_t>>{encode_message(pp)}));
    REQUIRE(msgs.ok());
    const auto& got = std::get<PushPullMsg>(msgs->at(0));
    REQUIRE(got.nodes.size() == 2);
    CHECK(got.nodes[0].name == "x");
    CHECK(got.nodes[1].name == "z");
    CHECK(got.nodes[1].state == NodeState::kLeft);
    CHECK(got.event_ltime == 12);
    CHECK(got.events.size() == 1);

    // A state far past a byte is a newer value too.
    WireWriter far;
    far.field_string(1, "v");
    far.field_uint(4, uint64_t{1} << 40);
    WireWriter body;
    body.field_bytes(2, far.bytes());
    auto r = decode_push_pull_body(body.bytes());
    REQUIRE(r.ok());
    CHECK(std::get<PushPullMsg>(r->at(0)).nodes.empty());

    // A state that is no integer at all, and a bad field beside a newer state, still fail it.
    WireWriter not_int;
    not_int.field_string(1, "v");
    not_int.field_double(4, 1.0);
    WireWriter bad_name;
    bad_name.field_string(1, std::string(513, 'v'));
    bad_name.field_uint(4, 9);
    for (const std::vector<uint8_t>& node : {not_int.bytes(), bad_name.bytes()}) {
        WireWriter bad;
        bad.field_bytes(2, node);
        auto refused = decode_push_pull_body(bad.bytes());
        CHECK(refused.status().code() == StatusCode::kDataLoss);
    }
}

// Likewise a pool state (beyond loading, serving, draining): a pool in one made the whole site
// state unreadable, so every pool of that site went unseen. Such a pool is not servable as far
// as this version can tell: it is left out (never routed to), and the site's others are taken.
TEST_CASE("site state: a pool in a state a newer peer added is left out, not the site") {
    SiteState s = sample_site();
    PoolInfo staged = s.pools[0];  // The same model's next version, in a newer state.
    staged.version_digest = "sha256:def";
    staged.state = static_cast<PoolState>(4);
    PoolInfo draining = s.pools[0];
    draining.model = "qwen3";
    draining.state = PoolState::kDraining;
    SiteState sent = s;
    sent.pools = {staged, s.pools[0], draining};
    auto decoded = decode_site_state(encode_site_state(sent));
    REQUIRE(decoded.ok());
    REQUIRE(decoded->pools.size() == 2);
    CHECK(decoded->pools[0] == s.pools[0]);
    CHECK(decoded->pools[1] == draining);
    CHECK(decoded->region == s.region);

    // Errors name a pool by its place as sent, left-out pools counted.
    sent.pools[2].model = std::string(kMaxSiteStringBytes + 1, 'q');
    auto long_name = decode_site_state(encode_site_state(sent));
    CHECK(long_name.status().code() == StatusCode::kDataLoss);
    CHECK(long_name.status().message().find("pool 2: ") == 0);
    // A state that is no integer at all still fails the site state, naming the field.
    WireWriter pool;
    pool.field_string(1, "m");
    pool.field_double(3, 2.0);
    WireWriter site;
    site.field_string(1, "fra1");
    site.field_bytes(7, pool.bytes());
    auto not_int = decode_site_state(site.bytes());
    CHECK(not_int.status().code() == StatusCode::kDataLoss);
    CHECK(not_int.status().message().find("pool 0: site state: pool state") == 0);
}

TEST_CASE("codec: truncations, bad versions and lying lengths are kDataLoss") {
    auto full = encode_packet(std::vector<std::vector<uint8_t>>{
        encode_message(AliveMsg{4, "d", "d:1", 9, encode_site_state(sample_site())})});
    for (size_t cut = 0; cut < full.size(); ++cut) {
        auto r = decode_packet(std::span<const uint8_t>(full.data(), cut));
        if (cut == 1) {
            CHECK(r.ok());  // a version byte alone is an empty packet
            continue;
        }
        CHECK_FALSE(r.ok());
        CHECK(r.status().code() == StatusCode::kDataLoss);
    }
    auto bad = full;
    bad[0] = 9;
    CHECK(decode_packet(bad).status().code() == StatusCode::kDataLoss);
    // A varint that never ends.
    std::vector<uint8_t> endless{kProtocolVersion, 1};
    endless.insert(endless.end(), 12, 0xff);
    CHECK_FALSE(decode_packet(endless).ok());
    // Incarnations at or above 2^62 (none is ever reached; at 2^64 - 1 a refutation wraps).
    for (const std::vector<uint8_t>& m :
         {encode_message(AliveMsg{kMaxIncarnation, "d", "d:1", 1, std::nullopt}),
          encode_message(SuspectMsg{UINT64_MAX, "d", "e"}),
          encode_message(DeadMsg{kMaxIncarnation + 1, "d", "e"})}) {
        auto r = decode_packet(encode_packet(std::vector<std::vector<uint8_t>>{m}));
        CHECK(r.status().code() == StatusCode::kDataLoss);
        CHECK(r.status().message().find("at or above 2^62") != std::string::npos);
    }
    CHECK(decode_packet(encode_packet(std::vector<std::vector<uint8_t>>{
                            encode_message(DeadMsg{kMaxIncarnation - 1, "d", "e"})}))
              .ok());
    // Non-finite latitude in site state.
    WireWriter w;
    w.field_double(3, std::nan(""));
    CHECK_FALSE(decode_site_state(w.bytes()).ok());
    // One model twice in a site's pools.
    SiteState twice = sample_site();
    twice.pools.push_back(twice.pools.front());
    twice.pools.back().version_digest = "sha256:def";
    auto dup = decode_site_state(encode_site_state(twice));
    CHECK(dup.status().code() == StatusCode::kDataLoss);
    CHECK(dup.status().message() == "site state: pool 1 repeats model 'kimi-k2'");
}

TEST_CASE("codec: user event Lamport times at or above 2^62 are kDataLoss") {
    // One ltime near 2^64 would wrap the Lamport clock of every member that witnesses it.
    const std::vector<uint8_t> refused[] = {
        encode_message(UserEventMsg{kMaxEventLtime, "rollout", {1}}),
        encode_message(UserEventMsg{UINT64_MAX, "rollout", {1}}),
        encode_message(PushPullMsg{false, {}, kMaxEventLtime, {}}),
        encode_message(PushPullMsg{false, {}, 1, {UserEventMsg{UINT64_MAX - 1, "rollout", {}}}}),
    };
    for (const std::vector<uint8_t>& m : refused) {
        auto r = decode_packet(encode_packet(std::vector<std::vector<uint8_t>>{m}));
        CHECK(r.status().code() == StatusCode::kDataLoss);
        CHECK(r.status().message().find("Lamport time") != std::string::npos);
        CHECK(r.status().message().find("at or above 2^62") != std::string::npos);
    }
    auto r = decode_packet(encode_packet(std::vector<std::vector<uint8_t>>{
        encode_message(UserEventMsg{kMaxEventLtime - 1, "rollout", {1}}),
        encode_message(PushPullMsg{
            false, {}, kMaxEventLtime - 1, {UserEventMsg{kMaxEventLtime - 1, "rollout", {}}}})}));
    REQUIRE(r.ok());
    CHECK(std::get<UserEventMsg>((*r)[0]).ltime == kMaxEventLtime - 1);
    CHECK(std::get<PushPullMsg>((*r)[1]).event_ltime == kMaxEventLtime - 1);
}

// The entry and event bounds held per push-pull, and a packet may hold 8192 messages: a 32 MiB
// stream frame of 255 push-pulls of 65,536 tiny entries each decoded into 16.7 M entries
// (3.3 GiB) before the stream's one-request check saw it.
TEST_CASE("codec: push-pull entry and event bounds hold across all the push-pulls of a packet") {
    PushPullMsg pp;
    for (int i = 0; i < 3; ++i) {
        pp.nodes.push_back(PushPullNode{"n" + std::to_string(i), "n:1", 1, NodeState::kAlive, 0,
                                        {}, std::nullopt});
    }
    const std::vector<uint8_t> one = encode_message(pp);
    const DecodeLimits four_nodes{4, 512};
    auto alone = decode_packet(encode_packet(std::vector<std::vector<uint8_t>>{one}), four_nodes);
    REQUIRE(alone.ok());
    CHECK(std::get<PushPullMsg>(alone->at(0)).nodes.size() == 3);
    auto two =
        decode_packet(encode_packet(std::vector<std::vector<uint8_t>>{one, one}), four_nodes);
    REQUIRE_FALSE(two.ok());
    CHECK(two.status().code() == StatusCode::kDataLoss);
    CHECK(two.status().message() ==
          "push-pull: push-pulls in one packet carry more than 4 nodes (max_members)");

    PushPullMsg events;
    events.events.assign(3, UserEventMsg{1, "e", {}});
    const std::vector<uint8_t> ev = encode_message(events);
    const DecodeLimits four_events{4, 4};
    CHECK(decode_packet(encode_packet(std::vector<std::vector<uint8_t>>{ev}), four_events).ok());
    auto both =
        decode_packet(encode_packet(std::vector<std::vector<uint8_t>>{ev, ev}), four_events);
    REQUIRE_FALSE(both.ok());
    CHECK(both.status().message() ==
          "push-pull: push-pulls in one packet carry more than 4 user events (user_event_buffer)");
    // User events gossiped as messages of their own are no push-pull's: a compound packet of
    // small messages beside a push-pull still decodes.
    auto compound = decode_packet(
        encode_packet(std::vector<std::vector<uint8_t>>{
            ev, encode_message(UserEventMsg{2, "e", {}}), encode_message(UserEventMsg{3, "e", {}}),
            encode_message(PingMsg{1, "a", "b", "b:1"}), encode_message(NackMsg{1})}),
        four_events);
    REQUIRE(compound.ok());
    CHECK(compound->size() == 5);
}

// A stream is one request and one answer: the caller says so, and the decoder refuses the second
// message before decoding it (each would be a push-pull of up to the bounds above).
TEST_CASE("codec: a packet over max_messages is refused at the message over, undecoded") {
    DecodeLimits stream;
    stream.max_messages = 1;
    // The second message is a push-pull whose body lies about a field's length (an entry of 9
    // bytes where none follow): decoded, it would fail as a push-pull.
    std::vector<uint8_t> bad_push_pull{static_cast<uint8_t>(MessageType::kPushPull), 2, 2, 9};
    std::vector<uint8_t> unknown{200, 1, 0};  // a newer peer's message type, not counted
    auto r = decode_packet(
        encode_packet(std::vector<std::vector<uint8_t>>{encode_message(NackMsg{1}), unknown,
                                                        bad_push_pull, encode_message(NackMsg{2})}),
        stream);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK(r.status().message() == "gossip packet: more than 1 message (it carries 3 messages)");
    CHECK(decode_packet(encode_packet(std::vector<std::vector<uint8_t>>{bad_push_pull}))
              .status()
              .message()
              .find("push-pull") == 0);
    // One message, beside a type this version skips, is what a stream holds.
    auto one = decode_packet(
        encode_packet(std::vector<std::vector<uint8_t>>{unknown, encode_message(PushPullMsg{})}),
        stream);
    REQUIRE(one.ok());
    CHECK(one->size() == 1);
    // The default bound is the packet's: its many small messages decode.
    std::vector<std::vector<uint8_t>> nacks(3, encode_message(NackMsg{1}));
    CHECK(decode_packet(encode_packet(nacks)).ok());
}

TEST_CASE("site state: load changes are material only past the thresholds") {
    SiteState a = sample_site();
    SiteState b = a;
    b.pools[0].load.queue_depth = 4;  // +1 request: not material
    CHECK(only_load_differs(a, b));
    CHECK_FALSE(load_changed_materially(a, b, 0.1, 2, kDefaultLine));
    b.pools[0].load.queue_depth = 10;
    CHECK(load_changed_materially(a, b, 0.1, 2, kDefaultLine));
    // Going idle is material however small the step; a first request on an idle pool is not.
    SiteState busy = a, idle = a;
    busy.pools[0].load.running = 1;
    busy.pools[0].load.queue_depth = 0;
    idle.pools[0].load.running = 0;
    idle.pools[0].load.queue_depth = 0;
    CHECK(load_changed_materially(busy, idle, 0.1, 2, kDefaultLine));
    CHECK_FALSE(load_changed_materially(idle, busy, 0.1, 2, kDefaultLine));
    b = a;
    b.pools[0].state = PoolState::kDraining;
    CHECK_FALSE(only_load_differs(a, b));
    CHECK(load_changed_materially(a, b, 0.1, 2, kDefaultLine));
}

// A site state holding `pool` alone, decoded.
Result<SiteState> decode_with_pool(WireWriter pool) {
    WireWriter site;
    site.field_string(1, "fra1");
    site.field_bytes(7, pool.bytes());
    return decode_site_state(site.bytes());
}

// A pool as a member from before pool tag `next` writes it: tags 1 to next - 1 (8 or 9).
WireWriter pool_before(int next) {
    WireWriter pool;
    pool.field_string(1, "kimi-k2");
    pool.field_string(2, "sha256:abc");
    pool.field_uint(3, static_cast<uint64_t>(PoolState::kServing));
    pool.field_uint(4, 64);
    pool.field_uint(5, 3);
    pool.field_uint(6, 17);
    pool.field_double(7, 0.42);
    pool.field_double(8, 1234.5);
    if (next > 9) {
        pool.field_double(9, 5120.0);
    }
    return pool;
}

TEST_CASE("site state: the prefill rate round-trips, and an older member's state has none") {
    SiteState s = sample_site();
    s.pools[0].load.prefill_tokens_per_s = 5120.5;
    auto decoded = decode_site_state(encode_site_state(s));
    REQUIRE(decoded.ok());
    CHECK(decoded->pools[0].load.prefill_tokens_per_s == 5120.5);
    CHECK(*decoded == s);

    // A pool as a member from before the field encodes it (tags 1..8 only): decoded with a
    // prefill rate of 0, not advertised, so routing assumes its default.
    auto old = decode_with_pool(pool_before(9));
    REQUIRE(old.ok());
    REQUIRE(old->pools.size() == 1);
    CHECK(old->pools[0].load.tokens_per_s == 1234.5);
    CHECK(old->pools[0].load.prefill_tokens_per_s == 0.0);

    // Decoders skip pool fields they do not know (as one from before this field skips it).
    WireWriter newer_pool;
    newer_pool.field_string(1, "kimi-k2");
    newer_pool.field_uint(3, static_cast<uint64_t>(PoolState::kServing));
    newer_pool.field_double(9, 777.0);
    newer_pool.field_double(4000, 1.0);
    auto newer = decode_with_pool(newer_pool);
    REQUIRE(newer.ok());
    CHECK(newer->pools[0].load.prefill_tokens_per_s == 777.0);

    // A rate that is no number, negative or beyond 1e9 tokens/s is garbage: kDataLoss.
    for (double bad : {std::nan(""), -1.0, 2e9, HUGE_VAL}) {
        CAPTURE(bad);
        WireWriter pool = pool_before(9);
        pool.field_double(9, bad);
        auto r = decode_with_pool(pool);
        REQUIRE_FALSE(r.ok());
        CHECK(r.status().code() == StatusCode::kDataLoss);
        CHECK(r.status().to_string().find("prefill tokens/s") != std::string::npos);
        // This site never sends one: encoded within what every decoder takes.
        s.pools[0].load.prefill_tokens_per_s = bad;
        auto sent = decode_site_state(encode_site_state(s));
        REQUIRE(sent.ok());
        CHECK(sent->pools[0].load.prefill_tokens_per_s == (bad > 1e9 ? 1e9 : 0.0));
    }
    s.pools[0].load.prefill_tokens_per_s = 1e9;
    CHECK(decode_site_state(encode_site_state(s)).ok());
}

TEST_CASE("site state: the queue bound round-trips, an older member's state has none") {
    SiteState s = sample_site();
    s.pools[0].load.max_queue = 4;
    auto decoded = decode_site_state(encode_site_state(s));
    REQUIRE(decoded.ok());
    CHECK(decoded->pools[0].load.max_queue == 4);
    CHECK(*decoded == s);

    // A pool as a member from before the field encodes it (tags 1..9 only): decoded with a
    // bound of 0, not advertised, so only routing's own saturation rule applies.
    auto old = decode_with_pool(pool_before(10));
    REQUIRE(old.ok());
    REQUIRE(old->pools.size() == 1);
    CHECK(old->pools[0].load.prefill_tokens_per_s == 5120.0);
    CHECK(old->pools[0].load.max_queue == 0);

    // A bound beyond 32 bits is garbage: kDataLoss.
    WireWriter bad_pool;
    bad_pool.field_string(1, "kimi-k2");
    bad_pool.field_uint(3, static_cast<uint64_t>(PoolState::kServing));
    bad_pool.field_uint(10, uint64_t{1} << 40);
    auto bad = decode_with_pool(bad_pool);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == StatusCode::kDataLoss);
    CHECK(bad.status().to_string().find("max queue") != std::string::npos);

    // A changed bound is material at once: it moves the pool's saturation point.
    SiteState bigger = s;
    bigger.pools[0].load.max_queue = 5;
    CHECK(load_changed_materially(s, bigger, 0.5, 100, kDefaultLine));
}

TEST_CASE("site state: a queue reaching or leaving its bound is material by one request") {
    // deploy/cluster-demo's fra: 4 slots, max_queue 4, the default thresholds (10 %, 2 requests).
    // 3 -> 4 was held back as +1 request: every site kept choosing the full pool (its engine
    // answered 503 "queue full"), and after 4 -> 3 kept refusing it while it had room.
    SiteState below = sample_site();
    below.pools[0].capacity = 4;
    below.pools[0].load.max_queue = 4;
    below.pools[0].load.queue_depth = 3;
    SiteState full = below;
    full.pools[0].load.queue_depth = 4;
    CHECK(load_changed_materially(below, full, 0.1, 2, kDefaultLine));
    CHECK(load_changed_materially(full, below, 0.1, 2, kDefaultLine));
    // Past the bound the pool stays saturated: +1 request is not news there.
    SiteState over = full;
    over.pools[0].load.queue_depth = 5;
    CHECK_FALSE(load_changed_materially(full, over, 0.1, 2, kDefaultLine));
    // Below the bound, +1 request is still below the thresholds.
    SiteState two = below;
    two.pools[0].load.queue_depth = 2;
    CHECK_FALSE(load_changed_materially(two, below, 0.1, 2, kDefaultLine));
    // Without an advertised bound (an older member), 3 -> 4 is the +1 request it always was.
    below.pools[0].load.max_queue = 0;
    full.pools[0].load.max_queue = 0;
    CHECK_FALSE(load_changed_materially(below, full, 0.1, 2, kDefaultLine));
}

TEST_CASE("site state: a pool becoming or ceasing to be saturated is material by any step") {
    // Routing's saturation line (routing.cost: kv_saturated, saturation_queue_per_slot) was
    // invisible to gossip: KV use 0.99 -> 0.90 was held back as a step under 0.1, and every site
    // kept the pool saturated (503 all_pools_saturated) while its engine had room; 0.91 -> 1.0
    // went unseen the other way. Likewise a queue crossing saturation_queue_per_slot * capacity.
    const SaturationLimits limits{.kv_saturated = 0.98, .queue_per_slot = 4.0};
    SiteState a = sample_site();
    SiteState b = a;
    a.pools[0].load.kv_use = 0.91;
    b.pools[0].load.kv_use = 1.0;
    CHECK(load_changed_materially(a, b, 0.1, 2, limits));
    a.pools[0].load.kv_use = 0.99;
    b.pools[0].load.kv_use = 0.90;
    CHECK(load_changed_materially(a, b, 0.1, 2, limits));
    // Both sides of the line: the step is judged by the thresholds alone.
    a.pools[0].load.kv_use = 0.5;
    b.pools[0].load.kv_use = 0.59;
    CHECK_FALSE(load_changed_materially(a, b, 0.1, 2, limits));
    // The line is the one passed (a reload may move it): 0.91 -> 0.95 crosses 0.95, not 0.98.
    a.pools[0].load.kv_use = 0.91;
    b.pools[0].load.kv_use = 0.95;
    CHECK_FALSE(load_changed_materially(a, b, 0.1, 2, limits));
    CHECK(load_changed_materially(a, b, 0.1, 2, {.kv_saturated = 0.95, .queue_per_slot = 4.0}));
    // One slot, no advertised queue bound: 4 queued is 4 per slot, saturated; 3 is not.
    a = sample_site();
    a.pools[0].capacity = 1;
    a.pools[0].load.max_queue = 0;
    a.pools[0].load.queue_depth = 3;
    b = a;
    b.pools[0].load.queue_depth = 4;
    CHECK(load_changed_materially(a, b, 0.1, 2, limits));
    CHECK(load_changed_materially(b, a, 0.1, 2, limits));
}

TEST_CASE("site state: a capacity past the engine's bound or a decode rate past 1e9 is kDataLoss") {
    // Routing costs a pool by its free slots and decode rate: one claiming 4e9 slots or 1e300
    // tokens/s had no queue wait at any queue depth, never counted as saturated, and drew every
    // site's traffic.
    for (uint64_t capacity : {uint64_t{kMaxPoolCapacity} + 1, uint64_t{4'000'000'000}}) {
        CAPTURE(capacity);
        WireWriter pool;
        pool.field_string(1, "kimi-k2");
        pool.field_uint(3, static_cast<uint64_t>(PoolState::kServing));
        pool.field_uint(4, capacity);
        auto r = decode_with_pool(pool);
        REQUIRE_FALSE(r.ok());
        CHECK(r.status().code() == StatusCode::kDataLoss);
        CHECK(r.status().to_string().find("capacity") != std::string::npos);
    }
    for (double bad : {-1.0, 2e9, 1e300}) {
        CAPTURE(bad);
        WireWriter pool;
        pool.field_string(1, "kimi-k2");
        pool.field_uint(3, static_cast<uint64_t>(PoolState::kServing));
        pool.field_double(8, bad);
        auto r = decode_with_pool(pool);
        REQUIRE_FALSE(r.ok());
        CHECK(r.status().code() == StatusCode::kDataLoss);
        CHECK(r.status().to_string().find("tokens/s") != std::string::npos);
    }

    // The bounds themselves are taken.
    SiteState s = sample_site();
    s.pools[0].capacity = kMaxPoolCapacity;
    s.pools[0].load.tokens_per_s = 1e9;
    auto at_bounds = decode_site_state(encode_site_state(s));
    REQUIRE(at_bounds.ok());
    CHECK(*at_bounds == s);

    // This site never sends more: encoded within what every decoder takes.
    for (double rate : {std::nan(""), -1.0, 1e300}) {
        CAPTURE(rate);
        s.pools[0].capacity = 4'000'000'000u;
        s.pools[0].load.tokens_per_s = rate;
        auto sent = decode_site_state(encode_site_state(s));
        REQUIRE(sent.ok());
        CHECK(sent->pools[0].capacity == kMaxPoolCapacity);
        CHECK(sent->pools[0].load.tokens_per_s == (rate > 1e9 ? 1e9 : 0.0));
    }
}

TEST_CASE("site state: a prefill rate change is material like a decode rate change") {
    SiteState a = sample_site();
    a.pools[0].load.prefill_tokens_per_s = 4000.0;
    SiteState b = a;
    b.pools[0].load.prefill_tokens_per_s = 4100.0;  // +2.5%: not material at 10%
    CHECK_FALSE(load_changed_materially(a, b, 0.1, 2, kDefaultLine));
    b.pools[0].load.prefill_tokens_per_s = 800.0;
    CHECK(load_changed_materially(a, b, 0.1, 2, kDefaultLine));
    // First measured (0 -> a rate) is material.
    SiteState unmeasured = a;
    unmeasured.pools[0].load.prefill_tokens_per_s = 0.0;
    CHECK(load_changed_materially(unmeasured, a, 0.1, 2, kDefaultLine));
}

TEST_CASE("site state: KV use 0.9 to a full 1.0 is a material step of 0.1") {
    // A KV line no use reaches (it is judged clamped to 1): 0.9 -> 1.0 crosses the default 0.98,
    // which would make the step material whatever the slack.
    const SaturationLimits kNoKvLine{.kv_saturated = 2.0, .queue_per_slot = 4.0};
    SiteState a = sample_site();
    a.pools[0].load.kv_use = 0.9;
    SiteState b = a;
    b.pools[0].load.kv_use = 1.0;  // 1.0 - 0.9 is 0.0999... in doubles
    CHECK(load_changed_materially(a, b, 0.1, 2, kNoKvLine));
    CHECK(load_changed_materially(b, a, 0.1, 2, kNoKvLine));
    a.pools[0].load.kv_use = 0.7;
    b.pools[0].load.kv_use = 0.8;  // 0.8 - 0.7 is 0.1000...1, material before too
    CHECK(load_changed_materially(a, b, 0.1, 2, kNoKvLine));
    b.pools[0].load.kv_use = 0.79;  // Still below the step: not material.
    CHECK_FALSE(load_changed_materially(a, b, 0.1, 2, kNoKvLine));
    CHECK_FALSE(load_changed_materially(a, a, 0.1, 2, kNoKvLine));
}

TEST_CASE("site state: strings longer than 255 bytes are kDataLoss, naming the field") {
    SiteState s = sample_site();
    s.pools[0].model = std::string(kMaxSiteStringBytes, 'm');
    REQUIRE(decode_site_state(encode_site_state(s)).ok());
    s.pools[0].model += "m";
    auto decoded = decode_site_state(encode_site_state(s));
    REQUIRE_FALSE(decoded.ok());
    CHECK(decoded.status().code() == StatusCode::kDataLoss);
    CHECK(decoded.status().to_string().find("model name is 256 bytes (at most 255)") !=
          std::string::npos);
    CHECK(decoded.status().to_string().find("pool 0") != std::string::npos);
    s = sample_site();
    s.region = std::string(1 << 20, 'r');
    decoded = decode_site_state(encode_site_state(s));
    REQUIRE_FALSE(decoded.ok());
    CHECK(decoded.status().to_string().find("region is 1048576 bytes") != std::string::npos);
}

TEST_CASE("keyring: sealed packets open with any installed key, label bound as AAD") {
    auto ring = Keyring::create({key_of(1), key_of(2)}).value();
    const std::vector<uint8_t> plain{1, 2, 3, 4};
    auto sealed = ring.seal("prod", plain).value();
    CHECK(sealed.size() == plain.size() + ring.overhead("prod"));
    CHECK(ring.open("prod", sealed).value() == plain);
    CHECK(ring.open("staging", sealed).status().code() == StatusCode::kUnauthenticated);
    auto tampered = sealed;
    tampered[20] ^= 1;
    CHECK(ring.open("prod", tampered).status().code() == StatusCode::kUnauthenticated);

    // Rotation: a ring whose primary is key 2 still reads packets sealed with key 1.
    auto rotated = Keyring::create({key_of(2), key_of(1)}).value();
    CHECK(rotated.open("prod", sealed).ok());
    auto only_other = Keyring::create({key_of(3)}).value();
    CHECK_FALSE(only_other.open("prod", sealed).ok());

    CHECK(ring.use_key(key_of(2)).ok());
    CHECK(ring.keys().front() == key_of(2));
    CHECK_FALSE(ring.remove_key(key_of(2)).ok());  // primary
    CHECK(ring.remove_key(key_of(1)).ok());
    CHECK_FALSE(ring.use_key(key_of(1)).ok());
    CHECK_FALSE(Keyring::create({key_of(1), key_of(1)}).ok());

    // Clear mode still checks the label, and never accepts encrypted input or vice versa.
    Keyring clear;
    auto c = clear.seal("prod", plain).value();
    CHECK(clear.open("prod", c).value() == plain);
    CHECK_FALSE(clear.open("other", c).ok());
    CHECK_FALSE(clear.open("prod", sealed).ok());
    CHECK_FALSE(rotated.open("prod", c).ok());
    CHECK_FALSE(ring.open("prod", std::vector<uint8_t>{1, 2}).ok());

    CHECK(parse_gossip_key(std::string(64, 'a')).ok());
    CHECK_FALSE(parse_gossip_key("abc").ok());
    CHECK_FALSE(parse_gossip_key(std::string(63, 'a') + "g").ok());
}

TEST_CASE("broadcast queue: least-sent and newest first, limited, replaced by key") {
    BroadcastQueue q(1);  // limit 1 * ceil(log10(n+1))
    q.queue("a", {1});
    q.queue("b", {2, 2});
    q.queue("a", {3, 3, 3});  // replaces the first "a"
    CHECK(q.size() == 2);
    auto got = q.get_broadcasts(0, 100, 9, 100);  // limit 1: each sent once, then dropped
    REQUIRE(got.size() == 2);
    CHECK(got[0] == std::vector<uint8_t>{3, 3, 3});  // newest first
    CHECK(got[1] == std::vector<uint8_t>{2, 2});
    CHECK(q.size() == 0);

    BroadcastQueue r(2);  // limit 2 for n = 9
    r.queue("x", std::vector<uint8_t>(10, 1));
    r.queue("y", std::vector<uint8_t>(10, 2));
    auto first = r.get_broadcasts(2, 12, 9, 12);  // room for one
    REQUIRE(first.size() == 1);
    CHECK(first[0][0] == 2);
    auto second = r.get_broadcasts(2, 12, 9, 12);  // the least-sent goes next
    REQUIRE(second.size() == 1);
    CHECK(second[0][0] == 1);
    CHECK(r.get_broadcasts(0, 100, 9, 100).size() == 2);
    CHECK(r.size() == 0);
}

TEST_CASE("broadcast queue: a message no packet can hold is dropped, not left to stall the rest") {
    BroadcastQueue q(3);  // 3 transmissions each for n = 9
    for (int i = 0; i < 20; ++i) {
        q.queue("big" + std::to_string(i), std::vector<uint8_t>(101, 7));  // > 100 each
    }
    q.queue("small", {1});
    auto first = q.get_broadcasts(0, 100, 9, 100);
    REQUIRE(first.size() == 1);
    CHECK(first[0] == std::vector<uint8_t>{1});
    CHECK(q.oversized_dropped() == 20);
    // The small one is retransmitted (it was never reached again behind 17 stuck items).
    CHECK(q.get_broadcasts(0, 100, 9, 100).size() == 1);
    CHECK(q.get_broadcasts(0, 100, 9, 100).size() == 1);
    CHECK(q.size() == 0);
    // Too big for this packet's room but not for a whole packet: kept for the next.
    q.queue("mid", std::vector<uint8_t>(60, 2));
    CHECK(q.get_broadcasts(0, 50, 9, 100).empty());
    CHECK(q.size() == 1);
    CHECK(q.get_broadcasts(0, 100, 9, 100).size() == 1);
}

// Nothing replaces a message without a key (a user event): past max_unkeyed the oldest goes, as
// with serf's MaxQueueDepth, while keyed ones (one per member) are never dropped for them.
TEST_CASE("broadcast queue: messages without a key are capped, the oldest dropped first") {
    BroadcastQueue q(3, 8);
    for (int i = 0; i < 5; ++i) {
        q.queue("member" + std::to_string(i), {static_cast<uint8_t>(200 + i)});
    }
    for (int i = 0; i < 100; ++i) {
        q.queue("", {static_cast<uint8_t>(i)});
    }
    CHECK(q.size() == 5 + 8);
    CHECK(q.overflow_dropped() == 92);
    std::multiset<uint8_t> sent;
    for (int round = 0; round < 3; ++round) {
        for (const auto& m : q.get_broadcasts(0, 1000, 9, 1000)) {
            sent.insert(m.at(0));
        }
    }
    CHECK(q.size() == 0);
    std::set<uint8_t> distinct(sent.begin(), sent.end());
    CHECK(distinct.size() == 13);
    for (int i = 92; i < 100; ++i) {
        CHECK(sent.count(static_cast<uint8_t>(i)) == 3);  // The newest, each sent in full.
    }
    for (int i = 0; i < 5; ++i) {
        CHECK(sent.count(static_cast<uint8_t>(200 + i)) == 3);
    }
    // A message sent already counts like any other, and the queue keeps working after a prune.
    q.queue("", {1});
    CHECK(q.get_broadcasts(0, 1000, 9, 1000).size() == 1);
    for (int i = 0; i < 9; ++i) {
        q.queue("", {static_cast<uint8_t>(10 + i)});
    }
    CHECK(q.size() == 8);
    CHECK(q.overflow_dropped() == 94);  // The one sent once, and 10.
    q.clear();
    q.queue("", {2});
    CHECK(q.size() == 1);
}

}  // namespace
}  // namespace edge::routing::membership
