#pragma once

// The fixture of the forwarding tests (forward_test.cc, forward_cut_test.cc): real Daemons on
// loopback, each with a peer (mutual TLS) listener whose certificates a cluster CA made at test
// time signs, ScriptedGenerators whose timing the test drives, a static RoutePlanner (a test double
// listing the peers) in place of the gossip-fed one, and RawPeer, a peer that is not an edgeserve
// and answers with bytes the test wrote.

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/cluster/route_planner.h"
#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "daemon/tenants.h"
#include "tests/testing/daemon_yaml.h"
#include "tests/testing/loopback_socket.h"
#include "tests/testing/scripted_generator.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/test_daemon.h"
#include "tests/testing/tls_client.h"

namespace edge::testing::forward {

using daemon::cluster::RoutePlan;
using daemon::cluster::RouteTarget;

inline constexpr const char* kKey = "sk-forward-test";

class StaticPlanner final : public daemon::cluster::RoutePlanner {
public:
    struct Report {
        std::string site;
        bool ok;
    };

    void set(RoutePlan plan) {
        std::lock_guard lock(mu_);
        plan_ = std::move(plan);
    }
    void route_to(std::vector<RouteTarget> targets) {
        RoutePlan p;
        p.targets = std::move(targets);
        set(std::move(p));
    }
    RoutePlan plan(std::string_view model, std::string_view version_pin) override {
        std::lock_guard lock(mu_);
        ++plans_;
        last_pin_ = std::string(version_pin);
        return plan_;
    }
    void report(const RouteTarget& target, bool ok, std::chrono::nanoseconds) override {
        std::lock_guard lock(mu_);
        reports_.push_back({target.site_id, ok});
    }
    std::vector<std::string> cluster_models() override {
        std::lock_guard lock(mu_);
        return cluster_models_;
    }
    void set_cluster_models(std::vector<std::string> models) {
        std::lock_guard lock(mu_);
        cluster_models_ = std::move(models);
    }
    // Models advertised beyond those serving (loading, draining, a dead member's).
    std::vector<std::string> advertised_models() override {
        std::lock_guard lock(mu_);
        std::vector<std::string> all = cluster_models_;
        all.insert(all.end(), advertised_only_.begin(), advertised_only_.end());
        return all;
    }
    void set_advertised_only(std::vector<std::string> models) {
        std::lock_guard lock(mu_);
        advertised_only_ = std::move(models);
    }
    int plans() const {
        std::lock_guard lock(mu_);
        return plans_;
    }
    std::string last_pin() const {
        std::lock_guard lock(mu_);
        return last_pin_;
    }
    std::vector<Report> reports() const {
        std::lock_guard lock(mu_);
        return reports_;
    }

private:
    mutable std::mutex mu_;
    RoutePlan plan_;  // Empty: run here.
    int plans_ = 0;
    std::string last_pin_;
    std::vector<Report> reports_;
    std::vector<std::string> cluster_models_;
    std::vector<std::string> advertised_only_;
};

struct Cluster {
    Cluster() { ca = testing::make_ca(dir.path(), "cluster-ca", "edgeserve test cluster CA"); }
    testing::TempDir dir;
    testing::TestCa ca;
    // Site certificates made elsewhere (deploy/make-cluster-certs), by site id.
    std::map<std::string, testing::TestCertificate> premade;
    // A site's own copy of the CA file (default: ca.cert_path), by site id.
    std::map<std::string, std::string> ca_files;
};

struct Site {
    // `extra`: more config sections; `peer_extra`: more keys of the peer section.
    Site(Cluster& cluster, std::string site_id, std::vector<std::string> models,
         const std::string& extra = "", bool with_peer = true, const std::string& peer_extra = "")
        : id(std::move(site_id)), generator(std::move(models)) {
        auto made = cluster.premade.find(id);
        cert = made != cluster.premade.end()
                   ? made->second
                   : testing::make_signed_certificate(cluster.ca, cluster.dir.path(), id,
                                                      {id, id + ".cluster.test", "localhost"});
        testing::DaemonYaml y;
        y.site_id = id;
        y.region = "local";
        y.cert_path = cert.cert_path;
        y.key_path = cert.key_path;
        y.drain_deadline_ms = 0;
        if (with_peer) {
            y.peer = testing::PeerYaml{cluster.ca_files.count(id) ? cluster.ca_files[id]
                                                                  : cluster.ca.cert_path,
                                       cert.cert_path, cert.key_path, 0, peer_extra};
        }
        y.extra = extra;
        daemon = testing::make_daemon(testing::daemon_yaml(y), cluster.dir.file(id + ".yaml"),
                                      generator, clock);
        daemon->set_route_planner(&planner);
        daemon->start();
    }

