// End to end: three real Daemons on loopback with gossip (real UDP, `local` preset, fast
// intervals), the cluster's own route planner and forwarding over mutual TLS (cluster CA made at
// test time). Clients talk only to fra, which serves no model itself: requests go to the
// lowest-cost pool, spill when it is loaded, honour a pinned version, avoid a draining pool while
// its stream finishes, and keep succeeding when a site dies abruptly (connect failures retry on
// the next pool; the dead site is dropped from the route within the detection bound).

#include <doctest/doctest.h>

#include <boost/json.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>

#include "daemon/cluster/cli.h"
#include "daemon/cluster/cluster.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "tests/testing/daemon_yaml.h"
#include "tests/testing/scripted_generator.h"
#include "tests/testing/test_daemon.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using namespace std::chrono_literals;
namespace json = boost::json;
namespace membership = edge::routing::membership;

namespace {

using testing::wait_for;

// A ScriptedGenerator that advertises its models with a given version digest.
class VersionedGenerator final : public engine::Generator {
public:
    VersionedGenerator(std::vector<std::string> models, std::string version)
        : inner(std::move(models)), version_(std::move(version)) {}
    std::vector<engine::ModelInfo> models() const override {
        auto out = inner.models();
        for (auto& m : out) {
            m.version = version_;
        }
        return out;
    }
    Result<std::shared_ptr<engine::GenerationHandle>> submit(
        engine::GenerateRequest request, std::shared_ptr<engine::GenerationSink> sink) override {
        return inner.submit(std::move(request), std::move(sink));
    }
    bool ready() const override { return inner.ready(); }
    std::vector<engine::ModelLoad> load() const override { return inner.load(); }

    testing::ScriptedGenerator inner;

private:
    std::string version_;
};

engine::ModelLoad load(uint32_t queue, uint32_t running) {
    engine::ModelLoad l;
    l.name = "m";
    l.queue_depth = queue;
    l.running = running;
    l.capacity = 8;
    l.decode_tokens_per_s = 100.0;
    return l;
}

struct Site {
    Site(std::string site_id, std::vector<std::string> models, std::string version)
        : id(std::move(site_id)), generator(std::move(models), std::move(version)) {}

    std::string admin() const { return "127.0.0.1:" + std::to_string(daemon->admin_port()); }

    // The site every request goes to now; "either" while two pools are within the margin of
    // each other (each request then goes to one of them at random, as when a load has not
    // reached this site's table yet), "rejected" with no usable pool.
    std::string chosen() {
        auto r = daemon::cluster::admin_request(admin(), "GET", "/admin/route?model=m");
        REQUIRE(r.ok());
        json::value v = json::parse(r->body);
        const json::value& c = v.at("chosen");
        if (c.is_null()) {
            return "rejected";
        }
        return v.at("reason") == "power_of_two_choices" ? "either"
                                                         : std::string(c.at("site").as_string());
    }

    // Answers every request that arrives with "from <site>" until stopped.
    void start_responder() {
        responding = true;
        responder = std::thread([this] {
            size_t next = 0;
            while (responding) {
                if (generator.inner.wait_for_request(next, 20)) {
                    generator.inner.emit(next, "from " + id);
                    generator.inner.finish(next, engine::FinishReason::kStop, {3, 2, 0});
                    ++next;
                    answered = next;
                }
            }
        });
    }
    void stop_responder() {
        responding = false;
        if (responder.joinable()) {
            responder.join();
        }
    }
    ~Site() { stop_responder(); }

    std::string id;
    VersionedGenerator generator;
    std::unique_ptr<daemon::Daemon> daemon;
    std::thread responder;
    std::atomic<bool> responding{false};
    std::atomic<size_t> answered{0};
};

class ForwardingCluster {
public:
    // fra serves nothing; sin serves `m` at `sin_version`, gru at `gru_version`.
    explicit ForwardingCluster(const std::string& sin_version = "v1",
                               const std::string& gru_version = "v1") {
        ca_ = testing::make_ca(dir_.path(), "ca", "edgeserve cluster test CA");
        add("fra", 50.1, 8.7, {}, "v1");
        add("sin", 1.35, 103.8, {"m"}, sin_version);
        add("gru", -23.5, -46.6, {"m"}, gru_version);
    }

    Site& operator[](const std::string& id) {
        for (auto& s : sites_) {
            if (s->id == id) return *s;
        }
        FAIL("no site " << id);
        return *sites_[0];
    }

    bool converged() {
        for (auto& s : sites_) {
            if (!s->daemon) continue;
            size_t ready = 0;
            for (const auto& m : s->daemon->cluster()->snapshot()->members) {
                if (m.state == membership::NodeState::kAlive && m.site &&
                    !m.site->peer_addr.empty()) {
                    ++ready;
                }
            }
            if (ready != 3) return false;
        }
        return true;
    }

