#pragma once

// ClusterRoutePlanner is the RoutePlanner of a daemon that gossips: it turns the latest
// membership snapshot into a RouteTable (routing/selection; cached, rebuilt when the snapshot
// changes, when an ejection happens or is lifted, and at least every rebuild_interval),
// applies outlier detection (routing/health: report() from forwarded requests and
// report_active() from /readyz checks feed it, for the pools of the latest table only; a
// member's new life, a restart, starts its pools' records afresh; a pool that failed and has
// not succeeded since is degraded for one outlier interval, see failed_) and picks
// the pool with choose(): the chosen target first, then fallbacks by cost. Model versions: a
// pinned X-Model-Version is honoured exactly; without a pin the model's target version
// (RolloutBook) is preferred and other versions serve only as fallback when version_fallback is
// set.
// Threading: every method is safe from any thread (the cache sits behind a mutex held only to
// swap a shared_ptr; the outlier detector and RolloutBook lock internally). The clock, snapshot
// source, rollout book and metrics must outlive the planner.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "daemon/cluster/rollout.h"
#include "daemon/cluster/route_planner.h"
#include "routing/health/outlier_detector.h"
#include "routing/membership/snapshot.h"
#include "routing/selection/route_table.h"
#include "routing/selection/selector.h"

namespace edge::daemon {
class Metrics;
}

namespace edge::daemon::cluster {

struct PlannerConfig {
    routing::selection::CostConfig cost;
    routing::selection::SelectionConfig selection;
    routing::health::OutlierConfig outlier;
    // Unpinned requests may use other versions than the target when none of it can take them.
    bool version_fallback = true;
    // Fallback targets listed after the chosen one, at most.
    size_t max_fallbacks = 3;
    // The table is rebuilt at least this often (ejections expire with time).
    Duration rebuild_interval = std::chrono::milliseconds(250);
};

using SnapshotSource =
    std::function<std::shared_ptr<const routing::membership::MembershipSnapshot>()>;

// The version filter a request gets: its pin, else the target version, else none.
struct VersionChoice {
    std::string version;   // Digest filtered on ("" for any).
    std::string source;    // "pin", "target", "fallback" (target unusable) or "none".
};

class ClusterRoutePlanner final : public RoutePlanner {
public:
    ClusterRoutePlanner(PlannerConfig config, Clock& clock, SnapshotSource snapshots,
                        RolloutBook& rollouts, Metrics* metrics);

    RoutePlan plan(std::string_view model, std::string_view version_pin) override;
    void report(const RouteTarget& target, bool ok, std::chrono::nanoseconds latency) override;
    std::vector<std::string> cluster_models() override;
    std::vector<std::string> advertised_models() override;
    // How long a model stays advertised after the last member holding it left the member list
    // (a site restarting loads its models before it rejoins: a large one takes minutes).
    static constexpr std::chrono::minutes kRememberAdvertised{30};

    // The result of one active /readyz check of `member`.
    enum class Readiness {
        kReady,     // 200.
        kNotReady,  // The site answered 503 (loading, draining): not a failure; its gossiped
                    // pool states keep it out of plans while it says so.
        kFailed,    // No answer (refused, reset, timeout) or any other status.
    };
    // A failed check counts as a failure of each of the member's pools that gossip says is
    // serving; kReady and kNotReady count for none (a site answers /readyz for all its models:
    // a 200 says nothing of one model's pool, which its requests tell).
    void report_active(const std::string& member, Readiness readiness);

    // The same decision as plan() with every candidate's cost terms and verdict; `version`
    // receives the version filter used.
    routing::selection::RouteDecision explain(std::string_view model,
                                              std::string_view version_pin,
                                              VersionChoice* version = nullptr);

    // The current table (rebuilt first when stale).
    std::shared_ptr<const routing::selection::RouteTable> table();
    routing::health::OutlierDetector& outliers() { return outliers_; }
    // The settings in use (a copy: reload() may replace them).
    PlannerConfig config();
    // SIGHUP: the cost weights, selection and version fallback apply from the next plan (the
    // table is rebuilt with them); the outlier detector keeps its settings. False when `fresh`
    // changes them (a restart applies those).
    bool reload(PlannerConfig fresh);

  private:
    // The models the members' pools hold: serving on live members (cluster_models), or in any
    // state on any member still listed, and those seen so within kRememberAdvertised
    // (advertised_models).
    std::vector<std::string> models(bool any_state);
    // Records the models of `snap`'s pools, any state, as seen now (under mu_).
    void remember_models(const routing::membership::MembershipSnapshot& snap);
    struct Built {
        std::shared_ptr<const routing::membership::MembershipSnapshot> snapshot;
        routing::selection::RouteTable table;
        std::unordered_map<std::string, std::string> peer_addr;  // member -> peer listener
        uint64_t ejections = 0;
        // The pools ejected when it was built: it is rebuilt once one of them is not any more.
        std::vector<std::string> ejected;
        TimePoint built_at{};
        std::shared_ptr<const PlannerConfig> config;  // The settings it was built and plans with.
    };

    std::shared_ptr<const Built> current();
    // Reports to the detector only a pool of the latest table: a report arriving after the pool
    // left it (its member died or left) re-created its entry, which no rebuild removed again,
    // and it counted in the max_ejection_percent cap for good.
    // `check`: the outcome of a /readyz check of the pool's site, not of a request to it.
    void report_known(const std::string& pool, bool ok, bool check);
    std::shared_ptr<const Built> rebuild(
        std::shared_ptr<const routing::membership::MembershipSnapshot> snap);
    VersionChoice version_for(const Built& b, std::string_view model, std::string_view pin,
                              std::mt19937_64& rng, routing::selection::RouteChoice* choice);

    Clock& clock_;
    SnapshotSource snapshots_;
    RolloutBook& rollouts_;
    Metrics* metrics_;
    routing::health::OutlierDetector outliers_;

    // Held while a table is rebuilt (a new snapshot, or every rebuild_interval): one sort per
    // model, then the swap; plans between rebuilds take it only to copy the pointer, reports
    // to check their pool is known (so no rebuild removes it between the check and the report).
    std::mutex mu_;
    std::shared_ptr<const PlannerConfig> config_;  // Under mu_.
    std::shared_ptr<const Built> built_;
    std::set<std::string> known_pools_;  // Registered with the detector (under mu_).
    // When each pool of known_pools_ last failed (a forwarded request, or a /readyz check of
    // its site), for those with no success since (under mu_). Such a pool, not ejected, is
    // degraded (the degraded penalty) in the tables built within one outlier interval of that
    // failure: a pool failing below the ejection threshold gives way to the healthy pools within
    // the penalty of its cost, rather than taking its full share until the Nth failure in a row
    // ejects it. A request's success lifts it, and so does the interval passing without another
    // failure (the penalty may keep requests away, so no success might come); a passing /readyz
    // check lifts it only when no request failed (a site slow to answer one check was kept
    // from its traffic for the whole interval).
    struct Failed {
        TimePoint at{};
        bool request = false;  // Some failure since the last success was a request's.
    };
    std::unordered_map<std::string, Failed> failed_;
    // The life (MemberView::life) of each member whose pools are in known_pools_, as last
    // rebuilt from (under mu_): a new one starts its pools' outlier records afresh.
    std::unordered_map<std::string, uint64_t> lives_;
    // When each model was last seen in some member's pools (under mu_): a site that left for a
    // restart is dropped from the member list within a minute, long before its models load
    // again, and its models must stay known (a 503 to retry, not a 404) meanwhile.
    std::unordered_map<std::string, TimePoint> seen_models_;
};

}  // namespace edge::daemon::cluster
