#include "daemon/cluster/admin_views.h"

#include <boost/json.hpp>

#include <algorithm>
#include <cstdio>

#include "common/json_text.h"

namespace edge::daemon::cluster {

namespace json = boost::json;
namespace sel = routing::selection;
namespace membership = routing::membership;

namespace {

std::string fmt(double v, int digits = 1) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
}

double ms(double seconds) { return seconds * 1e3; }

const membership::MemberView* local_member(const membership::MembershipSnapshot& snap) {
    return snap.find(snap.local_name);
}

std::string pool_rollout(const std::vector<RolloutIntent>& rollouts, const std::string& model) {
    for (const RolloutIntent& r : rollouts) {
        if (r.model == model) {
            return r.version;
        }
    }
    return "";
}

}  // namespace

std::string text_table(const std::vector<std::vector<std::string>>& rows) {
    std::vector<size_t> width;
    for (const auto& row : rows) {
        if (width.size() < row.size()) {
            width.resize(row.size(), 0);
        }
        for (size_t i = 0; i < row.size(); ++i) {
            width[i] = std::max(width[i], row[i].size());
        }
    }
    std::string out;
    for (const auto& row : rows) {
        std::string line;
        for (size_t i = 0; i < row.size(); ++i) {
            line += row[i];
            if (i + 1 < row.size()) {
                line.append(width[i] - row[i].size() + 2, ' ');
            }
        }
        out += line + "\n";
    }
    return out;
}

std::optional<sel::CostTerms> member_rtt(const membership::MembershipSnapshot& snap,
                                         const membership::MemberView& m,
                                         const sel::CostConfig& cost) {
    sel::CostInput in;
    in.is_local = m.is_local || m.name == snap.local_name;
    in.local_coord = snap.local_coord;
    in.remote_coord = m.coord;
    const membership::MemberView* local = local_member(snap);
    const bool positions = local != nullptr && local->site != nullptr && m.site != nullptr;
    if (positions) {
        in.local_lat = local->site->latitude;
        in.local_lon = local->site->longitude;
        in.remote_lat = m.site->latitude;
        in.remote_lon = m.site->longitude;
    }
    in.capacity = 1;
    const sel::CostTerms terms = sel::compute_cost(in, cost);
    if (terms.rtt_source == sel::RttSource::kGreatCircle && !positions) {
        return std::nullopt;  // A distance to (0, 0): a member whose state has not come yet.
    }
    return terms;
}

std::string members_json(const membership::MembershipSnapshot& snap,
                         const sel::CostConfig& cost) {
    json::object root;
    root["local"] = snap.local_name;
    json::array members;
    for (const membership::MemberView& m : snap.members) {
        json::object o;
        o["name"] = m.name;
        o["addr"] = m.addr;
        o["state"] = std::string(membership::node_state_name(m.state));
        o["incarnation"] = m.incarnation;
        o["local"] = m.is_local || m.name == snap.local_name;
        if (const std::optional<sel::CostTerms> rtt = member_rtt(snap, m, cost)) {
            o["rtt_ms"] = ms(rtt->rtt_s);
            o["rtt_source"] = std::string(sel::rtt_source_name(rtt->rtt_source));
        } else {
            o["rtt_ms"] = nullptr;
            o["rtt_source"] = "unknown";
        }
        if (m.coord) {
            o["coord_error"] = m.coord->error;
        }
        if (m.site) {
            o["site_id"] = m.site->site_id;
            o["region"] = m.site->region;
            o["latitude"] = m.site->latitude;
            o["longitude"] = m.site->longitude;
            o["admin_addr"] = m.site->admin_addr;
            o["peer_addr"] = m.site->peer_addr;
            o["pools"] = m.site->pools.size();
        }
        members.push_back(std::move(o));
    }
    root["members"] = std::move(members);
    return json_text(root) + "\n";
}

std::string members_text(const membership::MembershipSnapshot& snap,
                         const sel::CostConfig& cost) {
    std::vector<std::vector<std::string>> rows{
        {"NAME", "STATE", "GOSSIP", "REGION", "PEER", "ADMIN", "POOLS", "RTT_MS", "RTT_FROM"}};
    for (const membership::MemberView& m : snap.members) {
        const std::optional<sel::CostTerms> rtt = member_rtt(snap, m, cost);
        std::string name = m.name + (m.is_local || m.name == snap.local_name ? " *" : "");
        rows.push_back({name, std::string(membership::node_state_name(m.state)), m.addr,
                        m.site ? m.site->region : "?", m.site ? m.site->peer_addr : "?",
                        m.site ? m.site->admin_addr : "?",
                        m.site ? std::to_string(m.site->pools.size()) : "?",
                        rtt ? fmt(ms(rtt->rtt_s), 2) : "?",
                        rtt ? std::string(sel::rtt_source_name(rtt->rtt_source)) : "unknown"});
    }
    return text_table(rows);
}

