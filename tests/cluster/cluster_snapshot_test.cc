// gossip.snapshot_file through a Cluster (no Daemon around it) gossiping over real UDP/TCP on
// loopback: a site with no gossip.join that restored members from its snapshot is not a new
// cluster (it refuses rollouts until it has rejoined them), rejoins them by itself, and stamps its
// rollout past the clock it restored.

#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "daemon/cluster/cluster.h"
#include "routing/membership/snapshot_file.h"
#include "tests/cluster/cluster_pair.h"
#include "tests/testing/daemon_yaml.h"

using namespace edge;
using namespace std::chrono_literals;
namespace membership = edge::routing::membership;
using testing::ClusterPair;
using testing::post_rollout;
using testing::sees_alive;
using testing::wait_for;

TEST_CASE(
    "a seed restarted with a gossip snapshot waits to rejoin, then rolls out past its clock") {
    ClusterPair c("127.0.0.1:1");
    REQUIRE(wait_for([&] { return sees_alive(*c.fra, "sin"); }, 10s));
    // What "seed" wrote before its restart: the clock at 7, sin among its members.
    const std::string path =
        c.dir.write("seed.snapshot", "edgeserve-gossip-snapshot 1\nevent_clock 7\nmember " +
                                         c.seed() + " sin\nend 1\n");
    testing::DaemonYaml y;
    y.site_id = "seed";
    y.peer_address = "127.0.0.1:1";
    y.cert_path = c.cert.cert_path;
    y.key_path = c.cert.key_path;
    y.gossip.emplace();  // No join list.
    y.gossip->snapshot_file = path;
    const std::string yaml = testing::daemon_yaml(y);
    Result<daemon::Config> config = daemon::parse_config(yaml, "seed");
    REQUIRE_MESSAGE(config.ok(), config.status().to_string());
    REQUIRE(config->gossip.snapshot_file == path);
    auto made = daemon::cluster::Cluster::create(c.io, *config, c.fra_generator, nullptr,
                                                 SystemClock::instance(), "127.0.0.1:1");
    REQUIRE_MESSAGE(made.ok(), made.status().to_string());
    c.others.push_back(std::move(made).value());
    daemon::cluster::Cluster& seed = *c.others.back();

    // Alone with no seeds, but it was in a cluster: refused, not taken as the whole cluster.
    daemon::AdminReply r = post_rollout(seed, "v2");
    CHECK_MESSAGE(r.status == 503, r.body);
    CHECK_MESSAGE(r.body.find("not yet exchanged state with another member") != std::string::npos,
                  r.body);
    CHECK_FALSE(seed.rollouts().target("test-model"));

    // Started, it joins the member it saved, and its intent is stamped past the clock it restored.
    seed.start();
    REQUIRE(wait_for([&] { return sees_alive(seed, "sin") && sees_alive(*c.sin, "seed"); }, 10s));
    r = post_rollout(seed, "v2");
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const std::optional<daemon::cluster::RolloutIntent> held = seed.rollouts().target("test-model");
    REQUIRE(held);
    CHECK(held->ltime > 7);
    CHECK(wait_for(
        [&] {
            const auto t = c.sin->rollouts().target("test-model");
            return t && t->version == "v2";
        },
        5s));
    // And the file follows: sin and fra, the clock of the intent.
    CHECK(wait_for(
        [&] {
            Result<membership::GossipSnapshot> s = membership::read_gossip_snapshot(path);
            return s.ok() && s->event_clock == held->ltime && s->members.size() == 2;
        },
        5s));
}
