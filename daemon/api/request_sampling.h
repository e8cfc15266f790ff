#pragma once

// Parsers of the sampling fields that are more than one number: `stop` and `logit_bias`. Pure
// functions over the parsed body; thread-safe.

#include <boost/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "daemon/api/request_validator.h"
#include "engine/generator.h"

namespace edge::daemon::api {

// `stop`: a string or up to 4 non-empty strings (each within the engine's bound).
bool parse_stop(Validator& v, const boost::json::value& value, std::vector<std::string>& out);

// OpenAI's logit_bias: {"<token id>": bias in [-100, 100], ...}; null or {} is none.
bool parse_logit_bias(Validator& v, const boost::json::value& value,
                      std::vector<std::pair<engine::TokenId, float>>& out);

}  // namespace edge::daemon::api
