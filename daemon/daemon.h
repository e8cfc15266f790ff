#pragma once

// Daemon wires one PoP together from a validated Config and a Generator: the TLS certificates,
// the public HTTPS listener with the OpenAI API, the admin listener with metrics and health, and
// the I/O threads that run them; with a `peer` section also the peer (mutual TLS) listener that
// takes requests other sites forward, and the forwarding client (daemon/forward/); with a
// `gossip` section the cluster: gossip membership, this site's published pools and the route
// planner (daemon/cluster/). Lifecycle: create() binds the listeners (so the ports are known),
// start() starts serving, joins the cluster and watches the certificate files (a change reloads
// them, daemon/file_watcher.h), reload_certificates() is SIGHUP, stop(deadline)
// is SIGTERM: advertise draining, drain, leave the cluster, then close. Device health: the health
// probe (default engine::device_health(), a sticky GPU error) is asked by every /readyz and by
// check_health(), which the run loop polls; the first failure marks the daemon unhealthy for good
// (/readyz 503 with the reason, gossip advertises every local pool as draining) and the run loop
// then drains briefly and exits with kExitDeviceFault (daemon/commands.h) so systemd restarts
// the process. Threading: call
// create/start/stop from one controlling thread (never an I/O thread);
// reload_certificates() and the accessors from any thread. The generator and clock must outlive
// the Daemon.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "daemon/access_log.h"
#include "daemon/config.h"
#include "daemon/file_watcher.h"
#include "daemon/liveness.h"
#include "engine/generator.h"
#include "tls/tls_context.h"

namespace boost::asio {
class io_context;
}

namespace edge::tls {
class HttpServer;
class TlsContextStore;
}  // namespace edge::tls

namespace edge::daemon {

class AdminServer;
class FileWatcher;
class Metrics;
class TenantTable;
class TenantLimiter;
namespace api {
class ApiRouter;
}
namespace cluster {
class Cluster;
class RoutePlanner;
}  // namespace cluster
namespace forward {
class PeerClient;
class PeerHandler;
}  // namespace forward

// What a reload (SIGHUP) applies, as its log lines say it; the rest of the config waits for a
// restart (docs/operations.md, Reload, restart, stop, keeps the same list).
inline constexpr std::string_view kReloadApplies =
    "the certificates (public and cluster), tenants, limits, gossip keys, routing weights and "
    "admin token";

// How long stop() advertises draining by gossip before the listeners stop: three rounds of the
// gossip `config` runs (gossip.gossip_interval_ms, else its preset's: wan 500 ms), so the
// state has reached the other sites before this one refuses their requests.
std::chrono::milliseconds drain_advertise_window(const Config& config);

class Daemon {
public:
    // `public_listen_fd`: an inherited listening socket for the public listener (socket
    // activation, see daemon/socket_activation.h), owned by the Daemon from here on; -1 binds
    // listeners.public.address:port instead.
    static Result<std::unique_ptr<Daemon>> create(const Config& config,
                                                  engine::Generator& generator, Clock& clock,
                                                  int public_listen_fd = -1);
    ~Daemon();

    void start();
    // Re-reads the certificate files: the public ones, and with a `peer` section the cluster
    // certificate, key and CA of the peer listener and of the forwarding client. Each set whose
    // files fail to load keeps its old certificates (logged; the first error is returned).
    Status reload_certificates();
    // The same, from the files `config` names (SIGHUP with the re-read config): its
    // listeners.public.certificates (chains added, removed or moved) and, when the daemon runs a
    // peer listener and `config` has a `peer` section, its ca/cert/key. A set that loads
    // replaces the old one (the expiry gauge follows); one that fails keeps the old.
    Status reload_certificates(const Config& config);
    // SIGHUP with the re-read config: its certificates, tenants and limits, gossip keys,
    // routing weights and admin token (kReloadApplies), all or none. Everything that can refuse
    // it (a certificate or key that does not load, an unreadable token or keyring file, a section
    // whose loss would turn authentication off) is checked first; then nothing applies, the
    // error (naming the config file and key) is logged as config_reload_failed with the `part`
    // refused (preflight_reload's, or "tenants", "admin_token") and returned, and a refused
    // certificate set counts as a failed reload in edgeserve_certificate_reloads_total.
    // Sections that need a restart are not looked at (changed_restart_sections()). The outcome
    // sets edgeserve_config_last_reload_successful (Metrics::on_config_reload).
    Status reload(const Config& fresh);
    // Replaces tenants, keys and limits (SIGHUP). Requests in flight keep running and keep their
    // concurrency slots; new requests see the new table at once. A config without `tenants`
    // while authentication is on is refused (kFailedPrecondition, the old tenants stay): one
    // mis-edit must not open a live site to everyone; restart to run without authentication.
    Status reload_tenants(const std::optional<std::vector<TenantConfig>>& tenants);
    // Replaces the gossip keys (SIGHUP; see Cluster::reload_keys), logged either way. Nothing
    // to do without a `gossip` section.
    Status reload_gossip_keys(const GossipConfig& gossip);
    // SIGHUP: the routing weights (routing.cost, .selection, .version_fallback) apply from the
    // next routing decision; logged. Without a cluster, nothing to do.
    void reload_routing(const RoutingConfig& routing);
    // Reads listeners.admin.token_file again (SIGHUP), logged either way: the new token applies
    // from the next admin request; a file that does not load keeps the old token, and so does
    // a config without the key (refused: it would open /admin/; a restart can).
    Status reload_admin_token(const AdminListenerConfig& admin);
    // Stops accepting, lets requests in flight finish until `deadline`, closes the rest, stops
    // the admin listener and the I/O threads.
    void stop(std::chrono::milliseconds deadline);

