// The YAML adapter: the one file that calls yaml-cpp. Its exceptions stop here and become Status
// values with file:line:column and the key path.

#include "daemon/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_set>

#include <boost/asio/ip/address.hpp>

#include "common/file.h"
#include "engine/tokenizer/utf8.h"
#include "routing/membership/keyring.h"
#include "routing/membership/site_state.h"
#include "tls/cidr.h"

namespace edge::daemon {
namespace {

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
        if (digits.size() > 1 && digits[0] == '0') {
            return error(node, key,
                         "expected a decimal integer without leading zeros (YAML 1.1 reads a "
                         "leading 0 as octal)");
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

    Result<double> number(const YAML::Node& node, const std::string& key, double min,
                          double max) const {
        double value = 0;
        if (!node.IsScalar() || quoted(node) || !YAML::convert<double>::decode(node, value) ||
            !std::isfinite(value)) {
            return error(node, key, "expected a number");
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
                                                                          double scale = 1.0) {
    return [&r, &field, min, max, scale](const YAML::Node& n, const std::string& k) -> Status {
        EDGE_ASSIGN_OR_RETURN(double v, r.number(n, k, min, max));
        field = v * scale;
        return ok_status();
    };
}

std::function<Status(const YAML::Node&, const std::string&)> string_field(const Reader& r,
                                                                          std::string& field) {
    return [&r, &field](const YAML::Node& n, const std::string& k) -> Status {
        EDGE_ASSIGN_OR_RETURN(field, r.string(n, k));
        return ok_status();
    };
}

std::function<Status(const YAML::Node&, const std::string&)> ms_field(
    const Reader& r, std::chrono::milliseconds& field) {
    return [&r, &field](const YAML::Node& n, const std::string& k) {
        return r.milliseconds(n, k, field);
    };
}

// Like ms_field but 0 is allowed (meaning "off" or "the preset's").
std::function<Status(const YAML::Node&, const std::string&)> ms0_field(
    const Reader& r, std::chrono::milliseconds& field) {
    return [&r, &field](const YAML::Node& n, const std::string& k) -> Status {
        EDGE_ASSIGN_OR_RETURN(int64_t v, r.integer(n, k, 0, 86'400'000));
        field = std::chrono::milliseconds(v);
        return ok_status();
    };
}

// A listen or bind address: an IP literal, parsed as the listeners parse it (no host names).
std::function<Status(const YAML::Node&, const std::string&)> ip_field(const Reader& r,
                                                                      std::string& field) {
    return [&r, &field](const YAML::Node& n, const std::string& k) -> Status {
        EDGE_ASSIGN_OR_RETURN(field, r.string(n, k));
        boost::system::error_code ec;
        (void)boost::asio::ip::make_address(field, ec);
        if (ec) {
            return r.error(n, k, "expected an IP literal (not a host name)");
        }
        return ok_status();
    };
}

std::function<Status(const YAML::Node&, const std::string&)> identifier_field(const Reader& r,
                                                                              std::string& field) {
    return [&r, &field](const YAML::Node& n, const std::string& k) -> Status {
        EDGE_ASSIGN_OR_RETURN(field, r.string(n, k));
        if (field.empty() || field.size() > 64) {
            return r.error(n, k, "must be 1 to 64 characters");
        }
        if (!is_identifier(field)) {
            return r.error(n, k, "may hold only letters, digits, '.', '_' and '-'");
        }
        return ok_status();
    };
}

Status parse_certificates(const Reader& r, const YAML::Node& node, const std::string& key,
                          std::vector<tls::CertificateConfig>& out) {
    if (!node.IsSequence() || node.size() == 0) {
        return r.error(node, key, "expected a non-empty list of {server_names, cert, key}");
    }
    for (size_t i = 0; i < node.size(); ++i) {
        std::string item = key + "[" + std::to_string(i) + "]";
        tls::CertificateConfig cert;
        EDGE_RETURN_IF_ERROR(r.for_each_key(
            node[i], item,
            {{"server_names",
              [&](const YAML::Node& n, const std::string& k) -> Status {
                  EDGE_ASSIGN_OR_RETURN(cert.server_names, r.strings(n, k));
                  return ok_status();
              }},
             {"cert",
              [&](const YAML::Node& n, const std::string& k) -> Status {
                  EDGE_ASSIGN_OR_RETURN(cert.cert_path, r.path(n, k));
                  return ok_status();
              }},
             {"key", [&](const YAML::Node& n, const std::string& k) -> Status {
                  EDGE_ASSIGN_OR_RETURN(cert.key_path, r.path(n, k));
                  return ok_status();
              }}}));
        EDGE_RETURN_IF_ERROR(r.require_keys(node[i], item, {"cert", "key"}));
        out.push_back(std::move(cert));
    }
    return ok_status();
}

// The shortest certificate_watch_ms other than 0 (off).
constexpr int64_t kMinCertificateWatchMs = 100;

Status parse_listeners(const Reader& r, const YAML::Node& node, const std::string& key,
                       Config& c) {
    EDGE_RETURN_IF_ERROR(r.for_each_key(
        node, key,
        {{"public",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_RETURN_IF_ERROR(r.for_each_key(
                  n, k,
                  {{"address", ip_field(r, c.listener.address)},
                   {"port", int_field(r, c.listener.port, 0, 65535)},
                   {"io_threads", int_field(r, c.listener.io_threads, 1, 256)},
                   {"certificate_watch_ms",
                    [&](const YAML::Node& wn, const std::string& wk) -> Status {
                        EDGE_ASSIGN_OR_RETURN(int64_t ms, r.integer(wn, wk, 0, 86'400'000));
                        // A change settles over one poll: much shorter and a rotation's two
                        // renames are read apart (a mismatched pair), while the idle daemon
                        // spends its time polling.
                        if (ms != 0 && ms < kMinCertificateWatchMs) {
                            return r.error(wn, wk,
                                           "must be 0 (off) or at least " +
                                               std::to_string(kMinCertificateWatchMs) +
                                               " ms, got " + std::to_string(ms));
                        }
                        c.listener.certificate_watch = std::chrono::milliseconds(ms);
                        return ok_status();
                    }},
                   {"certificates", [&](const YAML::Node& cn, const std::string& ck) {
                        return parse_certificates(r, cn, ck, c.listener.certificates);
                    }}}));
              return r.require_keys(n, k, {"certificates"});
          }},
         {"admin", [&](const YAML::Node& n, const std::string& k) -> Status {
              return r.for_each_key(
                  n, k,
                  {{"address", ip_field(r, c.admin.address)},
                   {"port", int_field(r, c.admin.port, 0, 65535)},
                   {"token_file", [&](const YAML::Node& tn, const std::string& tk) -> Status {
                        EDGE_ASSIGN_OR_RETURN(c.admin.token_file, r.path(tn, tk));
                        return ok_status();
                    }}});
          }}}));
    return r.require_keys(node, key, {"public"});
}

// A "host:port" or "[v6]:port" string with a port in 1..65535.
Result<std::string> host_port(const Reader& r, const YAML::Node& n, const std::string& k) {
    EDGE_ASSIGN_OR_RETURN(std::string v, r.string(n, k));
    std::string port;
    if (!v.empty() && v[0] == '[') {
        const size_t close = v.find("]:");
        if (close == std::string::npos || close == 1) {
            return r.error(n, k, "expected [host]:port");
        }
        port = v.substr(close + 2);
    } else {
        const size_t colon = v.rfind(':');
        if (colon == std::string::npos || colon == 0 || v.find(':') != colon) {
            return r.error(n, k, "expected host:port");
        }
        port = v.substr(colon + 1);
    }
    if (port.empty() || port.size() > 5 ||
        port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) == 0 ||
        std::stoul(port) > 65535) {
        return r.error(n, k, "expected a port in 1..65535 after the colon");
    }
    return v;
}

Status parse_site(const Reader& r, const YAML::Node& node, const std::string& key, Config& c) {
    EDGE_RETURN_IF_ERROR(r.for_each_key(
        node, key,
        {{"id", identifier_field(r, c.site.id)},
         {"region", identifier_field(r, c.site.region)},
         {"latitude",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(c.site.latitude, r.number(n, k, -90, 90));
              return ok_status();
          }},
         {"longitude",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(c.site.longitude, r.number(n, k, -180, 180));
              return ok_status();
          }},
         {"peer_address",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(c.site.peer_address, host_port(r, n, k));
              return ok_status();
          }},
         {"admin_address", [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(c.site.admin_address, host_port(r, n, k));
              return ok_status();
          }}}));
    return r.require_keys(node, key, {"id"});
}

