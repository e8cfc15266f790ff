#include "daemon/cluster/rollout.h"

#include "routing/membership/messages.h"
#include "routing/membership/wire.h"

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

std::vector<uint8_t> encode_rollout_state(std::span<const RolloutIntent> intents) {
    routing::membership::WireWriter w;
    for (const RolloutIntent& i : intents) {
        if (i.ltime == 0) {
            continue;
        }
        routing::membership::WireWriter e;
        e.field_uint(1, i.ltime);
        e.field_bytes(2, encode_rollout(i.model, i.version));
        w.field_bytes(1, e.bytes());
    }
    return w.take();
}

Result<std::vector<RolloutIntent>> decode_rollout_state(std::span<const uint8_t> state,
                                                        uint64_t sender_ltime) {
    std::vector<RolloutIntent> out;
    routing::membership::WireReader r(state);
    while (!r.done()) {
        EDGE_ASSIGN_OR_RETURN(routing::membership::WireField f, r.read_field("rollout state"));
        if (f.tag != 1) {
            continue;  // a newer peer's field
        }
        if (out.size() >= RolloutBook::kMaxModels) {
            return invalid_argument_error("rollout state: more than " +
                                          std::to_string(RolloutBook::kMaxModels) + " intents");
        }
        uint64_t ltime = 0;
        std::optional<std::span<const uint8_t>> payload;
        routing::membership::WireReader er(f.value);
        while (!er.done()) {
            EDGE_ASSIGN_OR_RETURN(routing::membership::WireField g,
                                  er.read_field("rollout state intent"));
            if (g.tag == 1) {
                EDGE_ASSIGN_OR_RETURN(ltime, g.as_uint());
            } else if (g.tag == 2) {
                payload = g.value;
            }
        }
        if (ltime == 0 || ltime > sender_ltime || ltime >= routing::membership::kMaxEventLtime) {
            return invalid_argument_error("rollout state: intent at Lamport time " +
                                          std::to_string(ltime) + ", not in 1.." +
                                          std::to_string(sender_ltime) +
                                          " (the sender's clock)");
        }
        if (!payload) {
            return invalid_argument_error("rollout state: intent without model and version");
        }
        EDGE_ASSIGN_OR_RETURN(RolloutIntent intent, decode_rollout(*payload, ltime));
        out.push_back(std::move(intent));
    }
    return out;
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
