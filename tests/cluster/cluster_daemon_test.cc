// Three real Daemons in one process on loopback, gossiping over real UDP/TCP with the `local`
// preset and fast intervals: they converge, the admin views list every site and every cost term,
// published load and injected per-peer latency move the route, a reloaded saturation line is the
// one gossip judges load by, a rollout intent reaches every site, SIGTERM's path advertises
// draining before leaving, and a site that dies without leaving stops getting traffic within the
// detection bound. Waits poll real state with a deadline (the gossip runs on real sockets);
// nothing sleeps for a fixed time.

#include <doctest/doctest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/json.hpp>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "common/log.h"
#include "daemon/admin_server.h"
#include "daemon/cluster/cli.h"
#include "daemon/cluster/cluster.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "tests/cluster/cluster_pair.h"
#include "tests/testing/daemon_yaml.h"
#include "tests/testing/scripted_generator.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/test_daemon.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using namespace std::chrono_literals;
namespace json = boost::json;
namespace membership = edge::routing::membership;

namespace {

struct SiteSpec {
    std::string id;
    double lat;
    double lon;
};
const SiteSpec kFra{"fra", 50.1, 8.7};
const SiteSpec kSin{"sin", 1.35, 103.8};
const SiteSpec kGru{"gru", -23.5, -46.6};

using testing::wait_for;

struct Site {
    SiteSpec spec;
    testing::ScriptedGenerator generator;
    std::unique_ptr<daemon::Daemon> daemon;
    testing::DaemonYaml yaml;  // The config it started with, for Cluster3::reload.
    std::string path;          // Where that config is said to live.

    Site(SiteSpec s, std::vector<std::string> models) : spec(std::move(s)), generator(models) {}

    std::string admin() const { return "127.0.0.1:" + std::to_string(daemon->admin_port()); }

    json::value get_json(const std::string& target) {
        auto r = daemon::cluster::admin_request(admin(), "GET", target);
        REQUIRE_MESSAGE(r.ok(), r.status().to_string());
        REQUIRE_MESSAGE(r->status == 200, r->body);
        return json::parse(r->body);
    }

    std::string chosen(const std::string& model = "test-model") {
        json::value v = get_json("/admin/route?model=" + model);
        const json::value& c = v.at("chosen");
        return c.is_null() ? "rejected" : std::string(c.at("site").as_string());
    }

    std::shared_ptr<const membership::MembershipSnapshot> snapshot() {
        return daemon->cluster()->snapshot();
    }

    // This site sees `n` members alive, each with its site state and pools known.
    bool sees_alive(size_t n) {
        auto snap = snapshot();
        size_t alive = 0;
        for (const auto& m : snap->members) {
            if (m.state == membership::NodeState::kAlive && m.site) {
                ++alive;
            }
        }
        return alive == n;
    }

    const membership::MemberView* member(const std::string& name) {
        snap_ = snapshot();
        return snap_->find(name);
    }

    std::shared_ptr<const membership::MembershipSnapshot> snap_;
};

class Cluster3 {
public:
    // `routing` is appended to each site's routing section; `delays(site)` is its
    // testing_peer_delay_ms mapping ("" for none).
    Cluster3(const std::vector<std::vector<std::string>>& models,
             const std::function<std::string(const std::string&)>& delays = {},
             const std::string& routing = "", const std::vector<std::string>& gossip_keys = {}) {
        cert_ = testing::make_certificate(dir_.path(), "srv", {"localhost"});
        const SiteSpec specs[3] = {kFra, kSin, kGru};
        for (size_t i = 0; i < 3; ++i) {
            sites_.push_back(std::make_unique<Site>(specs[i], models[i]));
            Site& s = *sites_.back();
            testing::DaemonYaml y;
            y.site_id = s.spec.id;
            y.latitude = s.spec.lat;
            y.longitude = s.spec.lon;
            y.peer_address = "127.0.0.1:" + std::to_string(20000 + i);
            y.cert_path = cert_.cert_path;
            y.key_path = cert_.key_path;
            y.gossip.emplace();
            y.gossip->suspicion_mult = 2;
            if (i > 0) {
                const uint16_t seed = sites_[0]->daemon->cluster()->gossip_port();
                y.gossip->join = {"127.0.0.1:" + std::to_string(seed)};
            }
            y.gossip->testing_peer_delay = delays ? delays(s.spec.id) : "";
            y.gossip->keys = gossip_keys;
            y.extra = routing_section(routing);
            s.yaml = y;
            s.path = dir_.file(s.spec.id + ".yaml");
            s.daemon = testing::make_daemon(testing::daemon_yaml(y), s.path, s.generator,
                                            SystemClock::instance());
            s.daemon->start();
        }
    }

