// Metrics' series of the cluster: gossip membership (members, dropped packets, streams,
// refutations), routing decisions, ejections and RTT per site, forwarding to other sites, and
// retain_sites() dropping a departed site's series.

#include "daemon/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include <algorithm>
#include <chrono>

namespace edge::daemon {

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
