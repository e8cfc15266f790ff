#pragma once

// Metrics owns the prometheus-cpp registry of the daemon and is the public server's observer:
// edgeserve_http_requests_total{route,status}, edgeserve_http_request_duration_seconds{route,
// status}, edgeserve_tls_handshakes_total{resumed}, edgeserve_tls_handshake_failures_total{reason},
// edgeserve_open_connections, edgeserve_connections_rejected_total{reason},
// edgeserve_http_streams_cancelled_total{reason},
// edgeserve_build_info{version}, edgeserve_certificate_reloads_total{listener,result},
// edgeserve_config_last_reload_successful, edgeserve_config_last_reload_success_timestamp_seconds,
// and per
// tenant (label: the tenant's configured name, never a key):
// edgeserve_tenant_requests_total{tenant,outcome}, edgeserve_tenant_tokens_total{tenant,kind},
// edgeserve_tenant_rejections_total{tenant,reason} (a tenant a reload removed loses them, and
// its engine series, once nothing uses them: set_tenants()); the site, certificates, gossip
// membership, routing decisions and engine internals (see the methods below; docs/operations.md
// lists every series). Names follow Prometheus conventions: edgeserve_ prefix, base units
// (seconds, bytes, ratio), counters end in _total, label values come from bounded sets (config
// names, fixed enums) and never carry a request id, prompt or key. Thread-safe (prometheus-cpp
// metrics are atomic; the label caches have a mutex). serialize() renders the text exposition
// format for GET /metrics.
//
// The engine's serving figures (engine/serving_stats.h) are pulled from a source at each scrape
// and rendered after the registry, per model and tenant: edgeserve_tenant_queued_requests,
// edgeserve_tenant_running_requests, edgeserve_engine_batch_sequences{model},
// edgeserve_engine_queued_requests{model}, edgeserve_expert_tokens_total{model,expert},
// edgeserve_kv_cache_usage_ratio{model},
// edgeserve_kv_cache_blocks{model,state}, edgeserve_kv_cache_budget_bytes{model},
// edgeserve_prefix_cache_queries_total / _hits_total (prompt tokens),
// edgeserve_generated_tokens_total, edgeserve_prompt_tokens_total, edgeserve_preemptions_total,
// edgeserve_admission_rejections_total{model,[tenant,]reason}, and the histograms
// edgeserve_queue_time_seconds, edgeserve_time_to_first_token_seconds,
// edgeserve_inter_token_latency_seconds, edgeserve_end_to_end_latency_seconds.
//
// Routing between sites: edgeserve_route_decisions_total{outcome,site},
// edgeserve_route_ejections_total{site}, edgeserve_site_rtt_seconds{site},
// edgeserve_gossip_members{state}; forwarding (label: a configured site id):
// edgeserve_forwarded_requests_total{site,outcome}, edgeserve_forward_latency_seconds{site}
// (time to the peer's response head), edgeserve_forward_retries_total{reason}.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "engine/serving_stats.h"

#include "tls/http_types.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace edge::daemon {

class Metrics final : public tls::ServerObserver {
public:
    Metrics();
    ~Metrics() override;

    std::string serialize() const;
    prometheus::Registry& registry() { return *registry_; }

    void on_connection_opened() override;
    void on_connection_closed() override;
    void on_connection_rejected(std::string_view reason) override;
    void on_handshake(bool resumed, std::string_view failure_reason) override;
    void on_response(const tls::ResponseRecord& record) override;
    void on_stream_cancelled(std::string_view reason) override;

    // The peer listener's observer (mutual TLS from other sites; not the public one's series):
    // edgeserve_peer_tls_handshake_failures_total{reason} (a site whose cluster certificate
    // expired or comes from another CA, or a client with none, shows as client_certificate) and
    // edgeserve_peer_connections_rejected_total{reason}; the same reasons as the public ones.
    tls::ServerObserver* peer_listener() { return &peer_listener_; }
    // edgeserve_admin_connections_rejected_total{reason}: connections to the admin listener
    // closed at accept (reason "limit": AdminServer's connection cap).
    void on_admin_connection_rejected(std::string_view reason);

    // Per-tenant figures; `tenant` is a configured name (bounded by the config).
    // outcome: "ok", "error", "cancelled", "rejected".
    void on_tenant_request(const std::string& tenant, std::string_view outcome);
    void on_tenant_tokens(const std::string& tenant, int64_t prompt, int64_t completion);
    // reason: "missing_key" or "unknown_key" (tenant ""), "model_not_allowed",
    // "max_output_tokens", an engine refusal, or a rate limit's key.
    void on_tenant_rejected(const std::string& tenant, std::string_view reason);
    // The configured tenant names (the anonymous tenant's when authentication is off), at start
    // and after each tenants reload. A name configured before and not now is retired: its
    // series are dropped once nothing uses them, so they do not pile up with tenant churn. The
    // registry's (requests, tokens, rejections) here, unless `busy` (requests of the tenant
    // still run: they would count into them) says so, in which case at the next call; the
    // engine's (queued, running, latencies, ...) at each scrape once the engine holds no
    // request of it. A name configured again is not retired any more. Labels that were never
    // a configured name (tenant "" of auth failures, tenants of forwarded requests) stay.
    void set_tenants(const std::vector<std::string>& configured,
                     const std::function<bool(const std::string&)>& busy);

