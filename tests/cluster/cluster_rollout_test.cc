// Rollout intents through POST /admin/rollout on Clusters gossiping over real UDP/TCP on
// loopback: the answer says what this site's book made of the intent, and a site whose Lamport
// clock has not caught up with the cluster's (not yet joined) refuses to send one, which would be
// dropped everywhere as older than the intent the other sites hold. Waits poll real state with a
// deadline; nothing sleeps for a fixed time.

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "daemon/admin_server.h"
#include "daemon/cluster/cli.h"
#include "daemon/cluster/cluster.h"
#include "daemon/metrics.h"
#include "routing/membership/messages.h"
#include "routing/membership/wire.h"
#include "tests/cluster/cluster_pair.h"
#include "tests/testing/daemon_yaml.h"

using namespace edge;
using namespace std::chrono_literals;
namespace json = boost::json;
namespace membership = edge::routing::membership;
using testing::ClusterPair;
using testing::post_rollout;
using testing::sees_alive;
using testing::wait_for;

namespace {

bool holds(daemon::cluster::Cluster& site, const std::string& version) {
    const std::optional<daemon::cluster::RolloutIntent> t = site.rollouts().target("test-model");
    return t && t->version == version;
}

}  // namespace

TEST_CASE("POST /admin/rollout answers once the site's book holds the intent, or why it does not") {
    // One model short of the book's cap, from the config (intents at Lamport time 0).
    std::string targets = "  target_versions:\n";
    for (size_t i = 0; i + 1 < daemon::cluster::RolloutBook::kMaxModels; ++i) {
        targets += "    filler-" + std::to_string(i) + ": v1\n";
    }
    ClusterPair c("127.0.0.1:1", targets);
    daemon::Metrics metrics;
    auto admin =
        daemon::AdminServer::create(c.io, "127.0.0.1", 0, metrics, [] { return ok_status(); });
    REQUIRE(admin.ok());
    (*admin)->set_handler([&c](std::string_view method, std::string_view target) {
        return c.fra->handle_admin(method, target);
    });
    (*admin)->start();
    const std::string addr = "127.0.0.1:" + std::to_string((*admin)->port());
    const auto targets_held = [&] {
        auto r = daemon::cluster::admin_request(addr, "GET", "/admin/rollouts");
        REQUIRE(r.ok());
        REQUIRE(r->status == 200);
        std::map<std::string, std::string> held;
        const json::value body = json::parse(r->body);
        for (const json::value& v : body.at("rollouts").as_array()) {
            held[std::string(v.at("model").as_string())] = v.at("version").as_string();
        }
        return held;
    };

    // fra sends once its clock has synced with sin's (the join's push-pull).
    REQUIRE(wait_for([&] { return sees_alive(*c.fra, "sin"); }, 10s));
    // The 200 comes once the intent is held here (no wait before looking), with its time.
    auto r =
        daemon::cluster::admin_request(addr, "POST", "/admin/rollout?model=test-model&version=v2");
    REQUIRE(r.ok());
    CHECK_MESSAGE(r->status == 200, r->body);
    json::value sent = json::parse(r->body);
    CHECK(sent.at("version").as_string() == "v2");
    CHECK(sent.as_object().contains("ltime"));
    CHECK(targets_held()["test-model"] == "v2");

    // The book is full now: a model it does not hold is refused, and the answer says so
    // instead of `"sent": true`.
    r = daemon::cluster::admin_request(addr, "POST", "/admin/rollout?model=other&version=v1");
    REQUIRE(r.ok());
    CHECK_MESSAGE(r->status == 507, r->body);
    CHECK(r->body.find("4096") != std::string::npos);
    CHECK(targets_held().count("other") == 0);
    // A model it holds still rolls out.
    r = daemon::cluster::admin_request(addr, "POST", "/admin/rollout?model=filler-7&version=v3");
    REQUIRE(r.ok());
    CHECK_MESSAGE(r->status == 200, r->body);
    CHECK(targets_held()["filler-7"] == "v3");
    (*admin)->stop();
}

TEST_CASE("a site refuses a rollout until its Lamport clock synced, then it takes everywhere") {
    ClusterPair c("127.0.0.1:1");
    REQUIRE(wait_for([&] { return sees_alive(*c.fra, "sin"); }, 10s));
    // The cluster's clock moves on: two intents, the newest (v3) at Lamport time 2.
    daemon::AdminReply r = post_rollout(*c.sin, "v2");
    REQUIRE_MESSAGE(r.status == 200, r.body);
    REQUIRE(wait_for([&] { return holds(*c.fra, "v2"); }, 5s));
    r = post_rollout(*c.fra, "v3");
    REQUIRE_MESSAGE(r.status == 200, r.body);
    REQUIRE(wait_for([&] { return holds(*c.sin, "v3") && holds(*c.fra, "v3"); }, 5s));

    // gru has not joined yet: its clock is at 0. Sent, its intent would be stamped 1, dropped by
    // sin and fra as older than v3, and replaced by v3 in its own book at its join, while the
    // operator was told it took. Refused instead, naming why; nothing is sent.
    daemon::cluster::Cluster& gru = c.add("gru", {c.seed()});
    r = post_rollout(gru, "v4");
    CHECK_MESSAGE(r.status == 503, r.body);
    CHECK_MESSAGE(r.body.find("not yet exchanged state with another member") != std::string::npos,
                  r.body);
    CHECK_FALSE(gru.rollouts().target("test-model"));
    // So does a started site whose seeds do not answer.
    daemon::cluster::Cluster& syd = c.add("syd", {"127.0.0.1:1"});
    syd.start();
    CHECK(post_rollout(syd, "v4").status == 503);
    // A site with no seeds that knows nobody is the whole cluster as far as it can tell.
    daemon::cluster::Cluster& solo = c.add("solo", {});
    CHECK(post_rollout(solo, "v4").status == 200);

    // Joined, gru holds the cluster's intents and its clock; its rollout now takes at every site.
    gru.start();
    REQUIRE(wait_for([&] { return holds(gru, "v3"); }, 10s));
    r = post_rollout(gru, "v4");
    REQUIRE_MESSAGE(r.status == 200, r.body);
    CHECK(json::parse(r.body).at("ltime").to_number<uint64_t>() > 2);
    for (daemon::cluster::Cluster* site : {c.sin.get(), c.fra.get(), &gru}) {
        CHECK(wait_for([&] { return holds(*site, "v4"); }, 5s));
    }
}