    Site& operator[](size_t i) { return *sites_.at(i); }

    // SIGHUP's path (Daemon::reload) on site `i`: the config it started with, but `routing`
    // appended to its routing section in place of the constructor's.
    Status reload(size_t i, const std::string& routing) {
        Site& s = *sites_.at(i);
        testing::DaemonYaml y = s.yaml;
        y.extra = routing_section(routing);
        Result<daemon::Config> fresh = daemon::parse_config(testing::daemon_yaml(y), s.path);
        REQUIRE_MESSAGE(fresh.ok(), fresh.status().to_string());
        return s.daemon->reload(*fresh);
    }

    bool converged() {
        for (auto& s : sites_) {
            if (s->daemon && !s->sees_alive(3)) {
                return false;
            }
        }
        return true;
    }

private:
    // Every site's routing section: outliers ejected fast, then `routing` (more keys of it).
    static std::string routing_section(const std::string& routing) {
        return "routing:\n"
               "  outlier:\n"
               "    consecutive_failures: 2\n"
               "    max_ejection_percent: 100\n" +
               routing;
    }

    testing::TempDir dir_;
    testing::TestCertificate cert_;
    std::vector<std::unique_ptr<Site>> sites_;
};

engine::ModelLoad load(uint32_t queue, uint32_t running) {
    engine::ModelLoad l;
    l.name = "test-model";
    l.queue_depth = queue;
    l.running = running;
    l.capacity = 8;
    l.decode_tokens_per_s = 100.0;
    return l;
}

}  // namespace

TEST_CASE("three daemons converge, /admin/members, /pools and /route show the whole cluster") {
    Cluster3 c({{"test-model"}, {"test-model"}, {"test-model"}});
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));

    json::value members = c[0].get_json("/admin/members");
    CHECK(members.at("local").as_string() == "fra");
    REQUIRE(members.at("members").as_array().size() == 3);
    std::set<std::string> names;
    for (const auto& m : members.at("members").as_array()) {
        names.insert(std::string(m.at("name").as_string()));
        CHECK(m.at("state").as_string() == "alive");
        CHECK(m.at("pools").as_int64() == 1);
        CHECK(m.at("admin_addr").as_string().starts_with("127.0.0.1:"));
    }
    CHECK(names == std::set<std::string>{"fra", "gru", "sin"});

    json::value pools = c[1].get_json("/admin/pools");
    REQUIRE(pools.at("pools").as_array().size() == 3);
    for (const auto& p : pools.at("pools").as_array()) {
        CHECK(p.at("model").as_string() == "test-model");
        CHECK(p.at("version").as_string() == "v1");
        CHECK(p.at("state").as_string() == "serving");
        CHECK(p.at("capacity").as_int64() == 0);
    }

    json::value route = c[0].get_json("/admin/route?model=test-model");
    CHECK(route.at("outcome").as_string() == "local");
    REQUIRE(route.at("candidates").as_array().size() == 3);
    for (const auto& cand : route.at("candidates").as_array()) {
        for (const char* term : {"rtt_ms", "queue_ms", "prefill_ms", "kv_ms", "penalty_ms",
                                 "total_ms", "verdict"}) {
            CHECK_MESSAGE(cand.as_object().contains(term), term);
        }
    }
    auto text = daemon::cluster::admin_request(c[0].admin(), "GET",
                                               "/admin/members?format=text");
    REQUIRE(text.ok());
    CHECK(text->body.find("fra *") != std::string::npos);
    CHECK(text->body.find("sin") != std::string::npos);
    auto bad = daemon::cluster::admin_request(c[0].admin(), "GET", "/admin/route");
    REQUIRE(bad.ok());
    CHECK(bad->status == 400);
    auto wrong = daemon::cluster::admin_request(c[0].admin(), "POST", "/admin/members");
    REQUIRE(wrong.ok());
    CHECK(wrong->status == 405);

    // Gauges follow within one publish interval (50 ms here).
    CHECK(wait_for(
        [&] {
            const std::string metrics = c[0].daemon->metrics().serialize();
            return metrics.find("edgeserve_gossip_members{state=\"alive\"} 3") !=
                       std::string::npos &&
                   metrics.find("edgeserve_site_rtt_seconds{site=\"sin\"}") != std::string::npos;
        },
        2s));
}

