#include "daemon/forward/peer_client.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>

#include "common/log.h"
#include "daemon/forward/peer_client_impl.h"
#include "daemon/metrics.h"

namespace edge::daemon::forward {

namespace {

// The plan holds this site: when no remote target took the request, the caller runs it here.
bool has_local_target(const ForwardJob& job) {
    return std::any_of(job.targets.begin(), job.targets.end(),
                       [](const RouteTarget& t) { return t.local; });
}

}  // namespace

bool PeerClient::Impl::retry_allowed() const {
    double cap = std::max(static_cast<double>(config_.min_retry_concurrency),
                          config_.retry_budget * static_cast<double>(active_.load()));
    return static_cast<double>(retries_in_flight_ + 1) <= cap;
}

bool PeerClient::Impl::can_retry(ForwardJob& job) {
    if (job.local_fallback) {
        return true;  // Run here should the budget stop the remote targets left (run()).
    }
    if (!job.remote_next) {
        return false;
    }
    if (!job.counted_retry) {
        if (!retry_allowed()) {
            return false;
        }
        job.counted_retry = true;
        ++retries_in_flight_;
    }
    return true;
}

void PeerClient::Impl::abandon_site(const std::string& site_id) {
    for (ForwardJob* job : jobs_) {
        if ((job->current != nullptr || job->resolving) && job->current_site == site_id) {
            job->site_lost = true;
            stop_attempt(*job);
        }
    }
}

void PeerClient::Impl::cancel(ForwardJob& job) {
    job.cancelled = true;
    stop_attempt(job);
}

void PeerClient::Impl::stop_attempt(ForwardJob& job) {
    if (job.current != nullptr) {
        job.current->close();
    }
    if (job.resolving) {
        job.resolving->cancel();
    }
}

void PeerClient::Impl::report(const RouteTarget& target, bool ok, SteadyClock::duration latency) {
    if (cluster::RoutePlanner* planner = planner_.load()) {
        planner->report(target, ok, std::chrono::duration_cast<std::chrono::nanoseconds>(latency));
    }
}

void PeerClient::Impl::finish(ForwardJob& job) {
    job.result.cancelled = job.cancelled && !stopping_.load();
    const bool maybe_ran = job.head_timed_out || job.earlier.maybe_ran;
    job.result.maybe_ran = maybe_ran;
    // A peer's engine accepted it, this list's or one the caller tried before, then its answer
    // was cut (a peer that said it generated nothing is not counted: attempt()).
    const bool accepted = job.result.accepted || job.earlier.accepted;
    // No remote site took it: a local target in the plan runs it (the caller, on run_here),
    // as the next candidate would have been tried had it been remote.
    if (!job.result.started && !job.cancelled && !stopping_.load() && has_local_target(job)) {
        job.result.run_here = true;
        // The prompt a peer told when it accepted it, before its answer was cut (accepted): the
        // caller keeps it charged should this site or a later target refuse the request.
        job.result.prompt_tokens = job.accepted_prompt_tokens;
    } else if (!job.result.started && (!job.cancelled || stopping_.load())) {
        // A job cancelled by stop() still answers; one whose client left has nobody to answer.
        // A peer that was sent the request and sent no head in time (this list's, or one the
        // caller tried before it) may have run it: a 504, which the caller never refunds. Else
        // one that accepted it before its answer was cut may have generated: that cut's 503
        // (upstream_cut, as when no other target is left), charged as an answer cut. When none
        // was sent it (every peer refused the connection or timed out before it was up:
        // blackholed, a TLS handshake or name lookup that never ended), it ran nowhere: a 503,
        // which the caller refunds as refused.
        api::ApiError e;
        e.status = maybe_ran ? 504 : 503;
        e.type = "server_error";
        e.code = maybe_ran  ? "upstream_timeout"
                 : accepted ? "upstream_cut"
                            : "upstream_unavailable";
        if (stopping_.load()) {
            e.message = "this site is shutting down";
        } else if (accepted && !maybe_ran) {
            e.message = "a site accepted the request, then its answer was cut, and no other site "
                        "could take it" +
                        (job.last_error.empty() ? "" : "; last: " + job.last_error);
        } else if (job.last_error.empty()) {
            e.message = "no remote site to forward the request to";
        } else {
            e.message = "no site could take the request; last: " + job.last_error;
        }
        e.retry_after_seconds = 1;
        job.result.status = e.status;
        job.deliver_last = [channel = job.channel, r = e.to_response()]() mutable {
            channel->respond(std::move(r));
        };
    }
    if (job.result.accepted && !job.result.started && !job.result.run_here) {
        // A peer took it before its answer was cut, and no later target answered: none could,
        // or the client left while one was tried. It may have generated there, as an answer cut
        // while streaming, so its told prompt and max_tokens are charged whether or not anyone
        // is answered: a client leaving then pays as one leaving that peer's stream does.
        job.result.usage_unknown = true;
        job.result.prompt_tokens = job.accepted_prompt_tokens;
    }
    if (metrics_ != nullptr && !job.result.site_id.empty()) {
        // A stream the peer stopped for its load or a shutdown is cancelled, as one stopped
        // so here; one that failed otherwise after its head, or was cut, is an error; the peer's
        // refusal of the request itself (a 4xx: its context, its tenant's queue there) is
        // rejected, as the tenant's request is counted.
        std::string_view outcome = "error";
        if (job.cancelled || job.result.failed_unavailable) {
            outcome = "cancelled";
        } else if (job.result.started && job.result.status < 500 && !job.result.failed) {
            outcome = job.result.status >= 400 ? "rejected" : "ok";
        }
        metrics_->on_forwarded(job.result.site_id, outcome);
    }
}

net::awaitable<void> PeerClient::Impl::run(std::shared_ptr<ForwardJob> job) {
    jobs_.insert(job.get());
    // The remote targets before the plan's first local one: that one is next after them (the
    // caller runs it, and leaves it to the targets after it should this site refuse for load).
    std::vector<size_t> remote;
    for (size_t i = 0; i < job->targets.size() && !job->targets[i].local; ++i) {
        if (!job->targets[i].peer_addr.empty()) {
            remote.push_back(i);
        }
    }
    job->local_fallback = has_local_target(*job);
    for (size_t k = 0; k < remote.size() && !job->cancelled && !stopping_.load(); ++k) {
        const RouteTarget& target = job->targets[remote[k]];
        if (k > 0) {
            if (!job->counted_retry) {
                if (!retry_allowed()) {
                    log::info("forward_retry_budget_exhausted",
                              {{"retries_in_flight", retries_in_flight_}});
                    break;
                }
                job->counted_retry = true;
                ++retries_in_flight_;
            }
            if (metrics_ != nullptr) {
                metrics_->on_forward_retry(failure_reason(job->last_failure));
            }
        }
        // A local target in the plan follows the remote ones before it (or one the retry budget
        // stops at): a 5xx, or a deferred answer cut, with nothing relayed leaves the request to
        // it (finish()), as a refused connection does (can_retry()). Relayed, the 503 of a
        // peer's full queue reached the client while this site could have run it.
        job->remote_next = k + 1 < remote.size();
        ++job->result.attempts;
        job->result.site_id = target.site_id;
        bool over = co_await attempt(*job, target);
        if (over) {
            break;
        }
    }
    finish(*job);
    jobs_.erase(job.get());
    if (job->counted_retry) {
        --retries_in_flight_;
    }
    auto done = std::move(job->done);
    auto deliver_last = std::move(job->deliver_last);
    ForwardResult result = job->result;
    job.reset();
    if (done) {
        done(result);
    }
    if (deliver_last) {
        deliver_last();
    }
    {
        std::lock_guard lock(done_mu_);
        active_.fetch_sub(1);
    }
    done_cv_.notify_all();
}

Result<std::unique_ptr<PeerClient>> PeerClient::create(net::io_context& io,
                                                       PeerClientConfig config,
                                                       Metrics* metrics) {
    auto impl = std::make_shared<Impl>(io, std::move(config), metrics);
    impl->ca_path_ = impl->config_.ca_path;
    impl->cert_path_ = impl->config_.cert_path;
    impl->key_path_ = impl->config_.key_path;
    EDGE_ASSIGN_OR_RETURN(impl->ssl_,
                          Impl::load_context(impl->ca_path_, impl->cert_path_, impl->key_path_));
    if (!impl->config_.testing_delay.empty()) {
        log::warn("testing_peer_delay", {{"detail", "forwards to some sites are delayed on "
                                                    "purpose (gossip.testing_peer_delay_ms)"}});
    }
    return std::unique_ptr<PeerClient>(new PeerClient(std::move(impl)));
}

PeerClient::~PeerClient() { stop(std::chrono::milliseconds(0)); }

Status PeerClient::reload() {
    std::string ca_path, cert_path, key_path;
    {
        std::lock_guard lock(impl_->ssl_mu_);
        ca_path = impl_->ca_path_;
        cert_path = impl_->cert_path_;
        key_path = impl_->key_path_;
    }
    return reload(ca_path, cert_path, key_path);
}

Status PeerClient::reload(const std::string& ca_path, const std::string& cert_path,
                          const std::string& key_path) {
    Result<std::shared_ptr<ssl::context>> fresh = Impl::load_context(ca_path, cert_path, key_path);
    if (!fresh.ok()) {
        return fresh.status();
    }
    {
        std::lock_guard lock(impl_->ssl_mu_);
        impl_->ssl_ = std::move(fresh).value();
        impl_->ca_path_ = ca_path;
        impl_->cert_path_ = cert_path;
        impl_->key_path_ = key_path;
    }
    // Pooled connections were made with the old certificates: new requests handshake afresh.
    net::post(impl_->strand_, [impl = impl_] { impl->close_idle(); });
    return ok_status();
}

void PeerClient::set_planner(cluster::RoutePlanner* planner) { impl_->planner_.store(planner); }

void PeerClient::forward(tls::HttpRequest request, std::string tenant,
                         std::vector<RouteTarget> targets,
                         std::shared_ptr<tls::ResponseChannel> channel,
                         std::function<void(const ForwardResult&)> done,
                         std::function<void(int64_t prompt_tokens)> on_accepted,
                         cluster::EarlierTargets earlier) {
    auto job = std::make_shared<ForwardJob>();
    job->earlier = earlier;
    job->request = std::move(request);
    job->tenant = std::move(tenant);
    job->targets = std::move(targets);
    job->channel = std::move(channel);
    job->done = std::move(done);
    job->on_accepted = std::move(on_accepted);
    impl_->active_.fetch_add(1);
    std::weak_ptr<ForwardJob> weak = job;
    job->channel->on_client_gone([impl = impl_, weak] {
        net::post(impl->strand_, [impl, weak] {
            if (auto j = weak.lock()) {
                impl->cancel(*j);
            }
        });
    });
    net::co_spawn(impl_->strand_,
                  [impl = impl_, job = std::move(job)]() mutable {
                      return impl->run(std::move(job));
                  },
                  [](std::exception_ptr e) {
                      if (e) {
                          try {
                              std::rethrow_exception(e);
                          } catch (const std::exception& ex) {
                              log::error("forward_exception", {{"what", ex.what()}});
                          } catch (...) {
                              log::error("forward_exception", {{"what", "unknown"}});
                          }
                      }
                  });
}

void PeerClient::stop(std::chrono::milliseconds deadline) {
    if (!impl_->stopping_.exchange(true)) {
        net::post(impl_->strand_, [impl = impl_] {
            impl->close_idle();
            for (ForwardJob* job : impl->jobs_) {
                impl->cancel(*job);
            }
        });
    }
    std::unique_lock lock(impl_->done_mu_);
    impl_->done_cv_.wait_for(lock, deadline, [this] { return impl_->active_.load() == 0; });
}

std::function<void(const std::string&)> PeerClient::site_lost_handler() {
    return [weak = std::weak_ptr<Impl>(impl_)](const std::string& site_id) {
        if (std::shared_ptr<Impl> impl = weak.lock()) {
            net::post(impl->strand_, [impl, site_id] { impl->abandon_site(site_id); });
        }
    };
}

int64_t PeerClient::active() const { return impl_->active_.load(); }
int64_t PeerClient::connections_opened() const { return impl_->opened_.load(); }
int64_t PeerClient::idle_connections() const { return impl_->idle_.load(); }

}  // namespace edge::daemon::forward
