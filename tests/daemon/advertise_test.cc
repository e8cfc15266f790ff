// The addresses a site gossips for its admin and peer listeners (daemon/cluster/advertise.h).

#include "daemon/cluster/advertise.h"

#include <doctest/doctest.h>

#include "routing/membership/interface_address.h"

namespace edge::daemon::cluster {
namespace {

// The host gossip advertises for a wildcard bind on this machine ("" when it has none).
std::string wildcard_host(bool ipv6) {
    auto a = routing::membership::choose_advertise_address(
        routing::membership::interface_addresses(), ipv6);
    if (!a.ok()) {
        return {};
    }
    return a->is_v6() ? "[" + a->to_string() + "]" : a->to_string();
}

TEST_CASE("advertised addresses: the public host is the advertise host, else a specific bind") {
    CHECK(public_host("203.0.113.5:7946", "0.0.0.0") == "203.0.113.5");
    CHECK(public_host("[2001:db8::5]:7946", "::") == "[2001:db8::5]");
    CHECK(public_host("", "198.51.100.7") == "198.51.100.7");
    // A wildcard bind without an advertise address: what gossip advertises for it, an
    // interface's address (routing/membership/interface_address.h), or "" on a host without one.
    CHECK(public_host("", "0.0.0.0") == wildcard_host(false));
    CHECK(public_host("", "::") == wildcard_host(true));
}

TEST_CASE("advertised addresses: what other sites reach a listener at") {
    // A specific address is itself; a wildcard one is the public host (IPv6 in brackets).
    CHECK(reachable_address("198.51.100.7", 9443, "203.0.113.5") == "198.51.100.7:9443");
    CHECK(reachable_address("0.0.0.0", 8444, "203.0.113.5") == "203.0.113.5:8444");
    CHECK(reachable_address("::", 8444, "[2001:db8::5]") == "[2001:db8::5]:8444");
    CHECK(reachable_address("2001:db8::7", 8444, "203.0.113.5") == "[2001:db8::7]:8444");
    CHECK(reachable_address("0.0.0.0", 8444, "").empty());
    // Loopback (the admin listener's default): 127.0.0.1 would name the other site's own
    // machine, so it is not advertised, unless the whole cluster is on this machine.
    CHECK(reachable_address("127.0.0.1", 9443, "203.0.113.5").empty());
    CHECK(reachable_address("::1", 9443, "203.0.113.5").empty());
    CHECK(reachable_address("127.0.0.1", 9443, "127.0.0.1") == "127.0.0.1:9443");
    CHECK(reachable_address("::1", 9443, "[::1]") == "[::1]:9443");
    CHECK(reachable_address("127.0.0.1", 9443, "") == "127.0.0.1:9443");
    CHECK(is_loopback_host("localhost"));
    CHECK(is_loopback_host("127.8.9.10"));
    CHECK_FALSE(is_loopback_host("128.0.0.1"));
}

TEST_CASE("advertised addresses: wildcard and loopback listeners are known however spelt") {
    // The config takes any IP literal; as text these were advertised as addresses, which other
    // sites then sent to: their own machine.
    CHECK(reachable_address("::0", 8444, "203.0.113.5") == "203.0.113.5:8444");
    CHECK(reachable_address("0:0:0:0:0:0:0:0", 8444, "203.0.113.5") == "203.0.113.5:8444");
    CHECK(reachable_address("0:0:0:0:0:0:0:1", 9443, "203.0.113.5").empty());
    CHECK(reachable_address("::ffff:127.0.0.1", 9443, "203.0.113.5").empty());
    CHECK(public_host("", "0:0:0:0:0:0:0:0") == wildcard_host(true));
    CHECK(public_host("", "::0") == wildcard_host(true));
    CHECK(public_host("", "2001:db8::5") == "2001:db8::5");
    CHECK(is_loopback_host("[0:0:0:0:0:0:0:1]"));
    CHECK(is_loopback_host("::ffff:127.0.0.1"));
    CHECK_FALSE(is_loopback_host("::ffff:128.0.0.1"));
    CHECK_FALSE(is_loopback_host("127.example.net"));
}

}  // namespace
}  // namespace edge::daemon::cluster
