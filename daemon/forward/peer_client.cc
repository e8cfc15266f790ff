#include "daemon/forward/peer_client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include "common/log.h"
#include "daemon/api/api_error.h"
#include "daemon/api/deferred_response.h"
#include "daemon/forward/usage_scanner.h"
#include "daemon/metrics.h"
#include "tls/tls_context.h"

namespace edge::daemon::forward {

namespace net = boost::asio;
namespace ssl = net::ssl;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Stream = beast::ssl_stream<beast::tcp_stream>;
using SteadyClock = std::chrono::steady_clock;
using cluster::ForwardResult;
using cluster::RouteTarget;
constexpr auto kTuple = net::as_tuple(net::use_awaitable);

namespace {

// Client headers that travel to the peer. Never Authorization: the tenant travels instead.
constexpr std::string_view kForwardedRequestHeaders[] = {
    "content-type", "accept", cluster::kModelVersionHeader, "x-request-id", "user-agent",
    cluster::kRequestIdHeader, cluster::kMaxTokensHeader, cluster::kMaxPromptTokensHeader,
    cluster::kMaxContextTokensHeader};

// Peer response headers not passed to the client: hop-by-hop ones, and those our server writes.
bool is_hop_by_hop(std::string_view name) {
    for (std::string_view h : {"connection", "keep-alive", "transfer-encoding", "content-length",
                               "te", "trailer", "upgrade", "proxy-connection", "content-type"}) {
        if (beast::iequals(name, h)) {
            return true;
        }
    }
    return false;
}

struct HostPort {
    std::string host;
    std::string port;
};

Result<HostPort> split_host_port(std::string_view addr) {
    std::string_view host;
    std::string_view port;
    if (!addr.empty() && addr.front() == '[') {
        size_t close = addr.find(']');
        if (close == std::string_view::npos || close + 1 >= addr.size() || addr[close + 1] != ':') {
            return invalid_argument_error("peer address '" + std::string(addr) +
                                          "' is not [IPv6]:port");
        }
        host = addr.substr(1, close - 1);
        port = addr.substr(close + 2);
    } else {
        size_t colon = addr.rfind(':');
        if (colon == std::string_view::npos || colon == 0) {
            return invalid_argument_error("peer address '" + std::string(addr) +
                                          "' is not host:port");
        }
        host = addr.substr(0, colon);
        port = addr.substr(colon + 1);
    }
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return invalid_argument_error("peer address '" + std::string(addr) + "' has a bad port");
    }
    if (const int number = std::stoi(std::string(port)); number < 1 || number > 65535) {
        return invalid_argument_error("peer address '" + std::string(addr) +
                                      "' has a port outside 1..65535");
    }
    return HostPort{std::string(host), std::string(port)};
}

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

// The largest prompt length a peer's head is believed for (a context of a billion tokens).
constexpr int64_t kMaxToldPromptTokens = int64_t{1} << 30;

std::string_view failure_reason(Failure f) {
    switch (f) {
        case Failure::kConnect: return "connect";
        case Failure::kTimeout: return "timeout";
        case Failure::kReset: return "reset";
        case Failure::kStatus5xx: return "status_5xx";
        case Failure::kNone: break;
    }
    return "none";
}

}  // namespace

struct ForwardJob {
    tls::HttpRequest request;
    std::string tenant;
    std::vector<RouteTarget> targets;
    std::shared_ptr<tls::ResponseChannel> channel;
    std::function<void(const ForwardResult&)> done;
    ForwardResult result;
    // Strand only.
    Connection* current = nullptr;  // The connection in use, closed when the client goes away.
    // A host-name target's lookup while it runs, cancelled as `current` is closed.
    std::shared_ptr<tcp::resolver> resolving;
    std::string current_site;       // The target of the attempt running.
    bool site_lost = false;         // Its connection was closed: gossip declared the site dead.
    bool cancelled = false;
    bool counted_retry = false;  // Holds one of the retry budget's slots.
    bool cut = false;            // The answer broke after bytes reached the client.
    // The prompt's length a peer that accepted the request sent on its head (kPromptTokensHeader):
    // charged when its usage report never comes.
    int64_t accepted_prompt_tokens = 0;
    // The answer's last piece (respond or end_stream): delivered after `done` ran, so the caller's
    // bookkeeping (the tenant's concurrency slot) is settled before the client sees the end, as
    // for requests run here.
    std::function<void()> deliver_last;
    Failure last_failure = Failure::kNone;
    std::string last_error;
};

namespace {

// What an answer the peer accepted used: its usage report, or, without one (cut, the client
// gone, a peer that sends none), the prompt its head told and a generation of unknown length.
void take_usage(ForwardJob& job, const UsageScanner& usage) {
    if (usage.reported()) {
        job.result.prompt_tokens = usage.prompt_tokens();
        job.result.completion_tokens = usage.completion_tokens();
    } else {
        job.result.usage_unknown = true;
        job.result.prompt_tokens = job.accepted_prompt_tokens;
    }
}

}  // namespace

