// A standalone gossip member for bench/gossip_vs_serf.sh: one MembershipService with
// memberlist's LAN timers on a real UDP/TCP port. It logs, one line each, with the wall time in
// microseconds: membership events ("t=... event=dead member=x"), site state updates it learns
// ("t=... event=update member=x"), and once a second its counters
// ("t=... stats bytes_sent=... members=..."). SIGUSR1 changes its own site state (region
// "changed-<k>"), SIGTERM/SIGINT leave gracefully, SIGKILL is a crash.
//
//   bench_gossip_node --name N --bind 127.0.0.1:7946 [--join ip:port]... [--key HEX64]
//                     [--profile lan|local]

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <csignal>
#include <thread>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "routing/membership/membership_service.h"

using namespace edge;
using namespace edge::routing::membership;

namespace {

int64_t wall_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

int usage() {
    std::fprintf(stderr,
                 "usage: bench_gossip_node --name N --bind IP:PORT [--join IP:PORT]... "
                 "[--key HEX64] [--profile lan|local]\n");
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    std::string name, bind, profile = "lan";
    std::vector<std::string> joins;
    std::vector<GossipKey> keys;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            std::printf("usage: bench_gossip_node --name N --bind IP:PORT [--join IP:PORT]... "
                        "[--key HEX64] [--profile lan|local]\n");
            return 0;
        }
        if (i + 1 >= argc) {
            return usage();
        }
        const std::string val = argv[++i];
        if (arg == "--name") {
            name = val;
        } else if (arg == "--bind") {
            bind = val;
        } else if (arg == "--join") {
            joins.push_back(val);
        } else if (arg == "--profile") {
            if (val != "lan" && val != "local") {
                return usage();
            }
            profile = val;
        } else if (arg == "--key") {
            auto k = parse_gossip_key(val);
            if (!k.ok()) {
                std::fprintf(stderr, "%s\n", k.status().to_string().c_str());
                return 2;
            }
            keys.push_back(*k);
        } else {
            return usage();
        }
    }
    if (name.empty() || bind.empty()) {
        return usage();
    }
    auto hp = split_host_port(bind);
    if (!hp.ok()) {
        std::fprintf(stderr, "%s\n", hp.status().to_string().c_str());
        return 2;
    }
    MembershipConfig config = profile == "local" ? local_profile() : lan_profile();
    config.name = name;
    config.label = "bench";
    SiteState site;
    site.site_id = name;
    site.region = "initial";
    auto ring = Keyring::create(keys);
    if (!ring.ok()) {
        std::fprintf(stderr, "%s\n", ring.status().to_string().c_str());
        return 2;
    }
    boost::asio::io_context io;
    auto svc = MembershipService::create(io, config, *ring, site, hp->first, hp->second);
    if (!svc.ok()) {
        std::fprintf(stderr, "%s\n", svc.status().to_string().c_str());
        return 1;
    }
    MembershipService& s = **svc;
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    // Runs on the strand; reads the member's site from a fresh snapshot of the protocol.
    s.set_event_callback([&s](const MemberEvent& e) {
        std::printf("t=%lld event=%s member=%s\n", static_cast<long long>(wall_us()),
                    std::string(member_event_name(e.kind)).c_str(), e.name.c_str());
    });
    s.start(joins);

    int changes = 0;
    boost::asio::signal_set signals(io, SIGINT, SIGTERM, SIGUSR1);
    std::function<void(const boost::system::error_code&, int)> on_signal =
        [&](const boost::system::error_code& ec, int sig) {
            if (ec) {
                return;
            }
            if (sig == SIGUSR1) {
                const int k = ++changes;
                s.post([k, name](Memberlist& m) {
                    SiteState next;
                    next.site_id = name;
                    next.region = "changed-" + std::to_string(k);
                    m.update_site_state(next);
                });
                std::printf("t=%lld event=local_change region=changed-%d\n",
                            static_cast<long long>(wall_us()), k);
                signals.async_wait(on_signal);
                return;
            }
            std::thread([&] {
                s.stop(std::chrono::seconds(1));
                io.stop();
            }).detach();
        };
    signals.async_wait(on_signal);

    // Once a second: counters.
    boost::asio::steady_timer tick(io);
    std::function<void(const boost::system::error_code&)> on_tick =
        [&](const boost::system::error_code& ec) {
            if (ec) {
                return;
            }
            auto snap = s.snapshot();
            std::printf("t=%lld stats bytes_sent=%llu bytes_received=%llu alive=%zu\n",
                        static_cast<long long>(wall_us()),
                        static_cast<unsigned long long>(s.stats().bytes_sent.load()),
                        static_cast<unsigned long long>(s.stats().bytes_received.load()),
                        snap->count(NodeState::kAlive));
            tick.expires_after(std::chrono::seconds(1));
            tick.async_wait(on_tick);
        };
    tick.expires_after(std::chrono::seconds(1));
    tick.async_wait(on_tick);
    io.run();
    return 0;
}