TEST_CASE("membership changes are logged as gossip_member events naming the change") {
    std::mutex mu;
    std::vector<std::string> lines;
    log::set_sink([&](std::string_view line) {
        std::lock_guard lock(mu);
        lines.emplace_back(line);
    });
    {
        Cluster3 c({{"test-model"}, {"test-model"}, {"test-model"}});
        REQUIRE(wait_for([&] { return c.converged(); }, 10s));
    }
    log::set_sink(nullptr);
    size_t joins = 0;
    for (const std::string& line : lines) {
        const json::value v = json::parse(line);
        if (v.at("event").as_string() == "gossip_member") {
            joins += v.at("change").as_string() == "join" ? 1 : 0;
            CHECK(v.as_object().contains("member"));
        }
    }
    // Each of the three sites saw the two others join.
    CHECK(joins >= 6);
}

TEST_CASE("published load moves the route: a loaded local pool spills, then comes back") {
    Cluster3 c({{"test-model"}, {"test-model"}, {}});
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));
    CHECK(c[0].chosen() == "fra");
    c[0].generator.set_load({load(40, 8)});  // Saturated: 4 queued per slot.
    CHECK(wait_for([&] { return c[0].chosen() == "sin"; }, 5s));
    // The other site sees it too, through gossip.
    CHECK(wait_for([&] { return c[2].chosen() == "sin"; }, 5s));
    c[0].generator.set_load({load(0, 1)});
    CHECK(wait_for([&] { return c[0].chosen() == "fra"; }, 5s));
}

// Whether a load change is material was judged twice: by Cluster against the last sample it
// posted, and by the memberlist against the state it last gossiped, which keeps a sample that is
// not (or that comes within a second of the last). A kept sample became Cluster's baseline:
// gossiped 10, then 13 (kept: too soon), 11 (material against 13, but not against 10: kept), then
// 12 was never posted (not material against 11), though the cluster still held 10.
TEST_CASE("a load sample material against what was gossiped goes out whatever was kept before") {
    Cluster3 c({{"test-model"}, {"test-model"}, {}});
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));
    // What fra gossips, as its own snapshot shows it.
    auto gossiped_queue = [&]() -> int64_t {
        const membership::MemberView* fra = c[0].member("fra");
        if (fra == nullptr || !fra->site || fra->site->pools.empty()) {
            return -1;
        }
        return fra->site->pools[0].load.queue_depth;
    };
    c[0].generator.set_load({load(10, 4)});
    REQUIRE(wait_for([&] { return gossiped_queue() == 10; }, 5s));
    // Within the second after that publish (samples every 50 ms): each kept by the rate limit.
    c[0].generator.set_load({load(13, 4)});
    std::this_thread::sleep_for(200ms);
    c[0].generator.set_load({load(11, 4)});
    std::this_thread::sleep_for(200ms);
    c[0].generator.set_load({load(12, 4)});
    // 12 is 2 requests and 20 % past 10: what is gossiped ends within a step of 12 (12 itself
    // when the samples came as planned, 11 or 13 when a publish came between them).
    const bool close = wait_for(
        [&] {
            const int64_t q = gossiped_queue();
            return q >= 11 && q <= 13;
        },
        3s);
    CHECK_MESSAGE(close, "fra gossips queue " << gossiped_queue() << " for a queue of 12");
}

