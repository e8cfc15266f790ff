// Metrics' series per tenant: the registry's tenant counters (on_tenant_*(), and set_tenants()
// retiring a removed tenant's), and the engine's serving figures per model and tenant, rendered
// after the registry at each scrape (render_serving()).

#include "daemon/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>

#include <algorithm>
#include <charconv>
#include <sstream>

namespace edge::daemon {

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

void Metrics::tenant_count(prometheus::Family<prometheus::Counter>& family,
                           std::set<prometheus::Counter*> TenantSeries::*series,
                           const std::string& tenant, std::map<std::string, std::string> labels,
                           double amount) {
    if (retired_tenants_.contains(tenant) && !tenant_series_.contains(tenant)) {
        return;
    }
    labels.emplace("tenant", tenant);
    prometheus::Counter& counter = family.Add(labels);
    (tenant_series_[tenant].*series).insert(&counter);
    counter.Increment(amount);
}

void Metrics::on_tenant_request(const std::string& tenant, std::string_view outcome) {
    std::lock_guard lock(tenants_mu_);
    tenant_count(*tenant_requests_, &TenantSeries::requests, tenant,
                 {{"outcome", std::string(outcome)}}, 1);
}

void Metrics::on_tenant_tokens(const std::string& tenant, int64_t prompt, int64_t completion) {
    std::lock_guard lock(tenants_mu_);
    tenant_count(*tenant_tokens_, &TenantSeries::tokens, tenant, {{"kind", "prompt"}},
                 static_cast<double>(std::max<int64_t>(prompt, 0)));
    tenant_count(*tenant_tokens_, &TenantSeries::tokens, tenant, {{"kind", "completion"}},
                 static_cast<double>(std::max<int64_t>(completion, 0)));
}

void Metrics::on_tenant_rejected(const std::string& tenant, std::string_view reason) {
    std::lock_guard lock(tenants_mu_);
    tenant_count(*tenant_rejections_, &TenantSeries::rejections, tenant,
                 {{"reason", std::string(reason)}}, 1);
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
        if (busy && busy(name)) {
            // Not yet: its running requests still count into them, and into series made now
            // when they are its first (tenant_count() makes none for a retired name without).
            tenant_series_[name];
            continue;
        }
        auto it = tenant_series_.find(name);
        if (it == tenant_series_.end()) {
            continue;  // Nothing to drop.
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

}  // namespace edge::daemon
