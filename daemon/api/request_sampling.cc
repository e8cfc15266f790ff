#include "daemon/api/request_sampling.h"

#include <charconv>
#include <limits>
#include <optional>
#include <unordered_set>

#include "engine/sampling/sampler.h"

namespace edge::daemon::api {

namespace json = boost::json;

namespace {

// Bounds that keep a hostile request cheap before it reaches the engine.
constexpr size_t kMaxStops = 4;

}  // namespace

bool parse_stop(Validator& v, const json::value& value, std::vector<std::string>& out) {
    if (value.is_null()) {
        return true;
    }
    // One string, or each of the array's, named as the client wrote it.
    auto take = [&](const json::string& s, const std::string& name) {
        if (s.empty()) {
            return v.fail("'" + name + "' must not be empty", name);
        }
        if (s.size() > engine::sampling::kMaxStopBytes) {
            return v.fail("'" + name + "' is longer than " +
                              std::to_string(engine::sampling::kMaxStopBytes) + " bytes",
                          name);
        }
        out.push_back(std::string(s));
        return true;
    };
    if (value.is_string()) {
        return take(value.get_string(), "stop");
    }
    if (!value.is_array() || value.get_array().size() > kMaxStops) {
        return v.fail("'stop' must be a string or an array of at most 4 strings", "stop");
    }
    const json::array& a = value.get_array();
    for (size_t i = 0; i < a.size(); ++i) {
        const std::string name = "stop[" + std::to_string(i) + "]";
        const json::string* s = v.string(a[i], name);
        if (s == nullptr || !take(*s, name)) {
            return false;
        }
    }
    return true;
}

// OpenAI's logit_bias: {"<token id>": bias in [-100, 100], ...}; null or {} is none.
bool parse_logit_bias(Validator& v, const json::value& value,
                      std::vector<std::pair<engine::TokenId, float>>& out) {
    if (value.is_null()) {
        return true;
    }
    if (!value.is_object()) {
        return v.fail("'logit_bias' must be an object mapping token ids to biases", "logit_bias");
    }
    if (value.get_object().size() > engine::sampling::kMaxLogitBias) {
        return v.fail("'logit_bias' may hold at most 1024 tokens", "logit_bias");
    }
    std::unordered_set<int64_t> ids;
    for (const auto& kv : value.get_object()) {
        const std::string_view key = kv.key();
        int64_t id = -1;
        const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
        if (ec != std::errc() || end != key.data() + key.size() || id < 0 ||
            id > std::numeric_limits<engine::TokenId>::max()) {
            // At most 64 bytes of it, cut on a character boundary (the error is JSON: UTF-8).
            size_t cut = std::min<size_t>(key.size(), 64);
            while (cut > 0 && cut < key.size() &&
                   (static_cast<unsigned char>(key[cut]) & 0xC0) == 0x80) {
                --cut;
            }
            return v.fail(
                "'logit_bias' key '" + std::string(key.substr(0, cut)) + "' is not a token id",
                "logit_bias");
        }
        const std::string name = "logit_bias." + std::string(key);
        std::optional<double> bias = v.number(kv.value(), name, -100, 100);
        if (!bias) {
            return false;
        }
        if (!ids.insert(id).second) {
            // "7" and "07" are two keys to JSON, one token to the sampler, which would add
            // both biases (past +-100).
            return v.fail("'logit_bias' names token " + std::to_string(id) + " twice", name);
        }
        out.emplace_back(static_cast<engine::TokenId>(id), static_cast<float>(*bias));
    }
    return true;
}

}  // namespace edge::daemon::api
