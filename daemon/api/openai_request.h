#pragma once

// Parsing and validation of OpenAI request bodies (POST /v1/chat/completions and
// /v1/completions) into an engine::GenerateRequest plus the response options (stream, usage).
// Every field of the public schema is recognised: supported ones are type- and range-checked,
// unsupported features (tools, images, n > 1, logit_bias, ...) are refused with a 400 naming the
// field, unknown fields are refused too. Pure functions over untrusted bytes; thread-safe.

#include <string_view>
#include <variant>

#include "daemon/api/api_error.h"
#include "engine/generator.h"

namespace edge::daemon::api {

enum class Endpoint { kChatCompletions, kCompletions };

struct ParsedRequest {
    Endpoint endpoint = Endpoint::kChatCompletions;
    engine::GenerateRequest generate;  // request_id and tenant are left for the caller.
    bool stream = false;               // Answer as server-sent events.
    bool include_usage = false;        // stream_options.include_usage: a final usage chunk.
    bool max_tokens_given = false;     // The client set max_tokens (else the default applies).
};

std::variant<ParsedRequest, ApiError> parse_openai_request(Endpoint endpoint,
                                                           std::string_view body);

}  // namespace edge::daemon::api
