#include "daemon/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <sstream>

namespace edge::daemon {

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
    requests_ = &prometheus::BuildCounter()
                     .Name("edgeserve_http_requests_total")
                     .Help("HTTP requests answered on the public listener, by route and status.")
                     .Register(*registry_);
    durations_ = &prometheus::BuildHistogram()
                      .Name("edgeserve_http_request_duration_seconds")
                      .Help("Time from the end of the request headers to the last response byte.")
                      .Register(*registry_);
    handshakes_ = &prometheus::BuildCounter()
                       .Name("edgeserve_tls_handshakes_total")
                       .Help("Completed TLS handshakes, by whether the session was resumed.")
                       .Register(*registry_);
    handshake_failures_ = &prometheus::BuildCounter()
                               .Name("edgeserve_tls_handshake_failures_total")
                               .Help("Failed TLS handshakes, by reason.")
                               .Register(*registry_);
    rejected_ = &prometheus::BuildCounter()
                     .Name("edgeserve_connections_rejected_total")
                     .Help("Connections closed before TLS, by reason.")
                     .Register(*registry_);
    open_connections_ = &prometheus::BuildGauge()
                             .Name("edgeserve_open_connections")
                             .Help("Open connections on the public listener.")
                             .Register(*registry_)
                             .Add({});
    tenant_requests_ = &prometheus::BuildCounter()
                            .Name("edgeserve_tenant_requests_total")
                            .Help("Completion requests by tenant and outcome.")
                            .Register(*registry_);
    tenant_tokens_ = &prometheus::BuildCounter()
                          .Name("edgeserve_tenant_tokens_total")
                          .Help("Tokens by tenant and kind (prompt, completion).")
                          .Register(*registry_);
    tenant_rejections_ = &prometheus::BuildCounter()
                              .Name("edgeserve_tenant_rejections_total")
                              .Help("Requests refused by tenant policy, by tenant and reason.")
                              .Register(*registry_);
    forwarded_ = &prometheus::BuildCounter()
                      .Name("edgeserve_forwarded_requests_total")
                      .Help("Requests forwarded to another site, by destination site and outcome.")
                      .Register(*registry_);
    forward_latency_ = &prometheus::BuildHistogram()
                            .Name("edgeserve_forward_latency_seconds")
                            .Help("Forwarded requests: time to the peer's response head, by site.")
                            .Register(*registry_);
    forward_retries_ = &prometheus::BuildCounter()
                            .Name("edgeserve_forward_retries_total")
                            .Help("Forwarded requests retried on the next target, by reason.")
                            .Register(*registry_);
    prometheus::BuildGauge()
        .Name("edgeserve_build_info")
        .Help("Build information; the value is always 1.")
        .Register(*registry_)
        .Add({{"version", EDGE_VERSION}})
        .Set(1);
    handshakes_full_ = &handshakes_->Add({{"resumed", "false"}});
    handshakes_resumed_ = &handshakes_->Add({{"resumed", "true"}});
    // Routing between sites (daemon/cluster).
    route_decisions_ = &prometheus::BuildCounter()
                            .Name("edgeserve_route_decisions_total")
                            .Help("Routing decisions by outcome (local, forwarded, rejected) and "
                                  "the site chosen (empty when rejected).")
                            .Register(*registry_);
    route_ejections_ = &prometheus::BuildCounter()
                            .Name("edgeserve_route_ejections_total")
                            .Help("Outlier ejections of a site's pool, by site.")
                            .Register(*registry_);
    site_rtt_ = &prometheus::BuildGauge()
                     .Name("edgeserve_site_rtt_seconds")
                     .Help("Estimated round-trip time to each site (Vivaldi, or the "
                           "great-circle prior before coordinates converge).")
                     .Register(*registry_);
    gossip_members_ = &prometheus::BuildGauge()
                           .Name("edgeserve_gossip_members")
                           .Help("Gossip members by state as this site sees them (itself "
                                 "included).")
                           .Register(*registry_);
}