std::string pools_json(const sel::RouteTable& table, const membership::MembershipSnapshot& snap,
                       const std::vector<RolloutIntent>& rollouts) {
    json::array pools;
    for (const membership::MemberView& m : snap.members) {
        if (!m.site) {
            continue;
        }
        for (const membership::PoolInfo& p : m.site->pools) {
            json::object o;
            o["member"] = m.name;
            o["site_id"] = m.site->site_id;
            o["member_state"] = std::string(membership::node_state_name(m.state));
            o["model"] = p.model;
            o["version"] = p.version_digest;
            o["target_version"] = pool_rollout(rollouts, p.model);
            o["state"] = std::string(membership::pool_state_name(p.state));
            o["capacity"] = p.capacity;
            o["queue_depth"] = p.load.queue_depth;
            o["running"] = p.load.running;
            o["kv_use"] = p.load.kv_use;
            o["tokens_per_s"] = p.load.tokens_per_s;
            o["prefill_tokens_per_s"] = p.load.prefill_tokens_per_s;  // 0: not advertised
            o["max_queue"] = p.load.max_queue;                        // 0: not advertised
            if (const sel::ModelPools* mp = table.find(p.model)) {
                for (const sel::RouteCandidate& c : mp->candidates) {
                    if (c.member == m.name) {
                        o["cost_ms"] = ms(c.cost.total_s);
                        o["ejected"] = c.health == sel::PoolHealth::kEjected;
                        o["saturated"] = c.cost.saturated;
                    }
                }
            }
            pools.push_back(std::move(o));
        }
    }
    json::object root;
    root["local"] = snap.local_name;
    root["pools"] = std::move(pools);
    return json_text(root) + "\n";
}

std::string pools_text(const sel::RouteTable& table, const membership::MembershipSnapshot& snap,
                       const std::vector<RolloutIntent>& rollouts) {
    std::vector<std::vector<std::string>> rows{{"SITE", "MODEL", "VERSION", "TARGET", "STATE",
                                                "CAP", "QUEUE", "MAXQ", "RUN", "KV", "TOK/S",
                                                "PREFILL/S", "COST_MS", "HEALTH"}};
    for (const membership::MemberView& m : snap.members) {
        if (!m.site) {
            continue;
        }
        for (const membership::PoolInfo& p : m.site->pools) {
            std::string cost = "-";
            std::string health = std::string(membership::node_state_name(m.state));
            if (const sel::ModelPools* mp = table.find(p.model)) {
                for (const sel::RouteCandidate& c : mp->candidates) {
                    if (c.member == m.name) {
                        cost = fmt(ms(c.cost.total_s), 2);
                        if (c.health == sel::PoolHealth::kEjected) {
                            health += ",ejected";
                        }
                        if (c.cost.saturated) {
                            health += ",saturated";
                        }
                    }
                }
            }
            const std::string target = pool_rollout(rollouts, p.model);
            rows.push_back({m.site->site_id, p.model, p.version_digest.substr(0, 12),
                            target.empty() ? "-" : (target == p.version_digest ? "yes" : "no"),
                            std::string(membership::pool_state_name(p.state)),
                            std::to_string(p.capacity), std::to_string(p.load.queue_depth),
                            p.load.max_queue > 0 ? std::to_string(p.load.max_queue) : "-",
                            std::to_string(p.load.running), fmt(p.load.kv_use, 2),
                            fmt(p.load.tokens_per_s, 0),
                            p.load.prefill_tokens_per_s > 0.0 ? fmt(p.load.prefill_tokens_per_s, 0)
                                                              : "-",
                            cost, health});
        }
    }
    return text_table(rows);
}

std::string route_json(const sel::RouteDecision& d, const VersionChoice& v) {
    std::string out = sel::route_decision_json(d);
    // Splice two fields in front of the object's closing brace.
    out.pop_back();
    out += ",\"version_filter\":" + json_text(json::value(v.version)) +
           ",\"version_source\":" + json_text(json::value(v.source)) + "}\n";
    return out;
}

std::string route_text(const sel::RouteDecision& d, const VersionChoice& v) {
    std::string out = "model " + d.model + "  version " +
                      (v.version.empty() ? std::string("any") : v.version) + " (" + v.source +
                      ")\n";
    std::vector<std::vector<std::string>> rows{{"SITE", "VERSION", "STATE", "RTT_MS", "FROM",
                                                "QUEUE_MS", "PREFILL_MS", "KV_MS", "PENALTY_MS",
                                                "TOTAL_MS", "VERDICT"}};
    std::vector<const sel::CandidateReport*> sorted;
    for (const sel::CandidateReport& r : d.candidates) {
        sorted.push_back(&r);
    }
    std::stable_sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) {
        return a->candidate.cost.total_s < b->candidate.cost.total_s;
    });
    for (const sel::CandidateReport* r : sorted) {
        const sel::RouteCandidate& c = r->candidate;
        const sel::CostTerms& t = c.cost;
        rows.push_back({c.site_id + (c.is_local ? " *" : ""), c.version_digest.substr(0, 12),
                        std::string(membership::pool_state_name(c.state)), fmt(ms(t.rtt_s), 2),
                        std::string(sel::rtt_source_name(t.rtt_source)), fmt(ms(t.queue_s), 2),
                        fmt(ms(t.prefill_s), 2), fmt(ms(t.kv_s), 2), fmt(ms(t.penalty_s), 2),
                        fmt(ms(t.total_s), 2), r->verdict});
    }
    out += text_table(rows);
    for (const std::string& reason : d.reasons) {
        out += "- " + reason + "\n";
    }
    return out;
}

}  // namespace edge::daemon::cluster
