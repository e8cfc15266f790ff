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
