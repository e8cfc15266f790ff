#pragma once

// Cluster is the daemon's part in the gossip cluster: it runs a MembershipService
// (routing/membership) on the daemon's io_context, publishes this site's SiteState (its pools
// from Generator::models() and load(), sampled every publish_interval and gossiped only when
// they change materially; `serving`, or `draining` once set_draining() was called and while
// set_stalled(true) holds), keeps the cluster's rollout intents, actively checks every peer's
// /readyz, owns the RoutePlanner (ClusterRoutePlanner) the API router asks, answers the /admin/*
// views (members, pools, route, rollout) and updates the routing metrics.
//
// Lifecycle: create() binds the gossip sockets; start() joins and starts the timers;
// set_draining() advertises draining at once; stop() leaves gracefully (the leave is gossiped
// for leave_drain, then the sockets close); kill() drops everything at once (as SIGKILL would).
// Threading: create/start/stop/kill from the controlling thread (not an io thread; stop and kill
// block until the membership strand is done) while the io_context runs; planner(),
// handle_admin(), set_draining(), set_stalled() and the accessors from any thread. The generator,
// metrics and clock must outlive it.

#include <boost/asio/io_context.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/result.h"
#include "daemon/admin_server.h"
#include "daemon/cluster/planner.h"
#include "daemon/cluster/rollout.h"
#include "daemon/config.h"
#include "engine/generator.h"
#include "routing/membership/membership_service.h"

namespace edge::daemon {
class Metrics;
}

namespace edge::daemon::cluster {

class Cluster {
public:
    // `admin_addr` is the host:port this site's admin listener is reached at (advertised for
    // active health checks; config `site.admin_address` overrides it).
    static Result<std::unique_ptr<Cluster>> create(boost::asio::io_context& io,
                                                   const Config& config,
                                                   engine::Generator& generator,
                                                   Metrics* metrics, Clock& clock,
                                                   const std::string& admin_addr);
    ~Cluster();

    // The peer (forwarding) listener's address to advertise, when known only after binding
    // (config `site.peer_address` wins). Call before start().
    void set_peer_addr(const std::string& addr);
    // Called with a site's id when gossip declares it dead (not when it leaves: a leaving site
    // drains what it runs), on the membership strand. Call before start().
    void set_on_site_dead(std::function<void(const std::string& site_id)> fn);

    void start();
    // Advertises every pool as draining (new requests go elsewhere); in-flight ones continue.
    void set_draining();
    // While `stalled` (the watchdog found the engine or the I/O threads stuck), every pool is
    // advertised as draining too; cleared, they are advertised as before (serving, unless
    // set_draining() was called meanwhile): a stall that passes takes nothing away for good.
    void set_stalled(bool stalled);
    void stop();
    void kill();

    ClusterRoutePlanner& planner();
    RolloutBook& rollouts();
    // Sends a rollout intent to every site (this one included); one this site may not send yet
    // (see handle_admin) is logged as `rollout_send_failed`.
    Status rollout(const std::string& model, const std::string& version);
    // Replaces the gossip keys with those `gossip` names (SIGHUP: `gossip.keys` and the
    // `gossip.keyring_file`, read again), for the next packet sent or received. Refused, the old
    // keys staying, when they do not load or when they would turn encryption on or off (the
    // other sites would neither read this one nor be read: that needs every site restarted).
    // Returns how many keys are now accepted.
    Result<size_t> reload_keys(const GossipConfig& gossip);
    // SIGHUP: routing.cost, routing.selection and routing.version_fallback apply from the next
    // plan (routing.cost's saturation line to gossip's next load sample too); false when
    // routing.outlier changed too (that waits for a restart, as do routing.target_versions, the
    // rollout intents at time 0).
    bool reload_routing(const RoutingConfig& routing);

    std::shared_ptr<const routing::membership::MembershipSnapshot> snapshot() const;
    uint16_t gossip_port() const;
    const std::string& advertise_addr() const;

    // The /admin/* views; see AdminHandler. POST /admin/rollout answers deferred (AdminReply::
    // deferred): 200 once this site's book holds the intent, 409/507 when it refused it, 503
    // when it was not sent (this site has not yet synced its Lamport clock with a member).
    std::optional<AdminReply> handle_admin(std::string_view method, std::string_view target);

    class Impl;

private:
    explicit Cluster(std::shared_ptr<Impl> impl);
    std::shared_ptr<Impl> impl_;
};

// The sites whose per-site metrics are kept (Metrics::retain_sites): every member `snap` holds,
// by name and by site id, but those that left. A dead member stays until gossip reclaims it:
// it may come back, and its counters must not restart while it can.
std::set<std::string> metric_sites(const routing::membership::MembershipSnapshot& snap);

// The MembershipConfig a gossip section asks for (preset, overrides, site id as name).
Result<routing::membership::MembershipConfig> membership_config(const Config& config);
// The keyring from `gossip.keys` and `gossip.keyring_file` (one hex key per line, '#' comments).
Result<routing::membership::Keyring> load_keyring(const GossipConfig& gossip);

}  // namespace edge::daemon::cluster
