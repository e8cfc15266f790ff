#pragma once

// TenantTable answers "who is this API key?" from `Authorization: Bearer KEY`: the key is hashed
// with SHA-256 and compared in constant time (CRYPTO_memcmp) against every configured hash, so
// neither the key nor its position leaks through timing. Keys are never stored or logged.
// Immutable after construction; thread-safe.

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config.h"

namespace edge::daemon {

struct Tenant {
    std::string name;
    std::vector<std::string> models;  // Empty: every model.
    int32_t weight = 1;               // Fair-share weight passed to the engine.
    int64_t max_context_tokens = 0;   // Prompt + max_tokens cap; 0: none.
    int64_t max_output_tokens = 0;    // max_tokens cap; 0: none.
    int32_t priority = 0;             // Preemption priority passed to the engine (higher: later).
    int64_t input_tokens_per_minute = 0;  // The longest prompt one request may have; 0: none.
    // The tenant's identity for the prefix cache (GenerateRequest::cache_scope): its name and a
    // random tag drawn when the tenant appears, kept across reloads while the tenant keeps one
    // of its keys, under a new name too (a rename; the old name's tenant, if kept with one of
    // its keys, keeps it first). A name that comes back with none of its keys (another
    // customer, or the same one after its keys were all replaced) gets a new tag, so it never
    // hits the old prompts; a scope never passes to a tenant holding none of its keys.
    std::string cache_scope = {};

    bool may_use(std::string_view model) const;
};

// The engine's name for a tenant forwarded by another site that this site has no entry for (or
// every forwarded tenant where authentication is off): one name, so the per-tenant series and
// fair-share entries stay this site's tenants and that one. Not a tenant name the config
// accepts (is_identifier()), so it never merges with a configured tenant.
inline constexpr std::string_view kForwardedTenant = "(forwarded)";

enum class AuthOutcome { kOk, kMissing, kUnknown };

class TenantTable {
public:
    // `tenants` absent: authentication is off and every request is the anonymous tenant.
    // `previous`: the table this one replaces (a reload), whose cache scopes carry over.
    explicit TenantTable(const std::optional<std::vector<TenantConfig>>& tenants,
                         const TenantTable* previous = nullptr);

    bool enabled() const { return enabled_; }

    struct Match {
        AuthOutcome outcome = AuthOutcome::kMissing;
        const Tenant* tenant = nullptr;  // Valid while the table lives, when outcome is kOk.
    };
    // `authorization` is the raw header value ("" when absent).
    Match authenticate(std::string_view authorization) const;

    // The tenant configured under `name` (the anonymous tenant when authentication is off), or
    // null. For forwarded requests, whose tenant the forwarding site authenticated.
    const Tenant* find(std::string_view name) const;

    // Lower-case hex SHA-256 of `key` (for configs and the demo script).
    static std::string sha256_hex(std::string_view key);

private:
    struct Entry {
        std::array<unsigned char, 32> hash;
        size_t tenant;
    };
    // Gives tenants the cache scopes of `previous`'s tenants that held one of their keys (see
    // Tenant::cache_scope); those it gives none keep an empty one.
    void inherit_scopes(const TenantTable& previous);
    bool enabled_ = false;
    std::vector<Tenant> tenants_;
    std::vector<Entry> keys_;
    Tenant anonymous_{"anonymous", {}, 1, 0, 0, 0, 0, "anonymous"};
};

}  // namespace edge::daemon
