#pragma once

// Cluster::Impl, the state behind a Cluster (cluster.h), for the files that implement it:
// cluster.cc (create() wiring the membership service, planner and callbacks; the lifecycle),
// cluster_gossip.cc (this site's state published through gossip, the gossip metrics, the active
// health checks of other sites) and cluster_admin.cc (the /admin/* views and rollouts).
//
// Threading: as Cluster's; the publish and health timers, their checks and last_published_ live
// on strand_, local_rollout_ on the membership strand, peer_addr_ under mu_.

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "daemon/cluster/cluster.h"

namespace edge::daemon::cluster {

namespace net = boost::asio;
namespace membership = routing::membership;

class Cluster::Impl : public std::enable_shared_from_this<Cluster::Impl> {
  public:
    Impl(net::io_context& io, engine::Generator& generator, Metrics* metrics, Clock& clock)
        : io_(io),
          strand_(net::make_strand(io)),
          publish_timer_(strand_),
          health_timer_(strand_),
          generator_(generator),
          metrics_(metrics),
          clock_(clock) {}

    // cluster_gossip.cc
    membership::SiteState site_state() const;
    // On strand_: samples the site state and gossips it when it changed materially.
    void publish(bool force);
    void update_metrics();
    void arm_publish();
    void arm_health();
    void run_health_checks();
    static net::awaitable<void> check_ready(std::shared_ptr<Impl> self, std::string member,
                                            std::string addr);

    // cluster_admin.cc
    std::optional<AdminReply> handle_admin(std::string_view method, std::string_view target);
    static Status check_rollout(const std::string& model, const std::string& version);

    // On the membership strand: whether this site's Lamport clock has caught up with the
    // cluster's. An intent stamped before then may carry a time below the intent every other
    // site holds for the model: each drops it as stale, and this site's book takes theirs at its
    // first sync, so the rollout is lost while it was answered as taken. A site with no seeds
    // that knows no other member is the whole cluster as far as it can tell, unless its
    // gossip.snapshot_file named members it was with before it restarted.
    Status check_clock_synced(const membership::Memberlist& ml) const;

    // Sends the intent on the membership strand; `answer`, when set, gets the admin reply: what
    // this site's book made of it, or why it was not sent.
    Status send_rollout(const std::string& model, const std::string& version,
                        std::function<void(AdminReply)> answer = nullptr);

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
    std::atomic<bool> draining_{false};  // For good: set_draining().
    std::atomic<bool> stalled_{false};   // Until progress resumes: set_stalled().
    std::atomic<bool> stopped_{false};
    bool started_ = false;
    std::optional<membership::SiteState> last_published_;  // On strand_.
    std::unique_ptr<membership::MembershipService> service_;
    std::unique_ptr<ClusterRoutePlanner> planner_;
    RolloutBook rollouts_;
    // What this site's book made of the rollout event it sent last (membership strand only).
    std::optional<RolloutBook::Applied> local_rollout_;
    std::map<std::string, Duration> peer_delay_;            // Testing only: site id -> delay.
    std::function<void(const std::string&)> on_site_dead_;  // Set before start().
    bool encrypted_ = false;                                // Started with gossip keys.
};

}  // namespace edge::daemon::cluster