Status parse_models(const Reader& r, const YAML::Node& node, const std::string& key, Config& c) {
    if (!node.IsSequence()) {
        return r.error(node, key, "expected a list of models");
    }
    std::set<std::string> names;
    for (size_t i = 0; i < node.size(); ++i) {
        std::string item = key + "[" + std::to_string(i) + "]";
        engine::ModelConfig m;
        EDGE_RETURN_IF_ERROR(r.for_each_key(
            node[i], item,
            {{"name", string_field(r, m.name)},
             {"path",
              [&](const YAML::Node& n, const std::string& k) -> Status {
                  EDGE_ASSIGN_OR_RETURN(m.path, r.path(n, k));
                  return ok_status();
              }},
             {"quantization", string_field(r, m.quantization)},
             {"max_context", int_field(r, m.max_context, 0, int64_t{1} << 24)},
             {"chat_template", string_field(r, m.chat_template)}}));
        EDGE_RETURN_IF_ERROR(r.require_keys(node[i], item, {"name", "path"}));
        if (m.name.empty() || m.name.size() > routing::membership::kMaxSiteStringBytes) {
            // Gossiped to every site, whose decoders refuse longer strings.
            return r.error(node[i]["name"], item + ".name", "must be 1 to 255 bytes");
        }
        if (!names.insert(m.name).second) {
            return r.error(node[i]["name"], item + ".name",
                           "duplicate model name '" + m.name + "'");
        }
        c.models.push_back(std::move(m));
    }
    return ok_status();
}