class PeerClient::Impl : public std::enable_shared_from_this<Impl> {
public:
    Impl(net::io_context& io, PeerClientConfig config, Metrics* metrics)
        : strand_(net::make_strand(io)),
          config_(std::move(config)),
          metrics_(metrics) {}

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
    net::awaitable<bool> attempt(ForwardJob& job, const RouteTarget& target, bool can_retry);
    // A connection to `site_id` at `peer_addr`, handshaken (its certificate checked for the
    // site id when verify_site_identity).
    net::awaitable<std::unique_ptr<Connection>> connect(ForwardJob& job, const std::string& site_id,
                                                        const std::string& peer_addr,
                                                        Failure& failure, std::string& error);
    std::unique_ptr<Connection> take_pooled(const std::string& peer);
    void give_back(const std::string& peer, std::unique_ptr<Connection> connection);
    // Closes the idle connections past pool_idle_timeout of every peer, at most once per
    // timeout (strand; called as connections come back).
    void sweep_idle();
    // Closes and removes those of `idle` past pool_idle_timeout at `now` (strand).
    void drop_expired(std::deque<std::unique_ptr<Connection>>& idle, SteadyClock::time_point now);
    bool retry_allowed() const;
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
    SteadyClock::time_point last_sweep_{};
    std::unordered_set<ForwardJob*> jobs_;
    int64_t retries_in_flight_ = 0;
};

Result<std::shared_ptr<ssl::context>> PeerClient::Impl::load_context(const std::string& ca_path,
                                                                     const std::string& cert_path,
                                                                     const std::string& key_path) {
    auto context = std::make_shared<ssl::context>(ssl::context::tls_client);
    SSL_CTX* ctx = context->native_handle();
    ERR_clear_error();
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    EDGE_RETURN_IF_ERROR(tls::use_forward_secret_ciphers(ctx));  // As the peer listener takes.
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    // Never OpenSSL's terminal prompt (tls::refuse_pem_passphrase): the chain is read with it too.
    SSL_CTX_set_default_passwd_cb(ctx, tls::refuse_pem_passphrase);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_path.c_str()) != 1) {
        return invalid_argument_error("peer: cannot load certificate '" + cert_path +
                                      "': " + tls::openssl_errors());
    }
    if (Status key = tls::use_private_key_file(ctx, key_path); !key.ok()) {
        return invalid_argument_error("peer: " + key.message());
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        return invalid_argument_error("peer: key '" + key_path + "' does not match certificate '" +
                                      cert_path + "'");
    }
    if (SSL_CTX_load_verify_locations(ctx, ca_path.c_str(), nullptr) != 1) {
        return invalid_argument_error("peer: cannot load cluster CA '" + ca_path +
                                      "': " + tls::openssl_errors());
    }
    // Trust is membership of the cluster CA; peer addresses are often bare IPs, so the peer's
    // name is not checked against the address.
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    return context;
}

net::awaitable<void> PeerClient::Impl::testing_delay(const RouteTarget& target) {
    auto it = config_.testing_delay.find(target.site_id);
    if (it == config_.testing_delay.end() || it->second.count() <= 0) {
        co_return;
    }
    net::steady_timer timer(strand_, it->second);
    co_await timer.async_wait(kTuple);
}

bool PeerClient::Impl::retry_allowed() const {
    double cap = std::max(static_cast<double>(config_.min_retry_concurrency),
                          config_.retry_budget * static_cast<double>(active_.load()));
    return static_cast<double>(retries_in_flight_ + 1) <= cap;
}

void PeerClient::Impl::abandon_site(const std::string& site_id) {
    for (ForwardJob* job : jobs_) {
        if ((job->current != nullptr || job->resolving) && job->current_site == site_id) {
            job->site_lost = true;
            stop_attempt(*job);
        }
    }
}

void PeerClient::Impl::cancel(ForwardJob& job) {
    job.cancelled = true;
    stop_attempt(job);
}

void PeerClient::Impl::stop_attempt(ForwardJob& job) {
    if (job.current != nullptr) {
        job.current->close();
    }
    if (job.resolving) {
        job.resolving->cancel();
    }
}

void PeerClient::Impl::report(const RouteTarget& target, bool ok, SteadyClock::duration latency) {
    if (cluster::RoutePlanner* planner = planner_.load()) {
        planner->report(target, ok, std::chrono::duration_cast<std::chrono::nanoseconds>(latency));
    }
}

std::unique_ptr<Connection> PeerClient::Impl::take_pooled(const std::string& peer) {
    auto it = pool_.find(peer);
    if (it == pool_.end()) {
        return nullptr;
    }
    drop_expired(it->second, SteadyClock::now());
    if (it->second.empty()) {
        return nullptr;
    }
    std::unique_ptr<Connection> c = std::move(it->second.back());
    it->second.pop_back();
    idle_.fetch_sub(1);
    c->reused = true;
    return c;
}

