// Real sockets on 127.0.0.1: five encrypted members find each other from one seed address, a
// member with the wrong key is never admitted, keys rotate with no member lost, and a member
// stopped abruptly (no leave) is declared dead by the others. Timers are short (probe 200 ms) so
// this runs in a few seconds; the tests wait on conditions with deadlines, never on fixed sleeps.

#include <doctest/doctest.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "common/log.h"
#include "routing/membership/keyring.h"
#include "routing/membership/membership_service.h"
#include "routing/membership/messages.h"

namespace edge::routing::membership {
namespace {

using std::chrono::milliseconds;

GossipKey key_of(uint8_t b) {
    GossipKey k;
    k.fill(b);
    return k;
}

MembershipConfig fast_config(const std::string& name) {
    MembershipConfig c = local_profile();
    c.name = name;
    c.label = "test-cluster";
    c.probe_interval = milliseconds(200);
    c.probe_timeout = milliseconds(100);
    c.gossip_interval = milliseconds(30);
    c.push_pull_interval = milliseconds(1000);
    c.reconnect_interval = milliseconds(1000);
    c.stream_timeout = milliseconds(1000);
    c.join_retry_interval = milliseconds(100);
    c.join_retry_max_interval = milliseconds(400);
    c.max_inbound_streams = 16;
    c.suspicion_mult = 4;
    return c;
}

class Cluster {
public:
    Cluster() : work_(boost::asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}
    ~Cluster() {
        for (auto& s : services_) {
            if (s) {
                s->kill();
            }
        }
        services_.clear();
        work_.reset();
        io_.stop();
        thread_.join();
    }

    // `tweak` changes the test timings of this member.
    MembershipService& add(const std::string& name, std::vector<GossipKey> keys, uint16_t port = 0,
                           const std::function<void(MembershipConfig&)>& tweak = {},
                           const std::string& bind_host = "127.0.0.1") {
        SiteState site;
        site.site_id = name;
        MembershipConfig config = fast_config(name);
        if (tweak) {
            tweak(config);
        }
        auto svc = MembershipService::create(io_, std::move(config),
                                             Keyring::create(std::move(keys)).value(), site,
                                             bind_host, port);
        REQUIRE_MESSAGE(svc.ok(), svc.status().to_string());
        svc.value()->set_event_callback([this, name](const MemberEvent& e) {
            std::lock_guard lock(mu_);
            if (e.kind == MemberEventKind::kDead) {
                deaths_.insert(name + "->" + e.name);
            }
        });
        services_.push_back(std::move(svc).value());
        return *services_.back();
    }

    MembershipService& at(size_t i) { return *services_.at(i); }

    // Polls `pred` until it holds or `limit` passes.
    static bool wait_for(const std::function<bool()>& pred, Duration limit) {
        const auto end = std::chrono::steady_clock::now() + limit;
        while (!pred()) {
            if (std::chrono::steady_clock::now() > end) {
                return false;
            }
            std::this_thread::sleep_for(milliseconds(5));
        }
        return true;
    }

    // Every one of services [0, n) sees exactly `names` alive.
    bool all_see_alive(size_t n, const std::set<std::string>& names) {
        for (size_t i = 0; i < n; ++i) {
            if (!services_[i]) {
                continue;
            }
            auto snap = services_[i]->snapshot();
            std::set<std::string> alive;
            for (const MemberView& m : snap->members) {
                if (m.state == NodeState::kAlive) {
                    alive.insert(m.name);
                }
            }
            if (alive != names) {
                return false;
            }
        }
        return true;
    }

    std::set<std::string> deaths() {
        std::lock_guard lock(mu_);
        return deaths_;
    }

