#pragma once

// The parser of a chat request's `messages` (roles, text content parts, the history's tool calls
// and reasoning). Pure function over the parsed body; thread-safe.

#include <boost/json.hpp>
#include <vector>

#include "daemon/api/request_validator.h"
#include "engine/generator.h"

namespace edge::daemon::api {

// `messages`: the conversation, each message checked for its role's fields.
bool parse_messages(Validator& v, const boost::json::value& value,
                    std::vector<engine::ChatMessage>& out);

}  // namespace edge::daemon::api
