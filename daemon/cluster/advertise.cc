#include "daemon/cluster/advertise.h"

#include <optional>

#include <boost/asio/ip/address.hpp>

#include "routing/membership/interface_address.h"

namespace edge::daemon::cluster {

namespace {

// The IP address `host` spells (brackets allowed; a v4-mapped IPv6 address as its IPv4 one), or
// nullopt for anything else. Parsed, not compared as text: "::0", "0:0:0:0:0:0:0:0" and
// "::ffff:127.0.0.1" are IP literals the config takes too.
std::optional<boost::asio::ip::address> parse_ip(std::string_view host) {
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
    }
    boost::system::error_code ec;
    boost::asio::ip::address ip = boost::asio::ip::make_address(std::string(host), ec);
    if (ec) {
        return std::nullopt;
    }
    if (ip.is_v6() && ip.to_v6().is_v4_mapped()) {
        ip = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, ip.to_v6());
    }
    return ip;
}

bool is_wildcard(std::string_view host) {
    const std::optional<boost::asio::ip::address> ip = parse_ip(host);
    return ip && ip->is_unspecified();
}

}  // namespace

std::string public_host(std::string_view advertise_address, std::string_view bind_address) {
    if (!advertise_address.empty()) {
        return std::string(advertise_address.substr(0, advertise_address.rfind(':')));
    }
    if (!is_wildcard(bind_address)) {
        return std::string(bind_address);
    }
    // The address gossip advertises for a wildcard bind (MembershipService::create).
    const std::optional<boost::asio::ip::address> bind = parse_ip(bind_address);
    Result<boost::asio::ip::address> chosen = routing::membership::choose_advertise_address(
        routing::membership::interface_addresses(), bind && bind->is_v6());
    if (!chosen.ok()) {
        return {};
    }
    return chosen->is_v6() ? "[" + chosen->to_string() + "]" : chosen->to_string();
}

bool is_loopback_host(std::string_view host) {
    if (host == "localhost") {
        return true;
    }
    const std::optional<boost::asio::ip::address> ip = parse_ip(host);
    return ip && ip->is_loopback();
}

std::string reachable_address(std::string_view listen, uint16_t port,
                              std::string_view public_host) {
    std::string host(listen);
    if (is_wildcard(host)) {
        host = public_host;
    } else if (is_loopback_host(host) && !public_host.empty() && !is_loopback_host(public_host)) {
        host.clear();
    }
    if (host.empty()) {
        return host;
    }
    const bool v6 = host.find(':') != std::string::npos && host[0] != '[';
    return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace edge::daemon::cluster
