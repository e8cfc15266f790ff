#pragma once

// The cluster's admin views as JSON (for programs) and as aligned text tables (for
// `edgeserve members|pools|route`): members with state, address and estimated RTT; every pool
// with version, state, capacity, load and health; one routing decision with each candidate's
// cost terms. Pure functions of their arguments; safe from any thread.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/cluster/planner.h"
#include "daemon/cluster/rollout.h"
#include "routing/health/outlier_detector.h"
#include "routing/membership/snapshot.h"
#include "routing/selection/cost.h"
#include "routing/selection/route_table.h"
#include "routing/selection/selector.h"

namespace edge::daemon::cluster {

// Estimated RTT from the local member to `m`, seconds, and where it came from; none while it
// would be a great-circle distance and a site state (its position, or ours) has not come yet.
std::optional<routing::selection::CostTerms> member_rtt(
    const routing::membership::MembershipSnapshot& snap, const routing::membership::MemberView& m,
    const routing::selection::CostConfig& cost);

std::string members_json(const routing::membership::MembershipSnapshot& snap,
                         const routing::selection::CostConfig& cost);
std::string members_text(const routing::membership::MembershipSnapshot& snap,
                         const routing::selection::CostConfig& cost);

std::string pools_json(const routing::selection::RouteTable& table,
                       const routing::membership::MembershipSnapshot& snap,
                       const std::vector<RolloutIntent>& rollouts);
std::string pools_text(const routing::selection::RouteTable& table,
                       const routing::membership::MembershipSnapshot& snap,
                       const std::vector<RolloutIntent>& rollouts);

// route_decision_json plus "version_filter" and "version_source".
std::string route_json(const routing::selection::RouteDecision& d, const VersionChoice& v);
std::string route_text(const routing::selection::RouteDecision& d, const VersionChoice& v);

// Renders rows as columns padded to the widest cell, two spaces apart; the first row is the
// header.
std::string text_table(const std::vector<std::vector<std::string>>& rows);

}  // namespace edge::daemon::cluster