    boost::asio::io_context io_;

private:
    boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
    std::thread thread_;
    std::vector<std::unique_ptr<MembershipService>> services_;
    std::mutex mu_;
    std::set<std::string> deaths_;
};

std::set<std::string> names(size_t n) {
    std::set<std::string> out;
    for (size_t i = 0; i < n; ++i) {
        out.insert("site" + std::to_string(i));
    }
    return out;
}

void start_five(Cluster& c, std::vector<GossipKey> keys) {
    for (size_t i = 0; i < 5; ++i) {
        c.add("site" + std::to_string(i), keys);
    }
    c.at(0).start({});
    for (size_t i = 1; i < 5; ++i) {
        c.at(i).start({c.at(0).advertise_addr()});
    }
}

TEST_CASE("sockets: five encrypted members find each other from one seed") {
    Cluster c;
    start_five(c, {key_of(7)});
    CHECK(Cluster::wait_for([&] { return c.all_see_alive(5, names(5)); }, std::chrono::seconds(10)));
    CHECK(c.at(0).stats().auth_failures.load() == 0);
    CHECK(c.at(0).stats().bytes_sent.load() > 0);
    // RTTs measured by probes moved the coordinates.
    CHECK(Cluster::wait_for([&] { return c.at(1).stats().probe_rtt_count.load() > 3; },
                            std::chrono::seconds(5)));
}

TEST_CASE("sockets: a member with the wrong key is never admitted") {
    std::mutex log_mu;
    std::vector<std::string> warnings;
    edge::log::set_sink([&](std::string_view line) {
        if (line.find("\"gossip_auth_failed\"") != std::string_view::npos) {
            std::lock_guard lock(log_mu);
            warnings.emplace_back(line);
        }
    });
    Cluster c;
    start_five(c, {key_of(7)});
    REQUIRE(Cluster::wait_for([&] { return c.all_see_alive(5, names(5)); },
                              std::chrono::seconds(10)));
    MembershipService& intruder = c.add("intruder", {key_of(8)});
    intruder.start({c.at(0).advertise_addr()});
    // The seed drops its join stream unparsed; the intruder's join fails.
    REQUIRE(Cluster::wait_for([&] { return c.at(0).stats().auth_failures.load() > 0; },
                              std::chrono::seconds(5)));
    REQUIRE(Cluster::wait_for([&] { return intruder.stats().stream_failures.load() > 0; },
                              std::chrono::seconds(5)));
    CHECK(c.all_see_alive(5, names(5)));
    CHECK(intruder.snapshot()->members.size() == 1);
    // The seed says why, once (rate-limited), naming the sender's address.
    REQUIRE(Cluster::wait_for([&] { return c.at(0).stats().auth_failures.load() > 1; },
                              std::chrono::seconds(10)));
    edge::log::set_sink(nullptr);
    std::lock_guard lock(log_mu);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("127.0.0.1") != std::string::npos);
}

TEST_CASE("sockets: an incarnation near 2^64 is refused, a large plausible one is refuted") {
    std::mutex log_mu;
    std::vector<std::string> warnings;
    edge::log::set_sink([&](std::string_view line) {
        if (line.find("\"gossip_undecodable\"") != std::string_view::npos) {
            std::lock_guard lock(log_mu);
            warnings.emplace_back(line);
        }
    });
    Cluster c;
    c.add("site0", {key_of(7)});
    c.add("site1", {key_of(7)});
    c.at(0).start({});
    c.at(1).start({c.at(0).advertise_addr()});
    REQUIRE(Cluster::wait_for([&] { return c.all_see_alive(2, names(2)); },
                              std::chrono::seconds(10)));
    // Whoever holds the key (or anyone, on a cluster without keys) could send it: were it taken,
    // site0 would refute at 2^64 - 1 + 1 = 0 and stay dead everywhere.
    const std::vector<uint8_t> forged[] = {
        encode_message(DeadMsg{UINT64_MAX, "site0", "forger"}),
        encode_message(SuspectMsg{UINT64_MAX - 1, "site0", "forger"})};
    auto sealed = Keyring::create({key_of(7)})->seal("test-cluster", encode_packet(forged));
    REQUIRE(sealed.ok());
    boost::asio::ip::udp::socket sock(c.io_, boost::asio::ip::udp::v4());
    const std::string target = c.at(1).advertise_addr();
    const boost::asio::ip::udp::endpoint to(
        boost::asio::ip::make_address("127.0.0.1"),
        static_cast<uint16_t>(std::stoi(target.substr(target.rfind(':') + 1))));
    const uint64_t before = c.at(1).stats().decode_failures.load();
    sock.send_to(boost::asio::buffer(*sealed), to);
    REQUIRE(Cluster::wait_for([&] { return c.at(1).stats().decode_failures.load() >= before + 1; },
                              std::chrono::seconds(5)));
    // Both still see both alive for several probe rounds, and site0 refuted nothing.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (std::chrono::steady_clock::now() < until) {
        REQUIRE(c.all_see_alive(2, names(2)));
        std::this_thread::sleep_for(milliseconds(50));
    }
    CHECK(c.at(0).stats().refutations.load() == 0);
    {
        std::lock_guard lock(log_mu);
        REQUIRE(warnings.size() == 1);  // Once per sending host and interval.
        CHECK(warnings[0].find("incarnation 18446744073709551615 at or above 2^62") !=
              std::string::npos);
    }
    // One more than 2^32 past the incarnation site1 knows for site0 is no site's (each
    // refutation or publish adds one, and a life starts at the wall-clock second): dropped, not
    // gossiped, nothing to refute.
    const uint64_t known = c.at(1).snapshot()->find("site0")->incarnation;
    auto send_suspicion = [&](uint64_t incarnation) {
        const std::vector<uint8_t> msg[] = {
            encode_message(SuspectMsg{incarnation, "site0", "forger"})};
        auto sealed_msg = Keyring::create({key_of(7)})->seal("test-cluster", encode_packet(msg));
        REQUIRE(sealed_msg.ok());
        sock.send_to(boost::asio::buffer(*sealed_msg), to);
    };
    send_suspicion(known + (uint64_t{1} << 32) + 1);
    REQUIRE(Cluster::wait_for([&] { return c.at(1).stats().implausible_dropped.load() == 1; },
                              std::chrono::seconds(5)));
    CHECK(c.at(0).stats().refutations.load() == 0);
    // Incarnations grow with every site-state publish: a long-lived site's are large, and a
    // suspicion at one is taken, and refuted above it.
    send_suspicion(known + (uint64_t{1} << 24));
    REQUIRE(Cluster::wait_for([&] { return c.at(0).stats().refutations.load() > 0; },
                              std::chrono::seconds(5)));
    CHECK(Cluster::wait_for([&] { return c.all_see_alive(2, names(2)); }, std::chrono::seconds(5)));
    edge::log::set_sink(nullptr);
}

