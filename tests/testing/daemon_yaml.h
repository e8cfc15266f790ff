#pragma once

// Daemon configs for tests that start several daemons on loopback (in process, or the edgeserve
// binary): daemon_yaml() writes one config from the parts that differ between such tests (the
// site, its certificates, the peer section, the gossip timing), every listener on 127.0.0.1:0.
// wait_for() is the polling helper those tests wait with. Starting an in-process Daemon from such
// a config is tests/testing/test_daemon.h (header-only: only suites that link edge_daemon use it).
// Pure functions; any thread.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace edge::testing {

// The `gossip` section of a test cluster: the `local` preset with fast intervals.
struct GossipYaml {
    int probe_interval_ms = 200;         // Between probes of one member, ms.
    int probe_timeout_ms = 150;          // Before a probe counts as missed, ms.
    int suspicion_mult = 0;              // Suspicion timeout multiplier; 0: the preset's.
    int gossip_interval_ms = 30;         // Between gossip rounds, ms.
    int push_pull_interval_ms = 1000;    // Between full state exchanges, ms.
    int publish_interval_ms = 50;        // Between samples of this site's load, ms.
    int leave_drain_ms = 100;            // Leave gossiped this long before closing, ms; 0: default.
    int health_check_interval_ms = 100;  // Active /readyz checks of peers, ms; 0: none.
    int health_check_timeout_ms = 200;   // One check, ms; 0: the default.
    // testing_peer_delay_ms mapping without braces ("sin: 5, gru: 45"); "": none.
    std::string testing_peer_delay;
    std::vector<std::string> join;  // Seed members' gossip addresses (host:port).
    std::vector<std::string> keys;  // gossip.keys (64 hex digits each); none: in clear.
    // gossip.snapshot_file, always written: "" (none) unless a test gives one, so that a suite
    // run where STATE_DIRECTORY is set (under a systemd unit) does not give every site of every
    // test one file.
    std::string snapshot_file;
};

// The `peer` (mutual TLS forwarding) section.
struct PeerYaml {
    std::string ca_path;         // PEM: the cluster CA.
    std::string cert_path;       // PEM: this site's certificate (signed by the CA).
    std::string key_path;        // PEM: its key.
    int connect_timeout_ms = 0;  // Connect + handshake of a forward, ms; 0: the default.
    // More keys of the section, one "  key: value\n" line each.
    std::string extra;
};

struct DaemonYaml {
    std::string site_id = "test-site";  // site.id
    double latitude = 50.1;             // site.latitude, degrees.
    double longitude = 8.7;             // site.longitude, degrees.
    std::string region;                 // site.region; "": none.
    std::string peer_address;           // site.peer_address; "": learnt from the listener.
    std::string cert_path;              // PEM: the public listener's certificate (localhost).
    std::string key_path;               // PEM: its key.
    int drain_deadline_ms = 5000;       // limits.drain_deadline_ms; 0: the default.
    std::optional<PeerYaml> peer;       // No peer section when empty.
    std::optional<GossipYaml> gossip;   // No gossip section when empty.
    // More top-level sections, verbatim (models, engine, log, routing, tenants...).
    std::string extra;
};

std::string daemon_yaml(const DaemonYaml& config);

// Polls `pred` every 10 ms until it is true (true) or `limit` has passed (false).
bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds limit);

}  // namespace edge::testing
