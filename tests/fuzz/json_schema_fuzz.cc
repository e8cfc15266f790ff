// libFuzzer: JsonSchema::compile on untrusted schema documents (response_format json_schema),
// then JsonPrefix walking under what compiled. The input is a schema's JSON text, a NUL byte,
// then bytes fed in pieces (the byte after the NUL sets their length). Compilation must end with
// a schema or an error, never a crash or a hang; accepts() and feed() must agree; a refused piece
// must leave the prefix as it was; and what the prefix calls complete must parse (Boost.JSON) as
// an object. (Validity under the schema is checked by the unit tests' walks.)
#include <boost/json.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>

#include "common/json_text.h"
#include "engine/sampling/json_prefix.h"
#include "engine/sampling/json_schema.h"
#include "tests/fuzz/json_feed.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    const size_t nul = input.find('\0');
    std::error_code ec;
    const boost::json::value schema = edge::parse_json(input.substr(0, nul), ec);
    if (ec) {
        return 0;
    }
    auto compiled = edge::engine::sampling::JsonSchema::compile(schema);
    if (!compiled.ok() || nul == std::string_view::npos || nul + 1 >= input.size()) {
        return 0;
    }
    std::string_view rest = input.substr(nul + 2);
    const size_t piece = 1 + static_cast<unsigned char>(input[nul + 1]) % 8;
    edge::engine::sampling::JsonPrefix prefix(**compiled);
    const std::string accepted = edge::fuzz::feed_in_pieces(prefix, rest, piece);
    if (prefix.complete()) {
        boost::json::value v = boost::json::parse(accepted, ec);
        if (ec || !v.is_object()) {
            std::abort();  // Complete by JsonPrefix, not an object by Boost.JSON.
        }
    }
    return 0;
}
