#pragma once

// The parser of a completion request's `prompt`: a string, token ids, or a list of prompts
// (OpenAI's batch). Pure function over the parsed body; thread-safe.

#include <boost/json.hpp>

#include "daemon/api/openai_request.h"
#include "daemon/api/request_validator.h"

namespace edge::daemon::api {

// A string, token ids, or a list of prompts (OpenAI's batch: strings, or arrays of token ids,
// not both): the first goes to generate.prompt, the others to more_prompts.
bool parse_prompt(Validator& v, const boost::json::value& value, ParsedRequest& out);

}  // namespace edge::daemon::api
