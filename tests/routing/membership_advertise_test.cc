// The address a member bound to every interface advertises when none is configured
// (routing/membership/interface_address.h): a synthetic host's interfaces, and a real bind.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "routing/membership/config.h"
#include "routing/membership/interface_address.h"
#include "routing/membership/keyring.h"
#include "routing/membership/membership_service.h"

namespace edge::routing::membership {
namespace {

namespace ip = boost::asio::ip;

InterfaceAddress on(const char* interface, const char* address, bool up = true,
                    bool loopback = false) {
    return {interface, ip::make_address(address), up, loopback};
}

std::string chosen(const std::vector<InterfaceAddress>& host, bool ipv6_bind) {
    auto a = choose_advertise_address(host, ipv6_bind);
    return a.ok() ? a->to_string() : "error: " + a.status().message();
}

TEST_CASE("advertise for a wildcard bind: a private address first, never loopback or link-local") {
    std::vector<InterfaceAddress> host = {
        on("lo", "127.0.0.1", true, true), on("lo", "::1", true, true),
        on("eth0", "203.0.113.9"),         on("eth0", "fe80::1"),
        on("eth1", "169.254.3.4"),         on("docker0", "172.17.0.1", false),
        on("eth2", "100.64.1.2"),          on("eth3", "fd00::20"),
        on("eth4", "2001:db8::20"),        on("eth5", "192.168.1.20"),
        on("eth6", "10.0.0.7")};
    CHECK(chosen(host, false) == "192.168.1.20");  // The first private one; docker0 is down.
    CHECK(chosen(host, true) == "192.168.1.20");
    host.erase(host.end() - 2, host.end());  // No private IPv4 left.
    CHECK(chosen(host, false) == "100.64.1.2");  // Shared (carrier-grade NAT) before public.
    CHECK(chosen(host, true) == "fd00::20");     // Unique-local IPv6 for a dual-stack bind.
    const std::vector<InterfaceAddress> only_public = {on("lo", "127.0.0.1", true, true),
                                                       on("eth0", "2001:db8::20"),
                                                       on("eth0", "203.0.113.9")};
    CHECK(chosen(only_public, false) == "203.0.113.9");
    CHECK(chosen({on("eth0", "2001:db8::20")}, true) == "2001:db8::20");
    // Nothing another member could reach: the error says what to set.
    const std::string none = chosen({on("lo", "127.0.0.1", true, true), on("eth0", "fe80::1"),
                                     on("eth1", "169.254.3.4"), on("eth2", "10.1.1.1", false)},
                                    false);
    CHECK(none.rfind("error: ", 0) == 0);
    CHECK(none.find("set gossip.advertise_address") != std::string::npos);
    CHECK(chosen({on("eth0", "2001:db8::20")}, false).rfind("error: ", 0) == 0);
}

TEST_CASE("advertise for a wildcard bind: the default route's interface before a private bridge") {
    // A public NIC beside a container bridge that is up: the bridge's private 172.17.0.1 was
    // chosen, which no other machine can reach.
    InterfaceAddress eth0 = on("eth0", "203.0.113.9");
    std::vector<InterfaceAddress> host = {on("docker0", "172.17.0.1"), eth0};
    CHECK(chosen(host, false) == "172.17.0.1");  // Nothing known of the routes: memberlist's.
    host[1].default_route = true;
    CHECK(chosen(host, false) == "203.0.113.9");
    // Within the default route's interface, private first as elsewhere.
    InterfaceAddress private_eth0 = on("eth0", "10.0.0.7");
    private_eth0.default_route = true;
    host.push_back(private_eth0);
    CHECK(chosen(host, false) == "10.0.0.7");
    // A default route's interface with nothing to advertise for this bind leaves the order.
    InterfaceAddress v6_only = on("eth1", "2001:db8::20");
    v6_only.default_route = true;
    CHECK(chosen({on("docker0", "172.17.0.1"), v6_only}, false) == "172.17.0.1");
}

TEST_CASE("default routes are read from the kernel's tables, reject routes skipped") {
    const std::string route =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        "docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
        "wg0\t00000000\t00000000\t0000\t0\t0\t0\t00000000\t0\t0\t0\n"  // Not up.
        "garbage line\n";
    CHECK(default_route_interfaces(route, false) == std::vector<std::string>{"eth0"});
    const std::string zero(32, '0');
    const std::string ipv6_route =
        "fd000000000000000000000000000000 40 " + zero + " 00 " + zero +
        " 00000100 00000001 00000000 00000001     eth0\n" + zero + " 00 " + zero + " 00 " +
        "fd000000000000000000000000000001 00000400 00000003 00000000 00000003     eth1\n" + zero +
        " 00 " + zero + " 00 " + zero + " ffffffff 00000001 00000000 00200200       lo\n";
    CHECK(default_route_interfaces(ipv6_route, true) == std::vector<std::string>{"eth1"});
    CHECK(default_route_interfaces("", true).empty());
}

TEST_CASE("a member bound to 0.0.0.0 without an advertise address advertises an interface's") {
    // It advertised 0.0.0.0:port, which names each other member's own machine: their probes
    // never reached it, and it was declared dead everywhere.
    boost::asio::io_context io;
    MembershipConfig config = local_profile();
    config.name = "wild";
    SiteState site;
    site.site_id = "wild";
    auto service =
        MembershipService::create(io, config, Keyring::create({}).value(), site, "0.0.0.0", 0);
    const auto expected = choose_advertise_address(interface_addresses(), false);
    if (!expected.ok()) {  // A host with loopback only.
        REQUIRE_FALSE(service.ok());
        CHECK(service.status().message().find("set gossip.advertise_address") !=
              std::string::npos);
        return;
    }
    REQUIRE_MESSAGE(service.ok(), service.status().to_string());
    const std::string advertised = (*service)->advertise_addr();
    CHECK(advertised == expected->to_string() + ":" + std::to_string((*service)->port()));
    CHECK(advertised.find("0.0.0.0") == std::string::npos);
    io.stop();  // The service is destroyed with the loop never run.
}

}  // namespace
}  // namespace edge::routing::membership
