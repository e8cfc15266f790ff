#pragma once

// The address a member bound to every interface (0.0.0.0 or ::) advertises when none is
// configured. Other members send to the address it advertises, so the wildcard itself would
// name their own machine (their probes to it never arrive: the member is declared dead and
// flaps). The interface the default route leaves by is preferred: it is the one that reaches
// other sites, where a private address of any interface (memberlist's choice) may be a
// container bridge's (docker0's 172.17.0.1) that no other machine can reach. Among the rest, as
// memberlist does, a private address is chosen first, then any other address that is not
// loopback or link-local (memberlist refuses to start instead), so a host with public addresses
// only still joins.

#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/ip/address.hpp>

#include "common/result.h"

namespace edge::routing::membership {

struct InterfaceAddress {
    std::string interface;  // e.g. "eth0", for messages.
    boost::asio::ip::address address;
    bool up = false;
    bool loopback = false;
    bool default_route = false;  // The interface carries a default route of the address's family.
};

// This machine's interface addresses (getifaddrs), in the order the kernel lists them, those of
// the default routes' interfaces marked (from /proc/net/route and /proc/net/ipv6_route).
std::vector<InterfaceAddress> interface_addresses();

// The interfaces that carry a default route (up, not a reject route), from the text of
// /proc/net/route (`ipv6` false) or /proc/net/ipv6_route (`ipv6` true). Lines that do not parse
// are skipped.
std::vector<std::string> default_route_interfaces(std::string_view table, bool ipv6);

// The address to advertise for a wildcard bind, from `candidates`: for an IPv4 bind an IPv4
// address; for an IPv6 one (dual stack) either. Interfaces that are down, loopback, link-local
// and unspecified addresses are skipped; then the default route's addresses come first, and
// within them and among the rest: private IPv4 (10/8, 172.16/12, 192.168/16), IPv6 unique-local
// (fc00::/7), shared IPv4 (100.64/10), any other IPv4, any other IPv6, each in list order. An
// error saying what to set when there is none.
Result<boost::asio::ip::address> choose_advertise_address(
    const std::vector<InterfaceAddress>& candidates, bool ipv6_bind);

}  // namespace edge::routing::membership