// routing.kv_saturated is reloaded live, and gossip judges load steps by it: KV use held back as
// a step under 0.1 (0.86 gossiped, 0.92 held) crosses a line lowered to 0.9. Cluster's publisher
// posts no sample equal to the last and the engine's figures stand still, so only the reload
// itself (Cluster::reload_routing posting the new line to the memberlist) can send it; without
// it every site kept routing to the pool as below the line that its own site now counts it past.
TEST_CASE("a reload lowering routing.kv_saturated gossips the held KV use that now crosses it") {
    Cluster3 c({{"test-model"}, {"test-model"}, {}});
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));
    auto kv_load = [](double kv) {
        engine::ModelLoad l = load(0, 4);
        l.kv_use = kv;
        return l;
    };
    // fra's KV use as sin sees it, through gossip; -1 before fra's pool reached it.
    auto kv_at_sin = [&]() -> double {
        const membership::MemberView* fra = c[1].member("fra");
        if (fra == nullptr || !fra->site || fra->site->pools.empty()) {
            return -1;
        }
        return fra->site->pools[0].load.kv_use;
    };
    c[0].generator.set_load({kv_load(0.86)});
    REQUIRE(wait_for([&] { return kv_at_sin() == 0.86; }, 5s));
    // Under the 0.1 step and below the default line (0.98): held back, past the rate limit (1 s)
    // and many samples (every 50 ms).
    c[0].generator.set_load({kv_load(0.92)});
    std::this_thread::sleep_for(1500ms);
    REQUIRE(kv_at_sin() == 0.86);
    REQUIRE(c.reload(0, "  kv_saturated: 0.9\n").ok());
    const bool sent = wait_for([&] { return kv_at_sin() == 0.92; }, 5s);
    CHECK_MESSAGE(sent, "sin sees fra's KV use at " << kv_at_sin() << " for a held 0.92");
}

TEST_CASE("injected per-peer latency: routing follows the measured RTT, not the map") {
    // fra has no pool. By the map gru (Sao Paulo) is about as far as sin (Singapore); the
    // injected delays make sin 10 ms away and gru 100 ms.
    auto delays = [](const std::string& site) -> std::string {
        if (site == "fra") return "sin: 5, gru: 50";
        if (site == "sin") return "fra: 5, gru: 50";
        return "fra: 50, sin: 50";
    };
    Cluster3 c({{}, {"test-model"}, {"test-model"}}, delays);
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));
    // Coordinates converge from the probes' RTTs; then the route is decided by them.
    bool vivaldi = wait_for(
        [&] {
            json::value r = c[0].get_json("/admin/route?model=test-model");
            if (r.at("chosen").is_null()) return false;
            for (const auto& cand : r.at("candidates").as_array()) {
                if (cand.at("rtt_source").as_string() != "vivaldi") return false;
            }
            return true;
        },
        20s);
    REQUIRE(vivaldi);
    json::value r = c[0].get_json("/admin/route?model=test-model");
    double sin_rtt = 0;
    double gru_rtt = 0;
    for (const auto& cand : r.at("candidates").as_array()) {
        (cand.at("site").as_string() == "sin" ? sin_rtt : gru_rtt) =
            cand.at("rtt_ms").to_number<double>();
    }
    MESSAGE("vivaldi rtt from fra: sin " << sin_rtt << " ms, gru " << gru_rtt << " ms");
    CHECK(sin_rtt < gru_rtt);
    CHECK(gru_rtt > 40.0);
    CHECK(c[0].chosen() == "sin");
}

// Gossip packets and streams a site dropped because no key of its own opened them.
uint64_t gossip_auth_rejected(daemon::Daemon& d) {
    const std::string text = d.metrics().serialize();
    const std::string name = "edgeserve_gossip_packets_rejected_total{reason=\"auth\"} ";
    const size_t at = text.find(name);
    return at == std::string::npos ? 0 : std::stoull(text.substr(at + name.size()));
}

