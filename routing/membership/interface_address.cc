#include "routing/membership/interface_address.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

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

// Ranks past every address of the default routes' interfaces.
constexpr int kOffDefaultRoute = 10;

std::optional<uint32_t> hex_of(std::string_view text) {
    uint32_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 16);
    if (ec != std::errc() || end != text.data() + text.size()) {
        return std::nullopt;
    }
    return v;
}

}  // namespace

std::vector<std::string> default_route_interfaces(std::string_view table, bool ipv6) {
    constexpr uint32_t kRouteUp = 0x0001;      // RTF_UP
    constexpr uint32_t kRouteReject = 0x0200;  // RTF_REJECT
    std::vector<std::string> out;
    while (!table.empty()) {
        const size_t eol = table.find('\n');
        const std::string_view line = table.substr(0, eol);
        table = eol == std::string_view::npos ? std::string_view() : table.substr(eol + 1);
        std::istringstream words{std::string(line)};
        const std::vector<std::string> f{std::istream_iterator<std::string>(words), {}};
        // /proc/net/route: Iface Destination Gateway Flags RefCnt Use Metric Mask ...
        // /proc/net/ipv6_route: destination prefix-length source prefix-length next-hop metric
        // refcnt use flags device.
        std::string_view device, flags;
        bool any = false;
        if (!ipv6 && f.size() >= 8) {
            device = f[0];
            flags = f[3];
            any = f[1] == "00000000" && f[7] == "00000000";
        } else if (ipv6 && f.size() >= 10) {
            device = f[9];
            flags = f[8];
            any = f[0] == std::string(32, '0') && f[1] == "00";
        }
        const std::optional<uint32_t> bits = hex_of(flags);
        if (any && bits && (*bits & kRouteUp) != 0 && (*bits & kRouteReject) == 0 &&
            std::find(out.begin(), out.end(), device) == out.end()) {
            out.emplace_back(device);
        }
    }
    return out;
}

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
    for (const bool ipv6 : {false, true}) {
        // Line by line: a router's table (a full BGP feed) runs to many megabytes.
        std::ifstream in(ipv6 ? "/proc/net/ipv6_route" : "/proc/net/route");
        std::vector<std::string> devices;
        for (std::string line; std::getline(in, line);) {
            for (std::string& d : default_route_interfaces(line, ipv6)) {
                if (std::find(devices.begin(), devices.end(), d) == devices.end()) {
                    devices.push_back(std::move(d));
                }
            }
        }
        for (InterfaceAddress& a : out) {
            if (a.address.is_v6() == ipv6 &&
                std::find(devices.begin(), devices.end(), a.interface) != devices.end()) {
                a.default_route = true;
            }
        }
    }
    return out;
}

Result<ip::address> choose_advertise_address(const std::vector<InterfaceAddress>& candidates,
                                             bool ipv6_bind) {
    const InterfaceAddress* best = nullptr;
    int best_rank = 0;
    for (const InterfaceAddress& a : candidates) {
        std::optional<int> r = rank(a, ipv6_bind);
        if (r && !a.default_route) {
            *r += kOffDefaultRoute;
        }
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
