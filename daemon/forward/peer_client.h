#pragma once

// PeerClient is the forwarding client between sites: the cluster::Forwarder that carries a request
// to another site's peer listener over mutual TLS (this site's certificate, signed by the cluster
// CA, as the client certificate; the peer's certificate verified against the same CA and, with
// verify_site_identity, required to name the target site's id as a DNS subjectAltName) and streams
// the answer back to the client's ResponseChannel as it arrives.
//
// Per peer (site and host:port) it keeps a pool of idle keep-alive connections. A forwarded request
// carries the hop header (this site's id) and the tenant header; of the client's headers only an
// allow-list travels (never the client's API key). Targets are tried in order: the next one when
// connecting fails, a step times out, or the peer answers 5xx before any byte reached the client,
// as long as the retry budget allows (retries in flight <= max(min_retry_concurrency, retry_budget
// x forwards in flight)); never once a byte reached the client. Every attempt is reported to the
// planner, one the peer accepted at its answer's end (cut: a failure; not at all if the client
// left). A non-streamed answer's head is deferred (api/deferred_response.h): it comes once the
// peer's engine accepted the request, so response_timeout bounds the wait for acceptance, and
// deferred_answer_timeout the generation's; a streamed answer's generation is bounded by
// stream_idle_timeout between its bytes. Past either the connection is closed (the peer cancels
// the generation), the client gets a 504 (in-band once streaming) and the peer is reported failed.
// A client that goes away closes the upstream connection, which cancels the generation there.
// The tenant's token usage, which this site charges (the peer does not), comes from the answer:
// a JSON body's usage, or a stream's usage report comment (api::kUsageReportComment), which the
// peer always sends to forwarding sites and which is not relayed to the client. The report comes
// just before the stream's end event: a stream cut after it (or with it held, whole but for its
// blank line) is whole, charged the report and ended with the end event, not an error.
//
// This site, when the plan lists it, comes after the remote targets, retry budget or not: when
// none took the request and nothing reached the client (a 5xx, a deferred answer cut, as a failed
// connection), the caller runs it here (ForwardResult::run_here).
//
// reload() (SIGHUP) re-reads the certificate, key and CA: new handshakes use them, the pooled idle
// connections (made with the old ones) are closed, forwards in flight keep theirs; a file that
// does not load keeps the old ones and the error names it.
//
// Testing only: `testing_delay` holds a forward to the named site back before the request is sent
// and again before the answer's head is passed on (one emulated round trip of twice the delay),
// so sites on one machine see distinct forwarding latencies (config gossip.testing_peer_delay_ms).
//
// Threading: forward() and the accessors are thread-safe. All connections and forwards live on one
// strand of the given io_context. stop() may be called from any thread; forwards in flight are
// cancelled and finish on the io_context. Lifetime: the io_context must outlive the PeerClient and
// keep running until forwards in flight have finished; the planner and metrics must outlive it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/result.h"
#include "daemon/cluster/route_planner.h"

namespace boost::asio {
class io_context;
}

namespace edge::daemon {
class Metrics;
}

namespace edge::daemon::forward {

// Carried on every forwarded answer to the client: the site that produced it.
inline constexpr std::string_view kServedByHeader = "X-Edgeserve-Site";

struct PeerClientConfig {
    std::string site_id;    // This site's id: the value of the hop header.
    std::string ca_path;    // PEM: the cluster CA that peers' certificates must chain to.
    std::string cert_path;  // PEM: this site's certificate, presented as the client certificate.
    std::string key_path;   // PEM: its private key.
    std::chrono::milliseconds connect_timeout{2'000};  // Name lookup + TCP connect + TLS handshake.
    std::chrono::milliseconds response_timeout{30'000};     // Request sent to response head.
    // Longest silence in a response body (a deferred answer's, once its first byte came).
    std::chrono::milliseconds stream_idle_timeout{60'000};
    // Longest wait from a deferred head (the peer accepted a non-streamed request) to its
    // answer's first byte; 0: none.
    std::chrono::milliseconds deferred_answer_timeout{600'000};
    std::chrono::milliseconds pool_idle_timeout{30'000};    // Older idle connections are closed.
    int32_t max_idle_connections = 16;  // Idle connections pooled per peer.
    double retry_budget = 0.2;          // Retries in flight / forwards in flight, at most...
    int32_t min_retry_concurrency = 3;  // ...but this many retries in flight always allowed.
    uint64_t max_response_bytes = 64 * 1024 * 1024;  // Largest non-streamed answer, bytes.
    // A peer's certificate must name the site it is forwarded to (peer.verify_site_identity).
    bool verify_site_identity = true;
    // TESTING ONLY: site id -> artificial one-way delay on forwards to it (see above).
    std::map<std::string, std::chrono::milliseconds> testing_delay;
};

class PeerClient final : public cluster::Forwarder {
public:
    // Loads the certificate, key and CA (errors name the file). `metrics` may be null.
    static Result<std::unique_ptr<PeerClient>> create(boost::asio::io_context& io,
                                                      PeerClientConfig config, Metrics* metrics);
    ~PeerClient() override;

    // The planner that hears about every attempt (report()); null: nobody. Any thread.
    void set_planner(cluster::RoutePlanner* planner);

    void forward(tls::HttpRequest request, std::string tenant,
                 std::vector<cluster::RouteTarget> targets,
                 std::shared_ptr<tls::ResponseChannel> channel,
                 std::function<void(const cluster::ForwardResult&)> done,
                 std::function<void(int64_t prompt_tokens)> on_accepted = {},
                 cluster::EarlierTargets earlier = {}) override;

    // Re-reads cert_path, key_path and ca_path; on error nothing changes and the error (naming
    // the file) is returned. Any thread.
    Status reload();
    // Reads these files instead (a reloaded config that moved them); on success they are the
    // ones later reload() calls read. On error nothing changes. Any thread.
    Status reload(const std::string& ca_path, const std::string& cert_path,
                  const std::string& key_path);

    // Closes the pooled connections and cancels the forwards in flight (their clients get what
    // was already sent, or a 503). New forwards fail with 503 at once. Waits up to `deadline`
    // for the forwards to finish (the io_context must be running); call from a non-I/O thread.
    void stop(std::chrono::milliseconds deadline);

    // A function to call (any thread) when gossip declares a site dead: the forwards in flight to
    // it end now, rerun elsewhere when no byte reached the client, else cut in-band, rather than
    // at stream_idle_timeout (a paused or partitioned site keeps its connections open). It
    // does nothing once this PeerClient is gone.
    std::function<void(const std::string& site_id)> site_lost_handler();

    // Figures for tests and metrics.
    int64_t active() const;            // Forwards in flight.
    int64_t connections_opened() const;  // TLS connections made since start.
    int64_t idle_connections() const;  // Pooled idle connections, all peers.

    class Impl;

private:
    explicit PeerClient(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<Impl> impl_;
};

}  // namespace edge::daemon::forward