// A site bound to `::` (dual stack) sees an IPv4 member's packets come from
// [::ffff:a.b.c.d]:port, which equalled no member's advertised address as a string: a stale
// accusation from there was never answered directly, and ran out its timer at the accuser.
TEST_CASE("sockets: a site bound to :: answers a stale accusation from an IPv4 member") {
    namespace ip = boost::asio::ip;
    Cluster c;
    {
        boost::system::error_code ec;
        ip::udp::socket v6(c.io_);
        v6.open(ip::udp::v6(), ec);
        if (!ec) {
            v6.bind(ip::udp::endpoint(ip::address_v6::any(), 0), ec);
        }
        if (ec) {
            MESSAGE("skipped: no IPv6 here (" << ec.message() << ")");
            return;
        }
    }
    // Only the test's socket talks to it, so the address it advertises is never used.
    MembershipService& site = c.add(
        "site0", {key_of(5)}, 0,
        [](MembershipConfig& config) { config.advertise_addr = "127.0.0.1:7946"; }, "::");
    site.start({});
    // A member on 127.0.0.1, played by a plain socket that never answers.
    ip::udp::socket member(c.io_, ip::udp::endpoint(ip::make_address("127.0.0.1"), 0));
    member.non_blocking(true);
    const std::string member_addr = "127.0.0.1:" + std::to_string(member.local_endpoint().port());
    const Keyring keyring = Keyring::create({key_of(5)}).value();
    const ip::udp::endpoint to(ip::make_address("127.0.0.1"), site.port());
    auto send = [&](const Message& m) {
        const std::vector<uint8_t> framed[] = {encode_message(m)};
        auto sealed = keyring.seal("test-cluster", encode_packet(framed));
        REQUIRE(sealed.ok());
        member.send_to(boost::asio::buffer(*sealed), to);
    };
    // Whether a packet holding an alive of site0 reaches the member within `limit`.
    auto alive_arrives = [&](Duration limit) {
        std::vector<uint8_t> buf(65536);
        const auto end = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < end) {
            ip::udp::endpoint sender;
            boost::system::error_code ec;
            const size_t n = member.receive_from(boost::asio::buffer(buf), sender, 0, ec);
            if (ec) {
                std::this_thread::sleep_for(milliseconds(5));
                continue;
            }
            auto opened = keyring.open("test-cluster", std::span(buf.data(), n));
            REQUIRE(opened.ok());
            auto msgs = decode_packet(*opened);
            REQUIRE(msgs.ok());
            for (const Message& m : *msgs) {
                const auto* alive = std::get_if<AliveMsg>(&m);
                if (alive != nullptr && alive->node == "site0") {
                    return true;
                }
            }
        }
        return false;
    };
    send(AliveMsg{1, "Q", member_addr, 0, std::nullopt});
    REQUIRE(Cluster::wait_for([&] { return site.snapshot()->find("Q") != nullptr; },
                              std::chrono::seconds(5)));
    // What it gossips of its own alive runs out first (a few retransmissions).
    const auto drain_end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (alive_arrives(milliseconds(700))) {
        REQUIRE(std::chrono::steady_clock::now() < drain_end);
    }
    // A suspicion of site0 older than its life, from the member's address.
    send(SuspectMsg{0, "site0", "forger"});
    CHECK(alive_arrives(std::chrono::seconds(2)));
}

