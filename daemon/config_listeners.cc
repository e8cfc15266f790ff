// The `listeners` section (the public HTTPS listener with its certificates, the admin one) and
// the `limits` section (the timeouts and sizes the listeners enforce), for parse_config().

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <boost/asio/ip/address.hpp>

#include "daemon/config_internal.h"

namespace edge::daemon {
namespace {

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

// listeners.admin.host_names: DNS names, or a lone "*". A name is compared with a Host's part
// before the port, so a port here could never match; an IP literal is taken by the listener
// without listing and is let through, harmless. Wildcards such as *.example.org are refused
// rather than read as a name that never matches.
Status parse_host_names(const Reader& r, const YAML::Node& node, const std::string& key,
                        std::vector<std::string>& out) {
    EDGE_ASSIGN_OR_RETURN(out, r.strings(node, key));
    for (size_t i = 0; i < out.size(); ++i) {
        const std::string& name = out[i];
        const std::string item = key + "[" + std::to_string(i) + "]";
        auto refuse = [&](const std::string& why) { return r.error(node[i], item, why); };
        if (name.empty()) {
            return refuse("must not be empty");
        }
        if (name == "*") {
            if (out.size() > 1) {
                return refuse("\"*\" accepts any Host and turns the check off: list it alone, "
                              "or list names without it");
            }
            continue;
        }
        boost::system::error_code ec;
        const bool bracketed = name.size() > 2 && name.front() == '[' && name.back() == ']';
        (void)boost::asio::ip::make_address(
            bracketed ? name.substr(1, name.size() - 2) : name, ec);
        if (!ec) {
            continue;
        }
        const size_t colon = name.rfind(':');
        if (colon != std::string::npos && colon + 1 < name.size() &&
            name.find_first_not_of("0123456789", colon + 1) == std::string::npos) {
            return refuse("'" + name + "' has a port: list the name alone (every port is "
                          "accepted)");
        }
        if (!dns_name_chars(name)) {
            return refuse("'" + name + "' is not a DNS name (letters, digits, '-', '_' and '.'; "
                          "a lone \"*\" accepts any Host)");
        }
    }
    return ok_status();
}

// The shortest certificate_watch_ms other than 0 (off).
constexpr int64_t kMinCertificateWatchMs = 100;

}  // namespace

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
                   {"token_file",
                    [&](const YAML::Node& tn, const std::string& tk) -> Status {
                        EDGE_ASSIGN_OR_RETURN(c.admin.token_file, r.path(tn, tk));
                        return ok_status();
                    }},
                   {"host_names", [&](const YAML::Node& hn, const std::string& hk) {
                        return parse_host_names(r, hn, hk, c.admin.host_names);
                    }}});
          }}}));
    return r.require_keys(node, key, {"public"});
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

}  // namespace edge::daemon
