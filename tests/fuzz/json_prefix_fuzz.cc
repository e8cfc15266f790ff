// libFuzzer: JsonPrefix (the json_object response format's grammar) against Boost.JSON. The
// input is fed in pieces (the first byte sets their length, as a tokenizer's tokens would split
// it); pieces it refuses are skipped. Whatever it accepted and calls complete must be a JSON
// object by Boost.JSON's reading, and a refused piece must leave the prefix as it was.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <boost/json.hpp>

#include "engine/sampling/json_prefix.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) {
        return 0;
    }
    const size_t piece = 1 + data[0] % 8;
    std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    edge::engine::sampling::JsonPrefix prefix;
    std::string accepted;
    while (!rest.empty()) {
        const std::string_view bytes = rest.substr(0, piece);
        rest.remove_prefix(bytes.size());
        const bool would = prefix.accepts(bytes);
        const edge::engine::sampling::JsonPrefix before = prefix;
        if (prefix.feed(bytes) != would) {
            std::abort();  // accepts() and feed() disagree.
        }
        if (!would) {
            if (prefix.complete() != before.complete() || !prefix.accepts("")) {
                std::abort();
            }
            continue;
        }
        accepted.append(bytes);
    }
    if (prefix.complete()) {
        boost::system::error_code ec;
        boost::json::value v = boost::json::parse(accepted, ec);
        if (ec || !v.is_object()) {
            std::abort();  // Complete by JsonPrefix, not an object by Boost.JSON.
        }
    }
    return 0;
}
