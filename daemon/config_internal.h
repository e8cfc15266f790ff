#pragma once

// The parts of parse_config() (config.cc) shared with the files that parse its sections, for
// their use only: the Reader that turns yaml-cpp nodes into values or errors naming
// file:line:column and the key path, handlers for the common kinds of field, and one function per
// section (config_listeners.cc: listeners, limits; config_tenants.cc: tenants; config_engine.cc:
// models, engine; config_cluster.cc: site, routing, gossip, peer).
//
// Threading: a Reader serves one parse_config(), on its thread.

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "daemon/config.h"

namespace edge::daemon {

class Reader {
public:
    Reader(std::string source, std::filesystem::path base_dir)
        : source_(std::move(source)), base_dir_(std::move(base_dir)) {}

    Status error(const YAML::Mark& mark, const std::string& key, const std::string& message) const {
        std::string where = source_;
        if (!mark.is_null()) {
            where += ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
        }
        return invalid_argument_error(where + ": " + (key.empty() ? "" : key + ": ") + message);
    }
    Status error(const YAML::Node& node, const std::string& key, const std::string& message) const {
        // yaml-cpp gives an empty value the mark of the token after it (often the next line):
        // point at its key instead.
        if (node.IsNull()) {
            for (const auto& [value, key_mark] : null_values_) {
                if (value.is(node)) {
                    return error(key_mark, key, message);
                }
            }
        }
        return error(node.Mark(), key, message);
    }

    // Calls `handlers[key]` for each key of the map `node`; an unknown key is an error at the key.
    Status for_each_key(const YAML::Node& node, const std::string& path,
                        const std::map<std::string, std::function<Status(const YAML::Node&,
                                                                         const std::string&)>>&
                            handlers) const {
        if (!node.IsMap()) {
            return error(node, path, "expected a mapping");
        }
        std::set<std::string> seen;
        for (auto it = node.begin(); it != node.end(); ++it) {
            if (!it->first.IsScalar()) {
                return error(it->first, path, "keys must be plain strings");
            }
            std::string key = it->first.Scalar();
            std::string key_path = path.empty() ? key : path + "." + key;
            auto handler = handlers.find(key);
            if (handler == handlers.end()) {
                return error(it->first, key_path, "unknown key");
            }
            if (!seen.insert(key).second) {
                return error(it->first, key_path, "duplicate key");
            }
            if (it->second.IsNull()) {
                null_values_.emplace_back(it->second, it->first.Mark());
            }
            EDGE_RETURN_IF_ERROR(handler->second(it->second, key_path));
        }
        return ok_status();
    }

    Status require_keys(const YAML::Node& node, const std::string& path,
                        std::initializer_list<const char*> keys) const {
        for (const char* key : keys) {
            if (!node[key]) {
                return error(node, path.empty() ? key : path + "." + key, "required key missing");
            }
        }
        return ok_status();
    }

    Result<std::string> string(const YAML::Node& node, const std::string& key) const {
        if (!node.IsScalar()) {
            return error(node, key, "expected a string");
        }
        return node.Scalar();
    }

    // A quoted scalar is a string: `"true"` or `"100"` where a boolean or a number belongs is a
    // wrong type, which the configuration refuses (yaml-cpp's conversions would read either).
    static bool quoted(const YAML::Node& node) { return node.Tag() == "!"; }

    Result<bool> boolean(const YAML::Node& node, const std::string& key) const {
        bool value = false;
        if (!node.IsScalar() || quoted(node) || !YAML::convert<bool>::decode(node, value)) {
            return error(node, key, "expected true or false");
        }
        return value;
    }

    static constexpr const char* kLeadingZero =
        "expected a decimal integer without leading zeros (YAML 1.1 reads a leading 0 as octal)";
    // Digits (no sign) that start with a 0 and go on.
    static bool leading_zero(std::string_view digits) {
        return digits.size() > 1 && digits[0] == '0';
    }

