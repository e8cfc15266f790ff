#include "daemon/cluster/cluster.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <chrono>
#include <random>
#include <sstream>
#include <vector>

#include "common/file.h"
#include "common/log.h"
#include "daemon/cluster/cluster_impl.h"

namespace edge::daemon::cluster {

Result<membership::MembershipConfig> membership_config(const Config& config) {
    const GossipConfig& g = config.gossip;
    membership::MembershipConfig mc = g.preset == "wan"     ? membership::wan_profile()
                                      : g.preset == "local" ? membership::local_profile()
                                                            : membership::lan_profile();
    mc.name = config.site.id;
    mc.advertise_addr = g.advertise_address;
    mc.label = g.label;
    mc.snapshot_file = g.snapshot_file;
    if (g.probe_interval.count() > 0) mc.probe_interval = g.probe_interval;
    if (g.probe_timeout.count() > 0) mc.probe_timeout = g.probe_timeout;
    if (g.gossip_interval.count() > 0) mc.gossip_interval = g.gossip_interval;
    if (g.push_pull_interval.count() > 0) mc.push_pull_interval = g.push_pull_interval;
    if (g.suspicion_mult > 0) mc.suspicion_mult = g.suspicion_mult;
    if (g.join_retry_interval.count() > 0) mc.join_retry_interval = g.join_retry_interval;
    if (g.max_inbound_streams > 0) {
        mc.max_inbound_streams = static_cast<size_t>(g.max_inbound_streams);
    }
    if (g.max_members > 0) mc.max_members = static_cast<size_t>(g.max_members);
    if (g.max_fetches_in_flight > 0) mc.max_fetches_in_flight = g.max_fetches_in_flight;
    // Gossip sends a pool's load at once when it crosses routing's saturation line.
    mc.saturation = config.routing.cost.saturation_limits();
    mc.seed = std::hash<std::string>{}(config.site.id) ^ std::random_device{}();
    if (mc.probe_timeout >= mc.probe_interval) {
        // Named by the config's keys; either may be the preset's.
        const auto ms = [](Duration d) {
            return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
        };
        return invalid_argument_error(
            config.source + ": gossip.probe_timeout_ms (" + ms(mc.probe_timeout) +
            ") must be less than gossip.probe_interval_ms (" + ms(mc.probe_interval) +
            ", with gossip.preset " + g.preset +
            "): the next probe ends the round, leaving no time for indirect and TCP probes");
    }
    // An empty advertise address is filled in from the bound socket by MembershipService.
    membership::MembershipConfig check = mc;
    if (check.advertise_addr.empty()) {
        check.advertise_addr = "127.0.0.1:1";
    }
    if (Status s = check.validate(); !s.ok()) {
        return invalid_argument_error(config.source + ": gossip: " + s.message());
    }
    return mc;
}

Result<membership::Keyring> load_keyring(const GossipConfig& gossip) {
    std::vector<membership::GossipKey> keys;
    for (const std::string& hex : gossip.keys) {
        EDGE_ASSIGN_OR_RETURN(membership::GossipKey k, membership::parse_gossip_key(hex));
        keys.push_back(k);
    }
    if (!gossip.keyring_file.empty()) {
        // Bounded and from a regular file only: a FIFO there would hang the reload.
        Result<std::string> text = read_small_file(gossip.keyring_file, uint64_t{1} << 20);
        if (text.status().code() == StatusCode::kNotFound) {
            return not_found_error("gossip.keyring_file: cannot open '" + gossip.keyring_file +
                                   "'");
        }
        if (!text.ok()) {
            return text.status().with_context("gossip.keyring_file");
        }
        std::istringstream in(*text);
        std::string line;
        int n = 0;
        while (std::getline(in, line)) {
            ++n;
            const size_t b = line.find_first_not_of(" \t\r");
            if (b == std::string::npos || line[b] == '#') {
                continue;
            }
            const size_t e = line.find_last_not_of(" \t\r");
            Result<membership::GossipKey> k =
                membership::parse_gossip_key(line.substr(b, e - b + 1));
            if (!k.ok()) {
                return invalid_argument_error(gossip.keyring_file + ":" + std::to_string(n) +
                                              ": expected 64 hex digits (an AES-256 key)");
            }
            if (std::find(keys.begin(), keys.end(), *k) == keys.end()) {
                keys.push_back(*k);
            }
        }
        if (keys.empty()) {
            // Encryption off by an emptied file would be silent: say so instead.
            return invalid_argument_error(
                gossip.keyring_file + ": no keys (one 64-hex-digit key per line); to run "
                "gossip unencrypted, remove gossip.keyring_file");
        }
    }
    Result<membership::Keyring> ring = membership::Keyring::create(std::move(keys));
    if (!ring.ok()) {
        return invalid_argument_error("gossip keys: " + ring.status().message());
    }
    return ring;
}

std::set<std::string> metric_sites(const membership::MembershipSnapshot& snap) {
    std::set<std::string> sites{snap.local_name};
    for (const membership::MemberView& m : snap.members) {
        if (m.state == membership::NodeState::kLeft) {
            continue;
        }
        sites.insert(m.name);
        if (m.site && !m.site->site_id.empty()) {
            sites.insert(m.site->site_id);
        }
    }
    return sites;
}

namespace {

PlannerConfig planner_config(const RoutingConfig& routing) {
    PlannerConfig pc;
    pc.cost = routing.cost;
    pc.selection = routing.selection;
    pc.outlier = routing.outlier;
    pc.version_fallback = routing.version_fallback;
    return pc;
}

}  // namespace

Cluster::Cluster(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Cluster::~Cluster() {
    if (impl_->started_ && !impl_->stopped_) {
        kill();
    }
}

namespace {

// A rollout intent applied to the book, from an event or a peer's push-pull.
void log_rollout(const RolloutIntent& intent, RolloutBook::Applied applied) {
    switch (applied) {
        case RolloutBook::Applied::kTarget:
            log::info("rollout_target", {{"model", intent.model},
                                         {"version", intent.version},
                                         {"ltime", intent.ltime}});
            break;
        case RolloutBook::Applied::kFull:
            log::warn("rollout_event_refused",
                      {{"reason", "rollout targets are held for " +
                                      std::to_string(RolloutBook::kMaxModels) + " models already"},
                       {"ltime", intent.ltime}});
            break;
        case RolloutBook::Applied::kStale:
            break;
    }
}

}  // namespace

Result<std::unique_ptr<Cluster>> Cluster::create(net::io_context& io, const Config& config,
                                                 engine::Generator& generator, Metrics* metrics,
                                                 Clock& clock, const std::string& admin_addr) {
    if (!config.gossip.enabled) {
        return failed_precondition_error("cluster: no `gossip` section in the config");
    }
    auto impl = std::make_shared<Impl>(io, generator, metrics, clock);
    impl->site_ = config.site;
    impl->gossip_ = config.gossip;
    impl->admin_addr_ = config.site.admin_address.empty() ? admin_addr : config.site.admin_address;
    impl->peer_addr_ = config.site.peer_address;
    for (const auto& [site, delay] : config.gossip.testing_peer_delay) {
        impl->peer_delay_[site] = delay;
    }
    EDGE_ASSIGN_OR_RETURN(impl->mconfig_, membership_config(config));
    EDGE_ASSIGN_OR_RETURN(membership::Keyring keyring, load_keyring(config.gossip));
    impl->encrypted_ = !keyring.empty();
    for (const auto& [model, version] : config.routing.target_versions) {
        (void)impl->rollouts_.apply({model, version, 0});  // The config's list is small.
    }
    EDGE_ASSIGN_OR_RETURN(impl->service_,
                          membership::MembershipService::create(
                              io, impl->mconfig_, std::move(keyring), impl->site_state(),
                              config.gossip.bind_address, config.gossip.port));

    Impl* raw = impl.get();
    impl->planner_ = std::make_unique<ClusterRoutePlanner>(
        planner_config(config.routing), clock, [raw] { return raw->service_->snapshot(); },
        impl->rollouts_, metrics);

    impl->service_->set_user_event_callback([raw](const membership::UserEventMsg& e) {
        if (e.name != kRolloutEvent) {
            return;
        }
        Result<RolloutIntent> intent = decode_rollout(e.payload, e.ltime);
        if (!intent.ok()) {
            log::warn("rollout_event_invalid", {{"error", intent.status().message()}});
            return;
        }
        const RolloutBook::Applied applied = raw->rollouts_.apply(*intent);
        raw->local_rollout_ = applied;
        log_rollout(*intent, applied);
    });
    // The book rides on every push-pull too, so a site that joins or restarts after more than
    // user_event_buffer later intents (for other models) still learns each model's target.
    impl->service_->set_local_state(
        [raw] { return encode_rollout_state(raw->rollouts_.all()); });
    impl->service_->set_merge_remote_state([raw](std::span<const uint8_t> state, uint64_t ltime) {
        Result<std::vector<RolloutIntent>> intents = decode_rollout_state(state, ltime);
        if (!intents.ok()) {
            log::warn("rollout_state_invalid", {{"error", intents.status().message()}});
            return;
        }
        // Last writer wins on (ltime, version): idempotent, in any order. A full book is not
        // logged here: each push-pull would repeat it (the events that carried them did once).
        for (const RolloutIntent& intent : *intents) {
            if (raw->rollouts_.apply(intent) == RolloutBook::Applied::kTarget) {
                log_rollout(intent, RolloutBook::Applied::kTarget);
            }
        }
    });
    impl->service_->set_event_callback([raw](const membership::MemberEvent& e) {
        // "change", not "event": a field named "event" would overwrite the event name.
        log::info("gossip_member", {{"change", std::string(membership::member_event_name(e.kind))},
                                    {"member", e.name},
                                    {"site", raw->site_.id}});
        if (e.kind == membership::MemberEventKind::kDead && raw->on_site_dead_) {
            raw->on_site_dead_(e.name);
        }
    });
    if (!impl->peer_delay_.empty()) {
        log::warn("testing_peer_delay", {{"detail", "gossip.testing_peer_delay_ms is set: "
                                                    "gossip packets are delayed on purpose"}});
        // Runs on the membership strand: map the address back to a member through the latest
        // snapshot (member names are site ids).
        impl->service_->set_packet_delay([raw](const std::string& addr) -> Duration {
            auto snap = raw->service_->snapshot();
            if (!snap) {
                return Duration::zero();
            }
            for (const membership::MemberView& m : snap->members) {
                if (m.addr == addr) {
                    auto it = raw->peer_delay_.find(m.name);
                    return it == raw->peer_delay_.end() ? Duration::zero() : it->second;
                }
            }
            return Duration::zero();
        });
    }
    return std::unique_ptr<Cluster>(new Cluster(std::move(impl)));
}

void Cluster::set_on_site_dead(std::function<void(const std::string&)> fn) {
    impl_->on_site_dead_ = std::move(fn);
}

void Cluster::set_peer_addr(const std::string& addr) {
    std::lock_guard lock(impl_->mu_);
    if (impl_->peer_addr_.empty()) {
        impl_->peer_addr_ = addr;
    }
}

void Cluster::start() {
    impl_->started_ = true;
    impl_->service_->start(impl_->gossip_.join);
    net::post(impl_->strand_, [self = impl_] {
        self->publish(true);
        self->arm_publish();
        self->arm_health();
    });
    log::info("gossip_started", {{"site", impl_->site_.id},
                                 {"advertise", impl_->service_->advertise_addr()},
                                 {"seeds", static_cast<int64_t>(impl_->gossip_.join.size())}});
}

namespace {

// Gossips the site state now, not at the next publish interval: a change of the pools' state.
void publish_now(const std::shared_ptr<Cluster::Impl>& impl) {
    net::post(impl->strand_, [self = impl] {
        if (!self->stopped_) {
            self->publish(true);
        }
    });
}

}  // namespace

void Cluster::set_draining() {
    if (impl_->draining_.exchange(true)) {
        return;
    }
    log::info("pools_draining", {{"site", impl_->site_.id}});
    publish_now(impl_);
}

void Cluster::set_stalled(bool stalled) {
    if (impl_->stalled_.exchange(stalled) == stalled) {
        return;
    }
    log::info(stalled ? "pools_draining" : "pools_serving_again",
              {{"site", impl_->site_.id}, {"reason", "stalled"}});
    publish_now(impl_);
}

void Cluster::stop() {
    if (impl_->stopped_.exchange(true)) {
        return;
    }
    net::post(impl_->strand_, [self = impl_] {
        self->publish_timer_.cancel();
        self->health_timer_.cancel();
    });
    impl_->service_->stop(impl_->gossip_.leave_drain);
    log::info("gossip_left", {{"site", impl_->site_.id}});
}

void Cluster::kill() {
    if (impl_->stopped_.exchange(true)) {
        return;
    }
    net::post(impl_->strand_, [self = impl_] {
        self->publish_timer_.cancel();
        self->health_timer_.cancel();
    });
    impl_->service_->kill();
}

ClusterRoutePlanner& Cluster::planner() { return *impl_->planner_; }
RolloutBook& Cluster::rollouts() { return impl_->rollouts_; }

Status Cluster::rollout(const std::string& model, const std::string& version) {
    return impl_->send_rollout(model, version);
}

bool Cluster::reload_routing(const RoutingConfig& routing) {
    // Gossip judges load changes by the same saturation line the planner now routes by; the
    // memberlist is changed on its own strand, as every other change to it is.
    impl_->service_->post([limits = routing.cost.saturation_limits()](membership::Memberlist& ml) {
        ml.set_saturation_limits(limits);
    });
    return impl_->planner_->reload(planner_config(routing));
}

Result<size_t> Cluster::reload_keys(const GossipConfig& gossip) {
    EDGE_ASSIGN_OR_RETURN(membership::Keyring keyring, load_keyring(gossip));
    if (keyring.empty() == impl_->encrypted_) {
        return failed_precondition_error(
            impl_->encrypted_
                ? "the new config has no gossip keys: a reload cannot turn gossip encryption off"
                : "the new config has gossip keys, but this site gossips in clear: a reload "
                  "cannot turn gossip encryption on (restart every site)");
    }
    const size_t keys = keyring.keys().size();
    impl_->service_->post([keyring = std::move(keyring)](membership::Memberlist& ml) mutable {
        ml.keyring() = std::move(keyring);
    });
    return keys;
}

std::shared_ptr<const membership::MembershipSnapshot> Cluster::snapshot() const {
    return impl_->service_->snapshot();
}
uint16_t Cluster::gossip_port() const { return impl_->service_->port(); }
const std::string& Cluster::advertise_addr() const { return impl_->service_->advertise_addr(); }

std::optional<AdminReply> Cluster::handle_admin(std::string_view method, std::string_view target) {
    return impl_->handle_admin(method, target);
}

}  // namespace edge::daemon::cluster
