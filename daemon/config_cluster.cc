// The sections of a site in a cluster, for parse_config(): `site` (its identity and position),
// `routing` (the cost of each site and the choice between them), `gossip` (membership) and `peer`
// (the mutual-TLS listener and client for requests forwarded between sites).

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include <boost/asio/ip/address.hpp>

#include "daemon/config_internal.h"
#include "routing/membership/keyring.h"

namespace edge::daemon {
namespace {

// A "host:port" or "[v6]:port" string with a port in 1..65535; the host a DNS name or an IP
// literal (peers connect to it and send it as Host: a '*' or a URL there could never work).
Result<std::string> host_port(const Reader& r, const YAML::Node& n, const std::string& k) {
    EDGE_ASSIGN_OR_RETURN(std::string v, r.string(n, k));
    std::string port;
    if (!v.empty() && v[0] == '[') {
        const size_t close = v.find("]:");
        boost::system::error_code ec;
        if (close != std::string::npos && close > 1) {
            (void)boost::asio::ip::make_address_v6(v.substr(1, close - 1), ec);
        }
        if (close == std::string::npos || close == 1 || ec) {
            return r.error(n, k, "expected [IPv6 address]:port");
        }
        port = v.substr(close + 2);
    } else {
        const size_t colon = v.rfind(':');
        if (colon == std::string::npos || colon == 0 || v.find(':') != colon) {
            return r.error(n, k, "expected host:port");
        }
        if (!dns_name_chars(std::string_view(v).substr(0, colon))) {
            return r.error(n, k,
                           "the host before the port must be a DNS name or an IP address "
                           "(letters, digits, '-', '_' and '.')");
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

// gossip.snapshot_file when the config does not set it: in systemd's StateDirectory= (the unit
// sets StateDirectory=edgeserve), the first of STATE_DIRECTORY's paths; else none.
std::string default_snapshot_file() {
    const char* dirs = std::getenv("STATE_DIRECTORY");
    if (dirs == nullptr) {
        return "";
    }
    const std::string_view all(dirs);
    const std::filesystem::path first(all.substr(0, all.find(':')));
    if (first.empty() || !first.is_absolute()) {
        return "";
    }
    return (first / "gossip.snapshot").lexically_normal().string();
}

}  // namespace

Status parse_site(const Reader& r, const YAML::Node& node, const std::string& key, Config& c) {
    EDGE_RETURN_IF_ERROR(r.for_each_key(
        node, key,
        {{"id", identifier_field(r, c.site.id)},
         {"region", empty_means_default(identifier_field(r, c.site.region))},
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
          empty_means_default([&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(c.site.peer_address, host_port(r, n, k));
              return ok_status();
          })},
         {"admin_address",
          empty_means_default([&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(c.site.admin_address, host_port(r, n, k));
              return ok_status();
          })}}));
    return r.require_keys(node, key, {"id"});
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
    g.snapshot_file = default_snapshot_file();
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
          empty_means_default([&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(g.keyring_file, r.path(n, k));
              return ok_status();
          })},
         {"snapshot_file",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(std::string v, r.string(n, k));
              if (v.empty()) {
                  g.snapshot_file.clear();  // Explicitly none, STATE_DIRECTORY or not.
                  return ok_status();
              }
              if (v.back() == '/' || v == "." || v == ".." || v.ends_with("/.") ||
                  v.ends_with("/..")) {
                  return r.error(n, k, "names a directory; expected a file path (\"\" for none)");
              }
              if (std::any_of(v.begin(), v.end(),
                              [](char ch) { return static_cast<unsigned char>(ch) < 0x20; })) {
                  return r.error(n, k, "contains a control character");
              }
              EDGE_ASSIGN_OR_RETURN(g.snapshot_file, r.path(n, k));
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

}  // namespace edge::daemon
