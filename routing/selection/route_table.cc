#include "routing/selection/route_table.h"

#include <algorithm>
#include <cstddef>
#include <unordered_map>

#include "common/check.h"

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
    it->second.candidates.push_back(std::move(c));
    sealed_ = false;
}

void RouteTable::seal() {
    for (auto& [model, m] : by_model) {
        // Sorted by total cost once, equal costs in insertion order (a sorted insert per add
        // was quadratic: 8 peers of 4096 pools took 207 ms to build).
        const size_t n = m.candidates.size();
        std::vector<uint32_t> order(n);
        for (size_t i = 0; i < n; ++i) {
            order[i] = static_cast<uint32_t>(i);
        }
        const auto& candidates = m.candidates;  // Named: clang before 16 cannot capture `m`.
        std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
            return candidates[a].cost.total_s < candidates[b].cost.total_s;
        });
        m.versions.clear();
        std::unordered_map<std::string_view, uint32_t> version_of;
        std::vector<uint32_t> version(n);
        for (size_t i = 0; i < n; ++i) {  // Versions numbered in insertion order.
            const std::string& digest = m.candidates[i].version_digest;
            auto [at, fresh] = version_of.emplace(digest, static_cast<uint32_t>(m.versions.size()));
            if (fresh) {
                m.versions.push_back(digest);
            }
            version[i] = at->second;
        }
        m.index = order;
        m.total_s.resize(n);
        m.flags.resize(n);
        m.version.resize(n);
        m.local_positions.clear();
        for (size_t pos = 0; pos < n; ++pos) {
            const RouteCandidate& c = m.candidates[order[pos]];
            m.total_s[pos] = c.cost.total_s;
            m.version[pos] = version[order[pos]];
            // An unreachable pool is listed but, to choose(), not serving.
            const bool serving = c.state == membership::PoolState::kServing && c.reachable;
            m.flags[pos] = static_cast<uint8_t>((serving ? ModelPools::kServing : 0) |
                                                (c.cost.saturated ? ModelPools::kSaturated : 0) |
                                                (c.is_local ? ModelPools::kLocal : 0));
            if (c.is_local) {
                m.local_positions.push_back(static_cast<uint32_t>(pos));
            }
        }
    }
    sealed_ = true;
}

const ModelPools* RouteTable::find(std::string_view model) const {
    EDGE_CHECK(sealed_, "route table read before seal()");
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
                             const CostConfig& config, const PoolHealthFn& health,
                             bool need_peer_addr) {
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
            c.reachable = is_local || !need_peer_addr || !m.site->peer_addr.empty();
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
            in.prefill_tokens_per_s = pool.load.prefill_tokens_per_s;
            in.max_queue = pool.load.max_queue;
            in.suspect = m.state == membership::NodeState::kSuspect;
            in.ejected = c.health == PoolHealth::kEjected;
            in.degraded = c.health == PoolHealth::kDegraded;
            c.cost = compute_cost(in, config);
            table.add(std::move(c));
        }
    }
    table.seal();
    return table;
}

}  // namespace edge::routing::selection