Status parse_engine(const Reader& r, const YAML::Node& node, const std::string& key, Config& c) {
    engine::EngineConfig& e = c.engine;
    EDGE_RETURN_IF_ERROR(r.for_each_key(
        node, key,
        {{"threads", int_field(r, e.threads, 0, 4096)},
         {"backend",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(e.backend, r.string(n, k));
              if (e.backend != "cpu" && e.backend != "cuda" && e.backend != "auto") {
                  return r.error(n, k, "expected cpu, cuda or auto");
              }
              return ok_status();
          }},
         {"activation_precision",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(const std::string p, r.string(n, k));
              if (p == "exact") {
                  e.activation_precision = engine::ActivationPrecision::kExact;
              } else if (p == "bf16") {
                  e.activation_precision = engine::ActivationPrecision::kBf16;
              } else {
                  return r.error(n, k, "expected exact or bf16");
              }
              return ok_status();
          }},
         {"cpu_kernels",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              // Whether this CPU runs them is checked with the files (check-config, run).
              EDGE_ASSIGN_OR_RETURN(e.cpu_kernels, r.string(n, k));
              for (const char* known :
                   {"auto", "amx_bf16", "avx512_bf16", "avx512", "avx2", "scalar"}) {
                  if (e.cpu_kernels == known) {
                      return ok_status();
                  }
              }
              return r.error(n, k, "expected auto, amx_bf16, avx512_bf16, avx512, avx2 or scalar");
          }},
         {"max_batch_sequences", int_field(r, e.max_batch_sequences, 1, 1 << 16)},
         {"max_batch_tokens", int_field(r, e.max_batch_tokens, 1, 1 << 24)},
         {"max_decode_sequences", int_field(r, e.max_decode_sequences, 0, 1 << 16)},
         {"kv_cache_bytes", int_field(r, e.kv_cache_bytes, 1 << 20, int64_t{1} << 44)},
         {"kv_block_tokens", int_field(r, e.kv_block_tokens, 1, 4096)},
         {"kv_swap_bytes", int_field(r, e.kv_swap_bytes, 0, int64_t{1} << 44)},
         {"max_queue", int_field(r, e.max_queue, 1, 1 << 24)},
         {"max_queue_per_tenant", int_field(r, e.max_queue_per_tenant, 0, 1 << 24)},
         {"max_queue_wait_ms", int_field(r, e.max_queue_wait_ms, 0, int64_t{86'400'000})},
         {"prefix_cache", [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(e.prefix_cache, r.boolean(n, k));
              return ok_status();
          }},
         {"sharding", [&](const YAML::Node& n, const std::string& k) -> Status {
              engine::shard::ShardingConfig& sh = e.sharding;
              return r.for_each_key(
                  n, k,
                  {{"ranks", int_field(r, sh.ranks, 1, 256)},
                   {"slots_per_rank", int_field(r, sh.slots_per_rank, 0, 1 << 16)},
                   {"rebalance_interval_steps",
                    int_field(r, sh.rebalance_interval_steps, 0, 1 << 30)},
                   {"load_window_steps", int_field(r, sh.load_window_steps, 1, 1 << 30)},
                   {"static_plan", string_field(r, sh.static_plan)},
                   {"communicator", string_field(r, sh.communicator)}});
          }}}));
    // A step's decodes come first: a budget they can fill would leave newer sequences waiting
    // for their prefill until older ones finish.
    const int64_t decoders = e.max_decode_sequences > 0
                                 ? std::min(e.max_decode_sequences, e.max_batch_sequences)
                                 : e.max_batch_sequences;
    if (e.max_batch_tokens <= decoders) {
        return r.error(node, key,
                       "max_batch_tokens (" + std::to_string(e.max_batch_tokens) +
                           ") must exceed the sequences that decode in one step (" +
                           std::to_string(decoders) +
                           ": max_decode_sequences, or max_batch_sequences when that is 0), or "
                           "prefill stalls while they decode");
    }
    return ok_status();
}

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

Status parse_limits(const Reader& r, const YAML::Node& node, const std::string& key, Config& c) {
    LimitsConfig& l = c.limits;
    return r.for_each_key(
        node, key,
        {{"handshake_timeout_ms", ms_field(r, l.handshake_timeout)},
         {"header_timeout_ms", ms_field(r, l.header_timeout)},
         {"body_timeout_ms", ms_field(r, l.body_timeout)},
         {"request_read_timeout_ms", ms0_field(r, l.request_read_timeout)},
         {"idle_timeout_ms", ms_field(r, l.idle_timeout)},
         {"write_timeout_ms", ms_field(r, l.write_timeout)},
         {"drain_deadline_ms", ms_field(r, l.drain_deadline)},
         {"max_header_bytes", int_field(r, l.max_header_bytes, 1024, 1 << 20)},
         {"max_body_bytes", int_field(r, l.max_body_bytes, 1024, int64_t{1} << 30)},
         {"max_connections", int_field(r, l.max_connections, 1, 1 << 22)},
         {"max_stream_buffer_bytes",
          int_field(r, l.max_stream_buffer_bytes, 4096, int64_t{1} << 30)},
         {"stream_keepalive_ms", ms0_field(r, l.stream_keepalive)}});
}

// A millisecond count (1..86400000) into a common Duration.
std::function<Status(const YAML::Node&, const std::string&)> duration_field(const Reader& r,
                                                                            Duration& field) {
    return [&r, &field](const YAML::Node& n, const std::string& k) -> Status {
        std::chrono::milliseconds ms{0};
        EDGE_RETURN_IF_ERROR(r.milliseconds(n, k, ms));
        field = ms;
        return ok_status();
    };
}

