#pragma once

// Config is the daemon's whole configuration, as loaded from one YAML file and validated:
// listeners, site identity, models, engine tuning, tenants, limits, the PROXY protocol peers and
// routing between sites.
// load_config() is the only place that talks to yaml-cpp; every error it returns names
// file:line:column and the key (unknown keys are errors too). Plain values, no threading concerns.
// Every key is documented in docs/config.md.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/engine.h"
#include "routing/health/outlier_detector.h"
#include "routing/selection/cost.h"
#include "routing/selection/selector.h"
#include "tls/tls_context.h"

namespace edge::daemon {

struct PublicListenerConfig {
    std::string address = "0.0.0.0";  // Listen address for HTTPS.
    uint16_t port = 8443;              // TCP port; 0 picks a free one (tests).
    int32_t io_threads = 1;            // Threads running network I/O (TLS, HTTP).
    std::vector<tls::CertificateConfig> certificates;  // First is the default (no SNI match).
    // How often the certificate files (these and the peer section's) are checked for changes,
    // which reload them as SIGHUP does; 0: only SIGHUP reloads them.
    std::chrono::milliseconds certificate_watch{5000};

    bool operator==(const PublicListenerConfig&) const = default;
};

struct AdminListenerConfig {
    std::string address = "127.0.0.1";  // Plain HTTP; keep it on loopback or a private network.
    uint16_t port = 9443;               // TCP port; 0 picks a free one (tests).
    // File holding the bearer token every /admin/ request must carry; empty: none (then only
    // loopback clients may make state-changing admin requests). Reloaded on SIGHUP.
    std::string token_file;
    // DNS names a request's Host may carry besides IP literals and localhost (DNS rebinding
    // guard), as written; {"*"}: any Host. Restart-only, as address and port are.
    std::vector<std::string> host_names;

    bool operator==(const AdminListenerConfig&) const = default;
};

struct SiteConfig {
    std::string id;            // Unique name of this PoP, e.g. "fra1".
    std::string region;        // Free-form region label, e.g. "eu-central".
    double latitude = 0.0;     // Degrees north, -90..90.
    double longitude = 0.0;    // Degrees east, -180..180.
    // host:port other sites send forwarded requests to (this site's peer mTLS listener), as
    // gossiped; empty: this site takes no forwarded requests (the daemon may fill it in from the
    // bound peer listener).
    std::string peer_address;
    // host:port other sites reach this site's admin listener at (active /readyz checks); empty:
    // the admin listen address and bound port.
    std::string admin_address;