TEST_CASE("a reload rotates the gossip keys in three rounds with no member lost") {
    const std::string k1(64, '1'), k2(64, '2'), k3(64, '3');
    Cluster3 c({{"test-model"}, {"test-model"}, {"test-model"}}, {}, "", {k1});
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));
    auto reload = [&](size_t site, std::vector<std::string> keys, std::string file = "") {
        daemon::GossipConfig g;
        g.enabled = true;  // A config with a `gossip` section: one without keeps the keys.
        g.keys = std::move(keys);
        g.keyring_file = std::move(file);
        return c[site].daemon->reload_gossip_keys(g);
    };
    // Add the new key, make it primary, drop the old one: each round on every site first.
    for (const std::vector<std::string>& keys : std::vector<std::vector<std::string>>{
             {k1, k2}, {k2, k1}, {k2}}) {
        for (size_t i = 0; i < 3; ++i) {
            REQUIRE(reload(i, keys).ok());
        }
        std::this_thread::sleep_for(300ms);
    }
    // Probes and a push-pull under the new key alone.
    std::this_thread::sleep_for(1500ms);
    CHECK(c.converged());
    for (size_t i = 0; i < 3; ++i) {
        CHECK(gossip_auth_rejected(*c[i].daemon) == 0);
    }
    // Refused, the keys staying: encryption off, a keyring file that does not open.
    CHECK(reload(0, {}).code() == StatusCode::kFailedPrecondition);
    CHECK(reload(0, {k2}, "/nonexistent/gossip.keys").code() == StatusCode::kNotFound);
    std::this_thread::sleep_for(500ms);
    CHECK(c.converged());
    // The reload is what the site seals with: a key no one else holds makes it unreadable.
    REQUIRE(reload(2, {k3}).ok());
    CHECK(wait_for([&] { return gossip_auth_rejected(*c[0].daemon) > 0; }, 5s));
}

TEST_CASE("a rollout intent reaches every site and steers unpinned requests") {
    Cluster3 c({{}, {"test-model"}, {"test-model"}});
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));
    auto r = daemon::cluster::admin_request(c[1].admin(), "POST",
                                            "/admin/rollout?model=test-model&version=v2");
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    for (size_t i = 0; i < 3; ++i) {
        CHECK(wait_for(
            [&] {
                json::value v = c[i].get_json("/admin/rollouts");
                const auto& arr = v.at("rollouts").as_array();
                return arr.size() == 1 && arr[0].at("version").as_string() == "v2";
            },
            5s));
    }
    // No pool serves v2: the default fallback lets v1 serve, and the route says so.
    json::value route = c[0].get_json("/admin/route?model=test-model");
    CHECK(route.at("version_source").as_string() == "fallback");
    CHECK_FALSE(route.at("chosen").is_null());
    json::value pinned = c[0].get_json("/admin/route?model=test-model&version=v9");
    CHECK(pinned.at("rejection").as_string() == "version_pin_unmatched");
}

TEST_CASE("SIGTERM path: the site advertises draining, finishes its stream, then leaves") {
    Cluster3 c({{}, {"test-model"}, {"test-model"}});
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));

    // A stream in flight at sin.
    auto client = testing::TlsClient::connect(c[1].daemon->public_port());
    REQUIRE(client.ok());
    REQUIRE((*client)
                ->send(testing::http_request(
                    "POST", "/v1/chat/completions",
                    R"({"model":"test-model","stream":true,)"
                    R"("messages":[{"role":"user","content":"hi"}]})"))
                .ok());
    REQUIRE(c[1].generator.wait_for_request(0));

    auto stopping = std::async(std::launch::async,
                               [&] { c[1].daemon->stop(std::chrono::milliseconds(5000)); });
    // fra sees sin's pool draining and routes only to gru.
    CHECK(wait_for(
        [&] {
            const auto* m = c[0].member("sin");
            return m && m->site && !m->site->pools.empty() &&
                   m->site->pools[0].state == membership::PoolState::kDraining;
        },
        5s));
    for (int i = 0; i < 20; ++i) {
        CHECK(c[0].chosen() == "gru");
    }
    CHECK(stopping.wait_for(0ms) == std::future_status::timeout);  // Still draining the stream.
    c[1].generator.emit(0, "hello");
    c[1].generator.finish(0, engine::FinishReason::kStop, {1, 1, 0});
    auto reply = (*client)->read_response();
    REQUIRE(reply.ok());
    CHECK(reply->status == 200);
    CHECK(reply->body.find("hello") != std::string::npos);
    CHECK(reply->body.find("[DONE]") != std::string::npos);
    stopping.get();
    CHECK(wait_for(
        [&] {
            const auto* m = c[0].member("sin");
            return m && m->state == membership::NodeState::kLeft;
        },
        5s));
}

