#include "routing/selection/route_table.h"

#include <algorithm>
#include <cstddef>

namespace edge::routing::selection {

int64_t ModelPools::find_version(std::string_view digest) const {
    for (size_t i = 0; i < versions.size(); ++i) {
        if (versions[i] == digest) {
            return static_cast<int64_t>(i);
        }
    }
    return -1;
}

void RouteTable::add(RouteCandidate c) {
    auto it = by_model.find(std::string_view(c.model));
    if (it == by_model.end()) {
        it = by_model.emplace(c.model, ModelPools{}).first;
    }
    ModelPools& m = it->second;
    int64_t v = m.find_version(c.version_digest);
    if (v < 0) {
        v = static_cast<int64_t>(m.versions.size());
        m.versions.push_back(c.version_digest);
    }
    // Sorted insert after any equal cost, so equal costs keep insertion order.
    const auto pos = static_cast<size_t>(
        std::upper_bound(m.total_s.begin(), m.total_s.end(), c.cost.total_s) - m.total_s.begin());
    const auto at = [pos](auto& vec) { return vec.begin() + static_cast<std::ptrdiff_t>(pos); };
    m.index.insert(at(m.index), static_cast<uint32_t>(m.candidates.size()));
    m.version.insert(at(m.version), static_cast<uint32_t>(v));
    m.total_s.insert(at(m.total_s), c.cost.total_s);
    m.flags.insert(at(m.flags),
                   static_cast<uint8_t>(
                       (c.state == membership::PoolState::kServing ? ModelPools::kServing : 0) |
                       (c.cost.saturated ? ModelPools::kSaturated : 0) |
                       (c.is_local ? ModelPools::kLocal : 0)));
    m.candidates.push_back(std::move(c));
    m.local_positions.clear();
    for (size_t i = 0; i < m.flags.size(); ++i) {
        if ((m.flags[i] & ModelPools::kLocal) != 0) {
            m.local_positions.push_back(static_cast<uint32_t>(i));
        }
    }
}

const ModelPools* RouteTable::find(std::string_view model) const {
    auto it = by_model.find(model);
    return it == by_model.end() ? nullptr : &it->second;
}

size_t RouteTable::size() const {
    size_t n = 0;
    for (const auto& [model, pools] : by_model) {
        n += pools.candidates.size();
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
            table.add(std::move(c));
        }
    }
    return table;
}

}  // namespace edge::routing::selection
