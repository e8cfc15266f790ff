#pragma once

// ClusterPair: two Clusters (no Daemon around them) on one io_context, gossiping over real
// UDP/TCP on loopback with the `local` preset: `sin` starts the cluster (no seeds), `fra` joins
// it. add() creates more sites on the same io_context, not started. Shared by the cluster tests.

#include <doctest/doctest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "daemon/cluster/cluster.h"
#include "daemon/config.h"
#include "daemon/metrics.h"
#include "tests/testing/daemon_yaml.h"
#include "tests/testing/scripted_generator.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/test_daemon.h"

namespace edge::testing {

struct ClusterPair {
    // `sin_admin`: the admin address sin advertises (fra checks its /readyz there); `extra`:
    // appended to every site's routing section; `fra_metrics`, when given, gets fra's metrics.
    explicit ClusterPair(const std::string& sin_admin, const std::string& extra = "",
                         daemon::Metrics* fra_metrics = nullptr)
        : extra_(extra) {
        cert = testing::make_certificate(dir.path(), "srv", {"localhost"});
        auto made = daemon::cluster::Cluster::create(io, config_of("sin", {}), sin_generator,
                                                     nullptr, SystemClock::instance(), sin_admin);
        REQUIRE_MESSAGE(made.ok(), made.status().to_string());
        sin = std::move(made).value();
        made =
            daemon::cluster::Cluster::create(io, config_of("fra", {seed()}), fra_generator,
                                             fra_metrics, SystemClock::instance(), "127.0.0.1:1");
        REQUIRE_MESSAGE(made.ok(), made.status().to_string());
        fra = std::move(made).value();
        for (int i = 0; i < 2; ++i) {
            threads.emplace_back([this] {
                auto guard = boost::asio::make_work_guard(io);
                io.run();
            });
        }
        sin->start();
        fra->start();
    }
    ~ClusterPair() {
        for (auto& site : others) {
            site->kill();
        }
        fra->kill();
        sin->kill();
        io.stop();
        for (std::thread& t : threads) {
            t.join();
        }
    }

    // sin's gossip address, for a site's `gossip.join`.
    std::string seed() const { return "127.0.0.1:" + std::to_string(sin->gossip_port()); }

    // Another site with no pools on the same io_context, joining through `join`; start() is
    // the caller's.
    daemon::cluster::Cluster& add(const std::string& id, std::vector<std::string> join) {
        auto made =
            daemon::cluster::Cluster::create(io, config_of(id, std::move(join)), fra_generator,
                                             nullptr, SystemClock::instance(), "127.0.0.1:1");
        REQUIRE_MESSAGE(made.ok(), made.status().to_string());
        others.push_back(std::move(made).value());
        return *others.back();
    }

    testing::TempDir dir;
    testing::TestCertificate cert;
    boost::asio::io_context io;
    testing::ScriptedGenerator sin_generator{{"test-model"}};
    testing::ScriptedGenerator fra_generator{std::vector<std::string>{}};
    std::unique_ptr<daemon::cluster::Cluster> sin;
    std::unique_ptr<daemon::cluster::Cluster> fra;
    std::vector<std::unique_ptr<daemon::cluster::Cluster>> others;
    std::vector<std::thread> threads;

  private:
    daemon::Config config_of(const std::string& id, std::vector<std::string> join) const {
        testing::DaemonYaml y;
        y.site_id = id;
        y.peer_address = "127.0.0.1:1";  // Planned to; nothing is forwarded here.
        y.cert_path = cert.cert_path;
        y.key_path = cert.key_path;
        y.gossip.emplace();
        y.gossip->join = std::move(join);
        y.extra =
            "routing:\n"
            "  outlier:\n"
            "    consecutive_failures: 2\n"
            "    max_ejection_percent: 100\n" +
            extra_;
        Result<daemon::Config> c = daemon::parse_config(testing::daemon_yaml(y), id);
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        return std::move(c).value();
    }

    std::string extra_;
};

// Whether `site` sees `member` alive. The snapshot is held while its entry is read: the site
// may publish a new one meanwhile, which frees the old one.
inline bool sees_alive(daemon::cluster::Cluster& site, const std::string& member) {
    const auto snap = site.snapshot();
    const routing::membership::MemberView* m = snap->find(member);
    return m != nullptr && m->state == routing::membership::NodeState::kAlive;
}

// POST /admin/rollout of test-model at `site`, its deferred answer waited for.
inline daemon::AdminReply post_rollout(daemon::cluster::Cluster& site,
                                       const std::string& version) {
    std::optional<daemon::AdminReply> r =
        site.handle_admin("POST", "/admin/rollout?model=test-model&version=" + version);
    REQUIRE(r.has_value());
    REQUIRE(r->deferred);
    auto answered = std::make_shared<std::promise<daemon::AdminReply>>();
    std::future<daemon::AdminReply> answer = answered->get_future();
    r->deferred([answered](daemon::AdminReply a) { answered->set_value(std::move(a)); });
    REQUIRE(answer.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
    return answer.get();
}

}  // namespace edge::testing
