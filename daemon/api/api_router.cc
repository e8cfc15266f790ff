#include "daemon/api/api_router.h"

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

}  // namespace

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

    TenantTable::Match auth = tenants_.authenticate(request.header("authorization"));
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
    if (!auth.tenant->may_use(req.generate.model)) {
        ApiError e;
        e.status = 403;
        e.type = "permission_error";
        e.param = "model";
        e.code = "model_not_allowed";
        e.message = "Tenant '" + auth.tenant->name + "' may not use model '" +
                    req.generate.model + "'.";
        channel->respond(e.to_response());
        return;
    }
    req.generate.tenant = auth.tenant->name;
    char id[24];
    std::snprintf(id, sizeof(id), "%016llx",
                  static_cast<unsigned long long>(next_request_.fetch_add(1)));
    req.generate.request_id = id;
    run_completion(generator_, std::move(req), std::move(channel),
                   clock_.wall_now_us() / 1'000'000);
}

}  // namespace edge::daemon::api
