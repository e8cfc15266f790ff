#pragma once

// JSON text with numbers as Python writes them. Boost.JSON's serializer writes 0.5 as "5E-1"
// and 1.0 as "1E0": valid, but not what an OpenAI or vLLM client sees, and a tool call's
// arguments would come back spelled differently from what the model wrote. And JSON read back:
// the one depth that JSON from a client or from the model may nest to, and where a text that is
// not JSON goes wrong, for error messages. Pure.

#include <boost/json/parse_options.hpp>
#include <boost/json/value.hpp>
#include <cstddef>
#include <string>
#include <string_view>
#include <system_error>

#include "common/result.h"

namespace edge {

enum class JsonStyle {
    kCompact,  // "," and ":" with no spaces; NaN and infinities become null. The wire format.
    kPython,   // json.dumps' defaults: ", " and ": ", NaN and Infinity spelled as Python does.
};

// A double as Python's repr writes it: the shortest digits that read back, positional with
// ".0" for whole numbers while the decimal exponent is in -4..15 ("0.5", "1.0", "0.0001",
// "1000000000000000.0"), else "1e+16", "1.5e-07". NaN and infinities as Python spells them.
void append_python_float(double d, std::string* out);

// v as JSON text: members in insertion order, strings with '"', '\\' and control characters
// escaped and other characters kept as they are (ensure_ascii=False).
void append_json(const boost::json::value& v, JsonStyle style, std::string* out);

// Compact JSON text of v, for HTTP bodies, server-sent events and log lines.
std::string json_text(const boost::json::value& v);

// How many arrays and objects JSON may nest: the request parser, the response formats' grammar
// (JsonPrefix) and every later reading of such text (a tool call's arguments sent back in a
// message, a GLM-4.5 argument value, a tool's parameter schema) allow the same depth, so what
// one accepts the others read. (Boost.JSON's own default is 32.)
inline constexpr size_t kMaxJsonDepth = 64;

// Boost.JSON's options with that depth, for a parser the caller drives.
boost::json::parse_options json_parse_options();

// text parsed with `max_depth` levels allowed (kMaxJsonDepth unless the text will be nested in a
// container); ec says why not, and `why` (when given) says it for an error message, with where:
// "line 3, column 14: syntax error" (columns count bytes from 1).
boost::json::value parse_json(std::string_view text, std::error_code& ec,
                              std::string* why = nullptr, size_t max_depth = kMaxJsonDepth);

// text as a JSON object (parse_json's depth), for a file or field named `what`: otherwise a
// Status of `code` saying "<what>: not valid JSON at line L, column C: <reason>" or "<what>: not
// a JSON object" (no "<what>: " when `what` is empty, for a caller that adds its own context).
Result<boost::json::object> parse_json_object(std::string_view text, std::string_view what,
                                              StatusCode code = StatusCode::kInvalidArgument);

}  // namespace edge
