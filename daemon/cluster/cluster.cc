#include "daemon/cluster/cluster.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <initializer_list>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <vector>

#include "common/file.h"
#include "common/json_text.h"
#include "common/log.h"
#include "daemon/cluster/admin_views.h"
#include "daemon/metrics.h"

namespace edge::daemon::cluster {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace membership = routing::membership;
using tcp = net::ip::tcp;
using boost::system::error_code;
constexpr auto kTuple = net::as_tuple(net::use_awaitable);

Result<membership::MembershipConfig> membership_config(const Config& config) {
    const GossipConfig& g = config.gossip;
    membership::MembershipConfig mc = g.preset == "wan"     ? membership::wan_profile()
                                      : g.preset == "local" ? membership::local_profile()
                                                            : membership::lan_profile();
    mc.name = config.site.id;
    mc.advertise_addr = g.advertise_address;
    mc.label = g.label;
    if (g.probe_interval.count() > 0) mc.probe_interval = g.probe_interval;
    if (g.probe_timeout.count() > 0) mc.probe_timeout = g.probe_timeout;
    if (g.gossip_interval.count() > 0) mc.gossip_interval = g.gossip_interval;
    if (g.push_pull_interval.count() > 0) mc.push_pull_interval = g.push_pull_interval;
    if (g.suspicion_mult > 0) mc.suspicion_mult = g.suspicion_mult;
    if (g.join_retry_interval.count() > 0) mc.join_retry_interval = g.join_retry_interval;
    if (g.max_inbound_streams > 0) {
        mc.max_inbound_streams = static_cast<size_t>(g.max_inbound_streams);
    }
    if (g.max_members > 0) mc.max_members = static_cast<size_t>(g.max_members);
    if (g.max_fetches_in_flight > 0) mc.max_fetches_in_flight = g.max_fetches_in_flight;
    mc.seed = std::hash<std::string>{}(config.site.id) ^ std::random_device{}();
    if (mc.probe_timeout >= mc.probe_interval) {
        // Named by the config's keys; either may be the preset's.
        const auto ms = [](Duration d) {
            return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
        };
        return invalid_argument_error(
            config.source + ": gossip.probe_timeout_ms (" + ms(mc.probe_timeout) +
            ") must be less than gossip.probe_interval_ms (" + ms(mc.probe_interval) +
            ", with gossip.preset " + g.preset +
            "): the next probe ends the round, leaving no time for indirect and TCP probes");
    }
    // An empty advertise address is filled in from the bound socket by MembershipService.
    membership::MembershipConfig check = mc;
    if (check.advertise_addr.empty()) {
        check.advertise_addr = "127.0.0.1:1";
    }
    if (Status s = check.validate(); !s.ok()) {
        return invalid_argument_error(config.source + ": gossip: " + s.message());
    }
    return mc;
}

Result<membership::Keyring> load_keyring(const GossipConfig& gossip) {
    std::vector<membership::GossipKey> keys;
    for (const std::string& hex : gossip.keys) {
        EDGE_ASSIGN_OR_RETURN(membership::GossipKey k, membership::parse_gossip_key(hex));
        keys.push_back(k);
    }
    if (!gossip.keyring_file.empty()) {
        // Bounded and from a regular file only: a FIFO there would hang the reload.
        Result<std::string> text = read_small_file(gossip.keyring_file, uint64_t{1} << 20);
        if (text.status().code() == StatusCode::kNotFound) {
            return not_found_error("gossip.keyring_file: cannot open '" + gossip.keyring_file +
                                   "'");
        }
        if (!text.ok()) {
            return text.status().with_context("gossip.keyring_file");
        }
        std::istringstream in(*text);
        std::string line;
        int n = 0;
        while (std::getline(in, line)) {
            ++n;
            const size_t b = line.find_first_not_of(" \t\r");
            if (b == std::string::npos || line[b] == '#') {
                continue;
            }
            const size_t e = line.find_last_not_of(" \t\r");
            Result<membership::GossipKey> k =
                membership::parse_gossip_key(line.substr(b, e - b + 1));
            if (!k.ok()) {
                return invalid_argument_error(gossip.keyring_file + ":" + std::to_string(n) +
                                              ": expected 64 hex digits (an AES-256 key)");
            }
            if (std::find(keys.begin(), keys.end(), *k) == keys.end()) {
                keys.push_back(*k);
            }
        }
        if (keys.empty()) {
            // Encryption off by an emptied file would be silent: say so instead.
            return invalid_argument_error(
                gossip.keyring_file + ": no keys (one 64-hex-digit key per line); to run "
                "gossip unencrypted, remove gossip.keyring_file");
        }
    }
    Result<membership::Keyring> ring = membership::Keyring::create(std::move(keys));
    if (!ring.ok()) {
        return invalid_argument_error("gossip keys: " + ring.status().message());
    }
    return ring;
}

std::set<std::string> metric_sites(const membership::MembershipSnapshot& snap) {
    std::set<std::string> sites{snap.local_name};
    for (const membership::MemberView& m : snap.members) {
        if (m.state == membership::NodeState::kLeft) {
            continue;
        }
        sites.insert(m.name);
        if (m.site && !m.site->site_id.empty()) {
            sites.insert(m.site->site_id);
        }
    }
    return sites;
}

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

PlannerConfig planner_config(const RoutingConfig& routing) {
    PlannerConfig pc;
    pc.cost = routing.cost;
    pc.selection = routing.selection;
    pc.outlier = routing.outlier;
    pc.version_fallback = routing.version_fallback;
    return pc;
}

}  // namespace

