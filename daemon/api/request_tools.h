#pragma once

// Parsers of a chat request's tool fields (`tools`, `tool_choice`, the history's assistant
// `tool_calls`) and of `response_format`, whose JSON Schema is compiled here. Pure functions over
// the parsed body; thread-safe.

#include <boost/json.hpp>
#include <memory>
#include <string>
#include <vector>

#include "daemon/api/openai_request.h"
#include "daemon/api/request_validator.h"
#include "engine/generator.h"
#include "engine/sampling/json_schema.h"

namespace edge::daemon::api {

// An assistant message's `tool_calls` (the calls it made earlier in the conversation).
bool parse_history_tool_calls(Validator& v, const boost::json::value& value,
                              const std::string& where, std::vector<engine::ChatToolCall>& out);

// `tools`: function tools, each with a valid, unique name and an object of parameters.
bool parse_tools(Validator& v, const boost::json::value& value, std::vector<engine::ToolSpec>& out);

// `tool_choice`: "none", "auto", "required" or {"type": "function", "function": {"name": N}}.
bool parse_tool_choice(Validator& v, const boost::json::value& value, ParsedRequest& out,
                       bool& given);

// response_format: {"type": "text"}, {"type": "json_object"} (any object), or
// {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}, whose
// schema is compiled here (engine/sampling/json_schema.h says which keywords it holds a reply to;
// it always does, `strict` or not). `schema` is left null for text.
bool parse_response_format(Validator& v, const boost::json::value& value,
                           std::shared_ptr<const engine::sampling::JsonSchema>* schema);

}  // namespace edge::daemon::api