void PeerClient::Impl::drop_expired(std::deque<std::unique_ptr<Connection>>& idle,
                                    SteadyClock::time_point now) {
    const auto old = std::remove_if(idle.begin(), idle.end(), [&](auto& c) {
        if (now - c->idle_since <= config_.pool_idle_timeout) {
            return false;
        }
        c->close();
        return true;
    });
    idle_.fetch_sub(static_cast<int64_t>(idle.end() - old));
    idle.erase(old, idle.end());
}

void PeerClient::Impl::give_back(const std::string& peer, std::unique_ptr<Connection> connection) {
    sweep_idle();
    auto& idle = pool_[peer];
    // One opened before a certificate reload keeps the old certificates: not reused.
    if (stopping_.load() || idle.size() >= static_cast<size_t>(config_.max_idle_connections) ||
        connection->context != context()) {
        connection->close();
        return;
    }
    connection->idle_since = SteadyClock::now();
    idle.push_back(std::move(connection));
    idle_.fetch_add(1);
}

void PeerClient::Impl::sweep_idle() {
    const auto now = SteadyClock::now();
    if (now - last_sweep_ < config_.pool_idle_timeout) {
        return;
    }
    last_sweep_ = now;
    // Idle past the timeout (the peer has likely closed its end: the socket sits in CLOSE_WAIT),
    // for every peer, one that left the cluster or changed its address too.
    for (auto it = pool_.begin(); it != pool_.end();) {
        drop_expired(it->second, now);
        it = it->second.empty() ? pool_.erase(it) : std::next(it);
    }
}

net::awaitable<std::unique_ptr<Connection>> PeerClient::Impl::connect(ForwardJob& job,
                                                                      const std::string& site_id,
                                                                      const std::string& peer_addr,
                                                                      Failure& failure,
                                                                      std::string& error) {
    failure = Failure::kConnect;
    Result<HostPort> hp = split_host_port(peer_addr);
    if (!hp.ok()) {
        error = hp.status().message();
        co_return nullptr;
    }
    std::vector<tcp::endpoint> endpoints;
    // The lookup and the connect share one connect_timeout.
    auto connect_by = SteadyClock::now() + config_.connect_timeout;
    boost::system::error_code ec;
    net::ip::address literal = net::ip::make_address(hp->host, ec);
    uint16_t port = static_cast<uint16_t>(std::stoi(hp->port));
    if (!ec) {
        endpoints.emplace_back(literal, port);
    } else {
        // The lookup counts against connect_timeout, and ends when the client goes away or
        // gossip finds the site dead (stop_attempt), as the connect after it does.
        auto resolver = std::make_shared<tcp::resolver>(strand_);
        net::steady_timer deadline(strand_, config_.connect_timeout);
        deadline.async_wait([resolver](boost::system::error_code wait_ec) {
            if (!wait_ec) {
                resolver->cancel();
            }
        });
        job.resolving = resolver;
        auto [rec, results] = co_await resolver->async_resolve(hp->host, hp->port, kTuple);
        job.resolving.reset();
        // Cancelled by the deadline's handler (not by the client or gossip: checked below).
        const bool timed_out = rec == net::error::operation_aborted;
        deadline.cancel();
        connect_by = deadline.expiry();
        if (job.cancelled || job.site_lost) {
            error = job.cancelled ? "cancelled" : "the site was found dead";
            co_return nullptr;
        }
        if (rec || timed_out) {
            failure = timed_out ? Failure::kTimeout : Failure::kConnect;
            error = "cannot resolve '" + hp->host +
                    "': " + (timed_out ? std::string("timed out") : rec.message());
            co_return nullptr;
        }
        for (const auto& entry : results) {
            endpoints.push_back(entry.endpoint());
        }
    }
    auto connection = std::make_unique<Connection>(strand_, context());
    job.current = connection.get();
    auto& layer = beast::get_lowest_layer(connection->stream);
    layer.expires_at(connect_by);
    auto [cec, endpoint] = co_await layer.async_connect(endpoints, kTuple);
    if (cec) {
        job.current = nullptr;
        failure = cec == beast::error::timeout ? Failure::kTimeout : Failure::kConnect;
        error = "connect: " + cec.message();
        co_return nullptr;
    }
    boost::system::error_code ignored;
    layer.socket().set_option(tcp::no_delay(true), ignored);
    // A deferred answer's wait is long (deferred_answer_timeout, see attempt()): keepalive probes
    // notice a peer host that vanished sooner.
    layer.socket().set_option(net::socket_base::keep_alive(true), ignored);
    int keep_idle_s = 10;
    int keep_interval_s = 5;
    int keep_count = 3;
    setsockopt(layer.socket().native_handle(), IPPROTO_TCP, TCP_KEEPIDLE, &keep_idle_s,
               sizeof(keep_idle_s));
    setsockopt(layer.socket().native_handle(), IPPROTO_TCP, TCP_KEEPINTVL, &keep_interval_s,
               sizeof(keep_interval_s));
    setsockopt(layer.socket().native_handle(), IPPROTO_TCP, TCP_KEEPCNT, &keep_count,
               sizeof(keep_count));
    SSL* ssl = connection->stream.native_handle();
    if (ec) {  // A name, not an IP literal: send it as SNI.
        SSL_set_tlsext_host_name(ssl, hp->host.c_str());
    }
    if (config_.verify_site_identity) {
        // The certificate must name the site gossip says is at this address (a DNS
        // subjectAltName equal to the site id): another site's certificate, from the same CA,
        // is refused.
        SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_WILDCARDS);
        if (SSL_set1_host(ssl, site_id.c_str()) != 1) {
            job.current = nullptr;  // Not left naming the connection destroyed on return.
            error = "site id '" + site_id + "' cannot be checked against a certificate";
            co_return nullptr;
        }
    }
    auto [hec] = co_await connection->stream.async_handshake(ssl::stream_base::client, kTuple);
    job.current = nullptr;
    if (hec) {
        failure = hec == beast::error::timeout ? Failure::kTimeout : Failure::kConnect;
        error = "TLS handshake: " + hec.message();
        if (SSL_get_verify_result(ssl) == X509_V_ERR_HOSTNAME_MISMATCH) {
            error += " (its certificate does not name site '" + site_id +
                     "' as a DNS subjectAltName: peer.verify_site_identity)";
        }
        connection->close();
        co_return nullptr;
    }
    opened_.fetch_add(1);
    co_return connection;
}