    // Decimal digits with an optional sign. yaml-cpp's own conversion guesses the base (a
    // leading 0 read as octal, 0x as hex: `drain_deadline_ms: 030000` was 12288 ms), and YAML
    // 1.1 tools read a leading zero as octal too, so a leading zero is refused as ambiguous.
    Result<int64_t> integer(const YAML::Node& node, const std::string& key, int64_t min,
                            int64_t max) const {
        if (!node.IsScalar() || quoted(node)) {
            return error(node, key, "expected an integer");
        }
        std::string_view text = node.Scalar();
        const bool plus = text.starts_with('+');
        if (plus) {
            text.remove_prefix(1);
        }
        const std::string_view digits = !plus && text.starts_with('-') ? text.substr(1) : text;
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos) {
            return error(node, key, "expected an integer");
        }
        if (leading_zero(digits)) {
            return error(node, key, kLeadingZero);
        }
        int64_t value = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec == std::errc::result_out_of_range) {
            return error(node, key,
                         "must be in " + std::to_string(min) + ".." + std::to_string(max));
        }
        if (ec != std::errc() || end != text.data() + text.size()) {
            return error(node, key, "expected an integer");
        }
        if (value < min || value > max) {
            return error(node, key,
                         "must be in " + std::to_string(min) + ".." + std::to_string(max));
        }
        return value;
    }

    // A real number. A digit-only scalar with a leading zero is refused as integer() refuses
    // it: yaml-cpp reads `010` as 10 here, YAML 1.1 tools as 8.
    Result<double> number(const YAML::Node& node, const std::string& key, double min,
                          double max) const {
        double value = 0;
        if (!node.IsScalar() || quoted(node) || !YAML::convert<double>::decode(node, value) ||
            !std::isfinite(value)) {
            return error(node, key, "expected a number");
        }
        std::string_view digits = node.Scalar();
        if (digits.starts_with('+') || digits.starts_with('-')) {
            digits.remove_prefix(1);
        }
        if (digits.find_first_not_of("0123456789") == std::string_view::npos &&
            leading_zero(digits)) {
            return error(node, key, kLeadingZero);
        }
        if (value < min || value > max) {
            std::ostringstream range;
            range << "must be in " << min << ".." << max;
            return error(node, key, range.str());
        }
        return value;
    }

    Result<std::vector<std::string>> strings(const YAML::Node& node, const std::string& key) const {
        if (!node.IsSequence()) {
            return error(node, key, "expected a list of strings");
        }
        std::vector<std::string> out;
        for (size_t i = 0; i < node.size(); ++i) {
            EDGE_ASSIGN_OR_RETURN(std::string s,
                                  string(node[i], key + "[" + std::to_string(i) + "]"));
            out.push_back(std::move(s));
        }
        return out;
    }

    Result<std::string> path(const YAML::Node& node, const std::string& key) const {
        EDGE_ASSIGN_OR_RETURN(std::string p, string(node, key));
        if (p.empty()) {
            return error(node, key, "must not be empty");
        }
        std::filesystem::path fp(p);
        if (fp.is_relative()) {
            fp = base_dir_ / fp;
        }
        return fp.lexically_normal().string();
    }

    Status milliseconds(const YAML::Node& node, const std::string& key,
                        std::chrono::milliseconds& out) const {
        EDGE_ASSIGN_OR_RETURN(int64_t ms, integer(node, key, 1, 86'400'000));
        out = std::chrono::milliseconds(ms);
        return ok_status();
    }

private:
    std::string source_;
    std::filesystem::path base_dir_;
    // Each empty map value seen so far, with its key's mark (for error()).
    mutable std::vector<std::pair<YAML::Node, YAML::Mark>> null_values_;
};

using Handlers =
    std::map<std::string, std::function<Status(const YAML::Node&, const std::string&)>>;

// Assigns an integer field within [min, max].
template <typename T>
std::function<Status(const YAML::Node&, const std::string&)> int_field(const Reader& r, T& field,
                                                                       int64_t min, int64_t max) {
    return [&r, &field, min, max](const YAML::Node& n, const std::string& k) -> Status {
        EDGE_ASSIGN_OR_RETURN(int64_t v, r.integer(n, k, min, max));
        field = static_cast<T>(v);
        return ok_status();
    };
}

// Assigns a double field within [min, max], scaled by `scale` (milliseconds in YAML to seconds).
std::function<Status(const YAML::Node&, const std::string&)> number_field(const Reader& r,
                                                                          double& field,
                                                                          double min, double max,
                                                                          double scale = 1.0);

std::function<Status(const YAML::Node&, const std::string&)> string_field(const Reader& r,
                                                                          std::string& field);

std::function<Status(const YAML::Node&, const std::string&)> ms_field(
    const Reader& r, std::chrono::milliseconds& field);

// Like ms_field but 0 is allowed (meaning "off" or "the preset's").
std::function<Status(const YAML::Node&, const std::string&)> ms0_field(
    const Reader& r, std::chrono::milliseconds& field);

// Whether `name` is made only of what a DNS name (or an IPv4 literal) holds: letters, digits,
// '-', '_' and '.'. Not a full RFC 1035 check: it keeps wildcards, URLs, spaces and stray
// punctuation out of names that are sent as a Host or compared with one.
inline bool dns_name_chars(std::string_view name) {
    return !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '-' || c == '_' || c == '.';
    });
}

// A listen or bind address: an IP literal, parsed as the listeners parse it (no host names).
std::function<Status(const YAML::Node&, const std::string&)> ip_field(const Reader& r,
                                                                      std::string& field);

std::function<Status(const YAML::Node&, const std::string&)> identifier_field(const Reader& r,
                                                                              std::string& field);

// Wraps the handler of a key whose documented default is "": the value "" (which a tool that
// writes out every default writes) leaves the field at that default, as leaving the key out does,
// instead of meeting `handler`'s checks (1 to 64 characters, host:port, a non-empty path).
inline std::function<Status(const YAML::Node&, const std::string&)> empty_means_default(
    std::function<Status(const YAML::Node&, const std::string&)> handler) {
    return [handler = std::move(handler)](const YAML::Node& n, const std::string& k) -> Status {
        if (n.IsScalar() && n.Scalar().empty()) {
            return ok_status();
        }
        return handler(n, k);
    };
}

// The sections of the root mapping, each read from `node` at `key` into `c`.
Status parse_listeners(const Reader& r, const YAML::Node& node, const std::string& key, Config& c);
Status parse_limits(const Reader& r, const YAML::Node& node, const std::string& key, Config& c);
Status parse_tenants(const Reader& r, const YAML::Node& node, const std::string& key, Config& c);
Status parse_models(const Reader& r, const YAML::Node& node, const std::string& key, Config& c);
Status parse_engine(const Reader& r, const YAML::Node& node, const std::string& key, Config& c);
Status parse_site(const Reader& r, const YAML::Node& node, const std::string& key, Config& c);
Status parse_routing(const Reader& r, const YAML::Node& node, const std::string& key, Config& c);
Status parse_gossip(const Reader& r, const YAML::Node& node, const std::string& key, Config& c);
Status parse_peer(const Reader& r, const YAML::Node& node, const std::string& key, Config& c);

}  // namespace edge::daemon