TEST_CASE("sockets: a seed given by host name is resolved") {
    Cluster c;
    c.add("site0", {key_of(7)});
    c.add("site1", {key_of(7)});
    c.at(0).start({});
    const std::string seed = c.at(0).advertise_addr();
    c.at(1).start({"localhost" + seed.substr(seed.rfind(':'))});
    CHECK(Cluster::wait_for([&] { return c.all_see_alive(2, names(2)); },
                            std::chrono::seconds(10)));
}

// Seeds are often host names (one list for every site, this one included). A member's address
// is an IP, so a host-name seed never equals one: it was counted lost forever and push-pulled
// every reconnect_interval, and this site's own entry by host name too. The address that
// answered the seed is what finds it among the members.
TEST_CASE("sockets: a host-name seed is found among the members and not contacted again") {
    Cluster c;
    const auto tweak = [](MembershipConfig& config) {
        config.push_pull_interval = std::chrono::hours(1);  // Only seed and reconnect push-pulls.
        config.reconnect_interval = milliseconds(100);
    };
    MembershipService& seed = c.add("site0", {key_of(4)}, 0, tweak);
    MembershipService& joiner = c.add("site1", {key_of(4)}, 0, tweak);
    const auto by_name = [](const MembershipService& s) {
        const std::string& addr = s.advertise_addr();
        return "localhost" + addr.substr(addr.rfind(':'));
    };
    seed.start({});
    joiner.start({by_name(seed), by_name(joiner)});
    REQUIRE(
        Cluster::wait_for([&] { return c.all_see_alive(2, names(2)); }, std::chrono::seconds(10)));
    // The joins to both seeds are all it takes: ten reconnect intervals later, none more.
    const uint64_t after_join = joiner.stats().push_pulls.load();
    std::this_thread::sleep_for(milliseconds(1000));
    CHECK(joiner.stats().push_pulls.load() == after_join);
    CHECK(after_join <= 3);
    CHECK(c.all_see_alive(2, names(2)));
}

// Each process life starts at the wall-clock second, so it out-ranks its previous life's state at
// once (unless that life published more states than it ran seconds: then it refutes that one).
TEST_CASE("sockets: a member starts at the wall-clock second as its incarnation") {
    const auto now_s =
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count());
    Cluster c;
    MembershipService& s = c.add("site0", {key_of(3)});
    const MemberView* self = s.snapshot()->find("site0");
    REQUIRE(self != nullptr);
    CHECK(self->incarnation >= now_s);
    CHECK(self->incarnation <= now_s + 2);
    CHECK(self->site_version == 1);
}

