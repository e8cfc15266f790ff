#pragma once

// Metrics owns the prometheus-cpp registry of the daemon and is the public server's observer:
// edgeserve_http_requests_total{route,status}, edgeserve_http_request_duration_seconds{route,
// status}, edgeserve_tls_handshakes_total{resumed}, edgeserve_tls_handshake_failures_total{reason},
// edgeserve_open_connections, edgeserve_connections_rejected_total{reason},
// edgeserve_build_info{version}, and per tenant (label: the tenant's configured name, never a key):
// edgeserve_tenant_requests_total{tenant,outcome}, edgeserve_tenant_tokens_total{tenant,kind},
// edgeserve_tenant_rejections_total{tenant,reason}; routing between sites:
// edgeserve_route_decisions_total{outcome,site}, edgeserve_route_ejections_total{site},
// edgeserve_site_rtt_seconds{site}, edgeserve_gossip_members{state}; forwarding between sites
// (label: a configured site id): edgeserve_forwarded_requests_total{site,outcome},
// edgeserve_forward_latency_seconds{site} (time to the peer's response head),
// edgeserve_forward_retries_total{reason}. Thread-safe (prometheus-cpp metrics are atomic; the
// label cache has a mutex). serialize() renders the text exposition format for GET /metrics.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

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
    void on_response(std::string_view method, std::string_view path, int status,
                     std::chrono::nanoseconds duration) override;

    // Per-tenant figures; `tenant` is a configured name (bounded by the config).
    // outcome: "ok", "error", "cancelled", "rejected".
    void on_tenant_request(const std::string& tenant, std::string_view outcome);
    void on_tenant_tokens(const std::string& tenant, int64_t prompt, int64_t completion);
    // reason: "unknown_key", "model_not_allowed", "max_output_tokens", or a rate limit's key.
    void on_tenant_rejected(const std::string& tenant, std::string_view reason);

    // Routing between sites. outcome: "local", "forwarded", "rejected"; `site` is the chosen
    // site's id ("" when rejected). Sites are bounded by the cluster's size.
    void on_route_decision(std::string_view outcome, const std::string& site);
    // One outlier ejection of a pool at `site`.
    void on_route_ejection(const std::string& site);
    // Estimated round-trip time to `site`, seconds.
    void set_site_rtt(const std::string& site, double seconds);
    // edgeserve_gossip_members{state}: members in `state` ("alive", "suspect", "dead", "left").
    void set_gossip_members(std::string_view state, int64_t n);
    // Forwarding to other sites. outcome: "ok" (the peer answered < 500), "error" (5xx or no
    // answer, or cut mid-stream), "cancelled" (the client went away). reason (of the failure
    // before the retry): "connect", "timeout", "reset" (no response head), "status_5xx".
    void on_forwarded(const std::string& site, std::string_view outcome);
    void on_forward_latency(const std::string& site, std::chrono::nanoseconds to_head);
    void on_forward_retry(std::string_view reason);

    // The bounded route label for a request path.
    static std::string_view route_label(std::string_view path);

private:
    std::shared_ptr<prometheus::Registry> registry_;
    prometheus::Family<prometheus::Counter>* requests_;
    prometheus::Family<prometheus::Histogram>* durations_;
    prometheus::Family<prometheus::Counter>* handshakes_;
    prometheus::Family<prometheus::Counter>* handshake_failures_;
    prometheus::Family<prometheus::Counter>* rejected_;
    prometheus::Gauge* open_connections_;
    prometheus::Family<prometheus::Counter>* tenant_requests_;
    prometheus::Family<prometheus::Counter>* tenant_tokens_;
    prometheus::Family<prometheus::Counter>* tenant_rejections_;
    prometheus::Family<prometheus::Counter>* route_decisions_;
    prometheus::Family<prometheus::Counter>* route_ejections_;
    prometheus::Family<prometheus::Gauge>* site_rtt_;
    prometheus::Family<prometheus::Gauge>* gossip_members_;
    prometheus::Family<prometheus::Counter>* forwarded_;
    prometheus::Family<prometheus::Histogram>* forward_latency_;
    prometheus::Family<prometheus::Counter>* forward_retries_;

    struct RouteStatus {
        prometheus::Counter* count;
        prometheus::Histogram* duration;
    };
    std::mutex mu_;
    std::map<std::pair<std::string_view, int>, RouteStatus> by_route_status_;
    prometheus::Counter* handshakes_full_;
    prometheus::Counter* handshakes_resumed_;
};

}  // namespace edge::daemon