    // Site identity for the fleet map: edgeserve_site_info{site,region,latitude,longitude} = 1.
    void set_site_info(const std::string& site, const std::string& region, double latitude,
                       double longitude);
    // edgeserve_tls_certificate_expiry_timestamp_seconds{certificate}: the earliest notAfter of
    // a chain being served (leaf or intermediate), Unix seconds. `certificate`: the chain's first
    // SNI name (daemon/certificate_expiry.h).
    void set_certificate_expiry(const std::string& certificate, int64_t not_after_unix_seconds);
    // Drops the expiry series of every certificate not in `keep` (chains a reload took out of
    // the config), so an alert never fires for a file that is no longer served.
    void retain_certificate_expiry(const std::vector<std::string>& keep);
    // edgeserve_certificate_reloads_total{listener,result}: a reload of the certificate files
    // (SIGHUP or the file watch) of `listener` ("public", "peer", "forwarding_client"), result
    // "ok" or "error" (the previous certificates kept): what the alert on a failed renewal
    // (EdgeserveCertificateReloadFailed, deploy/prometheus/alerts.yml) watches.
    void on_certificate_reload(std::string_view listener, bool ok);
    // Starts `listener`'s error series at 0 (the daemon does so for each set it serves), so a
    // first failure, also one soon after a restart, is a rise that increase() sees.
    void declare_certificate_listener(std::string_view listener);
    // A configuration reload (SIGHUP) applied whole (`ok`) or refused or stopped part way (the
    // log says why): edgeserve_config_last_reload_successful is 1 or 0, and a success sets
    // edgeserve_config_last_reload_success_timestamp_seconds to now (Unix seconds). The load at
    // start counts as a success, as Prometheus's own series do; an alert on a refused reload
    // watches the first.
    void on_config_reload(bool ok);
    // edgeserve_gossip_members{state}: members of the fleet as this site's gossip sees them.
    // state: "alive", "suspect", "dead" or "left"; any other value is ignored.
    void set_gossip_members(std::string_view state, int64_t members);
    // edgeserve_gossip_packets_rejected_total{reason}: gossip packets and streams dropped, from
    // the membership's running totals. reason: "auth" (no accepted key opens it: a wrong or
    // missing gossip key) or "decode" (authenticated but malformed); others ignored.
    void set_gossip_rejected(std::string_view reason, uint64_t total);
    // edgeserve_gossip_inbound_streams (gauge) and edgeserve_gossip_inbound_streams_refused_total
    // (from the running total): gossip TCP streams open now, and refused at the cap.
    void set_gossip_inbound_streams(int64_t open, uint64_t refused_total);
    // edgeserve_gossip_refutations_total (from the running total): times this site out-bid a
    // suspicion, a death or a claim of its name from another address.
    void set_gossip_refutations(uint64_t total);
    // edgeserve_route_decisions_total{outcome,site}: where requests were sent. outcome: "local",
    // "forwarded" or "rejected" (others ignored); site: the destination site id ("" for rejected).
    void on_route_decision(std::string_view outcome, const std::string& site);

    // One outlier ejection of a pool at `site`.
    void on_route_ejection(const std::string& site);
    // Estimated round-trip time to `site`, seconds.
    void set_site_rtt(const std::string& site, double seconds);
    // Drops the per-site series (route decisions, ejections, RTT, forwarded requests and their
    // latency) of every site not in `present`: the sites gossip still holds (a left or reclaimed
    // member is gone; a dead one may come back). Without it a departed site's RTT stayed stale
    // forever and label sets grew with member churn. A removed counter is never reset while its
    // site is present; a site seen again starts new series from 0, which Prometheus reads as a
    // counter reset. Site "" (rejected decisions) is not a site and stays.
    void retain_sites(const std::set<std::string>& present);
    // Forwarding to other sites. outcome: "ok" (the peer answered < 500), "error" (5xx or no
    // answer, or cut mid-stream), "cancelled" (the client went away). reason (of the failure
    // before the retry): "connect", "timeout", "reset" (no response head), "status_5xx".
    void on_forwarded(const std::string& site, std::string_view outcome);
    void on_forward_latency(const std::string& site, std::chrono::nanoseconds to_head);
    void on_forward_retry(std::string_view reason);

