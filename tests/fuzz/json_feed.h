#pragma once

// The JSON fuzz targets' common walk: feeds a JsonPrefix `rest` in pieces of `piece` bytes (as a
// tokenizer's tokens would split a reply), skipping the pieces it refuses; aborts when accepts()
// and feed() disagree or a refused piece changed the prefix. Returns the bytes accepted.

#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>

#include "engine/sampling/json_prefix.h"

namespace edge::fuzz {

inline std::string feed_in_pieces(engine::sampling::JsonPrefix& prefix, std::string_view rest,
                                  size_t piece) {
    std::string accepted;
    while (!rest.empty()) {
        const std::string_view bytes = rest.substr(0, piece);
        rest.remove_prefix(bytes.size());
        const bool would = prefix.accepts(bytes);
        const engine::sampling::JsonPrefix before = prefix;
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
    return accepted;
}

}  // namespace edge::fuzz
