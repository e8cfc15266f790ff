#include "routing/selection/route_table.h"

namespace edge::routing::selection {

const std::vector<RouteCandidate>* RouteTable::find(std::string_view model) const {
    auto it = by_model.find(std::string(model));
    return it == by_model.end() ? nullptr : &it->second;
}

size_t RouteTable::size() const {
    size_t n = 0;
    for (const auto& [model, list] : by_model) {
        n += list.size();
    }
    return n;
}

RouteTable build_route_table(const membership::MembershipSnapshot& snapshot,
                             const CostConfig& config, const PoolHealthFn& health) {
    RouteTable table;
    table.local_member = snapshot.local_name;
    const membership::MemberView* local = snapshot.find(snapshot.local_name);
    const membership::SiteState* local_site =
        local != nullptr && local->site ? local->site.get() : nullptr;
    for (const membership::MemberView& m : snapshot.members) {
        if (!m.site) {
            continue;
        }
        if (m.state != membership::NodeState::kAlive &&
            m.state != membership::NodeState::kSuspect) {
            continue;
        }
        const bool is_local = m.is_local || m.name == snapshot.local_name;
        for (const membership::PoolInfo& pool : m.site->pools) {
            RouteCandidate c;
            c.member = m.name;
            c.site_id = m.site->site_id;
            c.model = pool.model;
            c.version_digest = pool.version_digest;
            c.state = pool.state;
            c.member_state = m.state;
            c.is_local = is_local;
            c.health = health ? health(m.name, pool.model) : PoolHealth::kHealthy;

            CostInput in;
            in.is_local = is_local;
            in.local_coord = snapshot.local_coord;
            in.remote_coord = m.coord;
            if (local_site != nullptr) {
                in.local_lat = local_site->latitude;
                in.local_lon = local_site->longitude;
            }
            in.remote_lat = m.site->latitude;
            in.remote_lon = m.site->longitude;
            in.capacity = pool.capacity;
            in.queue_depth = pool.load.queue_depth;
            in.running = pool.load.running;
            in.kv_use = pool.load.kv_use;
            in.decode_tokens_per_s = pool.load.tokens_per_s;
            in.suspect = m.state == membership::NodeState::kSuspect;
            in.ejected = c.health == PoolHealth::kEjected;
            in.degraded = c.health == PoolHealth::kDegraded;
            c.cost = compute_cost(in, config);
            table.by_model[pool.model].push_back(std::move(c));
        }
    }
    return table;
}

}  // namespace edge::routing::selection