    // One chat completion through fra's public listener.
    testing::HttpReply ask(bool stream = false, const std::string& headers = "") {
        auto c = testing::TlsClient::connect(sites_[0]->daemon->public_port());
        REQUIRE(c.ok());
        std::string body =
            std::string(R"({"model":"m","messages":[{"role":"user","content":"hi"}])") +
            (stream ? R"(,"stream":true})" : "}");
        REQUIRE((*c)->send(testing::http_request("POST", "/v1/chat/completions", body, headers))
                    .ok());
        auto r = (*c)->read_response();
        REQUIRE_MESSAGE(r.ok(), r.status().to_string());
        return *r;
    }

private:
    void add(const std::string& id, double lat, double lon, std::vector<std::string> models,
             const std::string& version) {
        sites_.push_back(std::make_unique<Site>(id, std::move(models), version));
        Site& s = *sites_.back();
        auto cert = testing::make_signed_certificate(ca_, dir_.path(), id,
                                                     {id, id + ".cluster.test", "localhost"});
        testing::DaemonYaml y;
        y.site_id = id;
        y.latitude = lat;
        y.longitude = lon;
        y.cert_path = cert.cert_path;
        y.key_path = cert.key_path;
        // A handshake on a loaded machine can take a while; a dead site refuses at once.
        y.peer = testing::PeerYaml{ca_.cert_path, cert.cert_path, cert.key_path, 5000, ""};
        y.gossip.emplace();
        y.gossip->suspicion_mult = 2;
        if (sites_.size() > 1) {
            y.gossip->join = {"127.0.0.1:" +
                              std::to_string(sites_[0]->daemon->cluster()->gossip_port())};
        }
        y.extra =
            "routing:\n"
            "  outlier:\n"
            "    consecutive_failures: 2\n"
            "    max_ejection_percent: 100\n";
        s.daemon = testing::make_daemon(testing::daemon_yaml(y), dir_.file(id + ".yaml"),
                                        s.generator, SystemClock::instance());
        s.daemon->start();
    }

    testing::TempDir dir_;
    testing::TestCa ca_;
    std::vector<std::unique_ptr<Site>> sites_;
};

}  // namespace

TEST_CASE("e2e: requests go to the lowest-cost pool and spill to the next when it is loaded") {
    ForwardingCluster c;
    c["sin"].generator.inner.set_load({load(0, 1)});
    c["gru"].generator.inner.set_load({load(3, 8)});
    c["sin"].start_responder();
    c["gru"].start_responder();
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));
    REQUIRE(wait_for([&] { return c["fra"].chosen() == "sin"; }, 5s));
    for (int i = 0; i < 5; ++i) {
        testing::HttpReply r = c.ask();
        CHECK(r.status == 200);
        CHECK(r.headers["x-edgeserve-site"] == "sin");
        CHECK(r.body.find("from sin") != std::string::npos);
    }
    CHECK(c["gru"].answered == 0);

    // sin gets loaded, gru frees up: new requests spill to gru.
    c["sin"].generator.inner.set_load({load(6, 8)});
    c["gru"].generator.inner.set_load({load(0, 1)});
    REQUIRE(wait_for([&] { return c["fra"].chosen() == "gru"; }, 5s));
    for (int i = 0; i < 5; ++i) {
        testing::HttpReply r = c.ask(true);
        CHECK(r.status == 200);
        CHECK(r.headers["x-edgeserve-site"] == "gru");
        CHECK(r.body.find("from gru") != std::string::npos);
        CHECK(r.body.find("[DONE]") != std::string::npos);
    }
    CHECK(c["sin"].answered == 5);
    const std::string metrics = c["fra"].daemon->metrics().serialize();
    CHECK(metrics.find("edgeserve_route_decisions_total{outcome=\"forwarded\",site=\"sin\"} 5") !=
          std::string::npos);
}

