// Daemon: what SIGHUP changes (tenants, gossip keys, routing weights, admin token, and the
// whole reload of a re-read config); the certificates' reload is in daemon.cc, with the watcher.

#include "daemon/daemon.h"

#include "common/log.h"
#include "daemon/admin_server.h"
#include "daemon/api/api_router.h"
#include "daemon/cluster/cluster.h"
#include "daemon/metrics.h"
#include "daemon/preflight.h"
#include "daemon/tenant_limiter.h"
#include "daemon/tenants.h"

namespace edge::daemon {

Status Daemon::reload(const Config& fresh) {
    Status s = apply_reload(fresh);
    metrics_->on_config_reload(s.ok());
    return s;
}

Status Daemon::apply_reload(const Config& fresh) {
    // Everything that can refuse the new config is asked before any of it applies: a config
    // with one bad part (a certificate that does not load, a lost `tenants` section) must not
    // leave the site half on it, say with the new tenants but the old certificates.
    std::string part;  // The part refused, as config_reload_failed names it.
    Status checked = preflight_reload(fresh, &part);
    if (checked.ok()) {
        checked = refuse_tenants(fresh.tenants).with_context(fresh.source);
        part = "tenants";
    }
    if (checked.ok()) {
        checked = refuse_admin_token(fresh.admin).with_context(fresh.source);
        part = "admin_token";
    }
    if (!checked.ok()) {
        // A certificate refused here is a failed certificate reload too, counted as one the
        // file watch meets is: the alert on edgeserve_certificate_reloads_total{result="error"}
        // must fire for a rotation done with `systemctl reload` as well.
        if (part == "certificates") {
            metrics_->on_certificate_reload("public", false);
        } else if (part == "peer_certificates") {
            if (peer_tls_) {
                metrics_->on_certificate_reload("peer", false);
            }
            if (forwarder_) {
                metrics_->on_certificate_reload("forwarding_client", false);
            }
        }
        log::error("config_reload_failed",
                   {{"part", part},
                    {"error", checked.message()},
                    {"detail", "nothing applied: " + std::string(kReloadApplies) +
                                   " stay as they were"}});
        return checked;
    }
    // The gossip keys first: the one refusal left (turning encryption on or off) then changes
    // nothing. The files read again below were checked just now; one replaced meanwhile stops
    // the reload there, logged.
    EDGE_RETURN_IF_ERROR(reload_gossip_keys(fresh.gossip));
    EDGE_RETURN_IF_ERROR(reload_admin_token(fresh.admin));
    EDGE_RETURN_IF_ERROR(reload_certificates(fresh));
    EDGE_RETURN_IF_ERROR(reload_tenants(fresh.tenants));
    if (!cluster_) {
        // Alone, a site serves only the models it started with (`models` waits for a restart),
        // whatever the new config's `models` says. A tenant list naming a model added or renamed
        // there is what the restart will serve, so it is taken (refusing it would hold back every
        // other change of the reload, a revoked key among them), and the operator is told which
        // models the tenants get 404 for until then: once the list is in force, not for a reload
        // refused above, which changed nothing.
        std::vector<std::string> served;
        for (const engine::ModelInfo& m : generator_->models()) {
            served.push_back(m.name);
        }
        if (Status unserved = check_tenant_models(fresh, served); !unserved.ok()) {
            log::warn("tenant_model_not_served_until_restart", {{"error", unserved.message()}});
        }
    }
    reload_routing(fresh.routing);
    // Last, as nothing after the checks above can refuse it: limits for new connections.
    reload_limits(fresh.limits);
    return ok_status();
}

Status Daemon::refuse_tenants(const std::optional<std::vector<TenantConfig>>& tenants) const {
    if (!tenants && router_->tenants_enabled()) {
        return failed_precondition_error(
            "the new config has no `tenants` section, which would turn authentication off; "
            "the old tenants stay (restart to run without authentication)");
    }
    return ok_status();
}

Status Daemon::refuse_admin_token(const AdminListenerConfig& admin) const {
    if (admin.token_file.empty() && admin_token_set_) {
        // As for `tenants`: a key deleted (or a config edited in haste) must not open the
        // admin API, rollouts included, to anyone on the admin listener's network.
        return failed_precondition_error(
            "the new config has no listeners.admin.token_file, which would open /admin/ "
            "without a token; the old token stays (restart to run without one)");
    }
    return ok_status();
}

Status Daemon::reload_tenants(const std::optional<std::vector<TenantConfig>>& tenants) {
    if (Status refused = refuse_tenants(tenants); !refused.ok()) {
        log::error("tenants_reload_refused", {{"error", refused.message()}});
        return refused;
    }
    auto table = std::make_shared<const TenantTable>(tenants, router_->tenants().get());
    // New limits before the new keys (a tenant added is never admitted unlimited), and the
    // removed tenants dropped after (their running requests keep their limits: TenantLimiter).
    limiter_->configure(tenants, /*keep_others=*/true);
    router_->set_tenants(table);
    limiter_->configure(tenants);
    // A removed tenant's series go once the requests admitted under its name (their leases,
    // alive until they have counted into its series) are done; those still running are looked
    // at again at the next reload. By name, not by state: a renamed tenant's state lives on
    // under the new name, and the old name is let go while its requests may still run.
    metrics_->set_tenants(tenant_names(tenants), [this](const std::string& name) {
        return limiter_->leases(name) > 0;
    });
    log::info("tenants_reloaded",
              {{"tenants", static_cast<int64_t>(tenants ? tenants->size() : 0)},
               {"auth", table->enabled() ? "on" : "off"}});
    return ok_status();
}

Status Daemon::reload_gossip_keys(const GossipConfig& gossip) {
    // A config without `gossip` leaves the cluster running as it is until the restart (the
    // section is restart-only; changed_sections_need_restart says so): its keys too. Read as
    // keys, its empty keyring would refuse the reload as turning encryption off, and with it an
    // unrelated change (a tenant key revoked) on every reload until then.
    if (!cluster_ || !gossip.enabled) {
        return ok_status();
    }
    Result<size_t> keys = cluster_->reload_keys(gossip);
    if (!keys.ok()) {
        log::error("gossip_keys_reload_failed", {{"error", keys.status().message()},
                                                 {"detail", "the previous gossip keys stay"}});
        return keys.status();
    }
    // `keys`: those accepted now, from gossip.keys and the keyring file together.
    log::info("gossip_keys_reloaded", {{"keys", static_cast<uint64_t>(*keys)},
                                       {"configured", static_cast<uint64_t>(gossip.keys.size())},
                                       {"file", gossip.keyring_file}});
    return ok_status();
}

Status Daemon::reload_admin_token(const AdminListenerConfig& admin) {
    if (Status refused = refuse_admin_token(admin); !refused.ok()) {
        log::error("admin_token_reload_refused", {{"error", refused.message()}});
        return refused;
    }
    if (admin.token_file.empty()) {
        return ok_status();  // None before, none now.
    }
    Result<std::string> token = read_admin_token(admin.token_file);
    if (!token.ok()) {
        log::error("admin_token_reload_failed", {{"error", token.status().message()},
                                                 {"detail", "the previous admin token stays"}});
        return token.status();
    }
    admin_->set_token(std::move(token).value());
    admin_token_set_ = true;
    log::info("admin_token_reloaded", {{"file", admin.token_file}});
    return ok_status();
}

void Daemon::reload_routing(const RoutingConfig& routing) {
    if (!cluster_) {
        return;
    }
    const bool whole = cluster_->reload_routing(routing);
    log::info("routing_reloaded",
              {{"applied", "routing.cost, routing.selection, routing.version_fallback"},
               {"outlier_changed", !whole}});
}

}  // namespace edge::daemon