    bool operator==(const SiteConfig&) const = default;
};

struct TenantConfig {
    std::string name;                         // Shown in logs and metrics; never the key.
    std::vector<std::string> api_key_sha256;  // Lower-case hex SHA-256 of each accepted key.
    std::vector<std::string> models;          // Models the tenant may use; empty (absent): all.
    int32_t weight = 1;      // Share of engine capacity relative to other tenants (1..10000).
    int32_t priority = 0;    // Higher is preempted last (0..100).
    // Limits; 0 means unlimited.
    double requests_per_second = 0;        // Sustained request rate, requests/s (0.5: 30/min).
    int64_t burst = 0;                     // Requests allowed at once above the rate; 0: the rate.
    int64_t input_tokens_per_minute = 0;   // Prompt tokens per minute (charged after each request).
    int64_t output_tokens_per_minute = 0;  // Generated tokens per minute (charged as produced).
    int64_t max_concurrent = 0;            // Requests running at once.
    int64_t max_context_tokens = 0;        // Prompt + max_tokens of one request, tokens.
    int64_t max_output_tokens = 0;         // max_tokens of one request.
};

struct LimitsConfig {
    std::chrono::milliseconds handshake_timeout{10'000};  // PROXY header + TLS handshake.
    std::chrono::milliseconds header_timeout{10'000};     // Reading a request's headers.
    std::chrono::milliseconds body_timeout{30'000};       // Reading a request's body.
    std::chrono::milliseconds request_read_timeout{300'000};  // A whole request; 0: none.
    std::chrono::milliseconds idle_timeout{60'000};       // Keep-alive wait between requests.
    std::chrono::milliseconds write_timeout{30'000};      // One write to a slow reader.
    uint64_t max_header_bytes = 16 * 1024;                // Request line + headers, bytes.
    uint64_t max_body_bytes = 4 * 1024 * 1024;            // Request body, bytes.
    uint64_t max_connections = 10'000;                    // Open public connections at most.
    uint64_t max_stream_buffer_bytes = 1024 * 1024;       // Queued for a slow stream reader.
    std::chrono::milliseconds stream_keepalive{15'000};   // SSE comment after this silence.
    std::chrono::milliseconds drain_deadline{30'000};     // SIGTERM: longest wait for in-flight.

    bool operator==(const LimitsConfig&) const = default;
};

struct ProxyProtocolConfig {
    std::vector<std::string> trusted;  // CIDRs of load balancers allowed to send PROXY v1/v2.

    bool operator==(const ProxyProtocolConfig&) const = default;
};

struct LogConfig {
    std::string level = "info";  // debug, info, warn, error.
    bool access_log = false;     // One info line per request (method, path, status, duration).

    bool operator==(const LogConfig&) const = default;
};

// Routing between sites: the cost function's tunables and the choice's margin and hysteresis
// (the defaults are those of routing/selection; units there are seconds, in YAML milliseconds).
struct RoutingConfig {
    routing::selection::CostConfig cost;
    routing::selection::SelectionConfig selection;
    // Passive outlier detection of pools (Envoy's defaults; `routing.outlier.*`).
    routing::health::OutlierConfig outlier;
    // Unpinned requests prefer each model's target version (the newest rollout intent); true
    // lets them fall back to other versions when no pool of the target version can take them.
    bool version_fallback = true;
    // Initial target version digest per model (a rollout intent at Lamport time 0; any
    // `edgeserve rollout` overrides it cluster-wide).
    std::map<std::string, std::string> target_versions;

    bool operator==(const RoutingConfig&) const = default;
};

// Gossip membership between sites (routing/membership over UDP and TCP on one port). Absent:
// the site runs alone and every request is served locally.
struct GossipConfig {
    bool enabled = false;                  // True when the `gossip` section is present.
    std::string bind_address = "0.0.0.0";  // IP literal the UDP and TCP sockets bind to.
    uint16_t port = 7946;                  // UDP and TCP port; 0 picks a free one (tests).
    std::string advertise_address;         // host:port other sites reach; "": bind address:port.
    std::vector<std::string> join;         // host:port of members to join through at start.
    std::string preset = "lan";            // Timing profile: lan, wan or local (loopback tests).
    std::string label;                     // Cluster label; clusters with others never mix.
    std::vector<std::string> keys;         // AES-256 keys, 64 hex digits each; first is primary.
    std::string keyring_file;              // File with one hex key per line, after `keys`.
    // The gossip snapshot file (routing/membership/snapshot_file.h): the user event Lamport
    // clock and the members alive, kept across restarts. "": none. Absent from the config, it
    // is $STATE_DIRECTORY/gossip.snapshot when the environment has STATE_DIRECTORY (systemd's
    // StateDirectory=), else none; only the path is decided at load, the file is not touched.
    std::string snapshot_file;
    // Overrides of the preset's timing; 0 keeps the preset's value. Milliseconds.
    std::chrono::milliseconds probe_interval{0};
    std::chrono::milliseconds probe_timeout{0};
    std::chrono::milliseconds gossip_interval{0};
    std::chrono::milliseconds push_pull_interval{0};
    int32_t suspicion_mult = 0;  // 0 keeps the preset's.
    // While no other member is alive, the first wait before the join seeds are tried again
    // (doubling up to 30 s); 0 keeps the default (1 s).
    std::chrono::milliseconds join_retry_interval{0};
    // Inbound gossip TCP streams served at once (more are closed at accept); 0 keeps the
    // default (64).
    int32_t max_inbound_streams = 0;
    // Members kept at most, dead ones included (alive messages naming more are refused), and
    // site-state fetches in flight at once; 0 keeps the defaults (65536 and 32).
    int64_t max_members = 0;
    int32_t max_fetches_in_flight = 0;
    // How often this site's pools and load are sampled for publication (only material changes
    // are gossiped).
    std::chrono::milliseconds publish_interval{500};
    // After leaving, how long the leave keeps being gossiped before the sockets close.
    std::chrono::milliseconds leave_drain{1000};
    // Active checks of every peer's /readyz; 0 disables them.
    std::chrono::milliseconds health_check_interval{2000};
    std::chrono::milliseconds health_check_timeout{1000};  // One check's deadline.
    // TESTING ONLY: artificial one-way delay added to this site's gossip packets to the named
    // site (site id -> milliseconds), and twice over (there and back) to requests forwarded to
    // it, so tests on loopback see distinct RTTs. load_config() refuses it unless the
    // environment sets EDGESERVE_TESTING=1.
    std::map<std::string, std::chrono::milliseconds> testing_peer_delay;

    bool operator==(const GossipConfig&) const = default;
};

// The peer listener and the forwarding client between sites (mutual TLS with a cluster CA). The
// same certificate serves both: as the peer listener's server certificate and as the client
// certificate this site presents when it forwards. Absent: no peer listener, no forwarding.
struct PeerConfig {
    std::string address = "0.0.0.0";  // Listen address of the peer (mTLS) listener.
    uint16_t port = 8444;              // TCP port; 0 picks a free one (tests).
    std::string ca_path;               // PEM: the cluster CA that signs every site's certificate.
    std::string cert_path;             // PEM: this site's certificate (server and client).
    std::string key_path;              // PEM: its private key.
    std::chrono::milliseconds connect_timeout{2'000};  // TCP connect + TLS handshake to a peer.
    std::chrono::milliseconds response_timeout{30'000};  // Request sent to response head.
    std::chrono::milliseconds stream_idle_timeout{60'000};  // Longest silence inside a response.
    // Longest wait for a non-streamed answer once the peer accepted it (its deferred head) until
    // the answer's first byte: the generation's; 0: none. 10 min, the OpenAI SDKs' own timeout.
    std::chrono::milliseconds deferred_answer_timeout{600'000};
    std::chrono::milliseconds pool_idle_timeout{30'000};  // Idle pooled connections older are
                                                          // closed, not reused.
    int32_t max_idle_connections = 16;  // Idle keep-alive connections pooled per peer.
    // Retries in flight at most this fraction of the forwarded requests in flight...
    double retry_budget = 0.2;
    int32_t min_retry_concurrency = 3;  // ...but this many retries are always allowed.
    uint64_t max_response_bytes = 64 * 1024 * 1024;  // Largest non-streamed peer answer, bytes.
    // Each side's certificate must name its site id as a DNS subjectAltName: the forwarding
    // client checks the site it forwards to, the listener the site the hop header names.
    bool verify_site_identity = true;

    bool operator==(const PeerConfig&) const = default;
};

struct Config {
    std::string source;  // The file it came from.
    PublicListenerConfig listener;
    AdminListenerConfig admin;
    SiteConfig site;
    std::vector<engine::ModelConfig> models;  // Empty: no engine, /v1/models lists nothing.
    engine::EngineConfig engine;              // `models` is filled from the list above.
    // Absent: authentication is off (logged at start). Present (even empty): keys required.
    std::optional<std::vector<TenantConfig>> tenants;
    LimitsConfig limits;
    ProxyProtocolConfig proxy_protocol;
    LogConfig log;
    RoutingConfig routing;
    GossipConfig gossip;
    std::optional<PeerConfig> peer;  // Absent: no peer listener, no forwarding.
};

// Whether `s` may name a site, region or tenant: 1 to 64 letters, digits, '.', '_' or '-' (they
// become metric labels, log fields and gossiped fields).
bool is_identifier(std::string_view s);

// Reads and validates `path`. Relative paths inside (certificates, models) are resolved against
// the directory of `path`.
Result<Config> load_config(const std::string& path);

// The sections whose restart-only settings differ between `running` and `fresh` (added,
// removed or changed), in name order: a SIGHUP does not apply them. The parsed values are
// compared, not the YAML: key order, layout, comments and a default written out change nothing.
// What SIGHUP reloads is left out (`tenants`, listeners.public.certificates, peer.ca/cert/key,
// gossip.keys/keyring_file, routing's weights: all of `routing` but outlier and target_versions).
std::vector<std::string> changed_restart_sections(const Config& running, const Config& fresh);

// For a reload of a site outside a cluster: every model a tenant of `fresh` names is one of
// `served`, the models the running site serves. `models` is restart-only, so a tenant list
// checked against the new config's models alone (as parse_config() does) can name a model that
// is not served until the restart (the reload takes it and warns with this). kInvalidArgument
// names the config file and every such key (tenants[i].models[j]) with its model; OK without
// `tenants`.
Status check_tenant_models(const Config& fresh, const std::vector<std::string>& served);

// Parses YAML text; `source` names it in errors and is the base for relative paths. Never throws.
Result<Config> parse_config(std::string_view yaml_text, const std::string& source);

}  // namespace edge::daemon
