// The /admin/* views of a Cluster (cluster_impl.h): members, pools, route, rollouts, their
// query parameters checked, and POST /admin/rollout sending a rollout intent through gossip,
// answered once this site's book took it or refused it.

#include <algorithm>
#include <boost/json.hpp>
#include <initializer_list>
#include <map>
#include <vector>

#include "common/json_text.h"
#include "common/log.h"
#include "daemon/cluster/admin_views.h"
#include "daemon/cluster/cluster_impl.h"

namespace edge::daemon::cluster {

namespace {

// An /admin/* query: its parameters, and the first one given twice ("" when none).
struct AdminQuery {
    std::map<std::string, std::string> params;
    std::string repeated;
};

AdminQuery parse_query(std::string_view q) {
    AdminQuery out;
    while (!q.empty()) {
        const size_t amp = q.find('&');
        std::string_view part = q.substr(0, amp);
        q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
        if (part.empty()) {
            continue;  // "a=1&&b=2", a trailing '&': nothing asked.
        }
        const size_t eq = part.find('=');
        std::string name = tls::percent_decode(part.substr(0, eq), true);
        std::string value =
            eq == std::string_view::npos ? "" : tls::percent_decode(part.substr(eq + 1), true);
        if (!out.params.emplace(name, std::move(value)).second && out.repeated.empty()) {
            out.repeated = std::move(name);
        }
    }
    return out;
}

// A parameter name from the request, for an error message: printable ASCII, bounded.
std::string quoted_param(std::string_view name) {
    std::string out = "'";
    for (const char c : name.substr(0, 64)) {
        out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
    }
    return out + (name.size() > 64 ? "...'" : "'");
}

AdminReply json_error(int status, const std::string& message) {
    boost::json::object o;
    o["error"] = message;
    return {status, "application/json", json_text(o) + "\n"};
}

}  // namespace

std::optional<AdminReply> Cluster::Impl::handle_admin(std::string_view method,
                                                      std::string_view target) {
    const size_t qpos = target.find('?');
    const std::string_view path = target.substr(0, qpos);
    const AdminQuery parsed =
        parse_query(qpos == std::string_view::npos ? std::string_view() : target.substr(qpos + 1));
    const std::map<std::string, std::string>& query = parsed.params;
    const bool text = query.count("format") && query.at("format") == "text";
    const std::string_view ctype = text ? "text/plain; charset=utf-8" : "application/json";
    // A parameter a view does not take is refused, not ignored: `dry_run=1` on a rollout
    // made a real, cluster-wide one. So is one given twice (which of them counts?) and a
    // format other than text or json.
    auto check_params =
        [&](std::initializer_list<std::string_view> known) -> std::optional<AdminReply> {
        if (!parsed.repeated.empty()) {
            return json_error(400, std::string(path) + ": parameter " +
                                       quoted_param(parsed.repeated) + " given more than once");
        }
        for (const auto& [name, value] : query) {
            if (std::find(known.begin(), known.end(), name) == known.end()) {
                std::string takes;
                for (std::string_view k : known) {
                    takes += (takes.empty() ? "" : ", ") + std::string(k);
                }
                return json_error(400, std::string(path) + ": unknown parameter " +
                                           quoted_param(name) + " (it takes " +
                                           (takes.empty() ? "none" : takes) + ")");
            }
            if (name == "format" && value != "text" && value != "json") {
                return json_error(400, std::string(path) + ": format must be text or json");
            }
        }
        return std::nullopt;
    };
    auto get_only =
        [&](std::initializer_list<std::string_view> known) -> std::optional<AdminReply> {
        if (method != "GET" && method != "HEAD") {
            return json_error(405, std::string(path) + " takes GET");
        }
        return check_params(known);
    };
    auto snap = service_->snapshot();
    if (path == "/admin/members") {
        if (auto e = get_only({"format"})) return e;
        const routing::selection::CostConfig cost = planner_->config().cost;
        return AdminReply{200, std::string(ctype),
                          text ? members_text(*snap, cost) : members_json(*snap, cost)};
    }
    if (path == "/admin/pools") {
        if (auto e = get_only({"format"})) return e;
        auto table = planner_->table();
        auto rollouts = rollouts_.all();
        return AdminReply{
            200, std::string(ctype),
            text ? pools_text(*table, *snap, rollouts) : pools_json(*table, *snap, rollouts)};
    }
    if (path == "/admin/route") {
        if (auto e = get_only({"model", "version", "format"})) return e;
        auto model = query.find("model");
        if (model == query.end() || model->second.empty()) {
            return json_error(400, "/admin/route needs ?model=NAME");
        }
        auto version = query.find("version");
        VersionChoice v;
        routing::selection::RouteDecision d =
            planner_->explain(model->second, version == query.end() ? "" : version->second, &v);
        return AdminReply{200, std::string(ctype), text ? route_text(d, v) : route_json(d, v)};
    }
    if (path == "/admin/rollout") {
        if (method != "POST") {
            return json_error(405, "/admin/rollout takes POST ?model=NAME&version=DIGEST");
        }
        // Its answer is JSON only: `format` is no parameter of it either.
        if (auto e = check_params({"model", "version"})) return e;
        auto model = query.find("model");
        auto version = query.find("version");
        if (model == query.end() || version == query.end() || model->second.empty() ||
            version->second.empty()) {
            return json_error(400, "/admin/rollout needs ?model=NAME&version=DIGEST");
        }
        if (Status s = check_rollout(model->second, version->second); !s.ok()) {
            return json_error(400, s.message());
        }
        // Answered once the gossip strand has stamped the intent and this site's book has
        // taken it (or refused it): a 200 sent before then claimed a change that a full
        // book or a failed send never made.
        AdminReply reply;
        reply.deferred = [self = shared_from_this(), model = model->second,
                          version = version->second](std::function<void(AdminReply)> answer) {
            if (Status s = self->send_rollout(model, version, answer); !s.ok()) {
                answer(json_error(400, s.message()));  // Checked above: not expected.
            }
        };
        return reply;
    }
    if (path == "/admin/rollouts") {
        if (auto e = get_only({"format"})) return e;
        boost::json::array arr;
        std::vector<std::vector<std::string>> rows{{"MODEL", "TARGET_VERSION", "LAMPORT"}};
        for (const RolloutIntent& r : rollouts_.all()) {
            boost::json::object o;
            o["model"] = r.model;
            o["version"] = r.version;
            o["ltime"] = r.ltime;
            arr.push_back(std::move(o));
            rows.push_back({r.model, r.version, std::to_string(r.ltime)});
        }
        boost::json::object root;
        root["rollouts"] = std::move(arr);
        return AdminReply{200, std::string(ctype),
                          text ? text_table(rows) : json_text(root) + "\n"};
    }
    return std::nullopt;
}

Status Cluster::Impl::check_rollout(const std::string& model, const std::string& version) {
    if (model.empty() || version.empty() || model.size() > 255 || version.size() > 255 ||
        model.find('\n') != std::string::npos || version.find('\n') != std::string::npos) {
        return invalid_argument_error(
            "rollout: model and version must be 1..255 bytes "
            "without newlines");
    }
    return ok_status();
}

Status Cluster::Impl::check_clock_synced(const membership::Memberlist& ml) const {
    // A lone site restarted with a snapshot of the cluster it was in is not a new cluster: its
    // restored clock may be behind what the others reached meanwhile, so it waits to rejoin.
    if (ml.event_clock_synced() ||
        (gossip_.join.empty() && ml.num_live() == 1 && ml.snapshot_members() == 0)) {
        return ok_status();
    }
    return unavailable_error(
        "this site has not yet exchanged state with another member (it has just started, "
        "or neither its gossip.join seeds nor the members its gossip.snapshot_file names "
        "have answered), so its Lamport clock may be behind "
        "the cluster's and the other sites would drop the intent as older than the one they "
        "hold; retry once it has joined (`edgeserve members` lists the members it knows), "
        "or send it through another site");
}

Status Cluster::Impl::send_rollout(const std::string& model, const std::string& version,
                                   std::function<void(AdminReply)> answer) {
    EDGE_RETURN_IF_ERROR(check_rollout(model, version));
    auto payload = encode_rollout(model, version);
    service_->post([self = shared_from_this(), model, version, payload = std::move(payload),
                    answer = std::move(answer)](membership::Memberlist& ml) mutable {
        // The event reaches this site's book within send_user_event (same strand).
        self->local_rollout_.reset();
        Status s = self->check_clock_synced(ml);
        if (s.ok()) {
            s = ml.send_user_event(std::string(kRolloutEvent), std::move(payload));
        }
        const std::optional<RolloutBook::Applied> applied = self->local_rollout_;
        self->local_rollout_.reset();
        if (!s.ok()) {
            log::warn("rollout_send_failed", {{"error", s.message()}});
        }
        if (!answer) {
            return;
        }
        if (!s.ok()) {
            answer(json_error(s.code() == StatusCode::kInvalidArgument ? 400 : 503,
                              "rollout not sent: " + s.message()));
            return;
        }
        const std::optional<RolloutIntent> held = self->rollouts_.target(model);
        if (applied == RolloutBook::Applied::kTarget && held && held->version == version) {
            boost::json::object o;
            o["model"] = model;
            o["version"] = version;
            o["ltime"] = held->ltime;
            o["sent"] = true;
            answer(AdminReply{200, "application/json", json_text(o) + "\n"});
        } else if (applied == RolloutBook::Applied::kFull) {
            answer(json_error(507, "rollout refused: the rollout book holds targets for " +
                                       std::to_string(RolloutBook::kMaxModels) +
                                       " models already, and not for '" + model + "'"));
        } else {
            // Not expected: the event's time passes every time this site's clock witnessed,
            // its book's intents included; kept so that a change there is reported, not
            // answered 200.
            answer(json_error(409, "rollout not taken: this site holds " +
                                       (held ? "version '" + held->version + "' at Lamport time " +
                                                   std::to_string(held->ltime)
                                             : std::string("no target")) +
                                       " for '" + model + "'"));
        }
    });
    return ok_status();
}

}  // namespace edge::daemon::cluster