net::awaitable<bool> PeerClient::Impl::attempt(ForwardJob& job, const RouteTarget& target,
                                               bool can_retry) {
    const auto start = SteadyClock::now();
    // `reported`: the planner already heard of this attempt (at the response head).
    auto fail = [&](Failure failure, const std::string& why, bool reported = false) {
        job.last_failure = failure;
        job.last_error = "site '" + target.site_id + "' (" + target.peer_addr + "): " + why;
        if (!reported) {
            report(target, false, SteadyClock::now() - start);
        }
        log::info("forward_attempt_failed", {{"site", target.site_id},
                                             {"peer", target.peer_addr},
                                             {"reason", std::string(failure_reason(failure))},
                                             {"error", why}});
    };

    job.current_site = target.site_id;
    job.site_lost = false;
    http::request<http::string_body> req;
    req.version(11);
    req.method_string(job.request.method);
    req.target(job.request.target);
    req.set(http::field::host, target.peer_addr);
    req.set(cluster::kHopHeader, config_.site_id);
    req.set(cluster::kTenantHeader, job.tenant);
    // A non-streamed answer's head comes once the peer's engine accepted the request.
    req.set(api::kDeferredHeadHeader, "1");
    for (std::string_view name : kForwardedRequestHeaders) {
        std::string_view value = job.request.header(name);
        if (!value.empty()) {
            req.set(name, value);
        }
    }
    req.body() = job.request.body;
    req.keep_alive(true);
    req.prepare_payload();

    co_await testing_delay(target);  // Testing only: the request's way there.
    if (job.cancelled) {
        co_return true;
    }
    // Pooled per site and address: a connection is only reused for the site it was verified as.
    const std::string pool_key = target.site_id + " " + target.peer_addr;
    std::unique_ptr<Connection> conn = take_pooled(pool_key);
    std::optional<http::response_parser<http::buffer_body>> parser;
    for (int tries = 0;; ++tries) {
        if (!conn) {
            Failure failure = Failure::kNone;
            std::string why;
            conn = co_await connect(job, target.site_id, target.peer_addr, failure, why);
            if (job.cancelled) {
                co_return true;
            }
            if (!conn) {
                fail(failure, why);
                co_return false;
            }
        }
        job.current = conn.get();
        auto& layer = beast::get_lowest_layer(conn->stream);
        layer.expires_after(config_.response_timeout);
        auto [wec, wn] = co_await http::async_write(conn->stream, req, kTuple);
        boost::system::error_code ec = wec;
        // An interim head (1xx: 100 Continue, 103 Early Hints) may precede the answer's and is
        // not passed on (RFC 9110 15.2): taken for the answer, it reached the client as a bare
        // 1xx and left the real answer unread on the connection. Their count is bounded by
        // response_timeout, which covers them all.
        bool interim = false;
        while (!ec) {
            parser.emplace();
            parser->header_limit(64 * 1024);
            // Beast's default 8 MiB body limit would cut a healthy stream (a long reasoning
            // reply, logprobs) and refuse answers below max_response_bytes, which bounds the
            // answers read whole (the loop below); a stream relays as it goes.
            parser->body_limit(boost::none);
            auto [hec, hn] = co_await http::async_read_header(conn->stream, conn->buffer, *parser,
                                                              kTuple);
            ec = hec;
            if (ec || parser->get().result_int() >= 200) {
                break;
            }
            interim = true;
        }
        if (!ec) {
            break;
        }
        job.current = nullptr;
        // A pooled connection the peer closed while idle fails before any answer: once, open a
        // fresh one to the same target instead of counting it as the target's failure (not when
        // this site closed it because gossip declared the target dead).
        bool stale = !job.site_lost && conn->reused && tries == 0 && !interim &&
                     ec != beast::error::timeout && (parser == std::nullopt || !parser->got_some());
        conn->close();
        conn.reset();
        if (job.cancelled) {
            co_return true;
        }
        if (stale) {
            continue;
        }
        fail(ec == beast::error::timeout ? Failure::kTimeout : Failure::kReset,
             job.site_lost ? std::string("no response head: declared dead by gossip")
                           : "no response head: " + ec.message());
        co_return false;
    }

    co_await testing_delay(target);  // Testing only: the answer's way back.
    if (job.cancelled) {
        job.current = nullptr;
        conn->close();
        co_return true;
    }
    const auto to_head = SteadyClock::now() - start;
    auto& response = parser->get();
    const int status = response.result_int();
    // A deferred answer (api/deferred_response.h): the peer accepted the request; its answer,
    // status included, is the body. If the connection breaks before it, nothing reached the
    // client and the next target is tried (a peer that died mid-generation), not charged twice.
    const bool deferred = status == 200 && !response[api::kDeferredHeadHeader].empty();
    const bool streamed = !deferred && !parser->is_done() &&
                          (parser->chunked() || !parser->content_length().has_value());
    // The head of an accepted request says only that it was accepted: its outcome is reported
    // at the answer's end. Reported here as a success, it reset the detector's consecutive
    // failures before the cut that followed, so a peer that accepted and then died every time
    // was never ejected.
    const bool accepted = deferred || (streamed && status == 200);
    if (status != 503 && !accepted) {
        // A 503 head is a refusal before the request ran (the peer's queue full, draining,
        // loading): load and state, which gossip gives the cost, not ill health. Counted as a
        // failure, a site busy for a moment was ejected for 30 s and more, past its load.
        report(target, status < 500, to_head);
    }
    if (metrics_ != nullptr) {
        metrics_->on_forward_latency(target.site_id, to_head);
    }
    if (status >= 500 && can_retry) {
        job.current = nullptr;
        conn->close();
        fail(Failure::kStatus5xx, "answered " + std::to_string(status), true);
        co_return false;
    }

    tls::HttpResponse head;
    head.status = status;
    auto content_type = response[http::field::content_type];
    head.content_type = content_type.empty() ? "application/json" : std::string(content_type);
    for (const auto& field : response) {
        if (!is_hop_by_hop(field.name_string())) {
            head.headers.push_back({std::string(field.name_string()), std::string(field.value())});
        }
    }
    head.headers.push_back({std::string(kServedByHeader), target.site_id});
    // For this site only: the prompt's length, sent once the peer's engine accepted the request.
    std::erase_if(head.headers, [](const tls::HttpHeader& h) {
        return beast::iequals(h.name, cluster::kPromptTokensHeader);
    });
    if (accepted) {
        // Only a request its engine took gets either head (an error is a whole answer).
        job.result.accepted = true;
        job.accepted_prompt_tokens =
            cluster::header_count(response[cluster::kPromptTokensHeader], 0, kMaxToldPromptTokens)
                .value_or(0);
    }
    const bool event_stream = beast::iequals(content_type, "text/event-stream");
    job.result.status = status;
    if (streamed) {
        job.channel->begin_stream(head);
        job.result.started = true;
    }

    UsageScanner usage;
    std::string body;
    std::array<char, 16 * 1024> chunk;
    boost::system::error_code ec;
    auto& layer = beast::get_lowest_layer(conn->stream);
    // A deferred answer's first byte comes when the generation has ended: the wait for it is
    // bounded by deferred_answer_timeout (0: by nothing but the peer's death, found by a reset or
    // keepalive, and the client's going away). Once it began, as any body, by stream_idle_timeout.
    const auto answer_by = SteadyClock::now() + config_.deferred_answer_timeout;
    while (!parser->is_done()) {
        response.body().data = chunk.data();
        response.body().size = chunk.size();
        if (deferred && body.empty()) {
            if (config_.deferred_answer_timeout.count() > 0) {
                layer.expires_at(answer_by);
            } else {
                layer.expires_never();
            }
        } else {
            layer.expires_after(config_.stream_idle_timeout);
        }
        auto [rec, rn] = co_await http::async_read_some(conn->stream, conn->buffer, *parser,
                                                        kTuple);
        size_t got = chunk.size() - response.body().size;
        if (got > 0) {
            std::string_view piece(chunk.data(), got);
            if (streamed) {
                // Events pass whole, less the peer's usage report (only for this site).
                std::string relay = event_stream ? usage.feed_events(piece) : std::string(piece);
                if (!relay.empty()) {
                    job.channel->write(std::move(relay));
                }
            } else if (body.size() + got > config_.max_response_bytes) {
                ec = http::error::body_limit;
                break;
            } else {
                body.append(piece);
            }
        }
        if (rec && rec != http::error::need_buffer) {
            ec = rec;
            break;
        }
        if (job.cancelled) {
            break;
        }
    }
    job.current = nullptr;
    if (ec || job.cancelled) {
        conn->close();
        // A peer silent past a timeout is stuck or too slow, not gone: the request is not run
        // again elsewhere (it would take as long, and the client has waited that long already).
        const bool timed_out = ec == beast::error::timeout;
        if (!job.cancelled && deferred && ec != http::error::body_limit && !timed_out &&
            can_retry) {
            // Nothing reached the client and the peer is gone: the next target runs it, as for
            // a peer that died before its head.
            fail(Failure::kReset, "deferred answer cut: " + ec.message());
            co_return false;
        }
        // The bytes held at the cut: a usage report without its blank line is read, the start
        // of an event is dropped (the error event below must not join it).
        const std::string close_event = usage.cut();
        // The peer ran it and this is the end: what it reported, else the tenant pays the
        // reservation (ForwardResult::usage_unknown).
        take_usage(job, usage);
        if (job.cancelled) {
            co_return true;  // The client left (or stop()): nothing learnt of the peer's health.
        }
        // Cut after the stream's end event, or after the usage report the peer writes after its
        // last event and just before that end event: the client has the whole answer (a peer
        // that closed before the end event or the chunked body's terminator).
        const bool whole = streamed && event_stream && (usage.ended() || usage.reported());
        if (accepted && ec != http::error::body_limit) {  // The limit is this site's.
            report(target, whole, to_head);
        }
        log::warn("forward_response_cut",
                  {{"site", target.site_id},
                   {"streamed", streamed},
                   {"error", job.site_lost ? std::string("declared dead by gossip")
                                           : ec.message()}});
        if (whole) {
            // Ended as it would have ended.
            if (!usage.ended()) {
                job.channel->write("data: [DONE]\n\n");
            }
            job.deliver_last = [channel = job.channel] { channel->end_stream(); };
            co_return true;
        }
        const api::ApiError e =
            broken_answer_error(job, target, ec, streamed, deferred && body.empty());
        if (streamed) {
            // Bytes are out: no retry. Say so in-band where the format allows, then end.
            if (event_stream) {
                // Ended as a locally cut stream is: the error event, then the stream's end;
                // after the relayed part of an over-long event, a blank line ends that event
                // first, so the error is an event of its own.
                job.channel->write(close_event + "data: " + e.to_json() + "\n\ndata: [DONE]\n\n");
            }
            job.cut = true;
            job.deliver_last = [channel = job.channel] { channel->end_stream(); };
        } else {
            job.result.status = e.status;
            job.result.started = true;
            job.deliver_last = [channel = job.channel, r = e.to_response()]() mutable {
                channel->respond(std::move(r));
            };
        }
        co_return true;
    }
    if (streamed) {
        if (std::string held = usage.flush(); !held.empty()) {
            job.channel->write(std::move(held));
        }
        job.deliver_last = [channel = job.channel] { channel->end_stream(); };
        if (accepted) {
            report(target, true, to_head);
        }
        // A stream that ended without the peer's report (not an edgeserve peer of this
        // version) is charged as one cut: otherwise it would be free.
        take_usage(job, usage);
    } else {
        if (deferred) {
            std::optional<tls::HttpResponse> answer = api::decode_deferred_response(body);
            if (!answer) {
                api::ApiError e;
                e.status = 502;
                e.type = "server_error";
                e.code = "upstream_bad_answer";
                e.message = "site '" + target.site_id + "' sent a malformed deferred answer";
                answer = e.to_response();
            }
            // As for a head (above): a 503 after acceptance (a drain cancelled it) is state.
            if (answer->status != 503) {
                report(target, answer->status < 500, to_head);
            }
            answer->headers.push_back({std::string(kServedByHeader), target.site_id});
            head = std::move(*answer);
            body = std::move(head.body);
            job.result.status = head.status;
        }
        if (head.status == 200) {
            usage.feed_json(body);
            job.result.prompt_tokens = usage.prompt_tokens();
            job.result.completion_tokens = usage.completion_tokens();
        } else if (deferred) {
            // Accepted, then failed there (a drain cancelled it, say): the prompt was read.
            job.result.prompt_tokens = job.accepted_prompt_tokens;
        }
        head.body = std::move(body);
        job.result.started = true;
        job.deliver_last = [channel = job.channel, head = std::move(head)]() mutable {
            channel->respond(std::move(head));
        };
    }
    // Bytes read past the answer's end (a peer that sent more than it declared, or a second
    // answer) would be parsed as the next forward's answer on this connection: never pooled.
    if (parser->keep_alive() && conn->buffer.size() == 0) {
        conn->reused = false;
        give_back(pool_key, std::move(conn));
    } else {
        conn->close();
    }
    co_return true;
}

