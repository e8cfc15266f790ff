#include "daemon/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <chrono>
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
                      .Help(
                          "Time from the request's last byte read to the last response byte; "
                          "for an answer the server makes itself (400, 413, 414, 431, 501, 505), "
                          "from the start of the request's read. A 408 is not observed here "
                          "(edgeserve_http_requests_total counts it).")
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
    admin_rejected_ = &prometheus::BuildCounter()
                           .Name("edgeserve_admin_connections_rejected_total")
                           .Help("Connections to the admin listener closed at accept, by reason.")
                           .Register(*registry_);
    streams_cancelled_ = &prometheus::BuildCounter()
                              .Name("edgeserve_http_streams_cancelled_total")
                              .Help("Streamed responses cut by the server, by reason.")
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
                               .Help(
                                   "Earliest notAfter among the certificates each served chain "
                                   "sends (leaf or intermediate; peer-ca: the cluster CA file's "
                                   "CAs), Unix time.")
                               .Register(*registry_);
    certificate_reloads_ = &prometheus::BuildCounter()
                                .Name("edgeserve_certificate_reloads_total")
                                .Help(
                                    "Reloads of certificate files by listener and result (ok, "
                                    "error: the previous certificates kept).")
                                .Register(*registry_);
    gossip_members_ = &prometheus::BuildGauge()
                           .Name("edgeserve_gossip_members")
                           .Help("Fleet members as this site's gossip sees them, by state.")
                           .Register(*registry_);
    for (const char* state : {"alive", "suspect", "dead", "left"}) {
        gossip_members_->Add({{"state", state}}).Set(0);
    }
    gossip_rejected_ = &prometheus::BuildCounter()
                            .Name("edgeserve_gossip_packets_rejected_total")
                            .Help(
                                "Gossip packets and streams dropped, by reason (auth, decode; "
                                "implausible: messages with an incarnation far past the "
                                "member's, or a Lamport time far past this site's clock; "
                                "members_full: alive messages naming a new member past "
                                "gossip.max_members).")
                            .Register(*registry_);
    for (const char* reason : {"auth", "decode", "implausible", "members_full"}) {
        gossip_rejected_->Add({{"reason", reason}});
    }
    gossip_inbound_streams_ = &prometheus::BuildGauge()
                                   .Name("edgeserve_gossip_inbound_streams")
                                   .Help("Inbound gossip TCP streams open now.")
                                   .Register(*registry_)
                                   .Add({});
    gossip_inbound_refused_ = &prometheus::BuildCounter()
                                   .Name("edgeserve_gossip_inbound_streams_refused_total")
                                   .Help("Inbound gossip TCP streams refused at the cap.")
                                   .Register(*registry_)
                                   .Add({});
    gossip_refutations_ = &prometheus::BuildCounter()
                               .Name("edgeserve_gossip_refutations_total")
                               .Help("Suspicions, deaths and name claims this site refuted.")
                               .Register(*registry_)
                               .Add({});
    route_decisions_ = &prometheus::BuildCounter()
                            .Name("edgeserve_route_decisions_total")
                            .Help("Routing decisions, by outcome and destination site.")
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
    peer_listener_.handshake_failures =
        &prometheus::BuildCounter()
             .Name("edgeserve_peer_tls_handshake_failures_total")
             .Help("Failed TLS handshakes on the peer listener (other sites), by reason.")
             .Register(*registry_);
    peer_listener_.rejected =
        &prometheus::BuildCounter()
             .Name("edgeserve_peer_connections_rejected_total")
             .Help("Connections closed before TLS on the peer listener, by reason.")
             .Register(*registry_);
    config_reload_successful_ =
        &prometheus::BuildGauge()
             .Name("edgeserve_config_last_reload_successful")
             .Help("Whether the last configuration reload (SIGHUP) applied (1) or not (0).")
             .Register(*registry_)
             .Add({});
    config_reload_success_time_ =
        &prometheus::BuildGauge()
             .Name("edgeserve_config_last_reload_success_timestamp_seconds")
             .Help("When the configuration last loaded whole (the start, or a reload), Unix time.")
             .Register(*registry_)
             .Add({});
    on_config_reload(true);  // The configuration the daemon starts with.
    handshakes_full_ = &handshakes_->Add({{"resumed", "false"}});
    handshakes_resumed_ = &handshakes_->Add({{"resumed", "true"}});
    // Routing between sites (daemon/cluster).
    route_ejections_ = &prometheus::BuildCounter()
                            .Name("edgeserve_route_ejections_total")
                            .Help("Outlier ejections of a site's pool, by site.")
                            .Register(*registry_);
    site_rtt_ = &prometheus::BuildGauge()
                     .Name("edgeserve_site_rtt_seconds")
                     .Help("Estimated round-trip time to each site (Vivaldi, or the "
                           "great-circle prior before coordinates converge).")
                     .Register(*registry_);
}

Metrics::~Metrics() = default;

