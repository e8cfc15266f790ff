#pragma once

// PeerClient's internals (peer_client.h), shared by the files that implement it: one attempt at
// one target (peer_attempt.cc), connecting and the TLS context (peer_connection.cc), the pool of
// idle connections (peer_pool.cc), and the forwards' lifecycle (peer_client.cc). Not for use
// outside daemon/forward. Threading as PeerClient's: what is marked "strand only" lives on
// PeerClient::Impl::strand_.

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/result.h"
#include "daemon/api/api_error.h"
#include "daemon/cluster/route_planner.h"
#include "daemon/forward/peer_client.h"

namespace edge::daemon::forward {

namespace net = boost::asio;
namespace ssl = net::ssl;
namespace beast = boost::beast;
using tcp = net::ip::tcp;
using Stream = beast::ssl_stream<beast::tcp_stream>;
using SteadyClock = std::chrono::steady_clock;
using cluster::ForwardResult;
using cluster::RouteTarget;
inline constexpr auto kTuple = net::as_tuple(net::use_awaitable);

struct HostPort {
    std::string host;
    std::string port;
};

// "host:port" or "[IPv6]:port", the port in 1..65535; errors name the address.
Result<HostPort> split_host_port(std::string_view addr);

struct Connection {
    Connection(net::any_io_executor executor, std::shared_ptr<ssl::context> ctx)
        : context(std::move(ctx)), stream(beast::tcp_stream(std::move(executor)), *context) {}

    void close() {
        boost::system::error_code ignored;
        auto& socket = beast::get_lowest_layer(stream).socket();
        socket.shutdown(tcp::socket::shutdown_both, ignored);
        socket.close(ignored);
    }

    std::shared_ptr<ssl::context> context;  // The certificates it was made with (before stream).
    Stream stream;
    beast::flat_buffer buffer;
    SteadyClock::time_point idle_since{};
    bool reused = false;  // Came from the pool (the peer may have closed it meanwhile).
};

enum class Failure { kNone, kConnect, kTimeout, kReset, kStatus5xx };

// The largest token count a peer's head or error answer is believed for (a context of a billion
// tokens).
inline constexpr int64_t kMaxToldTokens = int64_t{1} << 30;

inline std::string_view failure_reason(Failure f) {
    switch (f) {
        case Failure::kConnect:
            return "connect";
        case Failure::kTimeout:
            return "timeout";
        case Failure::kReset:
            return "reset";
        case Failure::kStatus5xx:
            return "status_5xx";
        case Failure::kNone:
            break;
    }
    return "none";
}

struct ForwardJob {
    tls::HttpRequest request;
    std::string tenant;
    std::vector<RouteTarget> targets;
    std::shared_ptr<tls::ResponseChannel> channel;
    std::function<void(const ForwardResult&)> done;
    // Forwarder::forward's: told the prompt's length when a peer accepts the request.
    std::function<void(int64_t prompt_tokens)> on_accepted;
    ForwardResult result;
    // Strand only.
    Connection* current = nullptr;  // The connection in use, closed when the client goes away.
    // A host-name target's lookup while it runs, cancelled as `current` is closed.
    std::shared_ptr<tcp::resolver> resolving;
    std::string current_site;  // The target of the attempt running.
    bool site_lost = false;    // Its connection was closed: gossip declared the site dead.
    bool cancelled = false;
    bool counted_retry = false;  // Holds one of the retry budget's slots.
    bool local_fallback = false;  // The plan holds this site: finish() runs what no peer took.
    bool remote_next = false;     // A remote target follows the attempt's.
    // The prompt's length a peer that accepted the request sent on its head (kPromptTokensHeader):
    // charged when its usage report never comes.
    int64_t accepted_prompt_tokens = 0;
    // The answer's last piece (respond or end_stream): delivered after `done` ran, so the caller's
    // bookkeeping (the tenant's concurrency slot) is settled before the client sees the end, as
    // for requests run here.
    std::function<void()> deliver_last;
    Failure last_failure = Failure::kNone;
    std::string last_error;
    // An attempt sent the request and its answer's head did not come within response_timeout:
    // that peer may have run it. A timeout connecting (the name lookup, TCP connect or TLS
    // handshake) does not set it: nothing was sent.
    bool head_timed_out = false;
    // What the targets the caller tried before these left (Forwarder::forward's `earlier`): a
    // peer there that was so (maybe_ran) makes the answer with no target reached the same 504,
    // and the result says maybe_ran; one that accepted it before its answer was cut makes it
    // that cut's 503 (finish()). Kept apart from head_timed_out and result.accepted, which
    // decide how this list's own ends settle: an end that was never placed stays `unplaced`
    // for the caller, which settles it, and charges the rest, as after its earlier targets.
    cluster::EarlierTargets earlier;
};

class PeerClient::Impl : public std::enable_shared_from_this<Impl> {
  public:
    Impl(net::io_context& io, PeerClientConfig config, Metrics* metrics)
        : strand_(net::make_strand(io)),
          config_(std::move(config)),
          metrics_(metrics),
          sweep_timer_(strand_) {}