api::ApiError PeerClient::Impl::broken_answer_error(const ForwardJob& job,
                                                    const RouteTarget& target,
                                                    boost::system::error_code ec, bool streamed,
                                                    bool awaiting_answer) const {
    const std::string site = "site '" + target.site_id + "'";
    auto ms = [](std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; };
    api::ApiError e;
    e.type = "server_error";
    if (ec == http::error::body_limit) {
        e.status = 503;
        e.code = "upstream_answer_too_large";
        e.message = "the answer of " + site + " is larger than " +
                    std::to_string(config_.max_response_bytes) + " bytes";
    } else if (ec == beast::error::timeout) {
        e.status = 504;
        e.code = "upstream_timeout";
        e.message = awaiting_answer
                        ? site + " accepted the request but sent no answer within " +
                              ms(config_.deferred_answer_timeout) +
                              " (peer.deferred_answer_timeout_ms)"
                        : site + " sent nothing for " + ms(config_.stream_idle_timeout) +
                              (streamed ? " while streaming" : " inside its answer") +
                              " (peer.stream_idle_timeout_ms)";
    } else if (streamed) {
        e.status = 502;
        e.code = "upstream_cut";
        e.message = job.site_lost
                        ? site + " was declared dead (gossip) while streaming"
                        : "the connection to " + site + " broke while streaming: " + ec.message();
    } else {
        e.status = 503;
        e.code = "upstream_cut";
        e.message =
            "the connection to " + site + " broke while reading its answer: " + ec.message();
    }
    return e;
}

