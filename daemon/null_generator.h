#pragma once

// NullGenerator serves no models: the daemon uses it when the config lists none, so the API runs
// (GET /v1/models is empty, completions answer 404 model_not_found). Stateless; thread-safe.

#include "engine/generator.h"

namespace edge::daemon {

class NullGenerator final : public engine::Generator {
public:
    std::vector<engine::ModelInfo> models() const override { return {}; }
    bool has_model(std::string_view) const override { return false; }
    Result<std::shared_ptr<engine::GenerationHandle>> submit(
        engine::GenerateRequest request, std::shared_ptr<engine::GenerationSink> sink) override {
        return not_found_error("model '" + request.model + "' is not served here");
    }
    bool ready() const override { return true; }
    std::vector<engine::ModelLoad> load() const override { return {}; }
};

}  // namespace edge::daemon
