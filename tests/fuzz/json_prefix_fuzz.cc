// libFuzzer: JsonPrefix (the json_object response format's grammar) against Boost.JSON. The
// input is fed in pieces (the first byte sets their length, as a tokenizer's tokens would split
// it); pieces it refuses are skipped. Whatever it accepted and calls complete must be a JSON
// object by Boost.JSON's reading, and a refused piece must leave the prefix as it was. The first
// byte's high bit gives the prefix heads and a tail (a forced tool call's start and end): then
// what is complete is a head, an object, the tail.
#include <algorithm>
#include <boost/json.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling/json_prefix.h"
#include "tests/fuzz/json_feed.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) {
        return 0;
    }
    using edge::engine::sampling::JsonHead;
    using edge::engine::sampling::JsonPrefix;
    using edge::engine::sampling::JsonSchema;
    const size_t piece = 1 + data[0] % 8;
    const bool framed = (data[0] & 0x80) != 0;
    static const std::vector<JsonHead> heads = {{"<a>", JsonSchema::any_object()},
                                                {"<ab>", JsonSchema::any_object()},
                                                {"{\"b\": ", JsonSchema::any_object()}};
    static const std::string tail = "}\n</end>";
    std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    JsonPrefix prefix = framed ? JsonPrefix(heads, tail) : JsonPrefix();
    const std::string accepted = edge::fuzz::feed_in_pieces(prefix, rest, piece);
    if (prefix.complete()) {
        std::string_view document = accepted;
        if (framed) {
            const auto head = std::find_if(heads.begin(), heads.end(), [&](const JsonHead& h) {
                return document.starts_with(h.text);
            });
            if (head == heads.end() || !document.ends_with(tail)) {
                std::abort();  // Complete without its head or tail.
            }
            document = document.substr(head->text.size(),
                                       document.size() - head->text.size() - tail.size());
        }
        boost::system::error_code ec;
        boost::json::value v = boost::json::parse(document, ec);
        if (ec || !v.is_object()) {
            std::abort();  // Complete by JsonPrefix, not an object by Boost.JSON.
        }
    }
    return 0;
}
