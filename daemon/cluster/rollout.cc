#include "daemon/cluster/rollout.h"

namespace edge::daemon::cluster {

namespace {
constexpr size_t kMaxField = 255;
}

std::vector<uint8_t> encode_rollout(std::string_view model, std::string_view version) {
    std::vector<uint8_t> out(model.begin(), model.end());
    out.push_back('\n');
    out.insert(out.end(), version.begin(), version.end());
    return out;
}

Result<RolloutIntent> decode_rollout(std::span<const uint8_t> payload, uint64_t ltime) {
    if (payload.size() > 2 * kMaxField + 1) {
        return invalid_argument_error("rollout event: payload of " +
                                      std::to_string(payload.size()) + " bytes is too long");
    }
    const std::string_view text(reinterpret_cast<const char*>(payload.data()), payload.size());
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos) {
        return invalid_argument_error("rollout event: payload is not 'model\\nversion'");
    }
    RolloutIntent intent;
    intent.model = std::string(text.substr(0, nl));
    intent.version = std::string(text.substr(nl + 1));
    intent.ltime = ltime;
    if (intent.model.empty() || intent.version.empty() || intent.model.size() > kMaxField ||
        intent.version.size() > kMaxField ||
        intent.version.find('\n') != std::string::npos) {
        return invalid_argument_error("rollout event: model and version must be 1..255 bytes "
                                      "without newlines");
    }
    return intent;
}

RolloutBook::Applied RolloutBook::apply(const RolloutIntent& intent) {
    std::lock_guard lock(mu_);
    auto it = by_model_.find(intent.model);
    if (it != by_model_.end()) {
        const RolloutIntent& held = it->second;
        if (intent.ltime < held.ltime ||
            (intent.ltime == held.ltime && intent.version <= held.version)) {
            return Applied::kStale;
        }
        it->second = intent;
        return Applied::kTarget;
    }
    if (by_model_.size() >= kMaxModels) {
        return Applied::kFull;
    }
    by_model_.emplace(intent.model, intent);
    return Applied::kTarget;
}

std::optional<RolloutIntent> RolloutBook::target(std::string_view model) const {
    std::lock_guard lock(mu_);
    auto it = by_model_.find(model);
    if (it == by_model_.end()) {
        return std::nullopt;
    }
    return it->second;
}

std::vector<RolloutIntent> RolloutBook::all() const {
    std::lock_guard lock(mu_);
    std::vector<RolloutIntent> out;
    for (const auto& [model, intent] : by_model_) {
        out.push_back(intent);
    }
    return out;
}

}  // namespace edge::daemon::cluster
