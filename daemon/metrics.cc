#include "daemon/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <charconv>
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
                                "member's; members_full: alive messages naming a new member "
                                "past gossip.max_members).")
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

// A label value in the text format: backslash, double quote and newline escaped.
std::string escape_label(const std::string& v) {
    std::string out;
    for (char c : v) {
        if (c == '\\' || c == '"') {
            out += '\\';
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out += c;
        }
    }
    return out;
}

std::string labels(const std::vector<std::pair<std::string, std::string>>& kv) {
    std::string out = "{";
    for (size_t i = 0; i < kv.size(); ++i) {
        out += (i ? "," : "") + kv[i].first + "=\"" + escape_label(kv[i].second) + "\"";
    }
    return out + "}";
}

// Shortest text that reads back as the same double ("0.025", not "0.025000000000000001").
std::string number(double v) {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
    return ec == std::errc() ? std::string(buf, end) : std::string("NaN");
}

void header(std::ostringstream& out, const char* name, const char* type, const char* help) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

using TenantValue = std::function<double(const engine::TenantServingStats&)>;

void per_tenant(std::ostringstream& out, const std::vector<engine::ServingStats>& stats,
                const char* name, const char* type, const char* help, const TenantValue& value) {
    header(out, name, type, help);
    for (const engine::ServingStats& m : stats) {
        for (const auto& [tenant, t] : m.tenants) {
            out << name << labels({{"model", m.model}, {"tenant", tenant}}) << " "
                << number(value(t)) << "\n";
        }
    }
}

using HistogramOf = std::function<const engine::LatencyHistogram&(const engine::TenantServingStats&)>;

void histogram(std::ostringstream& out, const std::vector<engine::ServingStats>& stats,
               const char* name, const char* help, const HistogramOf& of) {
    header(out, name, "histogram", help);
    const auto& bounds = engine::LatencyHistogram::kBounds;
    for (const engine::ServingStats& m : stats) {
        for (const auto& [tenant, t] : m.tenants) {
            const engine::LatencyHistogram& h = of(t);
            uint64_t cumulative = 0;
            for (size_t i = 0; i <= bounds.size(); ++i) {
                cumulative += h.bucket(i);
                out << name << "_bucket"
                    << labels({{"model", m.model},
                               {"tenant", tenant},
                               {"le", i < bounds.size() ? number(bounds[i]) : "+Inf"}})
                    << " " << cumulative << "\n";
            }
            const std::string l = labels({{"model", m.model}, {"tenant", tenant}});
            out << name << "_sum" << l << " " << number(h.sum()) << "\n";
            out << name << "_count" << l << " " << h.count() << "\n";
        }
    }
}

}  // namespace

