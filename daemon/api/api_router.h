#pragma once

// ApiRouter is the public listener's HttpHandler: it routes GET /v1/models and POST
// /v1/chat/completions and /v1/completions, authenticates the tenant, checks the tenant may use
// the model, enforces the tenant's limits (TenantLimiter: 429 with Retry-After; max_tokens and
// context caps: 400) and hands the parsed request to the injected Generator. Other paths get an
// OpenAI 404, other methods on known paths a 405 with Allow. Thread-safe: handle() runs on
// connection strands concurrently; set_tenants() (SIGHUP reload) swaps the table under a mutex,
// and requests already admitted keep the table they started with. The generator, limiter,
// metrics and clock must outlive it.
//
// Between sites: with a RoutePlanner installed (set_route_planner; without one every request runs
// here), an admitted completion goes where the plan says: here, to the Forwarder (another site), or
// a 503 that says why no pool can take it (Retry-After when waiting helps). handle() serves the
// public listener, where the hop header (cluster::kHopHeader) is refused with a 400: only sites
// forward. handle_forwarded() serves the peer (mutual TLS) listener: it requires the hop header and
// an authenticated peer, takes the tenant from cluster::kTenantHeader (the forwarding site
// authenticated it and charged its limits), and always runs the request here, never forwarding it
// again, so a forwarding loop cannot form. The planner and forwarder must outlive the router.

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/clock.h"
#include "daemon/api/api_error.h"
#include "daemon/api/openai_request.h"
#include "daemon/cluster/route_planner.h"
#include "daemon/metrics.h"
#include "daemon/tenant_limiter.h"
#include "daemon/tenants.h"
#include "engine/generator.h"
#include "tls/http_types.h"

namespace edge::daemon::api {

using cluster::EarlierTargets;

class ApiRouter final : public tls::HttpHandler {
public:
    // `metrics` may be null.
    ApiRouter(engine::Generator& generator, std::shared_ptr<const TenantTable> tenants,
              TenantLimiter& limiter, Metrics* metrics, Clock& clock)
        : generator_(generator),
          tenants_(std::move(tenants)),
          limiter_(limiter),
          metrics_(metrics),
          clock_(clock) {}

    void set_tenants(std::shared_ptr<const TenantTable> tenants);
    // Whether the tenant table in force checks API keys.
    bool tenants_enabled() const { return tenants()->enabled(); }
    // The tenant table in use (any thread).
    std::shared_ptr<const TenantTable> tenants() const;
    // Null: everything runs here. Any thread, any time; must outlive the router.
    void set_route_planner(cluster::RoutePlanner* planner) { planner_.store(planner); }
    // Carries requests planned for another site; null: such plans fail with 503. Before serving.
    void set_forwarder(cluster::Forwarder* forwarder) { forwarder_ = forwarder; }
    // This site's id, for error messages. Before serving.
    void set_site_id(std::string site_id) { site_id_ = std::move(site_id); }
    // Whether a forwarded request's hop header must be a DNS subjectAltName of the client
    // certificate (peer.verify_site_identity; default on). Before serving.
    void set_verify_site_identity(bool verify) { verify_site_identity_ = verify; }

    // The public listener.
    void handle(tls::HttpRequest request, std::shared_ptr<tls::ResponseChannel> channel) override;
    // The peer listener: requests other sites forwarded here.
    void handle_forwarded(tls::HttpRequest request, std::shared_ptr<tls::ResponseChannel> channel);

private:
    void serve(tls::HttpRequest request, std::shared_ptr<tls::ResponseChannel> channel,
               bool from_peer);
    // This site's models and those other sites serve (a request for one is forwarded there).
    std::vector<engine::ModelInfo> known_models() const;
    // Whether `model` exists: this site has it, or some site of the cluster advertises it in any
    // state (RoutePlanner::advertised_models); a request for one that does not is a 404.
    bool model_exists(const std::string& model) const;
    // GET /v1/models (`id` empty) or /v1/models/{id}: the models `tenant` may use (all for a
    // null tenant: a forwarded request).
    void models_endpoint(std::shared_ptr<tls::ResponseChannel>& channel, const Tenant* tenant,
                         std::string_view id);
    // Whether a request for `model` (pinned to `version_pin`, "" for none) can run here; else
    // `error` says why (code version_pin_unmatched or model_not_served_here), ending with
    // `no_elsewhere`: why no other site will be tried.
    bool serves_here(const std::string& model, std::string_view version_pin, ApiError& error,
                     std::string_view no_elsewhere) const;
    // Where a request the engine here refused for its load goes instead (the channel, still
    // unanswered, and the admission's lease).
    using Elsewhere = std::function<void(std::shared_ptr<tls::ResponseChannel> channel,
                                         std::shared_ptr<TenantLimiter::Lease> lease)>;
    // Runs an admitted request on this site's engine, settling `lease` when it ends. With
    // `elsewhere`, a refusal at submit for the site's load (kUnavailable: the model's queue
    // full, overloaded, shutting down) is handed to it instead of answered. `earlier`: what the
    // remote targets tried before this site left of it.
    void run_here(ParsedRequest req, std::shared_ptr<tls::ResponseChannel> channel,
                  std::shared_ptr<TenantLimiter::Lease> lease, const std::string& tenant_name,
                  Elsewhere elsewhere = {}, EarlierTargets earlier = {});
    // An Elsewhere that forwards the request (its peer headers set) to `targets`, remote ones,
    // after the targets that left `earlier` (forward_to()).
    Elsewhere forward_elsewhere(std::shared_ptr<tls::HttpRequest> request,
                                std::vector<cluster::RouteTarget> targets,
                                const std::string& tenant_name, int64_t most_output,
                                EarlierTargets earlier = {});
    // Sends an admitted request (its peer headers set) to `targets` through the forwarder,
    // settling `lease` when it ends; `req` runs here when the plan's local target comes next
    // (null for a list without one). `most_output`: what it may generate, charged when the
    // answer is cut before the peer's usage report. `earlier`: what the targets tried before
    // these left of it, settled with the forward's result as one list of targets would be.
    void forward_to(tls::HttpRequest request, std::shared_ptr<ParsedRequest> req,
                    std::vector<cluster::RouteTarget> targets,
                    std::shared_ptr<tls::ResponseChannel> channel,
                    std::shared_ptr<TenantLimiter::Lease> lease, const std::string& tenant_name,
                    int64_t most_output, EarlierTargets earlier = {});

    engine::Generator& generator_;
    mutable std::mutex tenants_mu_;
    std::shared_ptr<const TenantTable> tenants_;
    TenantLimiter& limiter_;
    Metrics* const metrics_;
    Clock& clock_;
    // Request ids count from a random start, so ids (and the response ids made from them) do
    // not repeat across restarts or between sites.
    std::atomic<uint64_t> next_request_{uint64_t{std::random_device{}()} << 32};
    std::atomic<cluster::RoutePlanner*> planner_{nullptr};
    cluster::Forwarder* forwarder_ = nullptr;
    std::string site_id_;
    bool verify_site_identity_ = true;
    // GET /v1/models body, rebuilt only when the model list changes.
    std::mutex models_mu_;
    std::vector<std::pair<std::string, int64_t>> models_key_;
    std::string models_body_;
};

}  // namespace edge::daemon::api