    // The bounded route label for a request path.
    static std::string_view route_label(std::string_view path);

    // Where serialize() gets the engine's serving figures (Generator::serving_stats). Set once
    // before serving; the source must outlive this object.
    void set_serving_source(std::function<std::vector<engine::ServingStats>()> source);
    // The text exposition of serving figures (the part serialize() appends).
    static std::string render_serving(const std::vector<engine::ServingStats>& stats);

private:
    std::shared_ptr<prometheus::Registry> registry_;
    prometheus::Family<prometheus::Counter>* requests_;
    prometheus::Family<prometheus::Histogram>* durations_;
    prometheus::Family<prometheus::Counter>* handshakes_;
    prometheus::Family<prometheus::Counter>* handshake_failures_;
    prometheus::Family<prometheus::Counter>* rejected_;
    prometheus::Family<prometheus::Counter>* admin_rejected_;
    prometheus::Family<prometheus::Counter>* streams_cancelled_;
    prometheus::Gauge* open_connections_;
    prometheus::Family<prometheus::Counter>* tenant_requests_;
    prometheus::Family<prometheus::Counter>* tenant_tokens_;
    prometheus::Family<prometheus::Counter>* tenant_rejections_;
    prometheus::Family<prometheus::Gauge>* site_info_;
    prometheus::Family<prometheus::Gauge>* certificate_expiry_;
    prometheus::Family<prometheus::Counter>* certificate_reloads_;
    class PeerListener final : public tls::ServerObserver {
    public:
        void on_connection_rejected(std::string_view reason) override;
        void on_handshake(bool resumed, std::string_view failure_reason) override;
        prometheus::Family<prometheus::Counter>* handshake_failures = nullptr;
        prometheus::Family<prometheus::Counter>* rejected = nullptr;
    };
    PeerListener peer_listener_;
    prometheus::Gauge* config_reload_successful_;
    prometheus::Gauge* config_reload_success_time_;
    prometheus::Family<prometheus::Gauge>* gossip_members_;
    prometheus::Family<prometheus::Counter>* gossip_rejected_;
    prometheus::Gauge* gossip_inbound_streams_;
    prometheus::Counter* gossip_inbound_refused_;
    prometheus::Counter* gossip_refutations_;
    prometheus::Family<prometheus::Counter>* route_decisions_;
    prometheus::Family<prometheus::Counter>* route_ejections_;
    prometheus::Family<prometheus::Gauge>* site_rtt_;
    prometheus::Family<prometheus::Counter>* forwarded_;
    prometheus::Family<prometheus::Histogram>* forward_latency_;
    prometheus::Family<prometheus::Counter>* forward_retries_;

    struct RouteStatus {
        prometheus::Counter* count;
        prometheus::Histogram* duration;  // Null for a 408 (on_response).
    };
    std::mutex mu_;
    std::map<std::pair<std::string_view, int>, RouteStatus> by_route_status_;
    // Per tenant label value, the registry series that carry it (what set_tenants() removes);
    // on_tenant_*() record them and count under the same lock, never into a removed one.
    struct TenantSeries {
        std::set<prometheus::Counter*> requests, tokens, rejections;
    };
    // Adds `amount` to the tenant's series with `labels`, created if needed; nothing for a
    // tenant a reload removed whose series set_tenants() dropped (a request it had authenticated
    // just before the reload, refused after it, would bring them back until the next reload).
    void tenant_count(prometheus::Family<prometheus::Counter>& family,
                      std::set<prometheus::Counter*> TenantSeries::*series,
                      const std::string& tenant, std::map<std::string, std::string> labels,
                      double amount);
    mutable std::mutex tenants_mu_;
    std::map<std::string, TenantSeries> tenant_series_;  // Guarded by tenants_mu_.
    std::set<std::string> configured_tenants_;           // Guarded by tenants_mu_.
    std::set<std::string> retired_tenants_;              // Guarded by tenants_mu_.
    std::mutex certificates_mu_;
    std::vector<std::string> certificate_labels_;  // Guarded by certificates_mu_.
    // Per site label value, the registry series that carry it (what retain_sites() removes);
    // the per-site writers record them and count under the same lock, never into a removed one.
    struct SiteSeries {
        std::set<prometheus::Counter*> decisions, forwarded;
        prometheus::Counter* ejections = nullptr;
        prometheus::Gauge* rtt = nullptr;
        prometheus::Histogram* forward_latency = nullptr;
    };
    std::mutex sites_mu_;
    std::map<std::string, SiteSeries> site_series_;  // Guarded by sites_mu_.
    mutable std::mutex source_mu_;
    std::function<std::vector<engine::ServingStats>()> serving_source_;
    prometheus::Counter* handshakes_full_;
    prometheus::Counter* handshakes_resumed_;
};

}  // namespace edge::daemon