class Cluster::Impl : public std::enable_shared_from_this<Cluster::Impl> {
public:
    Impl(net::io_context& io, engine::Generator& generator, Metrics* metrics, Clock& clock)
        : io_(io), strand_(net::make_strand(io)), publish_timer_(strand_),
          health_timer_(strand_), generator_(generator), metrics_(metrics), clock_(clock) {}

    membership::SiteState site_state() const {
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
        const std::vector<engine::ModelLoad> loads = generator_.load();
        for (const engine::ModelInfo& info : generator_.models()) {
            membership::PoolInfo p;
            p.model = info.name;
            p.version_digest = info.version;
            p.state = draining_.load() ? membership::PoolState::kDraining
                      : ready          ? membership::PoolState::kServing
                                       : membership::PoolState::kLoading;
            for (const engine::ModelLoad& l : loads) {
                if (l.name == info.name) {
                    p.capacity = l.capacity;
                    p.load.queue_depth = l.queue_depth;
                    p.load.running = l.running;
                    p.load.kv_use = l.kv_use;
                    p.load.tokens_per_s = l.decode_tokens_per_s;
                }
            }
            s.pools.push_back(std::move(p));
        }
        return s;
    }

    // On strand_: samples the site state and gossips it when it changed materially.
    void publish(bool force) {
        membership::SiteState s = site_state();
        const membership::MembershipConfig& mc = mconfig_;
        if (!force && last_published_ &&
            !membership::load_changed_materially(*last_published_, s, mc.load_change_fraction,
                                                 mc.load_change_abs)) {
            return;
        }
        last_published_ = s;
        service_->post([s = std::move(s)](membership::Memberlist& ml) mutable {
            ml.update_site_state(std::move(s));
        });
    }