void PeerClient::Impl::finish(ForwardJob& job) {
    // No remote site took it: a local target in the plan runs it (the caller, on run_here),
    // as the next candidate would have been tried had it been remote.
    const bool local_next = std::any_of(job.targets.begin(), job.targets.end(),
                                        [](const RouteTarget& t) { return t.local; });
    if (!job.result.started && !job.cancelled && !stopping_.load() && local_next) {
        job.result.run_here = true;
    } else if (!job.result.started && (!job.cancelled || stopping_.load())) {
        // A job cancelled by stop() still answers; one whose client left has nobody to answer.
        api::ApiError e;
        e.status = job.last_failure == Failure::kTimeout ? 504 : 503;
        e.type = "server_error";
        e.code = job.last_failure == Failure::kTimeout ? "upstream_timeout"
                                                       : "upstream_unavailable";
        if (stopping_.load()) {
            e.message = "this site is shutting down";
        } else if (job.last_error.empty()) {
            e.message = "no remote site to forward the request to";
        } else {
            e.message = "no site could take the request; last: " + job.last_error;
        }
        e.retry_after_seconds = 1;
        job.result.status = e.status;
        job.deliver_last = [channel = job.channel, r = e.to_response()]() mutable {
            channel->respond(std::move(r));
        };
        if (job.result.accepted) {
            // A peer took it before its answer was cut (then no other site could): it may have
            // generated, as an answer cut while streaming.
            job.result.usage_unknown = true;
            job.result.prompt_tokens = job.accepted_prompt_tokens;
        }
    }
    if (metrics_ != nullptr && !job.result.site_id.empty()) {
        std::string_view outcome =
            job.cancelled ? "cancelled"
            : job.result.started && job.result.status < 500 && !job.cut ? "ok"
                                                                          : "error";
        metrics_->on_forwarded(job.result.site_id, outcome);
    }
}

