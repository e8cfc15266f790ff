#pragma once

// JSON text with numbers as Python writes them. Boost.JSON's serializer writes 0.5 as "5E-1"
// and 1.0 as "1E0": valid, but not what an OpenAI or vLLM client sees, and a tool call's
// arguments would come back spelled differently from what the model wrote. Pure.

#include <boost/json/value.hpp>
#include <string>

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

}  // namespace edge
