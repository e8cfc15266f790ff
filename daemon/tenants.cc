#include "daemon/tenants.h"

#include <algorithm>
#include <map>
#include <random>

#include "common/hex.h"
#include "daemon/bearer.h"

namespace edge::daemon {
namespace {

// 16 random hex digits.
std::string random_tag() {
    std::random_device rd;
    std::array<unsigned char, 8> bytes{};
    for (unsigned char& b : bytes) {
        b = static_cast<unsigned char>(rd());
    }
    return to_hex(bytes);
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

}  // namespace

bool Tenant::may_use(std::string_view model) const {
    return models.empty() || std::find(models.begin(), models.end(), model) != models.end();
}

TenantTable::TenantTable(const std::optional<std::vector<TenantConfig>>& tenants,
                         const TenantTable* previous) {
    if (!tenants) {
        return;
    }
    enabled_ = true;
    for (const TenantConfig& t : *tenants) {
        size_t index = tenants_.size();
        tenants_.push_back(Tenant{t.name, t.models, t.weight, t.max_context_tokens,
                                  t.max_output_tokens, t.priority, t.input_tokens_per_minute});
        for (const std::string& hex : t.api_key_sha256) {
            // The config loader checked: 64 lower-case hex digits.
            Entry e{{}, index};
            for (size_t i = 0; i < 32; ++i) {
                e.hash[i] = static_cast<unsigned char>(hex_value(hex[2 * i]) * 16 +
                                                       hex_value(hex[2 * i + 1]));
            }
            keys_.push_back(e);
        }
    }
    if (previous != nullptr && previous->enabled_) {
        inherit_scopes(*previous);
    }
    for (Tenant& t : tenants_) {
        if (t.cache_scope.empty()) {
            t.cache_scope = t.name + "#" + random_tag();
        }
    }
}

void TenantTable::inherit_scopes(const TenantTable& previous) {
    // The old tenant holding each key (the config loader refuses a key two tenants share).
    std::map<std::array<unsigned char, 32>, size_t> holder;
    for (const Entry& old : previous.keys_) {
        holder.emplace(old.hash, old.tenant);
    }
    // A scope passes only to a tenant holding one of its old tenant's keys, and to one at most.
    // First to the tenant that keeps the name, then (a rename, as TenantLimiter carries its
    // counters over) to the first in the config holding one of the keys whose scope is left.
    std::vector<bool> taken(previous.tenants_.size(), false);
    for (const bool renamed : {false, true}) {
        for (const Entry& k : keys_) {
            Tenant& t = tenants_[k.tenant];
            const auto it = holder.find(k.hash);
            if (!t.cache_scope.empty() || it == holder.end() || taken[it->second]) {
                continue;
            }
            const Tenant& before = previous.tenants_[it->second];
            if (renamed || before.name == t.name) {
                t.cache_scope = before.cache_scope;
                taken[it->second] = true;
            }
        }
    }
}

const Tenant* TenantTable::find(std::string_view name) const {
    if (!enabled_) {
        return &anonymous_;
    }
    for (const Tenant& t : tenants_) {
        if (t.name == name) {
            return &t;
        }
    }
    return nullptr;
}

TenantTable::Match TenantTable::authenticate(std::string_view authorization) const {
    if (!enabled_) {
        return {AuthOutcome::kOk, &anonymous_};
    }
    std::optional<std::string_view> key = bearer_credentials(authorization);
    if (!key) {
        return {AuthOutcome::kMissing, nullptr};
    }
    const Sha256Digest hash = sha256(*key);
    const Tenant* found = nullptr;
    // Compare against every entry, so the time does not depend on which one matches.
    for (const Entry& e : keys_) {
        if (digests_equal(e.hash, hash)) {
            found = &tenants_[e.tenant];
        }
    }
    if (found == nullptr) {
        return {AuthOutcome::kUnknown, nullptr};
    }
    return {AuthOutcome::kOk, found};
}

std::string TenantTable::sha256_hex(std::string_view key) { return to_hex(sha256(key)); }

}  // namespace edge::daemon
