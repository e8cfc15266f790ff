#include "daemon/cluster/planner.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "daemon/metrics.h"

namespace edge::daemon::cluster {

namespace sel = routing::selection;
namespace membership = routing::membership;
using routing::health::pool_key;

namespace {

std::mt19937_64& thread_rng() {
    thread_local std::mt19937_64 rng(std::random_device{}() ^
                                     std::hash<std::thread::id>{}(std::this_thread::get_id()));
    return rng;
}

RouteRejection map_rejection(sel::Rejection r) {
    switch (r) {
        case sel::Rejection::kNoPoolServesModel: return RouteRejection::kNoPoolServesModel;
        case sel::Rejection::kVersionPinUnmatched: return RouteRejection::kVersionPinUnmatched;
        case sel::Rejection::kAllSaturated: return RouteRejection::kAllSaturated;
        case sel::Rejection::kNone: break;
    }
    return RouteRejection::kNone;
}

bool usable(const sel::RouteCandidate& c) {
    return c.state == membership::PoolState::kServing && c.reachable && !c.cost.saturated;
}

// Whether `pools` has a serving pool that only forwarding could reach, and this site cannot.
bool serving_unreachable(const sel::ModelPools* pools) {
    return pools != nullptr &&
           std::any_of(pools->candidates.begin(), pools->candidates.end(), [](const auto& c) {
               return c.state == membership::PoolState::kServing && !c.reachable;
           });
}

}  // namespace

ClusterRoutePlanner::ClusterRoutePlanner(PlannerConfig config, Clock& clock,
                                         SnapshotSource snapshots, RolloutBook& rollouts,
                                         Metrics* metrics)
    : clock_(clock),
      snapshots_(std::move(snapshots)),
      rollouts_(rollouts),
      metrics_(metrics),
      outliers_(config.outlier, clock),
      config_(std::make_shared<const PlannerConfig>(std::move(config))) {
    // Each ejection counted for its own site (pool keys are "<member>/<model>", members are
    // site ids), whichever thread's report or interval made it.
    outliers_.set_on_ejection([metrics](std::string_view pool) {
        if (metrics != nullptr) {
            metrics->on_route_ejection(std::string(pool.substr(0, pool.find('/'))));
        }
    });
}

PlannerConfig ClusterRoutePlanner::config() {
    std::lock_guard lock(mu_);
    return *config_;
}

bool ClusterRoutePlanner::reload(PlannerConfig fresh) {
    std::lock_guard lock(mu_);
    // The detector keeps its settings (its ejections and counts were made under them).
    const bool outlier_kept = fresh.outlier == config_->outlier;
    fresh.outlier = config_->outlier;
    config_ = std::make_shared<const PlannerConfig>(std::move(fresh));
    built_ = nullptr;  // The next plan rebuilds the table with the new weights.
    return outlier_kept;
}

std::shared_ptr<const ClusterRoutePlanner::Built> ClusterRoutePlanner::rebuild(
    std::shared_ptr<const membership::MembershipSnapshot> snap) {
    auto b = std::make_shared<Built>();
    b->snapshot = snap;
    b->ejections = outliers_.ejections_total();
    b->built_at = clock_.now();
    b->config = config_;
    if (!snap) {
        return b;
    }
    remember_models(*snap);
    const TimePoint now = b->built_at;
    const Duration degraded_for = config_->outlier.interval;
    // A failure older than that degrades nothing any more (see failed_).
    std::erase_if(failed_, [&](const auto& f) { return now - f.second.at >= degraded_for; });
    auto health = [this, &b](std::string_view member, std::string_view model) {
        std::string key = pool_key(member, model);
        if (outliers_.is_ejected(key)) {
            b->ejected.push_back(std::move(key));
            return sel::PoolHealth::kEjected;
        }
        return failed_.contains(key) ? sel::PoolHealth::kDegraded : sel::PoolHealth::kHealthy;
    };
    std::set<std::string> pools;
    std::unordered_map<std::string, uint64_t> lives;
    for (const membership::MemberView& m : snap->members) {
        if (!m.site) {
            continue;
        }
        b->peer_addr[m.name] = m.site->peer_addr;
        // The detector's ejection cap counts pools that may be planned to: not the local ones,
        // nor those of dead or departed members (kept in the snapshot for a day).
        if (m.is_local || m.name == snap->local_name ||
            (m.state != membership::NodeState::kAlive &&
             m.state != membership::NodeState::kSuspect)) {
            continue;
        }
        auto seen = lives_.find(m.name);
        // A new life (the memberlist's MemberView::life): the process that failed is gone, and
        // so are its pools' records. Seen dead or departed at a rebuild, its pools already left
        // the detector; a restart between two rebuilds (an idle site, or one fast enough that
        // gossip never declared it dead) kept the old life's ejection and backoff on the new one.
        const bool new_life = seen != lives_.end() && seen->second != m.life;
        lives.emplace(m.name, m.life);
        for (const membership::PoolInfo& p : m.site->pools) {
            std::string key = pool_key(m.name, p.model);
            if (new_life && known_pools_.erase(key) > 0) {
                outliers_.remove_pool(key);  // Added again, afresh, below.
                failed_.erase(key);
            }
            pools.insert(std::move(key));
        }
    }
    lives_ = std::move(lives);
    // Pools come and go with the snapshot.
    for (const std::string& p : pools) {
        if (!known_pools_.count(p)) {
            outliers_.add_pool(p);
        }
    }
    for (const std::string& p : known_pools_) {
        if (!pools.count(p)) {
            outliers_.remove_pool(p);
            failed_.erase(p);
        }
    }
    known_pools_ = std::move(pools);
    // After the detector learnt of the snapshot's lives: a new one's pools are not ejected.
    // A remote site without a peer address takes no forwarded requests: its pools are marked
    // unreachable in the table, so they neither win the choice nor make a saturated cluster's
    // answer "no pool" (dropped after the choice, they did both).
    b->table = sel::build_route_table(*snap, b->config->cost, health, /*need_peer_addr=*/true);
    return b;
}

std::shared_ptr<const ClusterRoutePlanner::Built> ClusterRoutePlanner::current() {
    outliers_.tick();
    auto snap = snapshots_ ? snapshots_() : nullptr;
    std::lock_guard lock(mu_);
    // A lifted ejection (tick() above) changes no count: the ejected pools are looked at
    // again, or a recovered pool kept its penalty until the rebuild interval passed.
    if (built_ && built_->snapshot == snap && built_->ejections == outliers_.ejections_total() &&
        clock_.now() - built_->built_at < config_->rebuild_interval &&
        std::all_of(built_->ejected.begin(), built_->ejected.end(),
                    [this](const std::string& pool) { return outliers_.is_ejected(pool); })) {
        return built_;
    }
    built_ = rebuild(std::move(snap));
    return built_;
}

std::vector<std::string> ClusterRoutePlanner::cluster_models() { return models(false); }

std::vector<std::string> ClusterRoutePlanner::advertised_models() { return models(true); }

void ClusterRoutePlanner::remember_models(const membership::MembershipSnapshot& snap) {
    const TimePoint now = clock_.now();
    for (const membership::MemberView& m : snap.members) {
        if (m.site != nullptr) {
            for (const membership::PoolInfo& pool : m.site->pools) {
                seen_models_[pool.model] = now;
            }
        }
    }
    std::erase_if(seen_models_,
                  [&](const auto& seen) { return now - seen.second > kRememberAdvertised; });
}

std::vector<std::string> ClusterRoutePlanner::models(bool any_state) {
    std::set<std::string> models;
    const auto snap = snapshots_ ? snapshots_() : nullptr;
    if (any_state) {
        std::lock_guard lock(mu_);
        if (snap != nullptr) {
            remember_models(*snap);
        }
        for (const auto& [model, when] : seen_models_) {
            models.insert(model);
        }
    }
    if (snap != nullptr) {
        for (const membership::MemberView& m : snap->members) {
            // As the route table: a suspect member's pools are still planned to.
            if (m.site == nullptr ||
                (!any_state && m.state != membership::NodeState::kAlive &&
                 m.state != membership::NodeState::kSuspect)) {
                continue;
            }
            // As the route table: a remote site without a peer address takes no forwarded
            // requests, so its models are not this site's to offer.
            if (!m.is_local && m.name != snap->local_name && m.site->peer_addr.empty()) {
                continue;
            }
            for (const membership::PoolInfo& pool : m.site->pools) {
                if (any_state || pool.state == membership::PoolState::kServing) {
                    models.insert(pool.model);
                }
            }
        }
    }
    return {models.begin(), models.end()};
}

std::shared_ptr<const sel::RouteTable> ClusterRoutePlanner::table() {
    auto b = current();
    return std::shared_ptr<const sel::RouteTable>(b, &b->table);
}

VersionChoice ClusterRoutePlanner::version_for(const Built& b, std::string_view model,
                                               std::string_view pin, std::mt19937_64& rng,
                                               sel::RouteChoice* choice) {
    if (!pin.empty()) {
        *choice = sel::choose(b.table, {model, pin}, b.config->selection, rng);
        return {std::string(pin), "pin"};
    }
    std::optional<RolloutIntent> target = rollouts_.target(model);
    if (target) {
        sel::RouteChoice c =
            sel::choose(b.table, {model, target->version}, b.config->selection, rng);
        // An ejected pool is chosen only when nothing better is left: when it is the best the
        // target version has, a pool of another version that is not ejected takes the request.
        const bool target_usable =
            c.chosen != nullptr && c.chosen->health != sel::PoolHealth::kEjected;
        if (target_usable || !b.config->version_fallback) {
            *choice = c;
            return {target->version, "target"};
        }
        sel::RouteChoice any = sel::choose(b.table, {model, ""}, b.config->selection, rng);
        if (c.chosen != nullptr &&
            (any.chosen == nullptr || any.chosen->health == sel::PoolHealth::kEjected)) {
            *choice = c;  // Every pool is ejected: the target version's, as without fallback.
            return {target->version, "target"};
        }
        if (any.chosen != nullptr || c.rejection == sel::Rejection::kVersionPinUnmatched) {
            *choice = any;
            return {"", "fallback"};
        }
        *choice = c;
        return {target->version, "target"};
    }
    *choice = sel::choose(b.table, {model, ""}, b.config->selection, rng);
    return {"", "none"};
}

RoutePlan ClusterRoutePlanner::plan(std::string_view model, std::string_view version_pin) {
    auto b = current();
    sel::RouteChoice choice;
    const VersionChoice v = version_for(*b, model, version_pin, thread_rng(), &choice);
    RoutePlan plan;
    const std::string m(model);

    auto target_of = [&](const sel::RouteCandidate& c) -> std::optional<RouteTarget> {
        RouteTarget t;
        t.local = c.is_local;
        t.site_id = c.site_id;
        t.cost_s = c.cost.total_s;
        t.model = m;
        if (!c.is_local) {
            auto it = b->peer_addr.find(c.member);
            if (it == b->peer_addr.end() || it->second.empty()) {
                return std::nullopt;  // The site takes no forwarded requests.
            }
            t.peer_addr = it->second;
        }
        return t;
    };

    if (choice.chosen != nullptr) {
        if (auto t = target_of(*choice.chosen)) {
            plan.targets.push_back(std::move(*t));
        }
        const sel::ModelPools* pools = b->table.find(model);
        // Fallbacks by cost: first those of the version filter, then (only when the filter is
        // the target version and fallback is allowed) the other versions.
        const bool other_versions = v.source == "target" && b->config->version_fallback;
        for (int pass = 0; pass < (other_versions ? 2 : 1); ++pass) {
            for (size_t i = 0; pools != nullptr && i < pools->index.size(); ++i) {
                if (plan.targets.size() >= b->config->max_fallbacks + 1) {
                    break;
                }
                const sel::RouteCandidate& c = pools->candidates[pools->index[i]];
                if (&c == choice.chosen || !usable(c)) {
                    continue;
                }
                const bool matches = v.version.empty() || c.version_digest == v.version;
                if (matches != (pass == 0)) {
                    continue;
                }
                if (auto t = target_of(c)) {
                    plan.targets.push_back(std::move(*t));
                }
            }
        }
        if (!plan.targets.empty()) {
            if (metrics_ != nullptr) {
                metrics_->on_route_decision(plan.targets[0].local ? "local" : "forwarded",
                                            plan.targets[0].site_id);
            }
            return plan;
        }
        plan.rejection = RouteRejection::kNoPoolServesModel;
        plan.message = "no reachable pool serves model '" + m +
                       "': the pools that do take no forwarded requests";
    } else {
        plan.rejection = map_rejection(choice.rejection);
        switch (choice.rejection) {
            case sel::Rejection::kNoPoolServesModel:
                plan.message = serving_unreachable(b->table.find(model))
                                   ? "no reachable pool serves model '" + m +
                                         "': the pools that do take no forwarded requests"
                                   : "no pool in the cluster serves model '" + m + "'";
                break;
            case sel::Rejection::kVersionPinUnmatched:
                plan.message = "no pool serves version '" + v.version + "' of model '" + m + "'" +
                               (v.source == "target" ? " (the cluster's target version)" : "");
                break;
            case sel::Rejection::kAllSaturated:
                plan.message = "every pool serving model '" + m + "' is saturated";
                plan.retry_after_seconds =
                    static_cast<int>(std::ceil(std::clamp(choice.retry_after_s, 1.0, 3600.0)));
                break;
            case sel::Rejection::kNone:
                plan.rejection = RouteRejection::kNoPoolServesModel;
                plan.message = "no pool in the cluster serves model '" + m + "'";
                break;
        }
    }
    if (metrics_ != nullptr) {
        metrics_->on_route_decision("rejected", "");
    }
    return plan;
}

void ClusterRoutePlanner::report(const RouteTarget& target, bool ok,
                                 std::chrono::nanoseconds /*latency*/) {
    if (target.local || target.site_id.empty() || target.model.empty()) {
        return;
    }
    report_known(pool_key(target.site_id, target.model), ok, /*check=*/false);
}

void ClusterRoutePlanner::report_known(const std::string& pool, bool ok, bool check) {
    for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1) {
            (void)current();  // The table may predate the pool's member, or not be built yet.
        }
        std::lock_guard lock(mu_);
        if (!known_pools_.contains(pool)) {
            continue;
        }
        if (ok) {
            outliers_.report_success(pool);
            failed_.erase(pool);
        } else {
            outliers_.report_failure(pool, routing::health::FailureKind::kConnect);
            Failed& f = failed_[pool];
            f.at = clock_.now();
            f.request = f.request || !check;
        }
        return;
    }
}