TEST_CASE("sockets: keys rotate with no member lost") {
    Cluster c;
    start_five(c, {key_of(1)});
    REQUIRE(Cluster::wait_for([&] { return c.all_see_alive(5, names(5)); },
                              std::chrono::seconds(10)));
    auto on_all = [&](const std::function<void(Memberlist&)>& fn) {
        std::atomic<int> done{0};
        for (size_t i = 0; i < 5; ++i) {
            c.at(i).post([&, fn](Memberlist& m) {
                fn(m);
                done.fetch_add(1);
            });
        }
        REQUIRE(Cluster::wait_for([&] { return done.load() == 5; }, std::chrono::seconds(5)));
    };
    on_all([](Memberlist& m) { m.keyring().add_key(key_of(2)); });
    on_all([](Memberlist& m) { REQUIRE(m.keyring().use_key(key_of(2)).ok()); });
    const uint64_t rtts = c.at(3).stats().probe_rtt_count.load();
    REQUIRE(Cluster::wait_for([&] { return c.at(3).stats().probe_rtt_count.load() > rtts + 3; },
                              std::chrono::seconds(5)));
    on_all([](Memberlist& m) { REQUIRE(m.keyring().remove_key(key_of(1)).ok()); });
    // Traffic under the new key alone: a state change still reaches everyone.
    c.at(2).post([](Memberlist& m) {
        SiteState s;
        s.site_id = m.name();
        s.region = "rotated";
        m.update_site_state(s);
    });
    CHECK(Cluster::wait_for(
        [&] {
            for (size_t i = 0; i < 5; ++i) {
                auto v = c.at(i).snapshot()->find("site2");
                if (v == nullptr || !v->site || v->site->region != "rotated") {
                    return false;
                }
            }
            return true;
        },
        std::chrono::seconds(5)));
    CHECK(c.all_see_alive(5, names(5)));
    CHECK(c.deaths().empty());
}

TEST_CASE("sockets: a member stopped abruptly is declared dead by the others") {
    Cluster c;
    start_five(c, {key_of(9)});
    REQUIRE(Cluster::wait_for([&] { return c.all_see_alive(5, names(5)); },
                              std::chrono::seconds(10)));
    c.at(4).kill();
    auto dead_everywhere = [&] {
        for (size_t i = 0; i < 4; ++i) {
            auto v = c.at(i).snapshot()->find("site4");
            if (v == nullptr || v->state != NodeState::kDead) {
                return false;
            }
        }
        return true;
    };
    // Bound: suspicion max = 6 * 4 * 200 ms = 4.8 s, plus probing and gossip.
    CHECK(Cluster::wait_for(dead_everywhere, std::chrono::seconds(8)));
    CHECK(c.all_see_alive(4, names(4)));

    // And a graceful leave is seen as left.
    c.at(3).stop(milliseconds(300));
    CHECK(Cluster::wait_for(
        [&] {
            for (size_t i = 0; i < 3; ++i) {
                auto v = c.at(i).snapshot()->find("site3");
                if (v == nullptr || v->state != NodeState::kLeft) {
                    return false;
                }
            }
            return true;
        },
        std::chrono::seconds(5)));
}

TEST_CASE("sockets: a member whose seed is not up yet joins once the seed is") {
    Cluster c;
    // A port with nothing behind it yet: joins to it are refused until the seed binds it.
    uint16_t seed_port = 0;
    {
        boost::asio::ip::tcp::acceptor probe(c.io_,
                                             {boost::asio::ip::make_address("127.0.0.1"), 0});
        seed_port = probe.local_endpoint().port();
    }
    MembershipService& first = c.add("site0", {key_of(5)});
    MembershipService& late = c.add("site2", {key_of(5)});
    first.start({});
    late.start({"127.0.0.1:" + std::to_string(seed_port)});
    REQUIRE(Cluster::wait_for([&] { return late.stats().stream_failures.load() > 1; },
                              std::chrono::seconds(5)));
    CHECK(late.snapshot()->members.size() == 1);
    MembershipService& seed = c.add("site1", {key_of(5)}, seed_port);
    seed.start({first.advertise_addr()});
    CHECK(
        Cluster::wait_for([&] { return c.all_see_alive(3, names(3)); }, std::chrono::seconds(10)));
}

// Resident set size of this process, in bytes.
size_t resident_bytes() {
    std::ifstream statm("/proc/self/statm");
    size_t pages = 0;
    size_t resident = 0;
    statm >> pages >> resident;
    return resident * 4096;
}