std::string Metrics::render_serving(const std::vector<engine::ServingStats>& stats) {
    using T = engine::TenantServingStats;
    std::ostringstream out;
    per_tenant(out, stats, "edgeserve_tenant_queued_requests", "gauge",
               "Requests waiting for admission to the running batch.",
               [](const T& t) { return static_cast<double>(t.queued); });
    per_tenant(out, stats, "edgeserve_tenant_running_requests", "gauge",
               "Requests in the running batch.",
               [](const T& t) { return static_cast<double>(t.running); });
    per_tenant(out, stats, "edgeserve_generated_tokens_total", "counter",
               "Tokens generated, counted as they stream.",
               [](const T& t) { return static_cast<double>(t.generated_tokens); });
    per_tenant(out, stats, "edgeserve_prompt_tokens_total", "counter",
               "Prompt tokens of finished requests.",
               [](const T& t) { return static_cast<double>(t.prompt_tokens); });
    per_tenant(out, stats, "edgeserve_prefix_cache_queries_total", "counter",
               "Prompt tokens looked up in the prefix cache.",
               [](const T& t) { return static_cast<double>(t.prefix_query_tokens); });
    per_tenant(out, stats, "edgeserve_prefix_cache_hits_total", "counter",
               "Prompt tokens served from the prefix cache.",
               [](const T& t) { return static_cast<double>(t.prefix_hit_tokens); });
    header(out, "edgeserve_preemptions_total", "counter",
           "Sequences preempted (their KV saved or recomputed later): kv_cache for lack of "
           "KV-cache blocks, fair_share to give a tenant below its weighted share of the batch "
           "its place.");
    for (const engine::ServingStats& m : stats) {
        for (const auto& [tenant, t] : m.tenants) {
            for (const auto& [reason, count] :
                 {std::pair<const char*, int64_t>{"kv_cache", t.preemptions - t.fair_preemptions},
                  {"fair_share", t.fair_preemptions}}) {
                out << "edgeserve_preemptions_total"
                    << labels({{"model", m.model}, {"tenant", tenant}, {"reason", reason}}) << " "
                    << count << "\n";
            }
        }
    }

    header(out, "edgeserve_admission_rejections_total", "counter",
           "Requests refused at admission: the tenant's queue full (429), the model's queue full "
           "(503) or the estimated queue wait past engine.max_queue_wait_ms (503).");
    for (const engine::ServingStats& m : stats) {
        for (const auto& [tenant, t] : m.tenants) {
            for (const auto& [reason, count] :
                 {std::pair<const char*, int64_t>{"tenant_queue_full", t.rejected_queue_full},
                  {"model_queue_full", t.rejected_model_queue_full},
                  {"queue_wait", t.rejected_queue_wait}}) {
                out << "edgeserve_admission_rejections_total"
                    << labels({{"model", m.model}, {"tenant", tenant}, {"reason", reason}}) << " "
                    << count << "\n";
            }
        }
    }
    header(out, "edgeserve_kv_cache_usage_ratio", "gauge",
           "KV-cache blocks referenced by running sequences over all blocks.");
    for (const engine::ServingStats& m : stats) {
        out << "edgeserve_kv_cache_usage_ratio" << labels({{"model", m.model}}) << " "
            << number(m.kv_use) << "\n";
    }
    header(out, "edgeserve_kv_cache_blocks", "gauge",
           "KV-cache blocks by state: used (referenced), cached (prefix cache), free; the states "
           "sum to the blocks the budget holds.");
    for (const engine::ServingStats& m : stats) {
        const int64_t free_blocks =
            std::max<int64_t>(0, m.kv_blocks_total - m.kv_blocks_used - m.kv_blocks_cached);
        for (const auto& [state, blocks] :
             {std::pair<const char*, int64_t>{"used", m.kv_blocks_used},
              {"cached", m.kv_blocks_cached},
              {"free", free_blocks}}) {
            out << "edgeserve_kv_cache_blocks" << labels({{"model", m.model}, {"state", state}})
                << " " << blocks << "\n";
        }
    }
    header(out, "edgeserve_kv_cache_budget_bytes", "gauge", "Configured KV-cache memory budget.");
    for (const engine::ServingStats& m : stats) {
        out << "edgeserve_kv_cache_budget_bytes" << labels({{"model", m.model}}) << " "
            << m.kv_budget_bytes << "\n";
    }
    header(out, "edgeserve_kv_swap_bytes", "gauge",
           "Host memory holding the KV cache of preempted sequences until they run again "
           "(engine.kv_swap_bytes).");
    for (const engine::ServingStats& m : stats) {
        out << "edgeserve_kv_swap_bytes" << labels({{"model", m.model}}) << " " << m.kv_swap_bytes
            << "\n";
    }
    header(out, "edgeserve_preempted_tokens_recomputed_total", "counter",
           "Positions of preempted sequences computed again because they were dropped without a "
           "saved copy (past engine.kv_swap_bytes, or a KV cache on a GPU); those the prefix "
           "cache still held are reused, not counted.");
    for (const engine::ServingStats& m : stats) {
        out << "edgeserve_preempted_tokens_recomputed_total" << labels({{"model", m.model}}) << " "
            << m.preempt_recompute_tokens << "\n";
    }
    header(out, "edgeserve_engine_batch_sequences", "gauge",
           "Sequences in the engine's running batch.");
    for (const engine::ServingStats& m : stats) {
        out << "edgeserve_engine_batch_sequences" << labels({{"model", m.model}}) << " "
            << m.batch_sequences << "\n";
    }
    header(out, "edgeserve_engine_queued_requests", "gauge",
           "Requests waiting for admission to the running batch (all tenants).");
    for (const engine::ServingStats& m : stats) {
        out << "edgeserve_engine_queued_requests" << labels({{"model", m.model}}) << " "
            << m.queued << "\n";
    }
    header(out, "edgeserve_expert_tokens_total", "counter",
           "Tokens routed to each MoE expert since load, summed over layers.");
    for (const engine::ServingStats& m : stats) {
        for (size_t e = 0; e < m.expert_tokens.size(); ++e) {
            out << "edgeserve_expert_tokens_total"
                << labels({{"model", m.model}, {"expert", std::to_string(e)}}) << " "
                << m.expert_tokens[e] << "\n";
        }
    }
    histogram(out, stats, "edgeserve_queue_time_seconds",
              "Time from submission to first admission to the running batch.",
              [](const T& t) -> const engine::LatencyHistogram& { return t.queue_time; });
    histogram(out, stats, "edgeserve_time_to_first_token_seconds",
              "Time from submission to the first generated token.",
              [](const T& t) -> const engine::LatencyHistogram& { return t.ttft; });
    histogram(out, stats, "edgeserve_inter_token_latency_seconds",
              "Time between consecutive generated tokens of a request.",
              [](const T& t) -> const engine::LatencyHistogram& { return t.inter_token; });
    histogram(out, stats, "edgeserve_end_to_end_latency_seconds",
              "Time from submission to the end of a request.",
              [](const T& t) -> const engine::LatencyHistogram& { return t.end_to_end; });
    return out.str();
}

