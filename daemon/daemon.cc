#include "daemon/daemon.h"

#include <algorithm>
#include <future>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "common/log.h"
#include "daemon/admin_server.h"
#include "daemon/api/api_router.h"
#include "daemon/certificate_expiry.h"
#include "daemon/cluster/advertise.h"
#include "daemon/cluster/cluster.h"
#include "daemon/file_watcher.h"
#include "daemon/forward/peer_client.h"
#include "daemon/forward/peer_handler.h"
#include "daemon/metrics.h"
#include "daemon/tenant_limiter.h"
#include "daemon/tenants.h"
#include "engine/backend.h"
#include "tls/http_server.h"
#include "tls/tls_context.h"

namespace edge::daemon {

namespace {

// The expiry gauge from the generations the public and (when there is one) peer listeners serve
// now, not from the files (daemon/certificate_expiry.h).
void publish_served_certificate_expiry(const tls::TlsContextStore& public_tls,
                                       const tls::TlsContextStore* peer_tls, Metrics& metrics) {
    const std::shared_ptr<const tls::TlsGeneration> served = public_tls.current();
    const std::shared_ptr<const tls::TlsGeneration> peer =
        peer_tls != nullptr ? peer_tls->current() : nullptr;
    publish_certificate_expiry(*served, metrics, peer.get());
}

// The stamps of `paths` alone, out of `stamps` (which has each of them).
std::map<std::string, FileStamp> stamps_of(const std::map<std::string, FileStamp>& stamps,
                                           const std::vector<std::string>& paths) {
    std::map<std::string, FileStamp> of;
    for (const std::string& path : paths) {
        of[path] = stamps.at(path);
    }
    return of;
}

// Whether each of `paths` has in `now` the stamp it had when its set last loaded (`loaded`): a
// file not recorded there (its set never loaded whole from it) has changed.
bool same_stamps(const std::map<std::string, FileStamp>& now,
                 const std::map<std::string, FileStamp>& loaded,
                 const std::vector<std::string>& paths) {
    return std::all_of(paths.begin(), paths.end(), [&](const std::string& path) {
        const auto a = now.find(path);
        const auto b = loaded.find(path);
        return a != now.end() && b != loaded.end() && a->second == b->second;
    });
}

// The `limits` section as both listeners, public and peer, apply it: at start and at reload.
tls::HttpLimits http_limits(const LimitsConfig& l) {
    tls::HttpLimits limits;
    limits.handshake_timeout = l.handshake_timeout;
    limits.header_timeout = l.header_timeout;
    limits.body_timeout = l.body_timeout;
    limits.request_read_timeout = l.request_read_timeout;
    limits.idle_timeout = l.idle_timeout;
    limits.write_timeout = l.write_timeout;
    limits.max_header_bytes = l.max_header_bytes;
    limits.max_body_bytes = l.max_body_bytes;
    limits.max_connections = l.max_connections;
    limits.max_stream_buffer_bytes = l.max_stream_buffer_bytes;
    limits.stream_keepalive = l.stream_keepalive;
    return limits;
}

}  // namespace

std::chrono::milliseconds drain_advertise_window(const Config& config) {
    // The round the membership runs: the key's, else the preset's, not a fixed fallback (a wan
    // round is 500 ms). Cluster::create() refuses a config whose membership does not validate.
    Result<routing::membership::MembershipConfig> m = cluster::membership_config(config);
    const Duration round =
        m.ok() ? m->gossip_interval : routing::membership::MembershipConfig{}.gossip_interval;
    return 3 * std::chrono::duration_cast<std::chrono::milliseconds>(round);
}

std::vector<std::string> Daemon::tenant_names(
    const std::optional<std::vector<TenantConfig>>& tenants) {
    // The anonymous tenant's (TenantTable) when authentication is off.
    if (!tenants) {
        return {"anonymous"};
    }
    std::vector<std::string> names;
    for (const TenantConfig& t : *tenants) {
        names.push_back(t.name);
    }
    return names;
}

Result<std::unique_ptr<Daemon>> Daemon::create(const Config& config, engine::Generator& generator,
                                               Clock& clock, int public_listen_fd) {
    std::unique_ptr<Daemon> d(new Daemon());
    d->generator_ = &generator;
    d->io_threads_ = std::max(1, config.listener.io_threads);
    d->io_ = std::make_unique<boost::asio::io_context>(d->io_threads_);
    d->metrics_ = std::make_unique<Metrics>();
    d->metrics_->set_site_info(config.site.id, config.site.region, config.site.latitude,
                               config.site.longitude);
    d->certificates_ = config.listener.certificates;
    d->certificate_watch_ = config.listener.certificate_watch;
    // Until gossip reports a membership (daemon/cluster), the fleet this site knows is itself.
    d->metrics_->set_gossip_members("alive", 1);
    d->metrics_->set_serving_source([&generator] { return generator.serving_stats(); });
    auto tenants = std::make_shared<const TenantTable>(config.tenants);
    d->liveness_ = std::make_unique<Liveness>(
        [io = d->io_.get()](std::function<void()> fn) {
            boost::asio::post(*io, std::move(fn));
        },
        [&generator] { return generator.serving_stats(); });
    d->limiter_ = std::make_unique<TenantLimiter>(clock);
    d->limiter_->configure(config.tenants);
    d->metrics_->set_tenants(tenant_names(config.tenants), {});
    if (!tenants->enabled()) {
        log::warn("auth_disabled", {{"reason", "no `tenants` section in the config; every "
                                               "request is served as tenant 'anonymous'"}});
    }
    if (config.peer) {
        d->peer_certificate_ = {{}, config.peer->cert_path, config.peer->key_path};
        d->peer_ca_ = config.peer->ca_path;
    }
    // The files as they are before they are read, as a reload records them, so that a first
    // SIGHUP finding them unchanged rebuilds nothing: the session caches, the forwarding
    // client's pooled connections and the reload counter stay as they are.
    std::map<std::string, FileStamp> stamps =
        stamp_files(certificate_paths(d->certificates_, d->peer_certificate_, d->peer_ca_));
    EDGE_ASSIGN_OR_RETURN(d->tls_, tls::TlsContextStore::create(config.listener.certificates));
    d->router_ = std::make_unique<api::ApiRouter>(generator, std::move(tenants), *d->limiter_,
                                                  d->metrics_.get(), clock);
    d->access_log_ =
        std::make_unique<AccessLog>(d->metrics_.get(), "public", config.log.access_log);

    tls::HttpServerConfig server_config;
    server_config.address = config.listener.address;
    server_config.port = config.listener.port;
    server_config.io_threads = d->io_threads_;
    server_config.listen_fd = public_listen_fd;
    server_config.limits = http_limits(config.limits);
    EDGE_ASSIGN_OR_RETURN(server_config.proxy_trusted,
                          tls::CidrSet::parse(config.proxy_protocol.trusted));
    EDGE_ASSIGN_OR_RETURN(d->server_, tls::HttpServer::create(*d->io_, std::move(server_config),
                                                              *d->tls_, *d->router_,
                                                              d->access_log_.get()));
    d->router_->set_site_id(config.site.id);
    d->router_->set_verify_site_identity(!config.peer || config.peer->verify_site_identity);
    if (config.peer) {
        const PeerConfig& p = *config.peer;
        EDGE_ASSIGN_OR_RETURN(
            d->peer_tls_,
            tls::TlsContextStore::create({d->peer_certificate_}, tls::ClientAuthConfig{p.ca_path}));
        d->peer_handler_ = std::make_unique<forward::PeerHandler>(*d->router_);
        d->peer_access_log_ = std::make_unique<AccessLog>(d->metrics_->peer_listener(), "peer",
                                                          config.log.access_log);
        tls::HttpServerConfig peer_config;
        peer_config.address = p.address;
        peer_config.port = p.port;
        peer_config.io_threads = d->io_threads_;
        peer_config.limits = http_limits(config.limits);
        EDGE_ASSIGN_OR_RETURN(d->peer_server_,
                              tls::HttpServer::create(*d->io_, std::move(peer_config),
                                                      *d->peer_tls_, *d->peer_handler_,
                                                      d->peer_access_log_.get()));
        forward::PeerClientConfig client;
        client.site_id = config.site.id;
        client.ca_path = p.ca_path;
        client.cert_path = p.cert_path;
        client.key_path = p.key_path;
        client.connect_timeout = p.connect_timeout;
        client.response_timeout = p.response_timeout;
        client.stream_idle_timeout = p.stream_idle_timeout;
        client.deferred_answer_timeout = p.deferred_answer_timeout;
        client.pool_idle_timeout = p.pool_idle_timeout;
        client.max_idle_connections = p.max_idle_connections;
        client.retry_budget = p.retry_budget;
        client.min_retry_concurrency = p.min_retry_concurrency;
        client.max_response_bytes = p.max_response_bytes;
        client.verify_site_identity = p.verify_site_identity;
        client.testing_delay = config.gossip.testing_peer_delay;
        EDGE_ASSIGN_OR_RETURN(d->forwarder_, forward::PeerClient::create(
                                                 *d->io_, std::move(client), d->metrics_.get()));
        d->router_->set_forwarder(d->forwarder_.get());
    }
    publish_served_certificate_expiry(*d->tls_, d->peer_tls_.get(), *d->metrics_);
    d->metrics_->declare_certificate_listener("public");
    if (d->peer_tls_) {
        d->metrics_->declare_certificate_listener("peer");
    }
    if (d->forwarder_) {
        d->metrics_->declare_certificate_listener("forwarding_client");
    }
    d->public_stamps_ = stamps_of(stamps, certificate_paths(d->certificates_, {}, ""));
    d->peer_stamps_ = stamps_of(stamps, certificate_paths({}, d->peer_certificate_, d->peer_ca_));
    Daemon* raw = d.get();
    d->health_probe_ = [] { return engine::device_health(); };
    EDGE_ASSIGN_OR_RETURN(
        d->admin_, AdminServer::create(*d->io_, config.admin.address, config.admin.port,
                                       *d->metrics_, [raw]() -> Status {
                                           // A failed device first: it is why the site drains.
                                           Status h = raw->check_health();
                                           if (!h.ok()) {
                                               return h;
                                           }
                                           // Then a stall the watchdog found: systemd kills
                                           // the process at WatchdogSec unless it moves again.
                                           if (std::string s = raw->stalled(); !s.empty()) {
                                               return unavailable_error("stalled: " + s);
                                           }
                                           if (raw->draining_.load()) {
                                               return unavailable_error("draining");
                                           }
                                           if (!raw->generator_->ready()) {
                                               return unavailable_error("models loading");
                                           }
                                           return ok_status();
                                       }));
    d->admin_->set_host_names(admin_host_names(config.admin.host_names, config.site.admin_address));
    if (!config.admin.token_file.empty()) {
        Result<std::string> token = read_admin_token(config.admin.token_file);
        if (!token.ok()) {
            return token.status().with_context("listeners.admin.token_file");
        }
        d->admin_->set_token(std::move(token).value());
        d->admin_token_set_ = true;
    }
    if (config.gossip.enabled) {
        // What other sites reach this one at: a listener's own address, or this site's public
        // host (the gossip advertise host, else a specific gossip bind address) when it
        // listens on every interface. A loopback listener is out of their reach unless the
        // whole cluster is on this machine: its address is then not gossiped (127.0.0.1 would
        // name their own machine). site.admin_address / site.peer_address, when set, win over
        // all of this (Cluster).
        const std::string public_host = cluster::public_host(config.gossip.advertise_address,
                                                             config.gossip.bind_address);
        auto reachable = [&](const std::string& listen, uint16_t port) {
            return cluster::reachable_address(listen, port, public_host);
        };
        const std::string admin_addr = reachable(config.admin.address, d->admin_->port());
        if (admin_addr.empty() && config.site.admin_address.empty()) {
            log::warn("admin_address_not_advertised",
                      {{"listen", config.admin.address},
                       {"effect", "other sites skip their /readyz checks of this one"},
                       {"fix", "set site.admin_address"}});
        }
        EDGE_ASSIGN_OR_RETURN(d->cluster_,
                              cluster::Cluster::create(*d->io_, config, generator,
                                                       d->metrics_.get(), clock, admin_addr));
        cluster::Cluster* c = d->cluster_.get();
        if (d->peer_server_) {
            // Other sites forward to the bound peer listener (unless site.peer_address says
            // otherwise).
            const std::string peer_addr = reachable(config.peer->address, d->peer_server_->port());
            if (!peer_addr.empty()) {
                c->set_peer_addr(peer_addr);
            } else if (config.site.peer_address.empty()) {
                log::warn("peer_address_not_advertised",
                          {{"listen", config.peer->address},
                           {"effect", "other sites cannot forward requests to this one"},
                           {"fix", "listen on a reachable address (peer.address) or set "
                                   "site.peer_address"}});
            }
        }
        // Without a forwarder every request runs here; the cluster is then only visible.
        if (d->forwarder_) {
            d->set_route_planner(&c->planner());
            // A forward to a site found dead ends now, not at the stream's idle timeout.
            c->set_on_site_dead(d->forwarder_->site_lost_handler());
        }
        d->admin_->set_handler([c](std::string_view method, std::string_view target) {
            return c->handle_admin(method, target);
        });
        // On SIGTERM the draining state is gossiped for a few rounds before the listener stops.
        d->advertise_drain_ = drain_advertise_window(config);
    }
    return d;
}

void Daemon::set_health_probe(std::function<Status()> probe) {
    std::lock_guard<std::mutex> lock(health_mu_);
    health_probe_ = std::move(probe);
}

Status Daemon::health() const {
    std::lock_guard<std::mutex> lock(health_mu_);
    return fault_;
}

Status Daemon::check_health() {
    Status probed;
    {
        std::lock_guard<std::mutex> lock(health_mu_);
        if (!fault_.ok()) {
            return fault_;
        }
        probed = health_probe_ ? health_probe_() : ok_status();
        if (probed.ok()) {
            return probed;
        }
        fault_ = unavailable_error("engine device failed: " + probed.message());
        probed = fault_;
    }
    log::error("device_unhealthy", {{"error", probed.message()},
                                    {"detail", "advertising draining; the process exits for a "
                                               "restart"}});
    draining_.store(true);
    if (cluster_) {
        cluster_->set_draining();
    }
    return probed;
}

cluster::RoutePlanner* Daemon::route_planner() {
    return cluster_ ? &cluster_->planner() : nullptr;
}

Daemon::~Daemon() {
    if (!threads_.empty() && !stopped_) {
        stop(std::chrono::milliseconds(0));
    }
    stop_certificate_watch();  // Before what its reloads touch.
    // The listeners go before the io_context: their sockets need its services; coroutine frames
    // still parked in it are destroyed with it.
    server_.reset();
    peer_server_.reset();
    forwarder_.reset();
    admin_.reset();
    // No thread runs the io_context any more: mark it stopped so the gossip service closes
    // without waiting for its strand.
    if (io_) {
        io_->stop();
    }
    cluster_.reset();
    io_.reset();
}

void Daemon::start() {
    server_->start();
    if (peer_server_) {
        peer_server_->start();
    }
    admin_->start();
    for (int i = 0; i < io_threads_; ++i) {
        threads_.emplace_back([this] {
            auto guard = boost::asio::make_work_guard(*io_);
            io_->run();
        });
    }
    if (cluster_) {
        cluster_->start();
    }
    if (certificate_watch_.count() > 0) {
        auto watcher = std::make_unique<FileWatcher>(
            certificate_watch_,
            [this] {
                std::lock_guard lock(reload_mu_);
                return certificate_paths(certificates_, peer_certificate_, peer_ca_);
            },
            [this](const std::vector<std::string>& changed) {
                std::string files;
                for (const std::string& f : changed) {
                    files += (files.empty() ? "" : ",") + f;
                }
                log::info("certificate_files_changed", {{"files", files}});
                (void)reload_certificates();  // Logged per set.
            });
        std::lock_guard lock(reload_mu_);
        certificate_watcher_ = std::move(watcher);
    }
    log::info("listening", {{"public_port", static_cast<uint64_t>(server_->port())},
                            {"admin_port", static_cast<uint64_t>(admin_->port())},
                            {"peer_port", static_cast<uint64_t>(peer_port())},
                            {"io_threads", static_cast<int64_t>(io_threads_)}});
}

Status Daemon::reload_certificates() {
    std::lock_guard lock(reload_mu_);
    return reload_certificate_files(certificates_, peer_certificate_, peer_ca_);
}

Status Daemon::reload_certificates(const Config& config) {
    std::lock_guard lock(reload_mu_);
    tls::CertificateConfig peer_certificate = peer_certificate_;
    std::string peer_ca = peer_ca_;
    // A `peer` section added while the daemon runs without one (it needs a restart) names files
    // nothing serves: not recorded, so the watch does not follow them either.
    if (config.peer && (peer_tls_ || forwarder_)) {
        peer_certificate = {{}, config.peer->cert_path, config.peer->key_path};
        peer_ca = config.peer->ca_path;
    }
    return reload_certificate_files(config.listener.certificates, peer_certificate, peer_ca);
}

void Daemon::reload_limits(const LimitsConfig& limits) {
    const tls::HttpLimits fresh = http_limits(limits);
    server_->set_limits(fresh);
    if (peer_server_) {
        peer_server_->set_limits(fresh);
    }
    log::info("limits_reloaded",
              {{"applied", "to new connections; open ones keep their limits"},
               {"max_connections", static_cast<uint64_t>(fresh.max_connections)},
               {"max_body_bytes", static_cast<uint64_t>(fresh.max_body_bytes)}});
}

void Daemon::stop_certificate_watch() {
    std::unique_ptr<FileWatcher> watcher;
    {
        std::lock_guard lock(reload_mu_);
        watcher = std::move(certificate_watcher_);
    }
    watcher.reset();  // Joins its thread, which may be waiting for reload_mu_: not held here.
}

std::vector<std::string> Daemon::certificate_paths(
    const std::vector<tls::CertificateConfig>& certificates,
    const tls::CertificateConfig& peer_certificate, const std::string& peer_ca) {
    std::vector<std::string> paths;
    for (const tls::CertificateConfig& c : certificates) {
        paths.push_back(c.cert_path);
        paths.push_back(c.key_path);
    }
    for (const std::string& p : {peer_certificate.cert_path, peer_certificate.key_path, peer_ca}) {
        if (!p.empty()) {
            paths.push_back(p);
        }
    }
    return paths;
}

Status Daemon::reload_certificate_files(const std::vector<tls::CertificateConfig>& certificates,
                                        const tls::CertificateConfig& peer_certificate,
                                        const std::string& peer_ca) {
    // The files as they are before they are read: the watcher does not reload this state again
    // (a change while they are read is newer, and is).
    std::map<std::string, FileStamp> stamps =
        stamp_files(certificate_paths(certificates, peer_certificate, peer_ca));
    if (certificate_watcher_) {
        certificate_watcher_->loaded(stamps);
    }
    // A set is rebuilt only when its own files or config changed since it last loaded (a SIGHUP
    // for the tenants, a renewal of the other set's files): rebuilt, a listener starts new
    // session caches and ticket keys (no client could resume), the forwarding client drops its
    // pooled connections, and the set counts a reload it did not have.
    const std::vector<std::string> public_paths = certificate_paths(certificates, {}, "");
    const std::vector<std::string> peer_paths = certificate_paths({}, peer_certificate, peer_ca);
    const bool public_changed =
        certificates != certificates_ || !same_stamps(stamps, public_stamps_, public_paths);
    const bool peer_changed = (peer_tls_ || forwarder_) &&
                              (peer_certificate != peer_certificate_ || peer_ca != peer_ca_ ||
                               !same_stamps(stamps, peer_stamps_, peer_paths));
    if (!public_changed && !peer_changed) {
        log::info("certificates_unchanged", {{"generation", tls_->current()->number()}});
        return ok_status();
    }
    // A set's stamps are those of the files it loaded whole from (files a reload took out of its
    // config go with the old ones); a failed set keeps none, so a later reload tries it again.
    // The other set's stamps stay as they are, also for a file the two share.
    Status s = ok_status();
    if (public_changed) {
        s = tls_->reload(certificates, {});
        metrics_->on_certificate_reload("public", s.ok());
        if (s.ok()) {
            certificates_ = certificates;
            public_stamps_ = stamps_of(stamps, public_paths);
            log::info("certificates_reloaded",
                      {{"generation", tls_->current()->number()},
                       {"chains", static_cast<int64_t>(certificates.size())}});
        } else {
            public_stamps_.clear();
            log::error("certificates_reload_failed",
                       {{"error", s.message()}, {"kept_generation", tls_->current()->number()}});
        }
    }
    // The cluster certificates: the peer listener's (server side) and the forwarding client's,
    // both or neither. The listener's generation is built first, the client loads (and swaps
    // in) its context only when that did, and the listener's is served only when the client's
    // loaded: a file one side refuses must not leave the two on different CAs (a leaf copied
    // over the CA file would have the client trust only it, and every forward fail).
    if (peer_changed) {
        Status p = ok_status();
        std::shared_ptr<tls::TlsGeneration> listener;
        if (peer_tls_) {
            Result<std::shared_ptr<tls::TlsGeneration>> built =
                peer_tls_->prepare({peer_certificate}, tls::ClientAuthConfig{peer_ca});
            if (built.ok()) {
                listener = std::move(built).value();
            } else {
                p = built.status();
            }
        }
        if (p.ok() && forwarder_) {
            p = forwarder_->reload(peer_ca, peer_certificate.cert_path, peer_certificate.key_path);
        }
        if (p.ok() && listener) {
            peer_tls_->install(std::move(listener));
        }
        if (p.ok()) {
            // Later reloads of the same files read these.
            peer_certificate_ = peer_certificate;
            peer_ca_ = peer_ca;
            peer_stamps_ = stamps_of(stamps, peer_paths);
        } else {
            peer_stamps_.clear();
        }
        if (peer_tls_) {
            metrics_->on_certificate_reload("peer", p.ok());
            if (p.ok()) {
                log::info("peer_certificates_reloaded",
                          {{"listener", "peer"}, {"generation", peer_tls_->current()->number()}});
            } else {
                log::error("peer_certificates_reload_failed",
                           {{"listener", "peer"},
                            {"error", p.message()},
                            {"kept_generation", peer_tls_->current()->number()}});
            }
        }
        if (forwarder_) {
            metrics_->on_certificate_reload("forwarding_client", p.ok());
            if (p.ok()) {
                log::info("peer_certificates_reloaded", {{"listener", "forwarding_client"}});
            } else {
                log::error("peer_certificates_reload_failed",
                           {{"listener", "forwarding_client"}, {"error", p.message()}});
            }
        }
        if (!p.ok() && s.ok()) {
            s = p;
        }
    }
    // From the generations now served: a set whose reload failed still serves, and shows, its
    // old certificates, whatever the files on disk hold now.
    publish_served_certificate_expiry(*tls_, peer_tls_.get(), *metrics_);
    return s;
}

std::string Daemon::stuck(std::chrono::milliseconds stall) {
    std::string verdict = liveness_->check(std::chrono::steady_clock::now(), stall);
    bool changed = false;
    {
        std::lock_guard<std::mutex> lock(stall_mu_);
        changed = verdict.empty() != stalled_.empty();
        stalled_ = verdict;
    }
    if (changed && verdict.empty()) {
        // The stall itself is logged by the run loop (watchdog_withheld).
        log::info("stall_over", {{"detail", "readyz answers 200 again; pools gossiped as before"}});
    }
    if (changed && cluster_) {
        cluster_->set_stalled(!verdict.empty());
    }
    return verdict;
}

std::string Daemon::stalled() const {
    std::lock_guard<std::mutex> lock(stall_mu_);
    return stalled_;
}

void Daemon::stop(std::chrono::milliseconds deadline) {
    if (stopped_) {
        return;
    }
    stopped_ = true;
    draining_.store(true);
    stop_certificate_watch();
    log::info("draining", {{"deadline_ms", static_cast<int64_t>(deadline.count())},
                           {"connections", static_cast<uint64_t>(server_->open_connections())}});
    if (cluster_ && !threads_.empty()) {
        // Advertise draining first so other sites stop sending here, then drain, then leave.
        // The advertising is part of the drain: requests in flight get what is left of the
        // deadline, so the whole stop stays within it (and within systemd's TimeoutStopSec).
        cluster_->set_draining();
        const std::chrono::milliseconds advertise = std::min(deadline, advertise_drain_);
        std::this_thread::sleep_for(advertise);
        deadline -= advertise;
    }
    if (!threads_.empty()) {
        // Both listeners drain at once: requests other sites forwarded here finish too.
        // At the deadline the engine stops: the requests still running end with an error the
        // client reads (an error event and [DONE], or a 503), not with a bare close.
        auto cut = [this] {
            if (generator_ != nullptr) {
                generator_->stop();
            }
        };
        std::future<void> peer_stopped;
        if (peer_server_) {
            peer_stopped = std::async(std::launch::async,
                                      [this, deadline, cut] { peer_server_->stop(deadline, cut); });
        }
        server_->stop(deadline, cut);
        if (peer_stopped.valid()) {
            peer_stopped.wait();
        }
        if (forwarder_) {
            forwarder_->stop(std::chrono::seconds(2));
        }
    }
    if (cluster_ && !threads_.empty()) {
        cluster_->stop();
    }
    admin_->stop();
    io_->stop();
    for (std::thread& t : threads_) {
        t.join();
    }
    threads_.clear();
    log::info("stopped");
}

uint16_t Daemon::public_port() const { return server_->port(); }
uint16_t Daemon::admin_port() const { return admin_->port(); }
uint16_t Daemon::peer_port() const { return peer_server_ ? peer_server_->port() : 0; }

void Daemon::set_route_planner(cluster::RoutePlanner* planner) {
    router_->set_route_planner(planner);
    if (forwarder_) {
        forwarder_->set_planner(planner);
    }
}

}  // namespace edge::daemon
