#pragma once

// Every series daemon::Metrics can export: a Metrics with each method called once, rendered, and
// the `# TYPE` lines read back. Shared by the metrics, dashboard and alert tests so that a query
// naming a series the daemon does not export fails. Header-only; pure.

#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/metrics.h"
#include "engine/serving_stats.h"

namespace edge::package_testing {

// The exposition text with every family populated.
inline std::string populated_metrics_text() {
    daemon::Metrics m;
    m.on_connection_opened();
    m.on_connection_rejected("limit");
    m.on_admin_connection_rejected("limit");
    m.on_handshake(false, "");
    m.on_handshake(true, "");
    m.on_handshake(false, "no_shared_cipher");
    tls::ResponseRecord answered;
    answered.method = "POST";
    answered.path = "/v1/chat/completions";
    answered.status = 200;
    answered.complete = true;
    answered.duration = std::chrono::milliseconds(12);
    m.on_response(answered);
    m.on_stream_cancelled("slow_reader");
    m.on_tenant_request("acme", "ok");
    m.on_tenant_tokens("acme", 10, 20);
    m.on_tenant_rejected("acme", "requests_per_second");
    m.set_site_info("fra1", "eu-central", 50.11, 8.68);
    m.set_certificate_expiry("api.example.net", 1'900'000'000);
    m.on_certificate_reload("public", true);
    m.set_gossip_members("alive", 3);
    m.on_route_decision("local", "fra1");
    m.on_route_decision("forwarded", "ams1");
    m.on_route_ejection("ams1");
    m.set_site_rtt("ams1", 0.012);
    m.on_forwarded("ams1", "ok");
    m.on_forward_latency("ams1", std::chrono::milliseconds(3));
    m.on_forward_retry("connect");
    m.peer_listener()->on_handshake(false, "client_certificate");
    m.peer_listener()->on_connection_rejected("limit");
    // The engine's series come from its serving stats at each scrape.
    m.set_serving_source([] {
        engine::ServingStats s;
        s.model = "qwen3-moe";
        s.kv_use = 0.5;
        s.batch_sequences = 12;
        s.queued = 2;
        s.kv_swap_bytes = 4096;
        s.preempt_recompute_tokens = 37;
        s.expert_tokens = {100, 0, 7};
        engine::TenantServingStats& t = s.tenants["acme"];
        t.queued = 2;
        t.running = 12;
        t.generated_tokens = 20;
        t.rejected_queue_full = 1;
        for (engine::LatencyHistogram* h : {&t.queue_time, &t.ttft, &t.inter_token, &t.end_to_end}) {
            h->observe(0.3);
        }
        return std::vector<engine::ServingStats>{s};
    });
    return m.serialize();
}

// name -> type ("counter", "gauge", "histogram", ...), from the `# TYPE` lines of `text`.
inline std::map<std::string, std::string> metric_types(const std::string& text) {
    std::map<std::string, std::string> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("# TYPE ", 0) == 0) {
            std::istringstream words(line.substr(7));
            std::string name, type;
            words >> name >> type;
            out[name] = type;
        }
    }
    return out;
}

// Names a query may use: each family, plus _bucket/_sum/_count of histograms and summaries.
inline std::map<std::string, std::string> queryable_series(const std::string& text) {
    std::map<std::string, std::string> out;
    for (const auto& [name, type] : metric_types(text)) {
        out[name] = type;
        if (type == "histogram" || type == "summary") {
            out[name + "_sum"] = type;
            out[name + "_count"] = type;
            if (type == "histogram") {
                out[name + "_bucket"] = type;
            }
        }
    }
    return out;
}

}  // namespace edge::package_testing
