#pragma once

// ApiError is an OpenAI-style error answer: HTTP status plus the JSON body
// {"error": {"message", "type", "param", "code"}}, and the mapping from our Status codes to it.
// Plain value.

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "tls/http_types.h"

namespace edge::daemon::api {

struct ApiError {
    int status = 400;
    std::string message;
    std::string type = "invalid_request_error";
    std::optional<std::string> param;  // The offending request field, e.g. "messages[0].role".
    std::optional<std::string> code;   // e.g. "model_not_found", "invalid_api_key".
    int retry_after_seconds = 0;       // Sent as Retry-After when > 0 (429, 503).
    std::string www_authenticate;      // Sent as WWW-Authenticate when set (401).

    std::string to_json() const;
    tls::HttpResponse to_response() const;
};

// On the peer listener's refusals of the forwarding site itself (a certificate that does not
// name it, a request that is not a forward), the refusal's code. The forwarding site takes such
// an answer as a failure to connect to that peer (the next target, or itself, runs the request),
// never as the answer to relay: the client did nothing wrong.
inline constexpr std::string_view kPeerRefusalHeader = "X-Edgeserve-Peer-Refusal";

ApiError invalid_request(std::string message, std::optional<std::string> param);
ApiError model_not_found(const std::string& model);

// Generator::submit() errors: kNotFound -> 404 model_not_found, kInvalidArgument -> 400 (with
// `param` when the message starts with "param NAME:"), kResourceExhausted -> 429 with Retry-After,
// kUnavailable -> 503, anything else -> 500.
ApiError api_error_from_status(const Status& status, const std::string& model);

}  // namespace edge::daemon::api
