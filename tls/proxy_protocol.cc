#include "tls/proxy_protocol.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <string>
#include <vector>

namespace edge::tls {
namespace {

constexpr std::string_view kV1Prefix = "PROXY ";
constexpr size_t kV1MaxBytes = 107;
constexpr char kV2SigBytes[12] = {'\r', '\n', '\r', '\n', '\0', '\r',
                                  '\n', 'Q',  'U',  'I',  'T',  '\n'};
constexpr std::string_view kV2Signature(kV2SigBytes, 12);

bool is_prefix_of(std::string_view bytes, std::string_view signature) {
    size_t n = std::min(bytes.size(), signature.size());
    return bytes.substr(0, n) == signature.substr(0, n);
}

std::vector<std::string_view> split_spaces(std::string_view line) {
    std::vector<std::string_view> parts;
    size_t start = 0;
    while (start <= line.size()) {
        size_t sp = line.find(' ', start);
        if (sp == std::string_view::npos) {
            parts.push_back(line.substr(start));
            break;
        }
        parts.push_back(line.substr(start, sp - start));
        start = sp + 1;
    }
    return parts;
}

Result<uint16_t> parse_port(std::string_view text) {
    uint32_t port = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
    if (ec != std::errc() || end != text.data() + text.size() || port > 65535 || text.empty() ||
        (text.size() > 1 && text[0] == '0')) {
        return invalid_argument_error("PROXY v1: bad port '" + std::string(text) + "'");
    }
    return static_cast<uint16_t>(port);
}

Result<ProxyParseOutcome> parse_v1(std::string_view bytes) {
    size_t crlf = bytes.find("\r\n");
    if (crlf == std::string_view::npos) {
        if (bytes.size() >= kV1MaxBytes) {
            return invalid_argument_error("PROXY v1: no CRLF within 107 bytes");
        }
        return ProxyParseOutcome{ProxyParseState::kNeedMore, {}};
    }
    if (crlf + 2 > kV1MaxBytes) {
        return invalid_argument_error("PROXY v1: header longer than 107 bytes");
    }
    std::string_view line = bytes.substr(kV1Prefix.size(), crlf - kV1Prefix.size());
    ProxyParseOutcome out{ProxyParseState::kDone, {}};
    out.header.version = 1;
    out.header.consumed = crlf + 2;
    std::vector<std::string_view> parts = split_spaces(line);
    if (parts.empty()) {
        return invalid_argument_error("PROXY v1: empty header");
    }
    if (parts[0] == "UNKNOWN") {
        out.header.local = true;
        return out;
    }
    if (parts[0] != "TCP4" && parts[0] != "TCP6") {
        return invalid_argument_error("PROXY v1: unknown protocol '" + std::string(parts[0]) +
                                      "'");
    }
    if (parts.size() != 5) {
        return invalid_argument_error("PROXY v1: expected 'TCPx SRC DST SPORT DPORT'");
    }
    EDGE_ASSIGN_OR_RETURN(IpAddress src, IpAddress::parse(parts[1]));
    EDGE_ASSIGN_OR_RETURN(IpAddress dst, IpAddress::parse(parts[2]));
    // The family as written: an IPv4-mapped IPv6 address ("::ffff:192.0.2.1", which a
    // dual-stack balancer sends for IPv4 clients on an IPv6 socket) parses as IPv4 but is TCP6,
    // and stands for that IPv4 client, as in v2.
    const bool want_v4 = parts[0] == "TCP4";
    auto written_v4 = [](std::string_view text) {
        return text.find(':') == std::string_view::npos;
    };
    if (written_v4(parts[1]) != want_v4 || written_v4(parts[2]) != want_v4) {
        return invalid_argument_error("PROXY v1: address family does not match " +
                                      std::string(parts[0]));
    }
    EDGE_ASSIGN_OR_RETURN(out.header.source_port, parse_port(parts[3]));
    EDGE_ASSIGN_OR_RETURN(uint16_t dst_port, parse_port(parts[4]));
    (void)dst_port;
    out.header.source = src;
    return out;
}

Result<ProxyParseOutcome> parse_v2(std::string_view bytes) {
    constexpr size_t kFixed = 16;
    if (bytes.size() < kFixed) {
        return ProxyParseOutcome{ProxyParseState::kNeedMore, {}};
    }
    auto byte = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
    uint8_t ver_cmd = byte(12);
    uint8_t fam = byte(13);
    size_t len = (static_cast<size_t>(byte(14)) << 8) | byte(15);
    if ((ver_cmd >> 4) != 2) {
        return invalid_argument_error("PROXY v2: version nibble is not 2");
    }
    uint8_t cmd = ver_cmd & 0x0f;
    if (cmd > 1) {
        return invalid_argument_error("PROXY v2: unknown command " + std::to_string(cmd));
    }
    if (kFixed + len > kMaxProxyHeaderBytes) {
        return invalid_argument_error("PROXY v2: header of " + std::to_string(kFixed + len) +
                                      " bytes exceeds the limit of " +
                                      std::to_string(kMaxProxyHeaderBytes));
    }
    if (bytes.size() < kFixed + len) {
        return ProxyParseOutcome{ProxyParseState::kNeedMore, {}};
    }
    ProxyParseOutcome out{ProxyParseState::kDone, {}};
    out.header.version = 2;
    out.header.consumed = kFixed + len;
    if (cmd == 0) {
        out.header.local = true;
        return out;
    }
    uint8_t family = fam >> 4;
    uint8_t transport = fam & 0x0f;
    if (transport > 2) {
        return invalid_argument_error("PROXY v2: unknown transport " + std::to_string(transport));
    }
    const uint8_t* addr = reinterpret_cast<const uint8_t*>(bytes.data()) + kFixed;
    IpAddress src;
    if (family == 1) {
        if (len < 12) {
            return invalid_argument_error("PROXY v2: IPv4 address block shorter than 12 bytes");
        }
        src.is_v4 = true;
        src.bytes[10] = 0xff;
        src.bytes[11] = 0xff;
        std::memcpy(src.bytes.data() + 12, addr, 4);
        out.header.source_port = static_cast<uint16_t>((addr[8] << 8) | addr[9]);
    } else if (family == 2) {
        if (len < 36) {
            return invalid_argument_error("PROXY v2: IPv6 address block shorter than 36 bytes");
        }
        std::memcpy(src.bytes.data(), addr, 16);
        static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        src.is_v4 = std::memcmp(src.bytes.data(), kMapped, 12) == 0;
        out.header.source_port = static_cast<uint16_t>((addr[32] << 8) | addr[33]);
    } else if (family == 0 || family == 3) {
        // AF_UNSPEC or AF_UNIX: no IP to report; treat like LOCAL.
        out.header.local = true;
        return out;
    } else {
        return invalid_argument_error("PROXY v2: unknown address family " +
                                      std::to_string(family));
    }
    out.header.source = src;
    return out;
}

}  // namespace

Result<ProxyParseOutcome> parse_proxy_header(std::string_view bytes) {
    if (bytes.empty()) {
        return ProxyParseOutcome{ProxyParseState::kNeedMore, {}};
    }
    bool maybe_v1 = is_prefix_of(bytes, kV1Prefix);
    bool maybe_v2 = is_prefix_of(bytes, kV2Signature);
    if (!maybe_v1 && !maybe_v2) {
        return ProxyParseOutcome{ProxyParseState::kNotProxy, {}};
    }
    if (maybe_v1) {
        if (bytes.size() < kV1Prefix.size()) {
            return ProxyParseOutcome{ProxyParseState::kNeedMore, {}};
        }
        return parse_v1(bytes);
    }
    if (bytes.size() < kV2Signature.size()) {
        return ProxyParseOutcome{ProxyParseState::kNeedMore, {}};
    }
    return parse_v2(bytes);
}

}  // namespace edge::tls
