#pragma once

// CidrSet is a list of IPv4/IPv6 address ranges ("10.0.0.0/8", "::1/128", "192.0.2.7") and answers
// whether an address falls in one of them. IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) match IPv4
// ranges. Immutable after parse(); safe to share between threads.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace edge::tls {

// An IP address in 16 bytes; IPv4 is stored IPv4-mapped (::ffff:a.b.c.d).
struct IpAddress {
    std::array<uint8_t, 16> bytes{};
    bool is_v4 = false;

    static Result<IpAddress> parse(std::string_view text);
    std::string to_string() const;
};

class CidrSet {
public:
    // Parses "addr/prefix" or a bare address (a full-length prefix).
    static Result<CidrSet> parse(const std::vector<std::string>& ranges);

    bool contains(const IpAddress& address) const;
    bool empty() const { return ranges_.empty(); }

private:
    struct Range {
        IpAddress base;
        int prefix_bits = 0;  // Over the 128-bit mapped form.
    };
    std::vector<Range> ranges_;
};

}  // namespace edge::tls
