#pragma once

// GossipSim runs N Memberlist instances over a FakeNetwork, each with its own clock view (a
// member's clock may run slow, like a CPU-starved host), for the membership scenarios and the
// gossip_sim bench. Member i is named "node<i>" at address "node<i>:7946". Single-threaded.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "routing/membership/memberlist.h"
#include "tests/testing/fake_network.h"

namespace edge::testing {

class GossipSim {
public:
    // `base` supplies the timers; name, address and seed are set per member. With `key`, every
    // member encrypts with it.
    GossipSim(size_t n, routing::membership::MembershipConfig base, uint64_t seed,
              std::optional<routing::membership::GossipKey> key = std::nullopt);
    ~GossipSim();

    FakeNetwork& net() { return net_; }
    size_t size() const { return nodes_.size(); }
    routing::membership::Memberlist& node(size_t i);
    static std::string name(size_t i) { return "node" + std::to_string(i); }
    static std::string addr(size_t i) { return name(i) + ":7946"; }

    // Member i's clock runs at `rate` (0.5 = half speed) from now on. Call before start_all().
    void set_clock_rate(size_t i, double rate);
    // Starts every member; member i > 0 joins member 0 at i * spacing.
    void start_all(Duration spacing = std::chrono::milliseconds(10));
    // Kills member i abruptly (no leave): its address goes dark and its timers stop.
    void kill(size_t i);
    bool is_killed(size_t i) const;
    // Starts member i again as a new process after kill(i): a fresh Memberlist (versions and
    // incarnation from scratch) with `site` as its state, joining member 0.
    void restart(size_t i, routing::membership::SiteState site);

    // Runs until `pred` holds (checked every `step`) or `limit` passes; true if it held.
    bool run_until(const std::function<bool()>& pred, Duration limit,
                   Duration step = std::chrono::milliseconds(20));

    // Every live member sees exactly the live members, all alive.
    bool converged() const;
    // Number of live members that consider member `target` dead (or left).
    size_t count_seeing_dead(size_t target) const;
    // Number of live members that hold member `target`'s site state version >= `version`.
    size_t count_with_version(size_t target, uint64_t version) const;

    // Dead declarations (by anyone) about members that were never killed.
    uint64_t false_deaths() const { return false_deaths_; }
    // "observer->target" for each of those, for diagnosis.
    const std::vector<std::string>& false_death_log() const { return false_death_log_; }

private:
    struct Node;
    void reschedule(Node& n);
    // (Re)creates member i's Memberlist and attaches its address.
    void create_member(Node& n, routing::membership::SiteState site);

    FakeNetwork net_;
    routing::membership::MembershipConfig base_;
    std::optional<routing::membership::GossipKey> key_;
    uint64_t seed_ = 0;
    std::vector<std::unique_ptr<Node>> nodes_;
    std::unordered_map<std::string, size_t> index_;
    uint64_t false_deaths_ = 0;
    std::vector<std::string> false_death_log_;
};

}  // namespace edge::testing