// An intent travels as a user event, and a push-pull hands on only the newest user_event_buffer
// (512) of those: a site that joined after 512 later intents for other models never learned
// test-model's target, and routed it to any version while the others routed it to v2. The book
// rides on every push-pull as well.
TEST_CASE("a site that joins after more than user_event_buffer later intents learns each target") {
    ClusterPair c("127.0.0.1:1");
    REQUIRE(wait_for([&] { return sees_alive(*c.fra, "sin"); }, 10s));
    daemon::AdminReply r = post_rollout(*c.sin, "v2");
    REQUIRE_MESSAGE(r.status == 200, r.body);
    for (int i = 0; i < 520; ++i) {
        std::optional<daemon::AdminReply> other = c.sin->handle_admin(
            "POST", "/admin/rollout?model=other-" + std::to_string(i) + "&version=v1");
        REQUIRE(other.has_value());
        REQUIRE(other->deferred);
        auto answered = std::make_shared<std::promise<daemon::AdminReply>>();
        std::future<daemon::AdminReply> answer = answered->get_future();
        other->deferred([answered](daemon::AdminReply a) { answered->set_value(std::move(a)); });
        REQUIRE(answer.wait_for(5s) == std::future_status::ready);
        REQUIRE_MESSAGE(answer.get().status == 200, i);
    }
    REQUIRE(wait_for([&] { return c.fra->rollouts().target("other-519").has_value(); }, 10s));

    daemon::cluster::Cluster& gru = c.add("gru", {c.seed()});
    gru.start();
    REQUIRE(wait_for([&] { return gru.rollouts().target("other-519").has_value(); }, 10s));
    CHECK(wait_for([&] { return holds(gru, "v2"); }, 5s));
    CHECK(gru.rollouts().all().size() == 521);
}

// The book as a peer sends it is untrusted: bounded as an intent event is, with times no later
// than the sender's clock, and refused whole otherwise.
TEST_CASE("rollout state from a push-pull is decoded within its bounds, or refused") {
    using daemon::cluster::decode_rollout_state;
    using daemon::cluster::encode_rollout_state;
    using daemon::cluster::RolloutIntent;
    // The config's intents (time 0) are not sent: each site's own config stands.
    const std::vector<RolloutIntent> book{{"a", "v1", 0}, {"b", "v2", 7}, {"c", "v3", 9}};
    const std::vector<uint8_t> bytes = encode_rollout_state(book);
    auto decoded = decode_rollout_state(bytes, 9);
    REQUIRE(decoded.ok());
    REQUIRE(decoded->size() == 2);
    CHECK(decoded->at(0).model == "b");
    CHECK(decoded->at(0).version == "v2");
    CHECK(decoded->at(0).ltime == 7);
    CHECK(decoded->at(1).ltime == 9);
    CHECK(decode_rollout_state({}, 0).value().empty());

    // Later than the sender's own clock, or at the decoder's cap.
    CHECK_FALSE(decode_rollout_state(bytes, 8).ok());
    const std::vector<RolloutIntent> capped{{"m", "v", membership::kMaxEventLtime}};
    CHECK_FALSE(decode_rollout_state(encode_rollout_state(capped),
                                     membership::kMaxEventLtime).ok());
    // Malformed: cut short, an intent with no time, a field too long or with a newline.
    CHECK_FALSE(decode_rollout_state(std::span(bytes).first(bytes.size() - 1), 9).ok());
    membership::WireWriter no_time;
    membership::WireWriter e;
    e.field_bytes(2, daemon::cluster::encode_rollout("m", "v"));
    no_time.field_bytes(1, e.bytes());
    CHECK_FALSE(decode_rollout_state(no_time.bytes(), 9).ok());
    const std::vector<RolloutIntent> long_model{{std::string(256, 'm'), "v", 1}};
    CHECK_FALSE(decode_rollout_state(encode_rollout_state(long_model), 9).ok());
    const std::vector<RolloutIntent> newline{{"m", "v\nw", 1}};
    CHECK_FALSE(decode_rollout_state(encode_rollout_state(newline), 9).ok());
    // More intents than a book holds.
    std::vector<RolloutIntent> many;
    for (size_t i = 0; i <= daemon::cluster::RolloutBook::kMaxModels; ++i) {
        many.push_back({"m" + std::to_string(i), "v", 1});
    }
    CHECK_FALSE(decode_rollout_state(encode_rollout_state(many), 1).ok());
    many.pop_back();
    CHECK(decode_rollout_state(encode_rollout_state(many), 1).ok());
}