TEST_CASE(
    "sockets: unauthenticated stream connections are capped, an eighth of them per address, and "
    "cost what they send") {
    Cluster c;
    MembershipService& seed = c.add("site0", {key_of(6)});
    seed.start({});
    const size_t cap = fast_config("x").max_inbound_streams;
    const size_t per_source = cap / 8;
    REQUIRE(per_source >= 2);
    const size_t before = resident_bytes();
    // Each claims a frame of 32 MiB - 1 and sends nothing more: an unbounded reader would
    // allocate (and zero) 32 MiB for each before authenticating anything.
    boost::asio::io_context io;
    std::vector<boost::asio::ip::tcp::socket> conns;
    const boost::asio::ip::tcp::endpoint to(boost::asio::ip::make_address("127.0.0.1"),
                                            seed.port());
    auto open_from = [&](int host) {  // From 127.0.0.<host>.
        conns.emplace_back(io);
        conns.back().open(boost::asio::ip::tcp::v4());
        conns.back().bind(boost::asio::ip::tcp::endpoint(
            boost::asio::ip::make_address("127.0.0." + std::to_string(host)), 0));
        conns.back().connect(to);
        const std::array<uint8_t, 4> header{0x01, 0xff, 0xff, 0xff};
        boost::asio::write(conns.back(), boost::asio::buffer(header));
    };
    // One address gets its eighth; the ones past it are closed at accept, long before the 1 s
    // stream timeout.
    for (size_t i = 0; i < per_source + 2; ++i) {
        open_from(2);
    }
    REQUIRE(Cluster::wait_for([&] { return seed.stats().inbound_streams_refused.load() >= 2; },
                              milliseconds(500)));
    CHECK(seed.stats().inbound_streams.load() == static_cast<int64_t>(per_source));
    // Other addresses fill the rest, and past the cap every connection is closed at accept.
    for (int host = 3; host < 3 + static_cast<int>(cap / per_source) + 1; ++host) {
        for (size_t i = 0; i < per_source; ++i) {
            open_from(host);
        }
    }
    REQUIRE(Cluster::wait_for(
        [&] { return seed.stats().inbound_streams_refused.load() >= 2 + 2 * per_source; },
        milliseconds(500)));
    CHECK(seed.stats().inbound_streams.load() == static_cast<int64_t>(cap));
    const size_t grown = resident_bytes() - std::min(before, resident_bytes());
    MESSAGE("resident set grew by " << grown / 1024 << " KiB with " << cap << " open streams");
    CHECK(grown < (64u << 20));
    for (auto& s : conns) {
        s.close();
    }
    REQUIRE(Cluster::wait_for([&] { return seed.stats().inbound_streams.load() == 0; },
                              std::chrono::seconds(3)));
    // Honest members still join; three of them share 127.0.0.1, which then holds an eighth for
    // each (the seed's own address does not count it).
    for (int i = 1; i <= 3; ++i) {
        c.add("site" + std::to_string(i), {key_of(6)}).start({seed.advertise_addr()});
    }
    REQUIRE(
        Cluster::wait_for([&] { return c.all_see_alive(4, names(4)); }, std::chrono::seconds(5)));
    for (size_t i = 0; i < 3 * per_source + 2; ++i) {
        open_from(1);
    }
    CHECK(Cluster::wait_for(
        [&] {
            return seed.stats().inbound_streams.load() >= static_cast<int64_t>(2 * per_source + 1);
        },
        milliseconds(500)));
}

TEST_CASE("sockets: addresses are parsed strictly") {
    CHECK(split_host_port("127.0.0.1:7946").value().second == 7946);
    CHECK(split_host_port("[::1]:80").value().first == "::1");
    CHECK_FALSE(split_host_port("127.0.0.1").ok());
    CHECK_FALSE(split_host_port("127.0.0.1:99999").ok());
    CHECK_FALSE(split_host_port("[::1:80").ok());
    CHECK_FALSE(split_host_port(":80").ok());
    CHECK_FALSE(split_host_port("h:8a").ok());
}

}  // namespace
}  // namespace edge::routing::membership