TEST_CASE("a site that dies without leaving stops getting traffic within the detection bound") {
    Cluster3 c({{}, {"test-model"}, {"test-model"}});
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));
    // Make sin the cheaper one: gru is loaded.
    c[1].generator.set_load({load(0, 1)});
    c[2].generator.set_load({load(6, 8)});
    const bool sin_first = wait_for([&] { return c[0].chosen() == "sin"; }, 5s);
    REQUIRE_MESSAGE(sin_first, json::serialize(c[0].get_json("/admin/route?model=test-model")));

    const auto died = std::chrono::steady_clock::now();
    c[1].daemon->cluster()->kill();  // No leave, no draining: as SIGKILL would.
    c[1].daemon.reset();             // Listeners gone too.
    REQUIRE(wait_for([&] { return c[0].chosen() == "gru"; }, 5s));
    const auto shifted = std::chrono::steady_clock::now() - died;
    MESSAGE("traffic shifted after " << std::chrono::duration<double, std::milli>(shifted).count()
                                     << " ms");
    // Bound: two failed /readyz checks 100 ms apart (ejection) or the gossip suspicion.
    CHECK(shifted < 3s);
}

using testing::ClusterPair;

TEST_CASE("a peer whose admin address is a host name gets its /readyz checks, not ejected") {
    // sin's admin listener, advertised as localhost:PORT (site.admin_address takes host:port).
    boost::asio::io_context admin_io;
    daemon::Metrics metrics;
    std::atomic<int> checks{0};
    auto admin = daemon::AdminServer::create(admin_io, "127.0.0.1", 0, metrics, [&] {
        ++checks;
        return ok_status();
    });
    REQUIRE(admin.ok());
    (*admin)->start();
    std::thread admin_thread([&] {
        auto guard = boost::asio::make_work_guard(admin_io);
        admin_io.run();
    });

    {
        ClusterPair c("localhost:" + std::to_string((*admin)->port()));
        CHECK(wait_for(
            [&] {
                const membership::MemberView* m = c.fra->snapshot()->find("sin");
                return m != nullptr && m->site != nullptr && !m->site->pools.empty();
            },
            10s));
        // Each check reaches the listener: an unresolved name failed them all, two in a row
        // ejected the healthy pool.
        CHECK(wait_for([&] { return checks.load() >= 4; }, 5s));
        CHECK_FALSE(
            c.fra->planner().outliers().is_ejected(routing::health::pool_key("sin", "test-model")));
    }
    (*admin)->stop();
    admin_io.stop();
    admin_thread.join();
}