    RouteTarget target() const {
        return RouteTarget{false, id, "127.0.0.1:" + std::to_string(daemon->peer_port()), 0.0,
                           "m"};
    }

    std::unique_ptr<TlsClient> client() {
        auto c = TlsClient::connect(daemon->public_port());
        REQUIRE(c.ok());
        return std::move(c).value();
    }
    // `request` sent on a connection of its own, and the answer read (its reading succeeded).
    Result<testing::HttpReply> ask(const std::string& request) {
        auto c = client();
        REQUIRE(c->send(request).ok());
        auto r = c->read_response();
        REQUIRE(r.ok());
        return r;
    }
    // `request` (not streamed) sent on `c` runs here, its first one: answered with "local
    // answer" (3 prompt tokens, 2 generated), and that answer reaches the client whole.
    testing::HttpReply answered_here(TlsClient& c, const std::string& request) {
        REQUIRE(c.send(request).ok());
        REQUIRE(generator.wait_for_request(0));
        generator.emit(0, "local answer");
        generator.finish(0, engine::FinishReason::kStop, engine::Usage{3, 2, 0});
        auto r = c.read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        CHECK(r->body.find("local answer") != std::string::npos);
        return std::move(r).value();
    }

    std::string id;
    testing::TestCertificate cert;
    ManualClock clock;
    testing::ScriptedGenerator generator;
    StaticPlanner planner;
    std::unique_ptr<daemon::Daemon> daemon;
};

inline std::string tenants_section() {
    return "tenants:\n"
           "  - name: acme\n"
           "    api_key_sha256: [" + daemon::TenantTable::sha256_hex(kKey) + "]\n";
}

inline std::string auth() { return std::string("Authorization: Bearer ") + kKey + "\r\n"; }

inline std::string chat_body(bool stream, const std::string& model = "m") {
    return R"({"model":")" + model + R"(","messages":[{"role":"user","content":"hi"}])" +
           (stream ? R"(,"stream":true,"stream_options":{"include_usage":true})" : "") + "}";
}

inline std::string chat_request(bool stream, const std::string& model = "m",
                         const std::string& headers = "") {
    return testing::http_request("POST", "/v1/chat/completions", chat_body(stream, model),
                                 auth() + headers);
}

inline boost::json::object json_of(const std::string& s) {
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(s, ec);
    REQUIRE_MESSAGE(!ec, s);
    REQUIRE(v.is_object());
    return v.get_object();
}

inline std::string error_code_of(const testing::HttpReply& r) {
    auto body = json_of(r.body);
    const auto& code = body["error"].as_object()["code"];
    return code.is_string() ? std::string(code.as_string()) : "";
}

// A loopback port nobody listens on (bound, then closed).
inline uint16_t refused_port() {
    uint16_t port = 0;
    close(testing::bind_loopback(SOCK_STREAM, port));
    return port;
}

// Site `id`, whose connection is refused: a port found when the target is made, not one a site
// made since may have been given.
inline RouteTarget refusing_site(const std::string& id = "ams") {
    return RouteTarget{false, id, "127.0.0.1:" + std::to_string(refused_port()), 0.0, "m"};
}

inline bool metrics_contain(Site& site, const std::string& line) {
    return site.daemon->metrics().serialize().find(line) != std::string::npos;
}

// Whether the tenant's request was counted (with `outcome`, when given) within 3 s: the forward's
// bookkeeping is done.
inline bool request_counted(Site& a, const std::string& outcome = "") {
    const std::string line = "edgeserve_tenant_requests_total{outcome=" +
                             (outcome.empty() ? std::string() : "\"" + outcome + "\"");
    for (int i = 0; i < 300; ++i) {
        if (metrics_contain(a, line)) {
            return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
}

// Whether the head of site `peer`'s answer reached `a` within 5 s (its time to head observed,
// `count` answers of it in all): a peer's engine accepted the request once its deferred head or
// its stream's head went out, so an end after this is an error after acceptance, not a refusal.
// What a test waits on before it ends a forwarded generation, never a sleep.
inline bool peer_head_arrived(Site& a, const std::string& peer, int count = 1) {
    const std::string line = "edgeserve_forward_latency_seconds_count{site=\"" + peer + "\"} " +
                             std::to_string(count) + "\n";
    return testing::wait_for([&] { return metrics_contain(a, line); }, std::chrono::seconds(5));
}

// The tenant is in debt at `a`: its next request (`request`) gets 429 there and never reaches
// `b`, which has seen `seen` requests.
inline void check_in_debt(Site& a, Site& b, const std::string& request, size_t seen) {
    CHECK(request_counted(a));
    auto c = a.client();
    REQUIRE(c->send(request).ok());
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 429);
    CHECK_FALSE(b.generator.wait_for_request(seen, 0));
}

// A streamed answer as a peer sends it: `events` in one chunk, then the last chunk unless the
// peer is to close before it.
inline std::string chunked_events(const std::string& events, bool last_chunk) {
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", events.size());
    return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           "Transfer-Encoding: chunked\r\n\r\n" +
           std::string(size) + events + "\r\n" + (last_chunk ? "0\r\n\r\n" : "");
}

// What a peer that accepted a non-streamed request sends first (its deferred head, with the
// prompt's length, 40 tokens), before its answer's body: a RawPeer's answer that then dies.
inline constexpr const char* kAcceptedDeferredHead =
    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
    "X-Edgeserve-Deferred-Head: 1\r\nX-Edgeserve-Prompt-Tokens: 40\r\n"
    "Transfer-Encoding: chunked\r\n\r\n";

// A peer that is not an edgeserve: one TLS connection (certificate from the cluster CA), the
// request read, `answer` written, then the socket closed without a TLS close_notify.
class RawPeer {
  public:
    // Site "raw" of `cluster`, with a certificate of the cluster's CA.
    RawPeer(Cluster& cluster, std::string answer) : answer_(std::move(answer)) {
        const auto cert = testing::make_signed_certificate(cluster.ca, cluster.dir.path(), "raw",
                                                           {"raw", "localhost"});
        listen_fd_ = testing::bind_loopback(SOCK_STREAM, port_);
        ctx_ = testing::make_server_context(cert);
        thread_ = std::thread([this] { serve(); });
    }
    ~RawPeer() {
        shutdown(listen_fd_, SHUT_RDWR);
        thread_.join();
        close(listen_fd_);
        SSL_CTX_free(ctx_);
    }
    RouteTarget target() const {
        return RouteTarget{false, "raw", "127.0.0.1:" + std::to_string(port_), 0.0, "m"};
    }

  private:
    void serve() {
        const int fd = accept(listen_fd_, nullptr, nullptr);
        if (fd < 0) {
            return;
        }
        SSL* ssl = SSL_new(ctx_);
        SSL_set_fd(ssl, fd);
        if (SSL_accept(ssl) == 1) {
            std::string request;
            char buf[4096];
            // The head, then the body its Content-Length gives.
            size_t need = std::string::npos;
            while (need == std::string::npos || request.size() < need) {
                const int n = SSL_read(ssl, buf, sizeof(buf));
                if (n <= 0) {
                    break;
                }
                request.append(buf, static_cast<size_t>(n));
                const size_t head_end = request.find("\r\n\r\n");
                const size_t cl = request.find("Content-Length: ");
                if (need == std::string::npos && head_end != std::string::npos &&
                    cl != std::string::npos) {
                    need = head_end + 4 + std::stoul(request.substr(cl + 16));
                }
            }
            SSL_write(ssl, answer_.data(), static_cast<int>(answer_.size()));
        }
        SSL_free(ssl);
        close(fd);
    }

    std::string answer_;
    int listen_fd_ = -1;
    uint16_t port_ = 0;
    SSL_CTX* ctx_ = nullptr;
    std::thread thread_;
};

}  // namespace edge::testing::forward