Status parse_routing(const Reader& r, const YAML::Node& node, const std::string& key,
                     Config& c) {
    routing::selection::CostConfig& cost = c.routing.cost;
    routing::selection::SelectionConfig& sel = c.routing.selection;
    constexpr double kMs = 1e-3;
    EDGE_RETURN_IF_ERROR(r.for_each_key(
        node, key,
        {{"path_inflation", number_field(r, cost.path_inflation, 1.0, 10.0)},
         {"coord_error_max", number_field(r, cost.coord_error_max, 0.0, 1.5)},
         {"prompt_tokens", number_field(r, cost.prompt_tokens, 1.0, 1e7)},
         {"mean_output_tokens", number_field(r, cost.mean_output_tokens, 1.0, 1e7)},
         {"default_prefill_tokens_per_s",
          number_field(r, cost.default_prefill_tokens_per_s, 1.0, 1e9)},
         {"kv_soft_limit", number_field(r, cost.kv_soft_limit, 0.0, 0.99)},
         {"kv_full_penalty_ms", number_field(r, cost.kv_full_penalty_s, 0.0, 3.6e6, kMs)},
         {"kv_saturated", number_field(r, cost.kv_saturated, 0.0, 1.0)},
         // 0 would call every pool saturated (a queue of 0 >= 0 x slots): every request a 503.
         {"saturation_queue_per_slot",
          number_field(r, cost.saturation_queue_per_slot, 0.01, 1e6)},
         {"suspect_penalty_ms", number_field(r, cost.suspect_penalty_s, 0.0, 3.6e6, kMs)},
         {"ejected_penalty_ms", number_field(r, cost.ejected_penalty_s, 0.0, 3.6e6, kMs)},
         {"degraded_penalty_ms", number_field(r, cost.degraded_penalty_s, 0.0, 3.6e6, kMs)},
         {"margin_ms", number_field(r, sel.margin_s, 0.0, 3.6e6, kMs)},
         {"margin_fraction", number_field(r, sel.margin_fraction, 0.0, 10.0)},
         {"local_hysteresis_ms", number_field(r, sel.local_hysteresis_s, 0.0, 3.6e6, kMs)},
         {"version_fallback",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(c.routing.version_fallback, r.boolean(n, k));
              return ok_status();
          }},
         {"target_versions",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              if (!n.IsMap()) {
                  return r.error(n, k, "expected a mapping of model name to version digest");
              }
              for (auto it = n.begin(); it != n.end(); ++it) {
                  EDGE_ASSIGN_OR_RETURN(std::string model, r.string(it->first, k));
                  EDGE_ASSIGN_OR_RETURN(std::string digest, r.string(it->second, k + "." + model));
                  if (model.empty() || digest.empty()) {
                      return r.error(it->first, k, "model and version must not be empty");
                  }
                  if (!c.routing.target_versions.emplace(model, digest).second) {
                      return r.error(it->first, k + "." + model, "duplicate key");
                  }
              }
              return ok_status();
          }},
         {"outlier", [&](const YAML::Node& n, const std::string& k) -> Status {
              routing::health::OutlierConfig& o = c.routing.outlier;
              return r.for_each_key(
                  n, k,
                  {{"consecutive_failures", int_field(r, o.consecutive_failures, 0, 1000000)},
                   {"interval_ms", duration_field(r, o.interval)},
                   {"base_ejection_ms", duration_field(r, o.base_ejection_time)},
                   {"max_ejection_ms", duration_field(r, o.max_ejection_time)},
                   {"max_ejection_percent", int_field(r, o.max_ejection_percent, 0, 100)},
                   {"success_rate_request_volume",
                    int_field(r, o.success_rate_request_volume, 1, 1000000000)},
                   {"success_rate_minimum_hosts",
                    int_field(r, o.success_rate_minimum_hosts, 1, 1000000)},
                   {"success_rate_stdev_factor",
                    number_field(r, o.success_rate_stdev_factor, 0.0, 100.0)}});
          }}}));
    // A pool is saturated at kv_saturated; the soft penalty below it must start first (and at
    // 0 every pool, an idle one too, would be saturated).
    if (cost.kv_saturated <= cost.kv_soft_limit) {
        std::ostringstream msg;
        msg << "kv_saturated (" << cost.kv_saturated << ") must be above kv_soft_limit ("
            << cost.kv_soft_limit << ")";
        return r.error(node, key, msg.str());
    }
    return ok_status();
}

