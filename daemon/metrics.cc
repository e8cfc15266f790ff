#include "daemon/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cstdio>
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
    site_info_ = &prometheus::BuildGauge()
                      .Name("edgeserve_site_info")
                      .Help("This site's identity and location; the value is always 1.")
                      .Register(*registry_);
    certificate_expiry_ = &prometheus::BuildGauge()
                               .Name("edgeserve_tls_certificate_expiry_timestamp_seconds")
                               .Help("notAfter of each served certificate chain's leaf, Unix time.")
                               .Register(*registry_);
    gossip_members_ = &prometheus::BuildGauge()
                           .Name("edgeserve_gossip_members")
                           .Help("Fleet members as this site's gossip sees them, by state.")
                           .Register(*registry_);
    for (const char* state : {"alive", "suspect", "dead", "left"}) {
        gossip_members_->Add({{"state", state}}).Set(0);
    }
    route_decisions_ = &prometheus::BuildCounter()
                            .Name("edgeserve_route_decisions_total")
                            .Help("Routing decisions, by outcome and destination site.")
                            .Register(*registry_);
    time_to_first_token_ = &prometheus::BuildHistogram()
                                .Name("edgeserve_time_to_first_token_seconds")
                                .Help("Time from admission to the first generated token, by model.")
                                .Register(*registry_);
    kv_cache_usage_ = &prometheus::BuildGauge()
                           .Name("edgeserve_kv_cache_usage_ratio")
                           .Help("Used KV-cache blocks over all blocks, by model.")
                           .Register(*registry_);
    batch_sequences_ = &prometheus::BuildGauge()
                            .Name("edgeserve_engine_batch_sequences")
                            .Help("Sequences in the engine's running batch, by model.")
                            .Register(*registry_);
    queued_requests_ = &prometheus::BuildGauge()
                            .Name("edgeserve_engine_queued_requests")
                            .Help("Requests waiting for a batch slot, by model.")
                            .Register(*registry_);
    expert_tokens_ = &prometheus::BuildCounter()
                          .Name("edgeserve_expert_tokens_total")
                          .Help("Tokens routed to each MoE expert (summed over layers), by model.")
                          .Register(*registry_);
    prometheus::BuildGauge()
        .Name("edgeserve_build_info")
        .Help("Build information; the value is always 1.")
        .Register(*registry_)
        .Add({{"version", EDGE_VERSION}})
        .Set(1);
    handshakes_full_ = &handshakes_->Add({{"resumed", "false"}});
    handshakes_resumed_ = &handshakes_->Add({{"resumed", "true"}});
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

namespace {

// A coordinate as a label value: fixed precision, so the series never changes between restarts.
std::string degrees_label(double degrees) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.4f", degrees);
    return buf;
}

}  // namespace

void Metrics::set_site_info(const std::string& site, const std::string& region, double latitude,
                            double longitude) {
    site_info_->Add({{"site", site},
                     {"region", region},
                     {"latitude", degrees_label(latitude)},
                     {"longitude", degrees_label(longitude)}})
        .Set(1);
}

void Metrics::set_certificate_expiry(const std::string& certificate,
                                     int64_t not_after_unix_seconds) {
    certificate_expiry_->Add({{"certificate", certificate}})
        .Set(static_cast<double>(not_after_unix_seconds));
}

void Metrics::set_gossip_members(std::string_view state, int64_t members) {
    if (state != "alive" && state != "suspect" && state != "dead" && state != "left") {
        return;
    }
    gossip_members_->Add({{"state", std::string(state)}})
        .Set(static_cast<double>(std::max<int64_t>(members, 0)));
}

void Metrics::on_route_decision(std::string_view outcome, const std::string& site) {
    if (outcome != "local" && outcome != "forwarded" && outcome != "rejected") {
        return;
    }
    route_decisions_->Add({{"outcome", std::string(outcome)}, {"site", site}}).Increment();
}

void Metrics::on_time_to_first_token(const std::string& model, double seconds) {
    static const prometheus::Histogram::BucketBoundaries kBuckets{
        0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30};
    time_to_first_token_->Add({{"model", model}}, kBuckets).Observe(std::max(seconds, 0.0));
}

void Metrics::set_kv_cache_usage(const std::string& model, double ratio) {
    kv_cache_usage_->Add({{"model", model}}).Set(std::clamp(ratio, 0.0, 1.0));
}

void Metrics::set_batch_sequences(const std::string& model, int64_t sequences) {
    batch_sequences_->Add({{"model", model}}).Set(static_cast<double>(sequences));
}

void Metrics::set_queued_requests(const std::string& model, int64_t requests) {
    queued_requests_->Add({{"model", model}}).Set(static_cast<double>(requests));
}

void Metrics::on_expert_tokens(const std::string& model, int expert, int64_t tokens) {
    if (expert < 0 || tokens <= 0) {
        return;
    }
    expert_tokens_->Add({{"model", model}, {"expert", std::to_string(expert)}})
        .Increment(static_cast<double>(tokens));
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

}  // namespace edge::daemon
