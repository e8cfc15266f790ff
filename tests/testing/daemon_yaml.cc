#include "tests/testing/daemon_yaml.h"

#include <thread>

namespace edge::testing {

namespace {

std::string ms_line(const char* key, int value) {
    return value > 0 ? std::string("  ") + key + ": " + std::to_string(value) + "\n" : "";
}

}  // namespace

std::string daemon_yaml(const DaemonYaml& c) {
    std::string y =
        "listeners:\n"
        "  public:\n"
        "    address: 127.0.0.1\n"
        "    port: 0\n"
        "    certificates:\n"
        "      - server_names: [localhost]\n"
        "        cert: " + c.cert_path + "\n"
        "        key: " + c.key_path + "\n"
        "  admin:\n"
        "    address: 127.0.0.1\n"
        "    port: 0\n"
        "site:\n"
        "  id: " + c.site_id + "\n"
        "  latitude: " + std::to_string(c.latitude) + "\n"
        "  longitude: " + std::to_string(c.longitude) + "\n";
    if (!c.region.empty()) {
        y += "  region: " + c.region + "\n";
    }
    if (!c.peer_address.empty()) {
        y += "  peer_address: " + c.peer_address + "\n";
    }
    if (c.drain_deadline_ms > 0) {
        y += "limits:\n" + ms_line("drain_deadline_ms", c.drain_deadline_ms);
    }
    if (c.peer) {
        const PeerYaml& p = *c.peer;
        y += "peer:\n"
             "  address: 127.0.0.1\n"
             "  port: 0\n"
             "  ca: " + p.ca_path + "\n"
             "  cert: " + p.cert_path + "\n"
             "  key: " + p.key_path + "\n" +
             ms_line("connect_timeout_ms", p.connect_timeout_ms) + p.extra;
    }
    if (c.gossip) {
        const GossipYaml& g = *c.gossip;
        y += "gossip:\n"
             "  bind_address: 127.0.0.1\n"
             "  port: 0\n"
             "  preset: local\n"
             "  snapshot_file: '" + g.snapshot_file + "'\n" +
             ms_line("probe_interval_ms", g.probe_interval_ms) +
             ms_line("probe_timeout_ms", g.probe_timeout_ms) +
             ms_line("suspicion_mult", g.suspicion_mult) +
             ms_line("gossip_interval_ms", g.gossip_interval_ms) +
             ms_line("push_pull_interval_ms", g.push_pull_interval_ms) +
             ms_line("publish_interval_ms", g.publish_interval_ms) +
             ms_line("leave_drain_ms", g.leave_drain_ms) +
             // 0 is meaningful here (no active checks), so it is always written.
             "  health_check_interval_ms: " + std::to_string(g.health_check_interval_ms) + "\n" +
             ms_line("health_check_timeout_ms", g.health_check_timeout_ms);
        if (!g.testing_peer_delay.empty()) {
            y += "  testing_peer_delay_ms: {" + g.testing_peer_delay + "}\n";
        }
        if (!g.join.empty()) {
            y += "  join: [";
            for (size_t i = 0; i < g.join.size(); ++i) {
                y += (i > 0 ? ", '" : "'") + g.join[i] + "'";
            }
            y += "]\n";
        }
        if (!g.keys.empty()) {
            y += "  keys: [";
            for (size_t i = 0; i < g.keys.size(); ++i) {
                y += (i > 0 ? ", " : "") + g.keys[i];
            }
            y += "]\n";
        }
    }
    return y + c.extra;
}

bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
        if (std::chrono::steady_clock::now() > end) {
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
}

}  // namespace edge::testing
