#pragma once

// The addresses a site gossips for its admin and peer listeners: what other sites reach them at
// (their /readyz checks, their forwards). Plain functions.

#include <cstdint>
#include <string>
#include <string_view>

namespace edge::daemon::cluster {

// The host other sites reach this site at when one of its listeners listens on every
// interface: the gossip advertise address's host (brackets kept for IPv6), else a specific
// gossip bind address, else the interface address gossip advertises for its wildcard bind
// (routing/membership/interface_address.h), else "" (none).
std::string public_host(std::string_view advertise_address, std::string_view bind_address);

// Whether `host` names this machine only (localhost, 127.0.0.0/8, ::1, [::1]).
bool is_loopback_host(std::string_view host);

// The "host:port" (IPv6 in brackets) other sites reach a listener on `listen`:`port` at: the
// public host for a wildcard listener, the listen address otherwise. "" when they cannot: a
// wildcard listener without a public host, or a loopback one on a site whose public host is not
// loopback (127.0.0.1 would name their own machine; a cluster all on one machine keeps it).
std::string reachable_address(std::string_view listen, uint16_t port,
                              std::string_view public_host);

}  // namespace edge::daemon::cluster