net::awaitable<void> PeerClient::Impl::run(std::shared_ptr<ForwardJob> job) {
    jobs_.insert(job.get());
    std::vector<size_t> remote;
    for (size_t i = 0; i < job->targets.size(); ++i) {
        if (!job->targets[i].local && !job->targets[i].peer_addr.empty()) {
            remote.push_back(i);
        }
    }
    for (size_t k = 0; k < remote.size() && !job->cancelled && !stopping_.load(); ++k) {
        const RouteTarget& target = job->targets[remote[k]];
        if (k > 0) {
            if (!job->counted_retry) {
                if (!retry_allowed()) {
                    log::info("forward_retry_budget_exhausted",
                              {{"retries_in_flight", retries_in_flight_}});
                    break;
                }
                job->counted_retry = true;
                ++retries_in_flight_;
            }
            if (metrics_ != nullptr) {
                metrics_->on_forward_retry(failure_reason(job->last_failure));
            }
        }
        bool can_retry = k + 1 < remote.size() && (job->counted_retry || retry_allowed());
        ++job->result.attempts;
        job->result.site_id = target.site_id;
        bool over = co_await attempt(*job, target, can_retry);
        if (over) {
            break;
        }
    }
    finish(*job);
    jobs_.erase(job.get());
    if (job->counted_retry) {
        --retries_in_flight_;
    }
    auto done = std::move(job->done);
    auto deliver_last = std::move(job->deliver_last);
    ForwardResult result = job->result;
    job.reset();
    if (done) {
        done(result);
    }
    if (deliver_last) {
        deliver_last();
    }
    {
        std::lock_guard lock(done_mu_);
        active_.fetch_sub(1);
    }
    done_cv_.notify_all();
}

