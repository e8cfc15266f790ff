#include "routing/membership/interface_address.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <optional>

namespace edge::routing::membership {

namespace {

namespace ip = boost::asio::ip;

// Lower is preferred; nullopt: never advertised.
std::optional<int> rank(const InterfaceAddress& a, bool ipv6_bind) {
    if (!a.up || a.loopback || a.address.is_unspecified() || a.address.is_loopback() ||
        a.address.is_multicast()) {
        return std::nullopt;
    }
    if (a.address.is_v4()) {
        const uint32_t v = a.address.to_v4().to_uint();
        auto in = [v](uint32_t net, int bits) { return (v >> (32 - bits)) == (net >> (32 - bits)); };
        if (in(0xA9FE0000, 16)) {  // 169.254/16, link-local.
            return std::nullopt;
        }
        if (in(0x0A000000, 8) || in(0xAC100000, 12) || in(0xC0A80000, 16)) {
            return 0;
        }
        return in(0x64400000, 10) ? 2 : 3;
    }
    if (!ipv6_bind) {
        return std::nullopt;
    }
    const ip::address_v6 v6 = a.address.to_v6();
    if (v6.is_link_local() || v6.is_v4_mapped()) {
        return std::nullopt;
    }
    return (v6.to_bytes()[0] & 0xFE) == 0xFC ? 1 : 4;
}

}  // namespace

std::vector<InterfaceAddress> interface_addresses() {
    std::vector<InterfaceAddress> out;
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) != 0) {
        return out;
    }
    for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
        if (i->ifa_addr == nullptr) {
            continue;
        }
        InterfaceAddress a;
        a.interface = i->ifa_name != nullptr ? i->ifa_name : "";
        a.up = (i->ifa_flags & IFF_UP) != 0 && (i->ifa_flags & IFF_RUNNING) != 0;
        a.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
        if (i->ifa_addr->sa_family == AF_INET) {
            const auto* sin = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
            a.address = ip::address_v4(ntohl(sin->sin_addr.s_addr));
        } else if (i->ifa_addr->sa_family == AF_INET6) {
            const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
            ip::address_v6::bytes_type bytes;
            std::copy(std::begin(sin6->sin6_addr.s6_addr), std::end(sin6->sin6_addr.s6_addr),
                      bytes.begin());
            a.address = ip::address_v6(bytes, sin6->sin6_scope_id);
        } else {
            continue;
        }
        out.push_back(std::move(a));
    }
    freeifaddrs(list);
    return out;
}

Result<ip::address> choose_advertise_address(const std::vector<InterfaceAddress>& candidates,
                                             bool ipv6_bind) {
    const InterfaceAddress* best = nullptr;
    int best_rank = 0;
    for (const InterfaceAddress& a : candidates) {
        const std::optional<int> r = rank(a, ipv6_bind);
        if (r && (best == nullptr || *r < best_rank)) {
            best = &a;
            best_rank = *r;
        }
    }
    if (best == nullptr) {
        return invalid_argument_error(
            std::string("gossip binds to every interface and no interface that is up has an ") +
            (ipv6_bind ? "" : "IPv4 ") +
            "address other members could reach (not loopback or link-local) to advertise: set "
            "gossip.advertise_address");
    }
    return best->address;
}

}  // namespace edge::routing::membership
