#include "daemon/daemon.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "common/log.h"
#include "daemon/admin_server.h"
#include "daemon/api/api_router.h"
#include "daemon/certificate_expiry.h"
#include "daemon/metrics.h"
#include "daemon/tenant_limiter.h"
#include "daemon/tenants.h"
#include "tls/http_server.h"
#include "tls/tls_context.h"

namespace edge::daemon {

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
    publish_certificate_expiry(d->certificates_, *d->metrics_);
    // Until gossip reports a membership (daemon/cluster), the fleet this site knows is itself.
    d->metrics_->set_gossip_members("alive", 1);
    d->metrics_->set_serving_source([&generator] { return generator.serving_stats(); });
    auto tenants = std::make_shared<const TenantTable>(config.tenants);
    d->limiter_ = std::make_unique<TenantLimiter>(clock);
    d->limiter_->configure(config.tenants);
    if (!tenants->enabled()) {
        log::warn("auth_disabled", {{"reason", "no `tenants` section in the config; every "
                                               "request is served as tenant 'anonymous'"}});
    }
    EDGE_ASSIGN_OR_RETURN(d->tls_, tls::TlsContextStore::create(config.listener.certificates));
    d->router_ = std::make_unique<api::ApiRouter>(generator, std::move(tenants), *d->limiter_,
                                                  d->metrics_.get(), clock,
                                                  config.log.access_log);

    tls::HttpServerConfig server_config;
    server_config.address = config.listener.address;
    server_config.port = config.listener.port;
    server_config.io_threads = d->io_threads_;
    server_config.listen_fd = public_listen_fd;
    const LimitsConfig& l = config.limits;
    server_config.limits.handshake_timeout = l.handshake_timeout;
    server_config.limits.header_timeout = l.header_timeout;
    server_config.limits.body_timeout = l.body_timeout;
    server_config.limits.idle_timeout = l.idle_timeout;
    server_config.limits.write_timeout = l.write_timeout;
    server_config.limits.max_header_bytes = l.max_header_bytes;
    server_config.limits.max_body_bytes = l.max_body_bytes;
    server_config.limits.max_connections = l.max_connections;
    EDGE_ASSIGN_OR_RETURN(server_config.proxy_trusted,
                          tls::CidrSet::parse(config.proxy_protocol.trusted));
    EDGE_ASSIGN_OR_RETURN(d->server_, tls::HttpServer::create(*d->io_, std::move(server_config),
                                                              *d->tls_, *d->router_,
                                                              d->metrics_.get()));
    Daemon* raw = d.get();
    EDGE_ASSIGN_OR_RETURN(d->admin_, AdminServer::create(*d->io_, config.admin.address,
                                                         config.admin.port, *d->metrics_,
                                                         [raw] {
                                                             return !raw->draining_.load() &&
                                                                    raw->generator_->ready();
                                                         }));
    return d;
}

Daemon::~Daemon() {
    if (!threads_.empty() && !stopped_) {
        stop(std::chrono::milliseconds(0));
    }
    // The listeners go before the io_context: their sockets need its services; coroutine frames
    // still parked in it are destroyed with it.
    server_.reset();
    admin_.reset();
    io_.reset();
}

void Daemon::start() {
    server_->start();
    admin_->start();
    for (int i = 0; i < io_threads_; ++i) {
        threads_.emplace_back([this] {
            auto guard = boost::asio::make_work_guard(*io_);
            io_->run();
        });
    }
    log::info("listening", {{"public_port", static_cast<uint64_t>(server_->port())},
                            {"admin_port", static_cast<uint64_t>(admin_->port())},
                            {"io_threads", static_cast<int64_t>(io_threads_)}});
}

Status Daemon::reload_certificates() {
    Status s = tls_->reload();
    if (s.ok()) {
        publish_certificate_expiry(certificates_, *metrics_);
        log::info("certificates_reloaded", {{"generation", tls_->current()->number()}});
    } else {
        log::error("certificates_reload_failed",
                   {{"error", s.message()}, {"kept_generation", tls_->current()->number()}});
    }
    return s;
}

void Daemon::reload_tenants(const std::optional<std::vector<TenantConfig>>& tenants) {
    auto table = std::make_shared<const TenantTable>(tenants);
    limiter_->configure(tenants);
    router_->set_tenants(table);
    log::info("tenants_reloaded",
              {{"tenants", static_cast<int64_t>(tenants ? tenants->size() : 0)},
               {"auth", table->enabled() ? "on" : "off"}});
}

void Daemon::stop(std::chrono::milliseconds deadline) {
    if (stopped_) {
        return;
    }
    stopped_ = true;
    draining_.store(true);
    log::info("draining", {{"deadline_ms", static_cast<int64_t>(deadline.count())},
                           {"connections", static_cast<uint64_t>(server_->open_connections())}});
    if (!threads_.empty()) {
        server_->stop(deadline);
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

}  // namespace edge::daemon
