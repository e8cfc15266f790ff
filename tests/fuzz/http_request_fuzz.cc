// libFuzzer: the bytes a client sends first: an optional PROXY header, then an HTTP request.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tls/http_request_parser.h"
#include "tls/proxy_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string_view bytes(reinterpret_cast<const char*>(data), size);
    auto proxy = edge::tls::parse_proxy_header(bytes);
    if (proxy.ok() && proxy->state == edge::tls::ProxyParseState::kDone) {
        bytes.remove_prefix(proxy->header.consumed);
    }
    edge::tls::HttpLimits limits;
    limits.max_header_bytes = 8192;
    limits.max_body_bytes = 65536;
    auto request = edge::tls::parse_http_request(bytes, limits);
    if (request.ok()) {
        (void)request->header("authorization");
        (void)request->path();
    }
    return 0;
}