Status parse_gossip(const Reader& r, const YAML::Node& node, const std::string& key, Config& c) {
    GossipConfig& g = c.gossip;
    g.enabled = true;
    if (node.IsNull()) {
        return ok_status();  // `gossip:` alone: every default.
    }
    EDGE_RETURN_IF_ERROR(r.for_each_key(
        node, key,
        {{"bind_address", ip_field(r, g.bind_address)},
         {"port", int_field(r, g.port, 0, 65535)},
         {"advertise_address",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(g.advertise_address, host_port(r, n, k));
              // Gossiped as is to every member, which sends to it: an address, not a name.
              std::string host = g.advertise_address.substr(0, g.advertise_address.rfind(':'));
              if (host.size() > 2 && host.front() == '[') {
                  host = host.substr(1, host.size() - 2);
              }
              boost::system::error_code ec;
              (void)boost::asio::ip::make_address(host, ec);
              if (ec) {
                  return r.error(n, k, "expected an IP literal and a port (members gossip it "
                                       "and send to it; not a host name)");
              }
              return ok_status();
          }},
         {"join",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              if (!n.IsSequence()) {
                  return r.error(n, k, "expected a list of host:port");
              }
              for (size_t i = 0; i < n.size(); ++i) {
                  EDGE_ASSIGN_OR_RETURN(std::string a,
                                        host_port(r, n[i], k + "[" + std::to_string(i) + "]"));
                  g.join.push_back(std::move(a));
              }
              return ok_status();
          }},
         {"preset",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(g.preset, r.string(n, k));
              if (g.preset != "lan" && g.preset != "wan" && g.preset != "local") {
                  return r.error(n, k, "expected lan, wan or local");
              }
              return ok_status();
          }},
         {"label",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(g.label, r.string(n, k));
              if (g.label.size() > 255) {
                  return r.error(n, k, "longer than 255 bytes");
              }
              return ok_status();
          }},
         {"keys",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(g.keys, r.strings(n, k));
              for (size_t i = 0; i < g.keys.size(); ++i) {
                  if (!routing::membership::parse_gossip_key(g.keys[i]).ok()) {
                      return r.error(n[i], k + "[" + std::to_string(i) + "]",
                                     "expected 64 hex digits (an AES-256 key)");
                  }
                  for (size_t j = 0; j < i; ++j) {
                      if (*routing::membership::parse_gossip_key(g.keys[j]) ==
                          *routing::membership::parse_gossip_key(g.keys[i])) {
                          return r.error(n[i], k + "[" + std::to_string(i) + "]",
                                         "the same key as " + k + "[" + std::to_string(j) + "]");
                      }
                  }
              }
              return ok_status();
          }},
         {"keyring_file",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(g.keyring_file, r.path(n, k));
              return ok_status();
          }},
         {"probe_interval_ms", ms0_field(r, g.probe_interval)},
         {"probe_timeout_ms", ms0_field(r, g.probe_timeout)},
         {"gossip_interval_ms", ms0_field(r, g.gossip_interval)},
         {"push_pull_interval_ms", ms0_field(r, g.push_pull_interval)},
         {"suspicion_mult", int_field(r, g.suspicion_mult, 0, 100)},
         {"join_retry_interval_ms",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              // At most the retry's cap (routing/membership's join_retry_max_interval).
              EDGE_ASSIGN_OR_RETURN(int64_t v, r.integer(n, k, 0, 30'000));
              g.join_retry_interval = std::chrono::milliseconds(v);
              return ok_status();
          }},
         {"max_inbound_streams", int_field(r, g.max_inbound_streams, 0, 65'536)},
         {"max_members", int_field(r, g.max_members, 0, 16'777'216)},
         {"max_fetches_in_flight", int_field(r, g.max_fetches_in_flight, 0, 4096)},
         {"publish_interval_ms", ms_field(r, g.publish_interval)},
         {"leave_drain_ms", ms0_field(r, g.leave_drain)},
         {"health_check_interval_ms", ms0_field(r, g.health_check_interval)},
         {"health_check_timeout_ms", ms_field(r, g.health_check_timeout)},
         {"testing_peer_delay_ms", [&](const YAML::Node& n, const std::string& k) -> Status {
              if (!n.IsMap()) {
                  return r.error(n, k, "expected a mapping of site id to milliseconds");
              }
              for (auto it = n.begin(); it != n.end(); ++it) {
                  EDGE_ASSIGN_OR_RETURN(std::string site, r.string(it->first, k));
                  EDGE_ASSIGN_OR_RETURN(int64_t ms, r.integer(it->second, k + "." + site, 0,
                                                              10'000));
                  if (!g.testing_peer_delay.emplace(site, std::chrono::milliseconds(ms)).second) {
                      return r.error(it->first, k + "." + site, "duplicate key");
                  }
              }
              return ok_status();
          }}}));
    return ok_status();
}

Status parse_peer(const Reader& r, const YAML::Node& node, const std::string& key, Config& c) {
    PeerConfig& p = c.peer.emplace();
    auto path_field = [&r](std::string& field) {
        return [&r, &field](const YAML::Node& n, const std::string& k) -> Status {
            EDGE_ASSIGN_OR_RETURN(field, r.path(n, k));
            return ok_status();
        };
    };
    EDGE_RETURN_IF_ERROR(r.for_each_key(
        node, key,
        {{"address", ip_field(r, p.address)},
         {"port", int_field(r, p.port, 0, 65535)},
         {"ca", path_field(p.ca_path)},
         {"cert", path_field(p.cert_path)},
         {"key", path_field(p.key_path)},
         {"connect_timeout_ms", ms_field(r, p.connect_timeout)},
         {"response_timeout_ms", ms_field(r, p.response_timeout)},
         {"stream_idle_timeout_ms", ms_field(r, p.stream_idle_timeout)},
         {"deferred_answer_timeout_ms", ms0_field(r, p.deferred_answer_timeout)},
         {"pool_idle_timeout_ms", ms_field(r, p.pool_idle_timeout)},
         {"max_idle_connections", int_field(r, p.max_idle_connections, 0, 10'000)},
         {"retry_budget", number_field(r, p.retry_budget, 0.0, 1.0)},
         {"min_retry_concurrency", int_field(r, p.min_retry_concurrency, 0, 10'000)},
         {"max_response_bytes", int_field(r, p.max_response_bytes, 1024, int64_t{1} << 32)},
         {"verify_site_identity", [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(p.verify_site_identity, r.boolean(n, k));
              return ok_status();
          }}}));
    return r.require_keys(node, key, {"ca", "cert", "key"});
}

// A new top-level section here is compared by changed_restart_sections() too (or, when SIGHUP
// applies it, left out there on purpose).
Status parse_root(const Reader& r, const YAML::Node& root, Config& c) {
    EDGE_RETURN_IF_ERROR(r.for_each_key(
        root, "",
        {{"listeners",
          [&](const YAML::Node& n, const std::string& k) { return parse_listeners(r, n, k, c); }},
         {"site",
          [&](const YAML::Node& n, const std::string& k) { return parse_site(r, n, k, c); }},
         {"models",
          [&](const YAML::Node& n, const std::string& k) { return parse_models(r, n, k, c); }},
         {"engine",
          [&](const YAML::Node& n, const std::string& k) { return parse_engine(r, n, k, c); }},
         {"tenants",
          [&](const YAML::Node& n, const std::string& k) { return parse_tenants(r, n, k, c); }},
         {"limits",
          [&](const YAML::Node& n, const std::string& k) { return parse_limits(r, n, k, c); }},
         {"routing",
          [&](const YAML::Node& n, const std::string& k) { return parse_routing(r, n, k, c); }},
         {"gossip",
          [&](const YAML::Node& n, const std::string& k) { return parse_gossip(r, n, k, c); }},
         {"peer",
          [&](const YAML::Node& n, const std::string& k) { return parse_peer(r, n, k, c); }},
         {"proxy_protocol",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              return r.for_each_key(
                  n, k, {{"trusted", [&](const YAML::Node& tn, const std::string& tk) -> Status {
                              EDGE_ASSIGN_OR_RETURN(c.proxy_protocol.trusted, r.strings(tn, tk));
                              Result<tls::CidrSet> set =
                                  tls::CidrSet::parse(c.proxy_protocol.trusted);
                              if (!set.ok()) {
                                  return r.error(tn, tk, set.status().message());
                              }
                              return ok_status();
                          }}});
          }},
         {"log", [&](const YAML::Node& n, const std::string& k) -> Status {
              return r.for_each_key(
                  n, k,
                  {{"level",
                    [&](const YAML::Node& ln, const std::string& lk) -> Status {
                        EDGE_ASSIGN_OR_RETURN(c.log.level, r.string(ln, lk));
                        if (c.log.level != "debug" && c.log.level != "info" &&
                            c.log.level != "warn" && c.log.level != "error") {
                            return r.error(ln, lk, "expected debug, info, warn or error");
                        }
                        return ok_status();
                    }},
                   {"access_log", [&](const YAML::Node& an, const std::string& ak) -> Status {
                        EDGE_ASSIGN_OR_RETURN(c.log.access_log, r.boolean(an, ak));
                        return ok_status();
                    }}});
          }}}));
    EDGE_RETURN_IF_ERROR(r.require_keys(root, "", {"listeners", "site"}));
    // In a cluster the other sites route by the distance to this one until their network
    // coordinates settle: a position left out would read as (0, 0), off the coast of Africa.
    if (c.gossip.enabled) {
        const YAML::Node site = root["site"];
        for (const char* k : {"latitude", "longitude"}) {
            if (!site[k]) {
                return r.error(site, "site",
                               std::string("missing '") + k +
                                   "': a site in a cluster (`gossip`) gives its position");
            }
        }
    }
    // Tenants may only name configured models.
    if (c.tenants) {
        std::set<std::string> served;
        for (const auto& m : c.models) {
            served.insert(m.name);
        }
        const YAML::Node tenants = root["tenants"];
        for (size_t i = 0; i < c.tenants->size(); ++i) {
            const auto& t = (*c.tenants)[i];
            for (size_t j = 0; j < t.models.size(); ++j) {
                if (!served.count(t.models[j])) {
                    std::string k = "tenants[" + std::to_string(i) + "].models[" +
                                    std::to_string(j) + "]";
                    return r.error(tenants[i]["models"][j], k,
                                   "model '" + t.models[j] + "' is not in `models`");
                }
            }
        }
    }
    c.engine.models = c.models;
    return ok_status();
}

// Where the text stops being one YAML document, if it does: the 0-based line and what is there.
// A `---` marker after content (comments, blank lines and directives are not content) starts a
// second document; content after a `...` end marker belongs to none. yaml-cpp's Load reads the
// first document and silently drops the rest, so a `...` that a template tool emitted mid-file
// (PyYAML writes one after a lone scalar) would drop every section after it: `tenants` among
// them, which turns authentication off.
struct DocumentBreak {
    int line = 0;
    std::string message;
};

std::optional<DocumentBreak> document_break(std::string_view text) {
    bool content = false;
    std::optional<int> end_marker;  // The line of a `...` seen so far.
    int line = 0;
    auto is_marker = [](std::string_view l, std::string_view m) {
        return l.starts_with(m) && (l.size() == 3 || l[3] == ' ' || l[3] == '\t');
    };
    for (size_t pos = 0; pos < text.size(); ++line) {
        size_t end = text.find('\n', pos);
        if (end == std::string_view::npos) {
            end = text.size();
        }
        std::string_view l = text.substr(pos, end - pos);
        pos = end + 1;
        if (!l.empty() && l.back() == '\r') {
            l.remove_suffix(1);
        }
        const bool start = is_marker(l, "---");
        if (start && content) {
            return DocumentBreak{line,
                                 "a second YAML document (`---` after the first); the "
                                 "configuration is one document"};
        }
        if (is_marker(l, "...")) {
            end_marker = end_marker.value_or(line);
            continue;
        }
        const size_t first = l.find_first_not_of(" \t");
        const bool blank_or_comment = first == std::string_view::npos || l[first] == '#';
        if (end_marker && !blank_or_comment) {
            return DocumentBreak{line, "content after the end of the document (`...` on line " +
                                           std::to_string(*end_marker + 1) +
                                           "); the configuration is one document"};
        }
        // Content on a `---` line (`--- {a: 1}`) belongs to the document the marker starts.
        const size_t after_marker = start ? l.find_first_not_of(" \t", 3) : first;
        if (!blank_or_comment && l[0] != '%' && after_marker != std::string_view::npos &&
            l[after_marker] != '#') {
            content = true;
        }
    }
    return std::nullopt;
}

// yaml-cpp reports a tab in the indentation as whatever it breaks ("end of map not found",
// "illegal map value"), without a word of tabs; YAML indents with spaces only. When the line of a
// parse error, or the line above it, has a tab before its first character, the error says so.
std::string tab_indentation_hint(std::string_view text, const YAML::Mark& mark) {
    if (mark.is_null()) {
        return {};
    }
    int line = 0;
    for (size_t pos = 0; pos < text.size() && line <= mark.line; ++line) {
        size_t end = text.find('\n', pos);
        if (end == std::string_view::npos) {
            end = text.size();
        }
        const std::string_view l = text.substr(pos, end - pos);
        pos = end + 1;
        const size_t first = l.find_first_not_of(" \t\r");
        if (line + 1 >= mark.line && first != std::string_view::npos &&
            l.substr(0, first).find('\t') != std::string_view::npos) {
            return " (line " + std::to_string(line + 1) +
                   " is indented with a tab; YAML indents with spaces only)";
        }
    }
    return {};
}

// Where `text` first stops being UTF-8, if it does: a mark with the 0-based line and byte column
// (as yaml-cpp counts them). yaml-cpp passes such bytes through as they are: a Latin-1 "é" in a
// model name would be served in /v1/models as JSON no client decodes, and would never match the
// UTF-8 name clients send.
std::optional<YAML::Mark> first_non_utf8(std::string_view text) {
    const size_t bad = engine::tokenizer::utf8_first_invalid(text);
    if (bad == text.size()) {
        return std::nullopt;
    }
    const std::string_view before = text.substr(0, bad);
    const size_t line_start = before.rfind('\n') + 1;  // npos + 1 == 0: the first line.
    YAML::Mark mark;
    mark.pos = static_cast<int>(bad);
    mark.line = static_cast<int>(std::count(before.begin(), before.end(), '\n'));
    mark.column = static_cast<int>(bad - line_start);
    return mark;
}

// yaml-cpp 0.7 accepts a quoted scalar whose closing quote never comes: it runs to the end of
// the input and swallows every section after it. Each quoted scalar (yaml-cpp tags it "!") is
// checked in the raw text from its opening quote at Mark().pos: a double-quoted one ends at an
// unescaped `"`, a single-quoted one at a `'` not doubled. Each node of the text is visited once
// (`seen` holds their positions): an alias is the node it names, and following every alias path
// of nested aliases would take exponential time (a "billion laughs" file of 600 bytes).
Status check_quoted_scalars(const Reader& r, std::string_view text, size_t offset,
                            const YAML::Node& node, std::unordered_set<int>& seen) {
    if (!node.Mark().is_null() && !seen.insert(node.Mark().pos).second) {
        return ok_status();
    }
    if (node.IsMap()) {
        for (auto it = node.begin(); it != node.end(); ++it) {
            EDGE_RETURN_IF_ERROR(check_quoted_scalars(r, text, offset, it->first, seen));
            EDGE_RETURN_IF_ERROR(check_quoted_scalars(r, text, offset, it->second, seen));
        }
        return ok_status();
    }
    if (node.IsSequence()) {
        for (size_t i = 0; i < node.size(); ++i) {
            EDGE_RETURN_IF_ERROR(check_quoted_scalars(r, text, offset, node[i], seen));
        }
        return ok_status();
    }
    if (!node.IsScalar() || node.Tag() != "!" || node.Mark().is_null()) {
        return ok_status();
    }
    const size_t start = offset + static_cast<size_t>(node.Mark().pos);
    if (start >= text.size() || (text[start] != '"' && text[start] != '\'')) {
        return ok_status();  // A block scalar (| or >), or a tagged one.
    }
    const char quote = text[start];
    for (size_t i = start + 1; i < text.size(); ++i) {
        if (quote == '"' && text[i] == '\\') {
            ++i;  // The escaped character, whatever it is.
        } else if (text[i] == quote) {
            if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
                ++i;  // '' is a quote inside a single-quoted string.
            } else {
                return ok_status();
            }
        }
    }
    return r.error(node, "",
                   std::string("unterminated quoted string (no closing ") + quote +
                       " before the end of the file)");
}

}  // namespace

Result<Config> parse_config(std::string_view yaml_text, const std::string& source) {
    Config config;
    config.source = source;
    // Relative paths in the config are relative to its directory, made absolute now: the
    // values (and their errors, on a reload too) then say where they point.
    std::filesystem::path base = std::filesystem::path(source).parent_path();
    if (base.empty()) {
        base = ".";
    }
    std::error_code cwd_error;
    if (std::filesystem::path absolute = std::filesystem::absolute(base, cwd_error);
        !cwd_error) {
        base = absolute;
    }
    Reader reader(source, base);
    try {
        // Not YAML::LoadAll: yaml-cpp 0.7 can loop forever in it on malformed input (the
        // fuzzer found one). A second document starts with `---` at column 0 after content.
        if (std::optional<DocumentBreak> b = document_break(yaml_text)) {
            YAML::Mark mark;
            mark.line = b->line;
            return reader.error(mark, "", b->message);
        }
        if (std::optional<YAML::Mark> bad = first_non_utf8(yaml_text)) {
            char byte[8];
            std::snprintf(byte, sizeof(byte), "0x%02X",
                          static_cast<unsigned char>(yaml_text[static_cast<size_t>(bad->pos)]));
            return reader.error(*bad, "",
                                std::string("byte ") + byte +
                                    " is not UTF-8; the configuration is UTF-8 text");
        }
        YAML::Node root = YAML::Load(std::string(yaml_text));
        if (!root.IsDefined() || root.IsNull()) {
            return invalid_argument_error(source + ": empty configuration");
        }
        // yaml-cpp's marks do not count a UTF-8 byte order mark.
        const size_t offset = yaml_text.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;
        std::unordered_set<int> seen;
        EDGE_RETURN_IF_ERROR(check_quoted_scalars(reader, yaml_text, offset, root, seen));
        EDGE_RETURN_IF_ERROR(parse_root(reader, root, config));
    } catch (const YAML::Exception& e) {
        return reader.error(e.mark, "", e.msg + tab_indentation_hint(yaml_text, e.mark));
    } catch (const std::exception& e) {
        return invalid_argument_error(source + ": " + e.what());
    }
    return config;
}

std::vector<std::string> changed_restart_sections(const Config& running, const Config& fresh) {
    // Each section's parsed values without what a reload applies. Compared as values, not as
    // YAML text, so that reordered keys or a default written out do not ask for a restart.
    auto listeners = [](const Config& c) {
        PublicListenerConfig pub = c.listener;
        pub.certificates.clear();
        AdminListenerConfig admin = c.admin;
        admin.token_file.clear();  // Read again by a reload.
        return std::pair(pub, admin);
    };
    auto engine = [](const Config& c) {
        engine::EngineConfig e = c.engine;
        e.models.clear();  // The `models` section's, compared there.
        return e;
    };
    auto gossip = [](const Config& c) {
        GossipConfig g = c.gossip;
        g.keys.clear();
        g.keyring_file.clear();
        return g;
    };
    auto peer = [](const Config& c) {
        std::optional<PeerConfig> p = c.peer;
        if (p) {
            p->ca_path.clear();
            p->cert_path.clear();
            p->key_path.clear();
        }
        return p;
    };
    std::vector<std::string> changed;
    auto check = [&](const char* section, auto value) {
        if (!(value(running) == value(fresh))) {
            changed.push_back(section);
        }
    };
    // In name order.
    check("engine", engine);
    check("gossip", gossip);
    check("limits", [](const Config& c) { return c.limits; });
    check("listeners", listeners);
    check("log", [](const Config& c) { return c.log; });
    check("models", [](const Config& c) { return c.models; });
    check("peer", peer);
    check("proxy_protocol", [](const Config& c) { return c.proxy_protocol; });
    // SIGHUP applies the routing weights; the outlier detector's settings and the initial
    // target versions wait for a restart.
    check("routing",
          [](const Config& c) { return std::pair(c.routing.outlier, c.routing.target_versions); });
    check("site", [](const Config& c) { return c.site; });
    return changed;
}

bool is_identifier(std::string_view s) {
    return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
               ch == '.' || ch == '_' || ch == '-';
    });
}

Result<Config> load_config(const std::string& path) {
    Result<std::string> text = read_small_file(path, uint64_t{16} << 20);
    if (text.status().code() == StatusCode::kNotFound) {
        return not_found_error("cannot open config file '" + path + "'");
    }
    if (!text.ok()) {
        return text.status();
    }
    EDGE_ASSIGN_OR_RETURN(Config config, parse_config(*text, path));
    // A testing-only key in a config file read by the daemon (run, check-config, SIGHUP): refused
    // unless the environment says this is a test (never set in the systemd unit).
    const char* testing = std::getenv("EDGESERVE_TESTING");
    if (!config.gossip.testing_peer_delay.empty() &&
        (testing == nullptr || std::string_view(testing) != "1")) {
        return invalid_argument_error(
            path + ": gossip.testing_peer_delay_ms is for tests only (it delays gossip packets "
                   "and forwarded requests on purpose); refused unless the environment sets "
                   "EDGESERVE_TESTING=1");
    }
    return config;
}

}  // namespace edge::daemon
