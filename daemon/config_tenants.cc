// The `tenants` section, for parse_config(): each tenant's name, key hashes, models and limits,
// and the checks across tenants (unique names, no key hash listed by two of them).

#include <map>
#include <set>
#include <string>
#include <vector>

#include "daemon/config_internal.h"

namespace edge::daemon {
namespace {

// Why `s` (lower-cased) is not a SHA-256 digest in hex, or "" when it is. Never quotes `s`: a
// key pasted where its hash belongs would be copied into the log.
std::string sha256_hex_problem(const std::string& s) {
    for (size_t i = 0; i < s.size(); ++i) {
        const char ch = s[i];
        if ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')) {
            continue;
        }
        const char* what = ch == ' '    ? "a space"
                           : ch == '\t' ? "a tab"
                           : ch == '\n' ? "a line break"
                                        : "not a hex digit";
        return "character " + std::to_string(i + 1) + " is " + what;
    }
    if (s.size() != 64) {
        return "got " + std::to_string(s.size());
    }
    return {};
}

// Where a key hash was listed first: its tenant's name and its config key.
struct HashSeen {
    std::string tenant;
    std::string key;
};

// Checks tenant `t`'s key hashes (lower-cased here), read from `node` at `key`: each a SHA-256
// in hex, and each one tenant's only (`seen`: the hashes of the tenants before). Once the name
// is known, so errors name the tenant as well as the index, and a hash two tenants list names
// both (the first one's key would otherwise authenticate as whichever the table found last).
Status check_key_hashes(const Reader& r, const YAML::Node& node, const std::string& key,
                        TenantConfig& t, std::map<std::string, HashSeen>& seen) {
    const std::string tenant = "tenant '" + t.name + "'";
    for (size_t j = 0; j < t.api_key_sha256.size(); ++j) {
        std::string& h = t.api_key_sha256[j];
        for (char& ch : h) {
            ch = (ch >= 'A' && ch <= 'F') ? static_cast<char>(ch + 32) : ch;
        }
        const std::string hk = key + "[" + std::to_string(j) + "]";
        if (std::string problem = sha256_hex_problem(h); !problem.empty()) {
            return r.error(node[j], hk,
                           tenant + ": expected the key's SHA-256 as 64 hex digits "
                                    "(printf '%s' \"$KEY\" | sha256sum): " +
                               problem);
        }
        auto [first, added] = seen.emplace(h, HashSeen{t.name, hk});
        if (!added && first->second.tenant == t.name) {
            return r.error(node[j], hk,
                           tenant + ": key hash listed twice (also " + first->second.key + ")");
        }
        if (!added) {
            return r.error(node[j], hk,
                           tenant + " and tenant '" + first->second.tenant + "' (" +
                               first->second.key +
                               ") list the same key hash; a key must identify one tenant");
        }
    }
    return ok_status();
}

}  // namespace

Status parse_tenants(const Reader& r, const YAML::Node& node, const std::string& key, Config& c) {
    if (node.IsNull()) {
        c.tenants.emplace();
        return ok_status();
    }
    if (!node.IsSequence()) {
        return r.error(node, key, "expected a list of tenants");
    }
    std::vector<TenantConfig> tenants;
    std::set<std::string> names;
    std::map<std::string, HashSeen> hashes;
    for (size_t i = 0; i < node.size(); ++i) {
        std::string item = key + "[" + std::to_string(i) + "]";
        TenantConfig t;
        EDGE_RETURN_IF_ERROR(r.for_each_key(
            node[i], item,
            {{"name", identifier_field(r, t.name)},
             {"api_key_sha256",
              [&](const YAML::Node& n, const std::string& k) -> Status {
                  EDGE_ASSIGN_OR_RETURN(t.api_key_sha256, r.strings(n, k));
                  if (t.api_key_sha256.empty()) {
                      return r.error(n, k,
                                     "must list at least one key hash (with none the "
                                     "tenant can never authenticate)");
                  }
                  return ok_status();  // Checked once the name is known.
              }},
             {"models",
              [&](const YAML::Node& n, const std::string& k) -> Status {
                  EDGE_ASSIGN_OR_RETURN(t.models, r.strings(n, k));
                  if (t.models.empty()) {
                      return r.error(n, k, "empty list; omit the key to allow every model");
                  }
                  return ok_status();
              }},
             {"weight", int_field(r, t.weight, 1, 10'000)},
             {"priority", int_field(r, t.priority, 0, 100)},
             {"requests_per_second", number_field(r, t.requests_per_second, 0.0, 1e6)},
             {"burst", int_field(r, t.burst, 0, 1'000'000)},
             {"input_tokens_per_minute",
              int_field(r, t.input_tokens_per_minute, 0, int64_t{1} << 40)},
             {"output_tokens_per_minute",
              int_field(r, t.output_tokens_per_minute, 0, int64_t{1} << 40)},
             {"max_concurrent", int_field(r, t.max_concurrent, 0, 1'000'000)},
             {"max_context_tokens", int_field(r, t.max_context_tokens, 0, int64_t{1} << 24)},
             {"max_output_tokens", int_field(r, t.max_output_tokens, 0, int64_t{1} << 24)}}));
        EDGE_RETURN_IF_ERROR(r.require_keys(node[i], item, {"name", "api_key_sha256"}));
        if (!names.insert(t.name).second) {
            return r.error(node[i]["name"], item + ".name", "duplicate tenant name");
        }
        if (t.name == "anonymous") {
            // A peer site without tenants forwards its requests under this name: a tenant of
            // that name here would take their limits and share their prefix cache.
            return r.error(node[i]["name"], item + ".name",
                           "'anonymous' is reserved for requests of sites that run without "
                           "tenants (authentication off)");
        }
        EDGE_RETURN_IF_ERROR(check_key_hashes(r, node[i]["api_key_sha256"],
                                              item + ".api_key_sha256", t, hashes));
        if (t.requests_per_second > 0 && t.requests_per_second < 1.0 / 60) {
            return r.error(node[i]["requests_per_second"], item + ".requests_per_second",
                           "below one request per minute; 0 means unlimited");
        }
        if (t.burst > 0 && t.requests_per_second == 0) {
            return r.error(node[i]["burst"], item + ".burst",
                           "needs requests_per_second (burst alone limits nothing)");
        }
        if (t.max_output_tokens > 0 && t.max_context_tokens > 0 &&
            t.max_output_tokens > t.max_context_tokens) {
            return r.error(node[i]["max_output_tokens"], item + ".max_output_tokens",
                           "larger than max_context_tokens");
        }
        tenants.push_back(std::move(t));
    }
    c.tenants = std::move(tenants);
    return ok_status();
}

}  // namespace edge::daemon
