#pragma once

// parse_http_request() parses one complete HTTP/1.1 request (head and body) from bytes with the
// same parser and limits the server uses on connections, for the fuzzer and tests. A pure function;
// thread-safe.

#include <string_view>

#include "common/result.h"
#include "tls/http_server.h"
#include "tls/http_types.h"

namespace edge::tls {

// kInvalidArgument for malformed input, kResourceExhausted for a header or body over the limits,
// kOutOfRange when the bytes end before the request does.
Result<HttpRequest> parse_http_request(std::string_view bytes, const HttpLimits& limits);

}  // namespace edge::tls