prometheus::Counter& Metrics::tenant_counter(prometheus::Family<prometheus::Counter>& family,
                                             std::set<prometheus::Counter*> TenantSeries::*series,
                                             const std::string& tenant,
                                             std::map<std::string, std::string> labels) {
    labels.emplace("tenant", tenant);
    prometheus::Counter& counter = family.Add(labels);
    (tenant_series_[tenant].*series).insert(&counter);
    return counter;
}

void Metrics::on_tenant_request(const std::string& tenant, std::string_view outcome) {
    std::lock_guard lock(tenants_mu_);
    tenant_counter(*tenant_requests_, &TenantSeries::requests, tenant,
                   {{"outcome", std::string(outcome)}})
        .Increment();
}

void Metrics::on_tenant_tokens(const std::string& tenant, int64_t prompt, int64_t completion) {
    std::lock_guard lock(tenants_mu_);
    tenant_counter(*tenant_tokens_, &TenantSeries::tokens, tenant, {{"kind", "prompt"}})
        .Increment(static_cast<double>(std::max<int64_t>(prompt, 0)));
    tenant_counter(*tenant_tokens_, &TenantSeries::tokens, tenant, {{"kind", "completion"}})
        .Increment(static_cast<double>(std::max<int64_t>(completion, 0)));
}

void Metrics::on_tenant_rejected(const std::string& tenant, std::string_view reason) {
    std::lock_guard lock(tenants_mu_);
    tenant_counter(*tenant_rejections_, &TenantSeries::rejections, tenant,
                   {{"reason", std::string(reason)}})
        .Increment();
}

void Metrics::set_tenants(const std::vector<std::string>& configured,
                          const std::function<bool(const std::string&)>& busy) {
    std::lock_guard lock(tenants_mu_);
    std::set<std::string> next(configured.begin(), configured.end());
    for (const std::string& name : configured_tenants_) {
        if (!next.contains(name)) {
            retired_tenants_.insert(name);
        }
    }
    for (const std::string& name : next) {
        retired_tenants_.erase(name);
    }
    configured_tenants_ = std::move(next);
    for (const std::string& name : retired_tenants_) {
        auto it = tenant_series_.find(name);
        if (it == tenant_series_.end() || (busy && busy(name))) {
            continue;  // Nothing to drop, or not yet: its running requests still count.
        }
        for (prometheus::Counter* c : it->second.requests) {
            tenant_requests_->Remove(c);
        }
        for (prometheus::Counter* c : it->second.tokens) {
            tenant_tokens_->Remove(c);
        }
        for (prometheus::Counter* c : it->second.rejections) {
            tenant_rejections_->Remove(c);
        }
        tenant_series_.erase(it);
    }
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

namespace {

// Brings a counter up to a running total kept elsewhere (never down).
void raise_to(prometheus::Counter& counter, uint64_t total) {
    const double now = counter.Value();
    if (static_cast<double>(total) > now) {
        counter.Increment(static_cast<double>(total) - now);
    }
}

}  // namespace

void Metrics::set_gossip_rejected(std::string_view reason, uint64_t total) {
    if (reason != "auth" && reason != "decode" && reason != "implausible" &&
        reason != "members_full") {
        return;
    }
    raise_to(gossip_rejected_->Add({{"reason", std::string(reason)}}), total);
}

void Metrics::set_gossip_inbound_streams(int64_t open, uint64_t refused_total) {
    gossip_inbound_streams_->Set(static_cast<double>(std::max<int64_t>(open, 0)));
    raise_to(*gossip_inbound_refused_, refused_total);
}

void Metrics::set_gossip_refutations(uint64_t total) { raise_to(*gossip_refutations_, total); }

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
    std::lock_guard lock(sites_mu_);
    prometheus::Counter& c =
        route_decisions_->Add({{"outcome", std::string(outcome)}, {"site", site}});
    if (!site.empty()) {
        site_series_[site].decisions.insert(&c);
    }
    c.Increment();
}

