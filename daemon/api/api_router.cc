#include "daemon/api/api_router.h"

#include <algorithm>

#include <boost/json.hpp>

#include "common/log.h"
#include "daemon/api/completion.h"
#include "daemon/api/openai_request.h"

namespace edge::daemon::api {
namespace {

ApiError auth_error(AuthOutcome outcome) {
    ApiError e;
    e.status = 401;
    e.code = "invalid_api_key";
    e.message = outcome == AuthOutcome::kMissing
                    ? "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'."
                    : "Incorrect API key provided.";
    return e;
}

ApiError method_not_allowed(std::string_view method, std::string_view path) {
    ApiError e;
    e.status = 405;
    e.message = "Method " + std::string(method) + " is not allowed on " + std::string(path);
    return e;
}

ApiError limit_error(RejectReason reason, Duration retry_after, const std::string& tenant) {
    ApiError e;
    e.status = 429;
    e.type = "rate_limit_exceeded";
    e.code = reject_reason_name(reason);
    int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(retry_after).count();
    int64_t seconds = ns <= 0 ? 1 : (ns + 999'999'999) / 1'000'000'000;
    e.retry_after_seconds = static_cast<int>(std::clamp<int64_t>(seconds, 1, 86'400));
    e.message = "Tenant '" + tenant + "' exceeded its limit " + reject_reason_name(reason) +
                "; retry after " + std::to_string(e.retry_after_seconds) + " s.";
    return e;
}

}  // namespace

void ApiRouter::set_tenants(std::shared_ptr<const TenantTable> tenants) {
    std::lock_guard lock(tenants_mu_);
    tenants_ = std::move(tenants);
}

std::shared_ptr<const TenantTable> ApiRouter::tenants() const {
    std::lock_guard lock(tenants_mu_);
    return tenants_;
}

void ApiRouter::list_models(std::shared_ptr<tls::ResponseChannel>& channel) {
    std::vector<engine::ModelInfo> models = generator_.models();
    std::vector<std::pair<std::string, int64_t>> key;
    key.reserve(models.size());
    for (const engine::ModelInfo& m : models) {
        key.emplace_back(m.name, m.created_unix);
    }
    tls::HttpResponse response;
    {
        std::lock_guard lock(models_mu_);
        if (key == models_key_ && !models_body_.empty()) {
            response.body = models_body_;
            channel->respond(std::move(response));
            return;
        }
    }
    boost::json::array data;
    for (const engine::ModelInfo& m : models) {
        boost::json::object model;
        model["id"] = m.name;
        model["object"] = "model";
        model["created"] = m.created_unix;
        model["owned_by"] = "edgeserve";
        data.push_back(std::move(model));
    }
    boost::json::object root;
    root["object"] = "list";
    root["data"] = std::move(data);
    response.body = boost::json::serialize(root);
    {
        std::lock_guard lock(models_mu_);
        models_key_ = std::move(key);
        models_body_ = response.body;
    }
    channel->respond(std::move(response));
}

void ApiRouter::handle(tls::HttpRequest request, std::shared_ptr<tls::ResponseChannel> channel) {
    std::string_view path = request.path();
    if (access_log_) {
        log::info("request", {{"method", request.method},
                              {"path", std::string(path)},
                              {"client", request.remote_address}});
    }
    Endpoint endpoint;
    if (path == "/v1/models") {
        if (request.method != "GET") {
            ApiError e = method_not_allowed(request.method, path);
            tls::HttpResponse r = e.to_response();
            r.headers.push_back({"Allow", "GET"});
            channel->respond(std::move(r));
            return;
        }
    } else if (path == "/v1/chat/completions" || path == "/v1/completions") {
        if (request.method != "POST") {
            ApiError e = method_not_allowed(request.method, path);
            tls::HttpResponse r = e.to_response();
            r.headers.push_back({"Allow", "POST"});
            channel->respond(std::move(r));
            return;
        }
        endpoint = path == "/v1/completions" ? Endpoint::kCompletions
                                             : Endpoint::kChatCompletions;
    } else {
        ApiError e;
        e.status = 404;
        e.message = "Unknown request URL: " + request.method + " " + std::string(path);
        e.code = "unknown_url";
        channel->respond(e.to_response());
        return;
    }

    std::shared_ptr<const TenantTable> table = tenants();
    TenantTable::Match auth = table->authenticate(request.header("authorization"));
    if (auth.outcome != AuthOutcome::kOk) {
        channel->respond(auth_error(auth.outcome).to_response());
        return;
    }
    if (path == "/v1/models") {
        list_models(channel);
        return;
    }
    std::variant<ParsedRequest, ApiError> parsed = parse_openai_request(endpoint, request.body);
    if (auto* error = std::get_if<ApiError>(&parsed)) {
        channel->respond(error->to_response());
        return;
    }
    ParsedRequest& req = std::get<ParsedRequest>(parsed);
    const Tenant& tenant = *auth.tenant;
    auto reject = [&](const ApiError& e, std::string_view reason) {
        if (metrics_ != nullptr) {
            metrics_->on_tenant_rejected(tenant.name, reason);
            metrics_->on_tenant_request(tenant.name, "rejected");
        }
        channel->respond(e.to_response());
    };
    if (!tenant.may_use(req.generate.model)) {
        ApiError e;
        e.status = 403;
        e.type = "permission_error";
        e.param = "model";
        e.code = "model_not_allowed";
        e.message = "Tenant '" + tenant.name + "' may not use model '" +
                    req.generate.model + "'.";
        reject(e, "model_not_allowed");
        return;
    }
    int32_t& max_tokens = req.generate.sampling.max_tokens;
    if (tenant.max_output_tokens > 0 && max_tokens > tenant.max_output_tokens) {
        if (req.max_tokens_given) {
            reject(invalid_request("max_tokens (" + std::to_string(max_tokens) +
                                       ") exceeds this tenant's limit of " +
                                       std::to_string(tenant.max_output_tokens),
                                   "max_tokens"),
                   "max_output_tokens");
            return;
        }
        max_tokens = static_cast<int32_t>(tenant.max_output_tokens);  // Lower the default.
    }
    req.generate.max_context_tokens = tenant.max_context_tokens;
    req.generate.tenant_weight = tenant.weight;
    req.generate.priority = tenant.priority;
    TenantLimiter::Decision admitted = limiter_.admit(tenant.name);
    if (admitted.reason != RejectReason::kNone) {
        reject(limit_error(admitted.reason, admitted.retry_after, tenant.name),
               reject_reason_name(admitted.reason));
        return;
    }
    req.generate.tenant = tenant.name;
    char id[24];
    std::snprintf(id, sizeof(id), "%016llx",
                  static_cast<unsigned long long>(next_request_.fetch_add(1)));
    req.generate.request_id = id;
    std::string tenant_name = tenant.name;
    run_completion(
        generator_, std::move(req), std::move(channel), clock_.wall_now_us() / 1'000'000,
        [lease = std::move(admitted.lease), metrics = metrics_,
         tenant_name](const engine::Finish& finish) {
            lease->finish(finish.usage.prompt_tokens, finish.usage.completion_tokens);
            if (metrics != nullptr) {
                metrics->on_tenant_tokens(tenant_name, finish.usage.prompt_tokens,
                                          finish.usage.completion_tokens);
                const char* outcome = finish.reason == engine::FinishReason::kError ? "error"
                                      : finish.reason == engine::FinishReason::kCancelled
                                          ? "cancelled"
                                          : "ok";
                metrics->on_tenant_request(tenant_name, outcome);
            }
        });
}

}  // namespace edge::daemon::api