TEST_CASE("e2e: a pinned version goes to the pool serving it, a rollout steers unpinned ones") {
    ForwardingCluster c("v1", "v2");
    c["sin"].generator.inner.set_load({load(0, 1)});
    c["gru"].generator.inner.set_load({load(0, 1)});
    c["sin"].start_responder();
    c["gru"].start_responder();
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));
    REQUIRE(wait_for([&] { return c["fra"].chosen() != "rejected"; }, 5s));

    testing::HttpReply pinned = c.ask(false, "X-Model-Version: v2\r\n");
    CHECK(pinned.status == 200);
    CHECK(pinned.headers["x-edgeserve-site"] == "gru");
    testing::HttpReply v1 = c.ask(false, "X-Model-Version: v1\r\n");
    CHECK(v1.headers["x-edgeserve-site"] == "sin");
    testing::HttpReply none = c.ask(false, "X-Model-Version: v9\r\n");
    CHECK(none.status == 503);
    CHECK(none.body.find("v9") != std::string::npos);

    auto r = daemon::cluster::admin_request(c["sin"].admin(), "POST",
                                            "/admin/rollout?model=m&version=v2");
    REQUIRE(r.ok());
    REQUIRE(wait_for(
        [&] {
            auto t = c["fra"].daemon->cluster()->rollouts().target("m");
            return t && t->version == "v2";
        },
        5s));
    for (int i = 0; i < 5; ++i) {
        testing::HttpReply u = c.ask();
        CHECK(u.status == 200);
        CHECK(u.headers["x-edgeserve-site"] == "gru");
    }
}

TEST_CASE("e2e: a draining pool finishes its stream and gets no new requests") {
    ForwardingCluster c;
    c["sin"].generator.inner.set_load({load(0, 1)});
    c["gru"].generator.inner.set_load({load(2, 8)});
    c["gru"].start_responder();
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));
    REQUIRE(wait_for([&] { return c["fra"].chosen() == "sin"; }, 5s));

    // A stream forwarded to sin, held open by the test.
    auto client = testing::TlsClient::connect(c["fra"].daemon->public_port());
    REQUIRE(client.ok());
    REQUIRE((*client)
                ->send(testing::http_request(
                    "POST", "/v1/chat/completions",
                    R"({"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]})"))
                .ok());
    REQUIRE(c["sin"].generator.inner.wait_for_request(0));
    c["sin"].generator.inner.emit(0, "first ");

    auto stopping = std::async(std::launch::async,
                               [&] { c["sin"].daemon->stop(std::chrono::milliseconds(5000)); });
    REQUIRE(wait_for([&] { return c["fra"].chosen() == "gru"; }, 5s));
    for (int i = 0; i < 5; ++i) {
        testing::HttpReply r = c.ask();
        CHECK(r.status == 200);
        CHECK(r.headers["x-edgeserve-site"] == "gru");
    }
    CHECK_FALSE(c["sin"].generator.inner.wait_for_request(1, 0));  // Nothing new at sin.
    c["sin"].generator.inner.emit(0, "second");
    c["sin"].generator.inner.finish(0, engine::FinishReason::kStop, {1, 2, 0});
    auto reply = (*client)->read_response();
    REQUIRE(reply.ok());
    CHECK(reply->status == 200);
    CHECK(reply->body.find("first ") != std::string::npos);
    CHECK(reply->body.find("second") != std::string::npos);
    CHECK(reply->body.find("[DONE]") != std::string::npos);
    stopping.get();
}

TEST_CASE("e2e: when a site dies abruptly no unstarted request fails and traffic shifts") {
    ForwardingCluster c;
    c["sin"].generator.inner.set_load({load(0, 1)});
    c["gru"].generator.inner.set_load({load(2, 8)});
    c["sin"].start_responder();
    c["gru"].start_responder();
    REQUIRE(wait_for([&] { return c.converged(); }, 10s));
    REQUIRE(wait_for([&] { return c["fra"].chosen() == "sin"; }, 5s));
    for (int i = 0; i < 3; ++i) {
        CHECK(c.ask().headers["x-edgeserve-site"] == "sin");  // Warm pooled connections.
    }

    // As SIGKILL: gossip stops without a leave, every socket closes, nothing drains.
    c["sin"].stop_responder();
    const auto died = std::chrono::steady_clock::now();
    c["sin"].daemon->cluster()->kill();
    c["sin"].daemon.reset();

    // Every request from now on succeeds (retried on gru while sin is still routed to).
    int failed = 0;
    std::chrono::steady_clock::duration shifted{};
    bool routed_away = false;
    for (int i = 0; i < 40; ++i) {
        testing::HttpReply r = c.ask();
        if (r.status != 200 || r.headers["x-edgeserve-site"] != "gru") {
            ++failed;
            MESSAGE("request " << i << ": " << r.status << " " << r.body);
        }
        if (!routed_away && c["fra"].chosen() == "gru") {
            routed_away = true;
            shifted = std::chrono::steady_clock::now() - died;
        }
        if (routed_away && i >= 10) {
            break;
        }
        std::this_thread::sleep_for(20ms);
    }
    CHECK(failed == 0);
    REQUIRE(routed_away);
    MESSAGE("traffic shifted away from the dead site after "
            << std::chrono::duration<double, std::milli>(shifted).count() << " ms");
    // Detection bound: two failed /readyz checks 100 ms apart, or two failed forwards.
    CHECK(shifted < 3s);
}