Metrics::~Metrics() = default;

std::string Metrics::serialize() const {
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, registry_->Collect());
    return out.str();
}

void Metrics::on_tenant_request(const std::string& tenant, std::string_view outcome) {
    tenant_requests_->Add({{"tenant", tenant}, {"outcome", std::string(outcome)}}).Increment();
}

void Metrics::on_tenant_tokens(const std::string& tenant, int64_t prompt, int64_t completion) {
    tenant_tokens_->Add({{"tenant", tenant}, {"kind", "prompt"}})
        .Increment(static_cast<double>(std::max<int64_t>(prompt, 0)));
    tenant_tokens_->Add({{"tenant", tenant}, {"kind", "completion"}})
        .Increment(static_cast<double>(std::max<int64_t>(completion, 0)));
}

void Metrics::on_tenant_rejected(const std::string& tenant, std::string_view reason) {
    tenant_rejections_->Add({{"tenant", tenant}, {"reason", std::string(reason)}}).Increment();
}

void Metrics::on_forwarded(const std::string& site, std::string_view outcome) {
    forwarded_->Add({{"site", site}, {"outcome", std::string(outcome)}}).Increment();
}

void Metrics::on_forward_latency(const std::string& site, std::chrono::nanoseconds to_head) {
    static const prometheus::Histogram::BucketBoundaries kBuckets{
        0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    forward_latency_->Add({{"site", site}}, kBuckets)
        .Observe(std::chrono::duration<double>(to_head).count());
}

void Metrics::on_forward_retry(std::string_view reason) {
    forward_retries_->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::on_connection_opened() { open_connections_->Increment(); }
void Metrics::on_connection_closed() { open_connections_->Decrement(); }

void Metrics::on_connection_rejected(std::string_view reason) {
    rejected_->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::on_handshake(bool resumed, std::string_view failure_reason) {
    if (failure_reason.empty()) {
        (resumed ? handshakes_resumed_ : handshakes_full_)->Increment();
        return;
    }
    handshake_failures_->Add({{"reason", std::string(failure_reason)}}).Increment();
}

std::string_view Metrics::route_label(std::string_view path) {
    for (std::string_view route : {"/v1/models", "/v1/chat/completions", "/v1/completions"}) {
        if (path == route) {
            return route;
        }
    }
    return "other";
}

void Metrics::on_response(std::string_view method, std::string_view path, int status,
                          std::chrono::nanoseconds duration) {
    std::string_view route = route_label(path);
    RouteStatus entry;
    {
        std::lock_guard lock(mu_);
        auto it = by_route_status_.find({route, status});
        if (it == by_route_status_.end()) {
            std::map<std::string, std::string> labels{{"route", std::string(route)},
                                                      {"status", std::to_string(status)}};
            static const prometheus::Histogram::BucketBoundaries kBuckets{
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                0.5,    1,     2.5,    5,     10,   30,    60,   120};
            RouteStatus created{&requests_->Add(labels), &durations_->Add(labels, kBuckets)};
            it = by_route_status_.emplace(std::make_pair(route, status), created).first;
        }
        entry = it->second;
    }
    entry.count->Increment();
    entry.duration->Observe(std::chrono::duration<double>(duration).count());
}

void Metrics::on_route_decision(std::string_view outcome, const std::string& site) {
    route_decisions_->Add({{"outcome", std::string(outcome)}, {"site", site}}).Increment();
}

void Metrics::on_route_ejection(const std::string& site) {
    route_ejections_->Add({{"site", site}}).Increment();
}

void Metrics::set_site_rtt(const std::string& site, double seconds) {
    site_rtt_->Add({{"site", site}}).Set(seconds);
}

void Metrics::set_gossip_members(std::string_view state, int64_t n) {
    gossip_members_->Add({{"state", std::string(state)}}).Set(static_cast<double>(n));
}

}  // namespace edge::daemon