    void update_metrics() {
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
        for (membership::NodeState st : {membership::NodeState::kAlive,
                                         membership::NodeState::kSuspect,
                                         membership::NodeState::kDead,
                                         membership::NodeState::kLeft}) {
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

    void arm_publish() {
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

    void arm_health() {
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

    void run_health_checks() {
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

    static net::awaitable<void> check_ready(std::shared_ptr<Impl> self, std::string member,
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
            log::debug("peer_not_ready", {{"member", member},
                                          {"admin", addr},
                                          {"answered", readiness == Readiness::kNotReady}});
        }
        self->planner_->report_active(member, readiness);
    }

    std::optional<AdminReply> handle_admin(std::string_view method, std::string_view target) {
        const size_t qpos = target.find('?');
        const std::string_view path = target.substr(0, qpos);
        const AdminQuery parsed = parse_query(
            qpos == std::string_view::npos ? std::string_view() : target.substr(qpos + 1));
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
            return AdminReply{200, std::string(ctype),
                              text ? pools_text(*table, *snap, rollouts)
                                   : pools_json(*table, *snap, rollouts)};
        }
        if (path == "/admin/route") {
            if (auto e = get_only({"model", "version", "format"})) return e;
            auto model = query.find("model");
            if (model == query.end() || model->second.empty()) {
                return json_error(400, "/admin/route needs ?model=NAME");
            }
            auto version = query.find("version");
            VersionChoice v;
            routing::selection::RouteDecision d = planner_->explain(
                model->second, version == query.end() ? "" : version->second, &v);
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

    static Status check_rollout(const std::string& model, const std::string& version) {
        if (model.empty() || version.empty() || model.size() > 255 || version.size() > 255 ||
            model.find('\n') != std::string::npos || version.find('\n') != std::string::npos) {
            return invalid_argument_error("rollout: model and version must be 1..255 bytes "
                                          "without newlines");
        }
        return ok_status();
    }

    // On the membership strand: whether this site's Lamport clock has caught up with the
    // cluster's. An intent stamped before then may carry a time below the intent every other
    // site holds for the model: each drops it as stale, and this site's book takes theirs at its
    // first sync, so the rollout is lost while it was answered as taken. A site with no seeds
    // that knows no other member is the whole cluster as far as it can tell.
    Status check_clock_synced(const membership::Memberlist& ml) const {
        if (ml.event_clock_synced() || (gossip_.join.empty() && ml.num_live() == 1)) {
            return ok_status();
        }
        return unavailable_error(
            "this site has not yet exchanged state with another member (it has just started, "
            "or its gossip.join seeds have not answered), so its Lamport clock may be behind "
            "the cluster's and the other sites would drop the intent as older than the one they "
            "hold; retry once it has joined (`edgeserve members` lists the members it knows), "
            "or send it through another site");
    }

    // Sends the intent on the membership strand; `answer`, when set, gets the admin reply: what
    // this site's book made of it, or why it was not sent.
    Status send_rollout(const std::string& model, const std::string& version,
                        std::function<void(AdminReply)> answer = nullptr) {
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
                answer(
                    json_error(409, "rollout not taken: this site holds " +
                                        (held ? "version '" + held->version + "' at Lamport time " +
                                                    std::to_string(held->ltime)
                                              : std::string("no target")) +
                                        " for '" + model + "'"));
            }
        });
        return ok_status();
    }

    net::io_context& io_;
    net::strand<net::io_context::executor_type> strand_;
    net::steady_timer publish_timer_;
    net::steady_timer health_timer_;
    engine::Generator& generator_;
    Metrics* metrics_;
    Clock& clock_;
    SiteConfig site_;
    GossipConfig gossip_;
    membership::MembershipConfig mconfig_;
    std::string admin_addr_;
    mutable std::mutex mu_;
    std::string peer_addr_;  // Under mu_.
    std::atomic<bool> draining_{false};
    std::atomic<bool> stopped_{false};
    bool started_ = false;
    std::optional<membership::SiteState> last_published_;  // On strand_.
    std::unique_ptr<membership::MembershipService> service_;
    std::unique_ptr<ClusterRoutePlanner> planner_;
    RolloutBook rollouts_;
    // What this site's book made of the rollout event it sent last (membership strand only).
    std::optional<RolloutBook::Applied> local_rollout_;
    std::map<std::string, Duration> peer_delay_;  // Testing only: site id -> delay.
    std::function<void(const std::string&)> on_site_dead_;  // Set before start().
    bool encrypted_ = false;                      // Started with gossip keys.
};

Cluster::Cluster(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Cluster::~Cluster() {
    if (impl_->started_ && !impl_->stopped_) {
        kill();
    }
}

Result<std::unique_ptr<Cluster>> Cluster::create(net::io_context& io, const Config& config,
                                                 engine::Generator& generator, Metrics* metrics,
                                                 Clock& clock, const std::string& admin_addr) {
    if (!config.gossip.enabled) {
        return failed_precondition_error("cluster: no `gossip` section in the config");
    }
    auto impl = std::make_shared<Impl>(io, generator, metrics, clock);
    impl->site_ = config.site;
    impl->gossip_ = config.gossip;
    impl->admin_addr_ = config.site.admin_address.empty() ? admin_addr : config.site.admin_address;
    impl->peer_addr_ = config.site.peer_address;
    for (const auto& [site, delay] : config.gossip.testing_peer_delay) {
        impl->peer_delay_[site] = delay;
    }
    EDGE_ASSIGN_OR_RETURN(impl->mconfig_, membership_config(config));
    EDGE_ASSIGN_OR_RETURN(membership::Keyring keyring, load_keyring(config.gossip));
    impl->encrypted_ = !keyring.empty();
    for (const auto& [model, version] : config.routing.target_versions) {
        (void)impl->rollouts_.apply({model, version, 0});  // The config's list is small.
    }
    EDGE_ASSIGN_OR_RETURN(impl->service_,
                          membership::MembershipService::create(
                              io, impl->mconfig_, std::move(keyring), impl->site_state(),
                              config.gossip.bind_address, config.gossip.port));

    Impl* raw = impl.get();
    impl->planner_ = std::make_unique<ClusterRoutePlanner>(
        planner_config(config.routing), clock, [raw] { return raw->service_->snapshot(); },
        impl->rollouts_, metrics);

    impl->service_->set_user_event_callback([raw](const membership::UserEventMsg& e) {
        if (e.name != kRolloutEvent) {
            return;
        }
        Result<RolloutIntent> intent = decode_rollout(e.payload, e.ltime);
        if (!intent.ok()) {
            log::warn("rollout_event_invalid", {{"error", intent.status().message()}});
            return;
        }
        const RolloutBook::Applied applied = raw->rollouts_.apply(*intent);
        raw->local_rollout_ = applied;
        switch (applied) {
            case RolloutBook::Applied::kTarget:
                log::info("rollout_target", {{"model", intent->model},
                                             {"version", intent->version},
                                             {"ltime", intent->ltime}});
                break;
            case RolloutBook::Applied::kFull:
                log::warn(
                    "rollout_event_refused",
                    {{"reason", "rollout targets are held for " +
                                    std::to_string(RolloutBook::kMaxModels) + " models already"},
                     {"ltime", intent->ltime}});
                break;
            case RolloutBook::Applied::kStale:
                break;
        }
    });
    impl->service_->set_event_callback([raw](const membership::MemberEvent& e) {
        // "change", not "event": a field named "event" would overwrite the event name.
        log::info("gossip_member", {{"change", std::string(membership::member_event_name(e.kind))},
                                    {"member", e.name},
                                    {"site", raw->site_.id}});
        if (e.kind == membership::MemberEventKind::kDead && raw->on_site_dead_) {
            raw->on_site_dead_(e.name);
        }
    });
    if (!impl->peer_delay_.empty()) {
        log::warn("testing_peer_delay", {{"detail", "gossip.testing_peer_delay_ms is set: "
                                                    "gossip packets are delayed on purpose"}});
        // Runs on the membership strand: map the address back to a member through the latest
        // snapshot (member names are site ids).
        impl->service_->set_packet_delay([raw](const std::string& addr) -> Duration {
            auto snap = raw->service_->snapshot();
            if (!snap) {
                return Duration::zero();
            }
            for (const membership::MemberView& m : snap->members) {
                if (m.addr == addr) {
                    auto it = raw->peer_delay_.find(m.name);
                    return it == raw->peer_delay_.end() ? Duration::zero() : it->second;
                }
            }
            return Duration::zero();
        });
    }
    return std::unique_ptr<Cluster>(new Cluster(std::move(impl)));
}

void Cluster::set_on_site_dead(std::function<void(const std::string&)> fn) {
    impl_->on_site_dead_ = std::move(fn);
}

void Cluster::set_peer_addr(const std::string& addr) {
    std::lock_guard lock(impl_->mu_);
    if (impl_->peer_addr_.empty()) {
        impl_->peer_addr_ = addr;
    }
}

void Cluster::start() {
    impl_->started_ = true;
    impl_->service_->start(impl_->gossip_.join);
    net::post(impl_->strand_, [self = impl_] {
        self->publish(true);
        self->arm_publish();
        self->arm_health();
    });
    log::info("gossip_started", {{"site", impl_->site_.id},
                                 {"advertise", impl_->service_->advertise_addr()},
                                 {"seeds", static_cast<int64_t>(impl_->gossip_.join.size())}});
}

void Cluster::set_draining() {
    if (impl_->draining_.exchange(true)) {
        return;
    }
    log::info("pools_draining", {{"site", impl_->site_.id}});
    net::post(impl_->strand_, [self = impl_] {
        if (!self->stopped_) {
            self->publish(true);
        }
    });
}

void Cluster::stop() {
    if (impl_->stopped_.exchange(true)) {
        return;
    }
    net::post(impl_->strand_, [self = impl_] {
        self->publish_timer_.cancel();
        self->health_timer_.cancel();
    });
    impl_->service_->stop(impl_->gossip_.leave_drain);
    log::info("gossip_left", {{"site", impl_->site_.id}});
}

void Cluster::kill() {
    if (impl_->stopped_.exchange(true)) {
        return;
    }
    net::post(impl_->strand_, [self = impl_] {
        self->publish_timer_.cancel();
        self->health_timer_.cancel();
    });
    impl_->service_->kill();
}

ClusterRoutePlanner& Cluster::planner() { return *impl_->planner_; }
RolloutBook& Cluster::rollouts() { return impl_->rollouts_; }

Status Cluster::rollout(const std::string& model, const std::string& version) {
    return impl_->send_rollout(model, version);
}

bool Cluster::reload_routing(const RoutingConfig& routing) {
    return impl_->planner_->reload(planner_config(routing));
}

Result<size_t> Cluster::reload_keys(const GossipConfig& gossip) {
    EDGE_ASSIGN_OR_RETURN(membership::Keyring keyring, load_keyring(gossip));
    if (keyring.empty() == impl_->encrypted_) {
        return failed_precondition_error(
            impl_->encrypted_
                ? "the new config has no gossip keys: a reload cannot turn gossip encryption off"
                : "the new config has gossip keys, but this site gossips in clear: a reload "
                  "cannot turn gossip encryption on (restart every site)");
    }
    const size_t keys = keyring.keys().size();
    impl_->service_->post([keyring = std::move(keyring)](membership::Memberlist& ml) mutable {
        ml.keyring() = std::move(keyring);
    });
    return keys;
}

std::shared_ptr<const membership::MembershipSnapshot> Cluster::snapshot() const {
    return impl_->service_->snapshot();
}
uint16_t Cluster::gossip_port() const { return impl_->service_->port(); }
const std::string& Cluster::advertise_addr() const { return impl_->service_->advertise_addr(); }

std::optional<AdminReply> Cluster::handle_admin(std::string_view method, std::string_view target) {
    return impl_->handle_admin(method, target);
}

}  // namespace edge::daemon::cluster
