// Cluster::Impl's work on its strand (cluster_impl.h): this site's state (its pools and their
// load) sampled every publish interval and gossiped when it changed materially, the gossip and
// per-site metrics, and the active health checks of the other sites' /readyz.

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <vector>

#include "common/log.h"
#include "daemon/cluster/admin_views.h"
#include "daemon/cluster/cluster_impl.h"
#include "daemon/metrics.h"

namespace edge::daemon::cluster {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;
constexpr auto kTuple = net::as_tuple(net::use_awaitable);

membership::SiteState Cluster::Impl::site_state() const {
    membership::SiteState s;
    s.site_id = site_.id;
    s.region = site_.region;
    s.latitude = site_.latitude;
    s.longitude = site_.longitude;
    s.admin_addr = admin_addr_;
    {
        std::lock_guard lock(mu_);
        s.peer_addr = peer_addr_;
    }
    const bool ready = generator_.ready();
    const bool draining = draining_.load() || stalled_.load();
    const std::vector<engine::ModelLoad> loads = generator_.load();
    for (const engine::ModelInfo& info : generator_.models()) {
        membership::PoolInfo p;
        p.model = info.name;
        p.version_digest = info.version;
        p.state = draining ? membership::PoolState::kDraining
                  : ready  ? membership::PoolState::kServing
                           : membership::PoolState::kLoading;
        for (const engine::ModelLoad& l : loads) {
            if (l.name == info.name) {
                p.capacity = l.capacity;
                p.load.queue_depth = l.queue_depth;
                p.load.running = l.running;
                p.load.kv_use = l.kv_use;
                p.load.tokens_per_s = l.decode_tokens_per_s;
                p.load.prefill_tokens_per_s = l.prefill_tokens_per_s;
                p.load.max_queue = l.max_queue;
            }
        }
        s.pools.push_back(std::move(p));
    }
    return s;
}

void Cluster::Impl::publish(bool force) {
    membership::SiteState s = site_state();
    // Whether a load change is material is decided once, by Memberlist::update_site_state,
    // against the state it last gossiped: it keeps a sample that is not (it goes out with the
    // next one that is). Judged here too, against the last sample posted, one it kept would
    // become the baseline, and a later sample material against what the cluster holds but not
    // against that one would never be posted. Only a sample equal to the last is not posted.
    if (!force && last_published_ && *last_published_ == s) {
        return;
    }
    last_published_ = s;
    service_->post([s = std::move(s)](membership::Memberlist& ml) mutable {
        ml.update_site_state(std::move(s));
    });
}

void Cluster::Impl::update_metrics() {
    if (metrics_ == nullptr) {
        return;
    }
    const membership::MembershipStats& stats = service_->stats();
    metrics_->set_gossip_rejected("auth", stats.auth_failures.load());
    metrics_->set_gossip_rejected("decode", stats.decode_failures.load());
    metrics_->set_gossip_rejected("implausible", stats.implausible_dropped.load());
    metrics_->set_gossip_rejected("members_full", stats.members_refused.load());
    metrics_->set_gossip_inbound_streams(stats.inbound_streams.load(),
                                         stats.inbound_streams_refused.load());
    metrics_->set_gossip_refutations(stats.refutations.load());
    auto snap = service_->snapshot();
    if (!snap) {
        return;
    }
    for (membership::NodeState st : {membership::NodeState::kAlive, membership::NodeState::kSuspect,
                                     membership::NodeState::kDead, membership::NodeState::kLeft}) {
        metrics_->set_gossip_members(membership::node_state_name(st),
                                     static_cast<int64_t>(snap->count(st)));
    }
    const routing::selection::CostConfig cost = planner_->config().cost;
    for (const membership::MemberView& m : snap->members) {
        // A left member's RTT is not set again: retain_sites() below drops its series.
        if (m.site && !m.is_local && m.name != snap->local_name &&
            m.state != membership::NodeState::kLeft) {
            if (const auto rtt = member_rtt(*snap, m, cost)) {
                metrics_->set_site_rtt(m.site->site_id, rtt->rtt_s);
            }
        }
    }
    metrics_->retain_sites(metric_sites(*snap));
}

void Cluster::Impl::arm_publish() {
    if (stopped_) {
        return;
    }
    publish_timer_.expires_after(gossip_.publish_interval);
    publish_timer_.async_wait([self = shared_from_this()](error_code ec) {
        if (ec || self->stopped_) {
            return;
        }
        self->publish(false);
        self->update_metrics();
        self->arm_publish();
    });
}

void Cluster::Impl::arm_health() {
    if (stopped_ || gossip_.health_check_interval.count() <= 0) {
        return;
    }
    health_timer_.expires_after(gossip_.health_check_interval);
    health_timer_.async_wait([self = shared_from_this()](error_code ec) {
        if (ec || self->stopped_) {
            return;
        }
        self->run_health_checks();
        self->arm_health();
    });
}

void Cluster::Impl::run_health_checks() {
    auto snap = service_->snapshot();
    if (!snap) {
        return;
    }
    for (const membership::MemberView& m : snap->members) {
        if (m.is_local || m.name == snap->local_name || !m.site || m.site->admin_addr.empty() ||
            (m.state != membership::NodeState::kAlive &&
             m.state != membership::NodeState::kSuspect)) {
            continue;
        }
        net::co_spawn(strand_, check_ready(shared_from_this(), m.name, m.site->admin_addr),
                      net::detached);
    }
}

net::awaitable<void> Cluster::Impl::check_ready(std::shared_ptr<Impl> self, std::string member,
                                                std::string addr) {
    using Readiness = ClusterRoutePlanner::Readiness;
    Readiness readiness = Readiness::kFailed;
    Result<std::pair<std::string, uint16_t>> hp = membership::split_host_port(addr);
    const auto deadline = std::chrono::steady_clock::now() + self->gossip_.health_check_timeout;
    std::vector<tcp::endpoint> endpoints;
    if (hp.ok()) {
        error_code ec;
        const net::ip::address ip = net::ip::make_address(hp->first, ec);
        if (!ec) {
            endpoints.emplace_back(ip, hp->second);
        } else {
            // site.admin_address may name a host (the config takes host:port): unresolved,
            // every check of a healthy site failed and its pools were ejected. The lookup
            // counts against the check's deadline.
            auto resolver = std::make_shared<tcp::resolver>(self->strand_);
            net::steady_timer timer(self->strand_, deadline);
            timer.async_wait([resolver](error_code wait_ec) {
                if (!wait_ec) {
                    resolver->cancel();
                }
            });
            auto [rec, results] =
                co_await resolver->async_resolve(hp->first, std::to_string(hp->second), kTuple);
            timer.cancel();
            if (!rec) {
                for (const auto& entry : results) {
                    endpoints.push_back(entry.endpoint());
                }
            }
        }
    }
    if (!endpoints.empty() && !self->stopped_) {
        beast::tcp_stream stream(self->strand_);
        stream.expires_at(deadline);
        auto [cec, connected] = co_await stream.async_connect(endpoints, kTuple);
        if (!cec) {
            http::request<http::empty_body> req{http::verb::get, "/readyz", 11};
            req.set(http::field::host, addr);
            req.keep_alive(false);
            auto [wec, wn] = co_await http::async_write(stream, req, kTuple);
            if (!wec) {
                beast::flat_buffer buf;
                http::response<http::string_body> res;
                auto [rec, rn] = co_await http::async_read(stream, buf, res, kTuple);
                if (!rec && res.result() == http::status::ok) {
                    readiness = Readiness::kReady;
                } else if (!rec && res.result() == http::status::service_unavailable) {
                    readiness = Readiness::kNotReady;
                }
            }
        }
        error_code ignored;
        stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    }
    if (self->stopped_) {
        co_return;
    }
    if (readiness != Readiness::kReady) {
        log::debug(
            "peer_not_ready",
            {{"member", member}, {"admin", addr}, {"answered", readiness == Readiness::kNotReady}});
    }
    self->planner_->report_active(member, readiness);
}

}  // namespace edge::daemon::cluster
