// ApiRouter's answers about models: GET /v1/models and /v1/models/{model} (the models a tenant
// may use, the list's body kept until the models change), the models known here and at other
// sites, and whether a request for a model can run on this site (serves_here()).

#include "daemon/api/api_router.h"

#include <algorithm>
#include <string>

#include <boost/json.hpp>

#include "common/json_text.h"
#include "daemon/api/completion.h"

namespace edge::daemon::api {

std::vector<engine::ModelInfo> ApiRouter::known_models() const {
    std::vector<engine::ModelInfo> models = generator_.models();
    if (cluster::RoutePlanner* planner = planner_.load()) {
        for (std::string& name : planner->cluster_models()) {
            if (std::none_of(models.begin(), models.end(),
                             [&](const engine::ModelInfo& m) { return m.name == name; })) {
                engine::ModelInfo remote;
                remote.name = std::move(name);
                models.push_back(std::move(remote));
            }
        }
    }
    return models;
}

bool ApiRouter::model_exists(const std::string& model) const {
    if (generator_.has_model(model)) {
        return true;
    }
    cluster::RoutePlanner* planner = planner_.load();
    if (planner == nullptr) {
        return false;
    }
    const std::vector<std::string> advertised = planner->advertised_models();
    return std::find(advertised.begin(), advertised.end(), model) != advertised.end();
}

void ApiRouter::models_endpoint(std::shared_ptr<tls::ResponseChannel>& channel,
                                const Tenant* tenant, std::string_view id) {
    // Only the models this tenant may use, as OpenAI lists those its key can call.
    std::vector<engine::ModelInfo> models = known_models();
    std::erase_if(models, [&](const engine::ModelInfo& m) {
        return tenant != nullptr && !tenant->may_use(m.name);
    });
    auto model_json = [](const engine::ModelInfo& m) {
        boost::json::object model;
        model["id"] = m.name;
        model["object"] = "model";
        model["created"] = m.created_unix;
        model["owned_by"] = "edgeserve";
        if (!m.version.empty()) {
            model["version"] = m.version;  // The digest X-Model-Version pins.
        }
        return model;
    };
    tls::HttpResponse response;
    if (!id.empty()) {  // GET /v1/models/{model}
        for (const engine::ModelInfo& m : models) {
            if (m.name == id) {
                response.body = json_text(model_json(m));
                channel->respond(std::move(response));
                return;
            }
        }
        // The id comes from the request target, which may hold any byte: JSON is UTF-8.
        channel->respond(model_not_found(logprob_token_text(id)).to_response());
        return;
    }
    std::vector<std::pair<std::string, int64_t>> key;
    key.reserve(models.size());
    for (const engine::ModelInfo& m : models) {
        key.emplace_back(m.name + '\n' + m.version, m.created_unix);  // What the body shows.
    }
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
        data.push_back(model_json(m));
    }
    boost::json::object root;
    root["object"] = "list";
    root["data"] = std::move(data);
    response.body = json_text(root);
    {
        std::lock_guard lock(models_mu_);
        models_key_ = std::move(key);
        models_body_ = response.body;
    }
    channel->respond(std::move(response));
}

bool ApiRouter::serves_here(const std::string& model, std::string_view version_pin,
                            ApiError& error, std::string_view no_elsewhere) const {
    for (const engine::ModelInfo& m : generator_.models()) {
        if (m.name != model) {
            continue;
        }
        if (!version_pin.empty() && !m.version.empty() && m.version != version_pin) {
            error.status = 503;
            error.type = "server_error";
            error.code = "version_pin_unmatched";
            error.message = "Site '" + site_id_ + "' serves model '" + model + "' in version " +
                            m.version + ", not the pinned " + logprob_token_text(version_pin) +
                            "; " + std::string(no_elsewhere) + ".";
            return false;
        }
        return true;
    }
    error.status = 503;
    error.type = "server_error";
    error.code = "model_not_served_here";
    error.message = "Site '" + site_id_ + "' does not serve model '" + model + "'; " +
                    std::string(no_elsewhere) + ".";
    return false;
}

}  // namespace edge::daemon::api
