#pragma once

// ApiRouter is the public listener's HttpHandler: it routes GET /v1/models and POST
// /v1/chat/completions and /v1/completions, authenticates the tenant, checks the tenant may use
// the model, and hands the parsed request to the injected Generator. Other paths get an OpenAI
// 404, other methods on known paths a 405 with Allow. Thread-safe: handle() runs on connection
// strands concurrently; its state is immutable or atomic. The generator, tenants and clock must
// outlive it.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "daemon/tenants.h"
#include "engine/generator.h"
#include "tls/http_types.h"

namespace edge::daemon::api {

class ApiRouter final : public tls::HttpHandler {
public:
    ApiRouter(engine::Generator& generator, const TenantTable& tenants, Clock& clock,
              bool access_log)
        : generator_(generator), tenants_(tenants), clock_(clock), access_log_(access_log) {}

    void handle(tls::HttpRequest request, std::shared_ptr<tls::ResponseChannel> channel) override;

private:
    void list_models(std::shared_ptr<tls::ResponseChannel>& channel);

    engine::Generator& generator_;
    const TenantTable& tenants_;
    Clock& clock_;
    const bool access_log_;
    std::atomic<uint64_t> next_request_{1};
    // GET /v1/models body, rebuilt only when the model list changes.
    std::mutex models_mu_;
    std::vector<std::pair<std::string, int64_t>> models_key_;
    std::string models_body_;
};

}  // namespace edge::daemon::api
