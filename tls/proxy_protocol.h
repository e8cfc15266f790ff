#pragma once

// Parser for the PROXY protocol header (HAProxy spec, versions 1 and 2) that a load balancer puts
// in front of the TLS bytes to tell us the real client address. A pure function over the bytes
// received so far; the caller reads more and calls again while it answers kNeedMore. The header is
// bounded (kMaxProxyHeaderBytes); anything malformed or longer is an error. Thread-safe (no state).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "common/result.h"
#include "tls/cidr.h"

namespace edge::tls {

// Upper bound on a header we accept (v1 is at most 107 bytes; v2 TLVs are rarely beyond 200).
inline constexpr size_t kMaxProxyHeaderBytes = 4096;

struct ProxyHeader {
    int version = 0;                  // 1 or 2.
    bool local = false;               // v2 LOCAL or v1 UNKNOWN: keep the socket's peer address.
    std::optional<IpAddress> source;  // The real client address, when not local.
    uint16_t source_port = 0;
    size_t consumed = 0;              // Bytes of the header; what follows is the TLS stream.
};

enum class ProxyParseState {
    kNeedMore,  // The bytes so far are a prefix of a header; read more.
    kNotProxy,  // The bytes do not start a PROXY header.
    kDone,      // `header` is complete.
};

struct ProxyParseOutcome {
    ProxyParseState state = ProxyParseState::kNeedMore;
    ProxyHeader header;
};

// Errors are kInvalidArgument naming what is wrong.
Result<ProxyParseOutcome> parse_proxy_header(std::string_view bytes);

}  // namespace edge::tls