    // A client context from the three PEM files (errors name the file).
    static Result<std::shared_ptr<ssl::context>> load_context(const std::string& ca_path,
                                                              const std::string& cert_path,
                                                              const std::string& key_path);
    std::shared_ptr<ssl::context> context() const {
        std::lock_guard lock(ssl_mu_);
        return ssl_;
    }
    net::awaitable<void> run(std::shared_ptr<ForwardJob> job);
    // One target. True when the job is over (answered, or cancelled); false to try the next.
    // A 5xx answer, or a deferred answer cut, nothing of which reached the client, is left to
    // the next target when can_retry() says one takes it; else it is relayed.
    net::awaitable<bool> attempt(ForwardJob& job, const RouteTarget& target);
    // A connection to `site_id` at `peer_addr`, handshaken (its certificate checked for the
    // site id when verify_site_identity).
    net::awaitable<std::unique_ptr<Connection>> connect(ForwardJob& job, const std::string& site_id,
                                                        const std::string& peer_addr,
                                                        Failure& failure, std::string& error);
    std::unique_ptr<Connection> take_pooled(const std::string& peer);
    void give_back(const std::string& peer, std::unique_ptr<Connection> connection);
    // Arms sweep_timer_ for when the oldest pooled connection passes pool_idle_timeout, unless
    // it is armed or nothing is pooled (strand): a client with no idle connection does no work.
    void arm_sweep();
    // Cancels sweep_timer_ (strand): nothing is pooled any more, or stop().
    void disarm_sweep();
    // sweep_timer_'s work: closes the idle connections past pool_idle_timeout of every peer (one
    // that left the cluster or changed its address too), then arms it for the next (strand).
    void sweep_idle();
    // Closes and removes those of `idle` past pool_idle_timeout at `now` (strand).
    void drop_expired(std::deque<std::unique_ptr<Connection>>& idle, SteadyClock::time_point now);
    // Closes every pooled idle connection and disarms the sweep (strand): the certificates
    // changed, or stop().
    void close_idle();
    bool retry_allowed() const;
    // Whether a next target takes the answer the attempt would hold back (strand): this site
    // (finish()), or the next remote target, whose retry slot is then taken at once. Checked
    // here and taken at the next turn of run(), the slot could go to other forwards meanwhile:
    // the answer held back was lost for a made-up 503.
    bool can_retry(ForwardJob& job);
    void cancel(ForwardJob& job);
    // Closes the attempt's connection, or cancels its lookup (strand).
    void stop_attempt(ForwardJob& job);
    // Strand only: closes the connections of the forwards whose attempt runs on `site_id`.
    void abandon_site(const std::string& site_id);
    void report(const RouteTarget& target, bool ok, SteadyClock::duration latency);
    // What the client is told of an answer whose connection failed (`ec`) after its head:
    // `awaiting_answer`, a deferred answer's generation was still awaited.
    api::ApiError broken_answer_error(const ForwardJob& job, const RouteTarget& target,
                                      boost::system::error_code ec, bool streamed,
                                      bool awaiting_answer) const;
    void finish(ForwardJob& job);

    net::awaitable<void> testing_delay(const RouteTarget& target);

    net::strand<net::io_context::executor_type> strand_;
    mutable std::mutex ssl_mu_;
    std::shared_ptr<ssl::context> ssl_;  // Under ssl_mu_; replaced by reload().
    // The files ssl_ came from (under ssl_mu_; config_'s at first, a reload may move them).
    std::string ca_path_;
    std::string cert_path_;
    std::string key_path_;
    const PeerClientConfig config_;
    Metrics* const metrics_;
    std::atomic<cluster::RoutePlanner*> planner_{nullptr};
    std::atomic<int64_t> active_{0};
    std::atomic<int64_t> opened_{0};
    std::atomic<int64_t> idle_{0};
    std::atomic<bool> stopping_{false};
    std::mutex done_mu_;
    std::condition_variable done_cv_;

    // Strand only.
    std::unordered_map<std::string, std::deque<std::unique_ptr<Connection>>> pool_;
    // Closes pooled connections once idle past pool_idle_timeout, with no request to notice
    // them; armed only while some are pooled (sweep_armed_). Its handler holds the Impl weakly.
    net::steady_timer sweep_timer_;
    bool sweep_armed_ = false;
    std::unordered_set<ForwardJob*> jobs_;
    int64_t retries_in_flight_ = 0;
};

}  // namespace edge::daemon::forward
