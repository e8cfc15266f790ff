#pragma once

// ApiRouter is the public listener's HttpHandler: it routes GET /v1/models and POST
// /v1/chat/completions and /v1/completions, authenticates the tenant, checks the tenant may use
// the model, enforces the tenant's limits (TenantLimiter: 429 with Retry-After; max_tokens and
// context caps: 400) and hands the parsed request to the injected Generator. Other paths get an
// OpenAI 404, other methods on known paths a 405 with Allow. Thread-safe: handle() runs on
// connection strands concurrently; set_tenants() (SIGHUP reload) swaps the table under a mutex,
// and requests already admitted keep the table they started with. The generator, limiter,
// metrics and clock must outlive it.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "daemon/metrics.h"
#include "daemon/tenant_limiter.h"
#include "daemon/tenants.h"
#include "engine/generator.h"
#include "tls/http_types.h"

namespace edge::daemon::api {

class ApiRouter final : public tls::HttpHandler {
public:
    // `metrics` may be null.
    ApiRouter(engine::Generator& generator, std::shared_ptr<const TenantTable> tenants,
              TenantLimiter& limiter, Metrics* metrics, Clock& clock, bool access_log)
        : generator_(generator),
          tenants_(std::move(tenants)),
          limiter_(limiter),
          metrics_(metrics),
          clock_(clock),
          access_log_(access_log) {}

    void set_tenants(std::shared_ptr<const TenantTable> tenants);

    void handle(tls::HttpRequest request, std::shared_ptr<tls::ResponseChannel> channel) override;

private:
    void list_models(std::shared_ptr<tls::ResponseChannel>& channel);

    std::shared_ptr<const TenantTable> tenants() const;

    engine::Generator& generator_;
    mutable std::mutex tenants_mu_;
    std::shared_ptr<const TenantTable> tenants_;
    TenantLimiter& limiter_;
    Metrics* const metrics_;
    Clock& clock_;
    const bool access_log_;
    std::atomic<uint64_t> next_request_{1};
    // GET /v1/models body, rebuilt only when the model list changes.
    std::mutex models_mu_;
    std::vector<std::pair<std::string, int64_t>> models_key_;
    std::string models_body_;
};

}  // namespace edge::daemon::api