void ClusterRoutePlanner::report_active(const std::string& member, Readiness readiness) {
    if (readiness == Readiness::kReady) {
        // The site answers again: the pools its failed checks degraded are not any more (those
        // a failed request degraded stay so: a 200 says nothing of one model's pool).
        std::lock_guard lock(mu_);
        const std::string prefix = member + "/";
        std::erase_if(failed_, [&](const auto& f) {
            return !f.second.request && f.first.starts_with(prefix);
        });
    }
    if (readiness != Readiness::kFailed) {
        // A site answers /readyz for all its models: its 200 says nothing of one model's pool,
        // and counted as a success it reset that pool's consecutive failures between requests
        // that all failed (a pool failing every forwarded request was never ejected).
        return;
    }
    auto b = current();
    if (!b->snapshot) {
        return;
    }
    const membership::MemberView* m = b->snapshot->find(member);
    if (m == nullptr || !m->site) {
        return;
    }
    for (const membership::PoolInfo& p : m->site->pools) {
        if (p.state != membership::PoolState::kServing) {
            continue;  // Not planned to (loading, draining): its checks say nothing of it.
        }
        report_known(pool_key(member, p.model), false, /*check=*/true);
    }
}

sel::RouteDecision ClusterRoutePlanner::explain(std::string_view model,
                                                std::string_view version_pin,
                                                VersionChoice* version) {
    auto b = current();
    sel::RouteChoice choice;
    std::mt19937_64& rng = thread_rng();
    VersionChoice v = version_for(*b, model, version_pin, rng, &choice);
    sel::RouteDecision d = sel::explain(b->table, {model, v.version}, b->config->selection, rng);
    if (v.source == "target") {
        d.reasons.push_back("unpinned request: the cluster's target version " + v.version +
                            (b->config->version_fallback
                                 ? " is preferred; other versions follow as fallbacks"
                                 : " is used"));
    } else if (v.source == "fallback") {
        d.reasons.push_back("unpinned request: no pool of the target version can take it; "
                            "other versions serve as fallback");
    }
    if (version != nullptr) {
        *version = std::move(v);
    }
    return d;
}

}  // namespace edge::daemon::cluster