Result<std::unique_ptr<PeerClient>> PeerClient::create(net::io_context& io,
                                                       PeerClientConfig config,
                                                       Metrics* metrics) {
    auto impl = std::make_shared<Impl>(io, std::move(config), metrics);
    impl->ca_path_ = impl->config_.ca_path;
    impl->cert_path_ = impl->config_.cert_path;
    impl->key_path_ = impl->config_.key_path;
    EDGE_ASSIGN_OR_RETURN(impl->ssl_,
                          Impl::load_context(impl->ca_path_, impl->cert_path_, impl->key_path_));
    if (!impl->config_.testing_delay.empty()) {
        log::warn("testing_peer_delay", {{"detail", "forwards to some sites are delayed on "
                                                    "purpose (gossip.testing_peer_delay_ms)"}});
    }
    return std::unique_ptr<PeerClient>(new PeerClient(std::move(impl)));
}

PeerClient::~PeerClient() { stop(std::chrono::milliseconds(0)); }

Status PeerClient::reload() {
    std::string ca_path, cert_path, key_path;
    {
        std::lock_guard lock(impl_->ssl_mu_);
        ca_path = impl_->ca_path_;
        cert_path = impl_->cert_path_;
        key_path = impl_->key_path_;
    }
    return reload(ca_path, cert_path, key_path);
}

Status PeerClient::reload(const std::string& ca_path, const std::string& cert_path,
                          const std::string& key_path) {
    Result<std::shared_ptr<ssl::context>> fresh = Impl::load_context(ca_path, cert_path, key_path);
    if (!fresh.ok()) {
        return fresh.status();
    }
    {
        std::lock_guard lock(impl_->ssl_mu_);
        impl_->ssl_ = std::move(fresh).value();
        impl_->ca_path_ = ca_path;
        impl_->cert_path_ = cert_path;
        impl_->key_path_ = key_path;
    }
    // Pooled connections were made with the old certificates: new requests handshake afresh.
    net::post(impl_->strand_, [impl = impl_] {
        for (auto& [peer, idle] : impl->pool_) {
            for (auto& c : idle) {
                c->close();
            }
            impl->idle_.fetch_sub(static_cast<int64_t>(idle.size()));
        }
        impl->pool_.clear();
    });
    return ok_status();
}

void PeerClient::set_planner(cluster::RoutePlanner* planner) { impl_->planner_.store(planner); }

void PeerClient::forward(tls::HttpRequest request, std::string tenant,
                         std::vector<RouteTarget> targets,
                         std::shared_ptr<tls::ResponseChannel> channel,
                         std::function<void(const ForwardResult&)> done) {
    auto job = std::make_shared<ForwardJob>();
    job->request = std::move(request);
    job->tenant = std::move(tenant);
    job->targets = std::move(targets);
    job->channel = std::move(channel);
    job->done = std::move(done);
    impl_->active_.fetch_add(1);
    std::weak_ptr<ForwardJob> weak = job;
    job->channel->on_client_gone([impl = impl_, weak] {
        net::post(impl->strand_, [impl, weak] {
            if (auto j = weak.lock()) {
                impl->cancel(*j);
            }
        });
    });
    net::co_spawn(impl_->strand_,
                  [impl = impl_, job = std::move(job)]() mutable {
                      return impl->run(std::move(job));
                  },
                  [](std::exception_ptr e) {
                      if (e) {
                          try {
                              std::rethrow_exception(e);
                          } catch (const std::exception& ex) {
                              log::error("forward_exception", {{"what", ex.what()}});
                          } catch (...) {
                              log::error("forward_exception", {{"what", "unknown"}});
                          }
                      }
                  });
}

void PeerClient::stop(std::chrono::milliseconds deadline) {
    if (!impl_->stopping_.exchange(true)) {
        net::post(impl_->strand_, [impl = impl_] {
            for (auto& [peer, idle] : impl->pool_) {
                for (auto& c : idle) {
                    c->close();
                }
            }
            impl->pool_.clear();
            impl->idle_.store(0);
            for (ForwardJob* job : impl->jobs_) {
                impl->cancel(*job);
            }
        });
    }
    std::unique_lock lock(impl_->done_mu_);
    impl_->done_cv_.wait_for(lock, deadline, [this] { return impl_->active_.load() == 0; });
}

std::function<void(const std::string&)> PeerClient::site_lost_handler() {
    return [weak = std::weak_ptr<Impl>(impl_)](const std::string& site_id) {
        if (std::shared_ptr<Impl> impl = weak.lock()) {
            net::post(impl->strand_, [impl, site_id] { impl->abandon_site(site_id); });
        }
    };
}

int64_t PeerClient::active() const { return impl_->active_.load(); }
int64_t PeerClient::connections_opened() const { return impl_->opened_.load(); }
int64_t PeerClient::idle_connections() const { return impl_->idle_.load(); }

}  // namespace edge::daemon::forward