    uint16_t public_port() const;
    uint16_t admin_port() const;
    // The peer listener's port; 0 without a `peer` section.
    uint16_t peer_port() const;
    // Installs the route planner (null: every request runs here). It also hears the forwarder's
    // reports. Any thread; the planner must outlive the Daemon.
    void set_route_planner(cluster::RoutePlanner* planner);
    // The forwarding client; null without a `peer` section.
    forward::PeerClient* forwarder() { return forwarder_.get(); }
    bool draining() const { return draining_.load(); }
    // Replaces the device-health probe (default: engine::device_health). Only tests call this,
    // to inject a fault on a machine without a GPU; the binary has no way to reach it. Call
    // before start().
    void set_health_probe(std::function<Status()> probe);
    // Asks the probe. On its first failure: logs it, marks the daemon unhealthy for good (/readyz
    // 503 "not ready: <reason>", gossip advertises every local pool as draining) and returns the
    // fault; afterwards returns that same fault without asking again. Any thread.
    Status check_health();
    // The recorded fault, or OK while the probe has never failed. Any thread.
    Status health() const;
    Metrics& metrics() { return *metrics_; }
    // For the systemd watchdog (daemon/liveness.h): "" while the I/O threads and the engine make
    // progress, else what has made none for longer than `stall` ("io", "engine"). The verdict
    // is kept until the next call: while it names a stall, /readyz answers 503 "not ready:
    // stalled: <what>" and gossip advertises every local pool as draining, so traffic leaves
    // before systemd kills the process; a call that finds progress again clears both. Run loop
    // only.
    std::string stuck(std::chrono::milliseconds stall);
    // The last verdict of stuck() ("" when it found progress, or was never asked). Any thread.
    std::string stalled() const;
    // The gossip cluster and its route planner; null when the config has no `gossip` section.
    cluster::Cluster* cluster() { return cluster_.get(); }
    cluster::RoutePlanner* route_planner();

private:
    Daemon() = default;
    // reload()'s work; reload() records its outcome in the metrics.
    Status apply_reload(const Config& fresh);
    // Loads each set from the given files; reload_mu_ held.
    Status reload_certificate_files(const std::vector<tls::CertificateConfig>& certificates,
                                    const tls::CertificateConfig& peer_certificate,
                                    const std::string& peer_ca);
    // Why `tenants` / `admin` may not replace the running ones (OK when they may).
    Status refuse_tenants(const std::optional<std::vector<TenantConfig>>& tenants) const;
    Status refuse_admin_token(const AdminListenerConfig& admin) const;
    // The new limits for the connections the public and peer listeners accept from now on (those
    // open keep theirs); logged.
    void reload_limits(const LimitsConfig& limits);
    // The tenant names requests run under: the configured ones, or "anonymous".
    static std::vector<std::string> tenant_names(
        const std::optional<std::vector<TenantConfig>>& tenants);
    // Stops the certificate watcher and waits for a reload it runs.
    void stop_certificate_watch();
    // Every certificate, key and CA file of these sets.
    static std::vector<std::string> certificate_paths(
        const std::vector<tls::CertificateConfig>& certificates,
        const tls::CertificateConfig& peer_certificate, const std::string& peer_ca);

    engine::Generator* generator_ = nullptr;
    int io_threads_ = 1;
    std::unique_ptr<boost::asio::io_context> io_;
    std::unique_ptr<Metrics> metrics_;
    // The listeners' observers: the public one passes events on to metrics_.
    std::unique_ptr<AccessLog> access_log_;
    std::unique_ptr<AccessLog> peer_access_log_;
    std::unique_ptr<Liveness> liveness_;
    std::unique_ptr<TenantLimiter> limiter_;
    std::unique_ptr<tls::TlsContextStore> tls_;
    std::unique_ptr<api::ApiRouter> router_;
    std::unique_ptr<tls::HttpServer> server_;
    std::unique_ptr<AdminServer> admin_;
    bool admin_token_set_ = false;  // The admin listener has a token (reloads run one at a time).
    // The files the certificates came from (the expiry gauge, a reload of the same files);
    // guarded by reload_mu_, which serialises reloads.
    std::mutex reload_mu_;
    std::vector<tls::CertificateConfig> certificates_;
    tls::CertificateConfig peer_certificate_;
    std::string peer_ca_;
    // Per set, its files' stamps when it last loaded from them, by create() or a reload (empty:
    // reload next time): an unchanged set is not rebuilt. Apart, because a file both sets read
    // (one certificate for the public and the peer listener) loaded in one set and failed in
    // the other: one map forgot it for both, and the set that loaded rebuilt at every reload.
    std::map<std::string, FileStamp> public_stamps_;
    std::map<std::string, FileStamp> peer_stamps_;
    // listeners.public.certificate_watch_ms: reloads the files above when they change (started
    // by start(), stopped first by stop()).
    std::chrono::milliseconds certificate_watch_{0};
    std::unique_ptr<FileWatcher> certificate_watcher_;  // Guarded by reload_mu_.
    std::unique_ptr<cluster::Cluster> cluster_;
    std::chrono::milliseconds advertise_drain_{0};
    std::unique_ptr<tls::TlsContextStore> peer_tls_;
    std::unique_ptr<forward::PeerHandler> peer_handler_;
    std::unique_ptr<tls::HttpServer> peer_server_;
    std::unique_ptr<forward::PeerClient> forwarder_;
    std::vector<std::thread> threads_;
    std::atomic<bool> draining_{false};
    bool stopped_ = false;
    std::function<Status()> health_probe_;
    mutable std::mutex health_mu_;
    Status fault_;  // Guarded by health_mu_; sticky once set.
    mutable std::mutex stall_mu_;
    std::string stalled_;  // Guarded by stall_mu_: stuck()'s last verdict.
};

}  // namespace edge::daemon
