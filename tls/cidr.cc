#include "tls/cidr.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cstring>

namespace edge::tls {

Result<IpAddress> IpAddress::parse(std::string_view text) {
    // A NUL would end the text inet_pton reads early: "1.2.3.4\0zz" must not pass as 1.2.3.4.
    if (text.empty() || text.size() > INET6_ADDRSTRLEN ||
        text.find('\0') != std::string_view::npos) {
        return invalid_argument_error("not an IP address: '" + std::string(text) + "'");
    }
    std::string s(text);
    IpAddress out;
    in_addr v4{};
    if (inet_pton(AF_INET, s.c_str(), &v4) == 1) {
        out.is_v4 = true;
        out.bytes[10] = 0xff;
        out.bytes[11] = 0xff;
        std::memcpy(out.bytes.data() + 12, &v4, 4);
        return out;
    }
    in6_addr v6{};
    if (inet_pton(AF_INET6, s.c_str(), &v6) == 1) {
        std::memcpy(out.bytes.data(), &v6, 16);
        static constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        out.is_v4 = std::memcmp(out.bytes.data(), kMappedPrefix, 12) == 0;
        return out;
    }
    return invalid_argument_error("not an IP address: '" + s + "'");
}

std::string IpAddress::to_string() const {
    char buf[INET6_ADDRSTRLEN] = {};
    if (is_v4) {
        inet_ntop(AF_INET, bytes.data() + 12, buf, sizeof(buf));
    } else {
        inet_ntop(AF_INET6, bytes.data(), buf, sizeof(buf));
    }
    return buf;
}

Result<CidrSet> CidrSet::parse(const std::vector<std::string>& ranges) {
    CidrSet set;
    for (const std::string& text : ranges) {
        std::string_view addr = text;
        std::string_view prefix;
        if (size_t slash = addr.find('/'); slash != std::string_view::npos) {
            prefix = addr.substr(slash + 1);
            addr = addr.substr(0, slash);
        }
        EDGE_ASSIGN_OR_RETURN(IpAddress base, IpAddress::parse(addr));
        int max_bits = base.is_v4 ? 32 : 128;
        int bits = max_bits;
        if (!prefix.empty() || text.find('/') != std::string::npos) {
            auto [end, ec] = std::from_chars(prefix.data(), prefix.data() + prefix.size(), bits);
            if (ec != std::errc() || end != prefix.data() + prefix.size() || bits < 0 ||
                bits > max_bits) {
                return invalid_argument_error("bad prefix length in '" + text + "' (0.." +
                                              std::to_string(max_bits) + ")");
            }
        }
        const int prefix_bits = base.is_v4 ? bits + 96 : bits;
        IpAddress network = base;
        for (int i = 0; i < 16; ++i) {
            const int keep = std::clamp(prefix_bits - 8 * i, 0, 8);
            network.bytes[i] &= static_cast<uint8_t>(0xff00 >> keep);
        }
        if (network.bytes != base.bytes) {
            // Most likely a typo for the network, or for one address: say which is which.
            return invalid_argument_error(
                "'" + text + "' has address bits past its /" + std::to_string(bits) +
                " prefix: write the range as " + network.to_string() + "/" +
                std::to_string(bits) + ", or one address as " + base.to_string() + "/" +
                std::to_string(max_bits));
        }
        set.ranges_.push_back(Range{base, prefix_bits});
    }
    return set;
}

bool CidrSet::contains(const IpAddress& address) const {
    for (const Range& r : ranges_) {
        int full = r.prefix_bits / 8;
        int rest = r.prefix_bits % 8;
        if (std::memcmp(r.base.bytes.data(), address.bytes.data(), full) != 0) {
            continue;
        }
        if (rest != 0) {
            uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
            if ((r.base.bytes[full] & mask) != (address.bytes[full] & mask)) {
                continue;
            }
        }
        return true;
    }
    return false;
}

}  // namespace edge::tls