void Metrics::on_forwarded(const std::string& site, std::string_view outcome) {
    std::lock_guard lock(sites_mu_);
    prometheus::Counter& c = forwarded_->Add({{"site", site}, {"outcome", std::string(outcome)}});
    if (!site.empty()) {
        site_series_[site].forwarded.insert(&c);
    }
    c.Increment();
}

void Metrics::on_forward_latency(const std::string& site, std::chrono::nanoseconds to_head) {
    static const prometheus::Histogram::BucketBoundaries kBuckets{
        0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    std::lock_guard lock(sites_mu_);
    prometheus::Histogram& h = forward_latency_->Add({{"site", site}}, kBuckets);
    if (!site.empty()) {
        site_series_[site].forward_latency = &h;
    }
    h.Observe(std::chrono::duration<double>(to_head).count());
}

void Metrics::on_forward_retry(std::string_view reason) {
    forward_retries_->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::on_connection_opened() { open_connections_->Increment(); }
void Metrics::on_connection_closed() { open_connections_->Decrement(); }

void Metrics::on_connection_rejected(std::string_view reason) {
    rejected_->Add({{"reason", std::string(reason)}}).Increment();
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
            static const prometheus::Histogram::BucketBoundaries kBuckets{
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                0.5,    1,     2.5,    5,     10,   30,    60,   120};
            RouteStatus created{&requests_->Add(labels), &durations_->Add(labels, kBuckets)};
            it = by_route_status_.emplace(std::make_pair(route, status), created).first;
        }
        entry = it->second;
    }
    entry.count->Increment();
    entry.duration->Observe(std::chrono::duration<double>(record.duration).count());
}

void Metrics::on_route_ejection(const std::string& site) {
    std::lock_guard lock(sites_mu_);
    prometheus::Counter& c = route_ejections_->Add({{"site", site}});
    if (!site.empty()) {
        site_series_[site].ejections = &c;
    }
    c.Increment();
}

void Metrics::set_site_rtt(const std::string& site, double seconds) {
    std::lock_guard lock(sites_mu_);
    prometheus::Gauge& g = site_rtt_->Add({{"site", site}});
    if (!site.empty()) {
        site_series_[site].rtt = &g;
    }
    g.Set(seconds);
}

void Metrics::retain_sites(const std::set<std::string>& present) {
    std::lock_guard lock(sites_mu_);
    for (auto it = site_series_.begin(); it != site_series_.end();) {
        if (present.contains(it->first)) {
            ++it;
            continue;
        }
        const SiteSeries& s = it->second;
        for (prometheus::Counter* c : s.decisions) {
            route_decisions_->Remove(c);
        }
        for (prometheus::Counter* c : s.forwarded) {
            forwarded_->Remove(c);
        }
        if (s.ejections != nullptr) {
            route_ejections_->Remove(s.ejections);
        }
        if (s.rtt != nullptr) {
            site_rtt_->Remove(s.rtt);
        }
        if (s.forward_latency != nullptr) {
            forward_latency_->Remove(s.forward_latency);
        }
        it = site_series_.erase(it);
    }
}

}  // namespace edge::daemon
