#pragma once

// The address a member bound to every interface (0.0.0.0 or ::) advertises when none is
// configured. Other members send to the address it advertises, so the wildcard itself would
// name their own machine (their probes to it never arrive: the member is declared dead and
// flaps). As HashiCorp's memberlist does, a private address of an interface that is up is
// chosen; this one then falls back to any other address that is not loopback or link-local
// (memberlist refuses to start instead), so a host with public addresses only still joins.

#include <string>
#include <vector>

#include <boost/asio/ip/address.hpp>

#include "common/result.h"

namespace edge::routing::membership {

struct InterfaceAddress {
    std::string interface;  // e.g. "eth0", for messages.
    boost::asio::ip::address address;
    bool up = false;
    bool loopback = false;
};

// This machine's interface addresses (getifaddrs), in the order the kernel lists them.
std::vector<InterfaceAddress> interface_addresses();

// The address to advertise for a wildcard bind, from `candidates`: for an IPv4 bind an IPv4
// address; for an IPv6 one (dual stack) either. Interfaces that are down, loopback, link-local
// and unspecified addresses are skipped; then private IPv4 (10/8, 172.16/12, 192.168/16), IPv6
// unique-local (fc00::/7), shared IPv4 (100.64/10), any other IPv4, any other IPv6, each in
// list order. An error saying what to set when there is none.
Result<boost::asio::ip::address> choose_advertise_address(
    const std::vector<InterfaceAddress>& candidates, bool ipv6_bind);

}  // namespace edge::routing::membership