TEST_CASE("/admin/* refuse a parameter they do not take, or one given twice, naming it") {
    ClusterPair c("127.0.0.1:1");
    const auto answer = [&](std::string_view method, std::string_view target) {
        std::optional<daemon::AdminReply> r = c.fra->handle_admin(method, target);
        REQUIRE(r.has_value());
        return std::move(r).value();
    };
    // A dry run that is not one: refused before anything is sent.
    daemon::AdminReply r = answer("POST", "/admin/rollout?model=m&version=v&dry_run=1");
    CHECK(r.status == 400);
    CHECK_FALSE(r.deferred);
    CHECK_MESSAGE(r.body.find("unknown parameter 'dry_run'") != std::string::npos, r.body);
    r = answer("POST", "/admin/rollout?model=m&version=v&version=w");
    CHECK(r.status == 400);
    CHECK_FALSE(r.deferred);
    CHECK_MESSAGE(r.body.find("parameter 'version' given more than once") != std::string::npos,
                  r.body);
    r = answer("POST", "/admin/rollout?model=m&version=v&format=text");  // Its answer is JSON.
    CHECK(r.status == 400);
    CHECK_FALSE(r.deferred);
    CHECK_FALSE(c.fra->rollouts().target("m"));
    // A name that is no text is not echoed as it came.
    r = answer("POST", "/admin/rollout?model=m&version=v&%0A%FF=1");
    CHECK(r.status == 400);
    CHECK_MESSAGE(r.body.find("'\?\?'") != std::string::npos, r.body);

    // The views: `format` (text or json), and /admin/route's model and version.
    for (const char* target :
         {"/admin/members?verbose=1", "/admin/pools?model=m", "/admin/rollouts?format=text&x",
          "/admin/route?model=m&versoin=v", "/admin/route?model=m&model=n",
          "/admin/members?format=xml", "/admin/pools?format=text&format=json"}) {
        r = answer("GET", target);
        CHECK_MESSAGE(r.status == 400, target);
        CHECK_MESSAGE((r.body.find("parameter '") != std::string::npos ||
                       r.body.find("format must be text or json") != std::string::npos),
                      r.body);
    }
    for (const char* target : {"/admin/members?format=text", "/admin/pools?format=json&",
                               "/admin/rollouts", "/admin/route?model=m&version=v&format=text"}) {
        CHECK_MESSAGE(answer("GET", target).status == 200, target);
    }
    // Still 405 for a wrong method, whatever the query.
    CHECK(answer("GET", "/admin/rollout?model=m&version=v&dry_run=1").status == 405);
    r = answer("POST", "/admin/rollout?model=m&version=v");
    CHECK(r.deferred);
}

TEST_CASE("a site that leaves loses its per-site series at the others") {
    daemon::Metrics metrics;
    ClusterPair c("127.0.0.1:1", "", &metrics);
    const auto sin_serves = [&] {
        const membership::MemberView* m = c.fra->snapshot()->find("sin");
        return m != nullptr && m->site != nullptr && !m->site->pools.empty();
    };
    REQUIRE(wait_for(sin_serves, 10s));
    // A decision, an ejection, a forwarded request and an RTT estimate for sin.
    daemon::cluster::RoutePlan plan = c.fra->planner().plan("test-model", "");
    REQUIRE_FALSE(plan.targets.empty());
    REQUIRE(plan.targets[0].site_id == "sin");
    for (int i = 0; i < 2; ++i) {
        c.fra->planner().report(plan.targets[0], false, 1ms);
    }
    metrics.on_forwarded("sin", "error");
    metrics.on_forward_latency("sin", 1ms);
    const auto has = [&](const std::string& series) {
        return metrics.serialize().find(series) != std::string::npos;
    };
    REQUIRE(wait_for([&] { return has("edgeserve_site_rtt_seconds{site=\"sin\"}"); }, 5s));
    CHECK(has("edgeserve_route_decisions_total{outcome=\"forwarded\",site=\"sin\"} 1"));
    CHECK(has("edgeserve_route_ejections_total{site=\"sin\"}"));
    CHECK(has("edgeserve_forwarded_requests_total{outcome=\"error\",site=\"sin\"} 1"));
    CHECK(has("edgeserve_forward_latency_seconds_count{site=\"sin\"} 1"));

    c.sin->stop();  // Leaves: gossiped, then gone.
    CHECK(wait_for(
        [&] {
            const membership::MemberView* m = c.fra->snapshot()->find("sin");
            return m != nullptr && m->state == membership::NodeState::kLeft;
        },
        5s));
    // Within a publish interval of the leave, every series naming sin is gone.
    CHECK_MESSAGE(wait_for([&] { return !has("site=\"sin\""); }, 5s), metrics.serialize());
    CHECK(has("edgeserve_gossip_members{state=\"left\"} 1"));
}