std::string Metrics::serialize() const {
    std::ostringstream out;
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    std::function<std::vector<engine::ServingStats>()> source;
    {
        std::lock_guard<std::mutex> lock(source_mu_);
        source = serving_source_;
    }
    prometheus::TextSerializer().Serialize(out, families);
    if (source) {
        std::vector<engine::ServingStats> stats = source();
        {
            // A retired tenant's engine series go once the engine holds none of its requests.
            std::lock_guard lock(tenants_mu_);
            for (engine::ServingStats& m : stats) {
                std::erase_if(m.tenants, [this](const auto& entry) {
                    return entry.second.queued == 0 && entry.second.running == 0 &&
                           retired_tenants_.contains(entry.first);
                });
            }
        }
        out << render_serving(stats);
    }
    return out.str();
}

void Metrics::set_serving_source(std::function<std::vector<engine::ServingStats>()> source) {
    std::lock_guard<std::mutex> lock(source_mu_);
    serving_source_ = std::move(source);
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

void Metrics::on_certificate_reload(std::string_view listener, bool ok) {
    certificate_reloads_
        ->Add({{"listener", std::string(listener)}, {"result", ok ? "ok" : "error"}})
        .Increment();
}

void Metrics::declare_certificate_listener(std::string_view listener) {
    certificate_reloads_->Add({{"listener", std::string(listener)}, {"result", "error"}});
}

void Metrics::on_config_reload(bool ok) {
    config_reload_successful_->Set(ok ? 1 : 0);
    if (ok) {
        config_reload_success_time_->Set(
            std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count());
    }
}

void Metrics::set_certificate_expiry(const std::string& certificate,
                                     int64_t not_after_unix_seconds) {
    std::lock_guard lock(certificates_mu_);
    certificate_expiry_->Add({{"certificate", certificate}})
        .Set(static_cast<double>(not_after_unix_seconds));
    if (std::find(certificate_labels_.begin(), certificate_labels_.end(), certificate) ==
        certificate_labels_.end()) {
        certificate_labels_.push_back(certificate);
    }
}

void Metrics::retain_certificate_expiry(const std::vector<std::string>& keep) {
    std::lock_guard lock(certificates_mu_);
    std::vector<std::string> kept;
    for (const std::string& label : certificate_labels_) {
        if (std::find(keep.begin(), keep.end(), label) != keep.end()) {
            kept.push_back(label);
        } else {
            certificate_expiry_->Remove(&certificate_expiry_->Add({{"certificate", label}}));
        }
    }
    certificate_labels_ = std::move(kept);
}

void Metrics::on_connection_opened() { open_connections_->Increment(); }
void Metrics::on_connection_closed() { open_connections_->Decrement(); }

void Metrics::on_connection_rejected(std::string_view reason) {
    rejected_->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::on_admin_connection_rejected(std::string_view reason) {
    admin_rejected_->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::on_stream_cancelled(std::string_view reason) {
    streams_cancelled_->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::on_handshake(bool resumed, std::string_view failure_reason) {
    if (failure_reason.empty()) {
        (resumed ? handshakes_resumed_ : handshakes_full_)->Increment();
        return;
    }
    handshake_failures_->Add({{"reason", std::string(failure_reason)}}).Increment();
}

void Metrics::PeerListener::on_connection_rejected(std::string_view reason) {
    rejected->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::PeerListener::on_handshake(bool /*resumed*/, std::string_view failure_reason) {
    if (!failure_reason.empty()) {
        handshake_failures->Add({{"reason", std::string(failure_reason)}}).Increment();
    }
}

std::string_view Metrics::route_label(std::string_view path) {
    for (std::string_view route : {"/v1/models", "/v1/chat/completions", "/v1/completions"}) {
        if (path == route) {
            return route;
        }
    }
    if (path.starts_with("/v1/models/") && path.size() > 11) {
        return "/v1/models/{model}";  // One series for every model id.
    }
    return "other";
}

void Metrics::on_response(const tls::ResponseRecord& record) {
    const int status = record.status;
    std::string_view route = route_label(record.path);
    RouteStatus entry;
    {
        std::lock_guard lock(mu_);
        auto it = by_route_status_.find({route, status});
        if (it == by_route_status_.end()) {
            std::map<std::string, std::string> labels{{"route", std::string(route)},
                                                      {"status", std::to_string(status)}};
            // To the last byte of a reply, which may take minutes (the engine's histograms
            // reach 600 s too): a quantile past the top bound reads as that bound.
            static const prometheus::Histogram::BucketBoundaries kBuckets{
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1,      2.5,   5,      10,    30,   60,    120,  300, 600};
            // A 408's duration is the timeout (header, body or request read) the server waited
            // for a client that stopped sending, not time spent answering: observed, it would
            // pull every latency quantile summed over statuses (the dashboard's p50/p99) towards
            // the timeout for a client's stall. It is counted by status; the access log keeps
            // the wait.
            RouteStatus created{&requests_->Add(labels),
                                status == 408 ? nullptr : &durations_->Add(labels, kBuckets)};
            it = by_route_status_.emplace(std::make_pair(route, status), created).first;
        }
        entry = it->second;
    }
    entry.count->Increment();
    if (entry.duration != nullptr) {
        entry.duration->Observe(std::chrono::duration<double>(record.duration).count());
    }
}

}  // namespace edge::daemon
