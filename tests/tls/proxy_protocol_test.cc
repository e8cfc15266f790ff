#include "tls/proxy_protocol.h"

#include <doctest/doctest.h>

#include <string>

#include "tls/cidr.h"

using namespace edge::tls;

namespace {

std::string v2_header(uint8_t ver_cmd, uint8_t fam, const std::string& addr) {
    std::string h("\r\n\r\n\0\r\nQUIT\n", 12);
    h += static_cast<char>(ver_cmd);
    h += static_cast<char>(fam);
    h += static_cast<char>(addr.size() >> 8);
    h += static_cast<char>(addr.size() & 0xff);
    return h + addr;
}

}  // namespace

TEST_CASE("proxy v1 TCP4 header gives the client address and the consumed length") {
    std::string bytes = "PROXY TCP4 203.0.113.7 10.0.0.1 51234 443\r\n\x16\x03\x01";
    auto out = parse_proxy_header(bytes);
    REQUIRE(out.ok());
    CHECK(out->state == ProxyParseState::kDone);
    CHECK(out->header.version == 1);
    CHECK(out->header.source->to_string() == "203.0.113.7");
    CHECK(out->header.source_port == 51234);
    CHECK(out->header.consumed == bytes.size() - 3);
}

TEST_CASE("proxy v1 TCP6, UNKNOWN, partial and malformed headers") {
    auto v6 = parse_proxy_header("PROXY TCP6 2001:db8::1 2001:db8::2 1 2\r\n");
    REQUIRE(v6.ok());
    CHECK(v6->header.source->to_string() == "2001:db8::1");
    // A dual-stack balancer's IPv4 client on an IPv6 socket: the IPv4 client, as v2 reads it.
    auto mapped = parse_proxy_header("PROXY TCP6 ::ffff:203.0.113.8 ::1 5555 443\r\n");
    REQUIRE(mapped.ok());
    CHECK(mapped->header.source->to_string() == "203.0.113.8");
    CHECK_FALSE(parse_proxy_header("PROXY TCP4 ::ffff:203.0.113.8 1.2.3.4 1 1\r\n").ok());
    CHECK_FALSE(parse_proxy_header("PROXY TCP6 1.2.3.4 ::1 1 1\r\n").ok());
    auto unknown = parse_proxy_header("PROXY UNKNOWN\r\n");
    REQUIRE(unknown.ok());
    CHECK(unknown->header.local);
    auto partial = parse_proxy_header("PROXY TCP4 1.2.3.4");
    REQUIRE(partial.ok());
    CHECK(partial->state == ProxyParseState::kNeedMore);
    CHECK(parse_proxy_header("PRO")->state == ProxyParseState::kNeedMore);
    CHECK_FALSE(parse_proxy_header("PROXY TCP4 1.2.3.4 5.6.7.8 99999 1\r\n").ok());
    CHECK_FALSE(parse_proxy_header("PROXY TCP4 1.2.3 5.6.7.8 1 1\r\n").ok());
    CHECK_FALSE(parse_proxy_header("PROXY TCP4 2001:db8::1 5.6.7.8 1 1\r\n").ok());
    CHECK_FALSE(parse_proxy_header("PROXY UDP4 1.2.3.4 5.6.7.8 1 1\r\n").ok());
    CHECK_FALSE(parse_proxy_header("PROXY " + std::string(200, 'x')).ok());
}

TEST_CASE("proxy v2 IPv4, IPv6 and LOCAL") {
    std::string v4addr = {char(198), 51, 100, 9, 10, 0, 0, 1, char(0xc8), 0x01, 0x01, char(0xbb)};
    auto v4 = parse_proxy_header(v2_header(0x21, 0x11, v4addr) + "rest");
    REQUIRE(v4.ok());
    CHECK(v4->state == ProxyParseState::kDone);
    CHECK(v4->header.source->to_string() == "198.51.100.9");
    CHECK(v4->header.source_port == 0xc801);
    CHECK(v4->header.consumed == 28);

    std::string v6addr(36, '\0');
    v6addr[0] = 0x20;
    v6addr[1] = 0x01;
    v6addr[15] = 5;
    auto v6 = parse_proxy_header(v2_header(0x21, 0x21, v6addr));
    REQUIRE(v6.ok());
    CHECK(v6->header.source->to_string() == "2001::5");

    auto local = parse_proxy_header(v2_header(0x20, 0x00, ""));
    REQUIRE(local.ok());
    CHECK(local->header.local);

    CHECK(parse_proxy_header(v2_header(0x21, 0x11, v4addr).substr(0, 20))->state ==
          ProxyParseState::kNeedMore);
    CHECK_FALSE(parse_proxy_header(v2_header(0x31, 0x11, v4addr)).ok());   // version 3
    CHECK_FALSE(parse_proxy_header(v2_header(0x21, 0x11, "short")).ok());  // short block
    std::string huge = v2_header(0x21, 0x11, std::string(5000, 'a'));
    CHECK_FALSE(parse_proxy_header(huge).ok());
}

TEST_CASE("a TLS ClientHello is not a proxy header") {
    auto out = parse_proxy_header("\x16\x03\x01\x02\x00");
    REQUIRE(out.ok());
    CHECK(out->state == ProxyParseState::kNotProxy);
}

TEST_CASE("CIDR sets match IPv4, mapped IPv4 and IPv6") {
    auto set = CidrSet::parse({"10.0.0.0/8", "192.0.2.7", "2001:db8::/32"});
    REQUIRE(set.ok());
    CHECK(set->contains(*IpAddress::parse("10.1.2.3")));
    CHECK(set->contains(*IpAddress::parse("::ffff:10.9.9.9")));
    CHECK(set->contains(*IpAddress::parse("192.0.2.7")));
    CHECK_FALSE(set->contains(*IpAddress::parse("192.0.2.8")));
    // A NUL inside would end what inet_pton reads: refused, not read as 1.2.3.4.
    CHECK_FALSE(IpAddress::parse(std::string_view("1.2.3.4\0zz", 10)).ok());
    CHECK(set->contains(*IpAddress::parse("2001:db8:1::1")));
    CHECK_FALSE(set->contains(*IpAddress::parse("2001:db9::1")));
    CHECK_FALSE(CidrSet::parse({"10.0.0.0/33"}).ok());
    CHECK_FALSE(CidrSet::parse({"nonsense"}).ok());
}
