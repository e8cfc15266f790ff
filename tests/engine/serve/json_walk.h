#pragma once

// random_walk(): a random walk through a JsonPrefix, the check that what it takes can always be
// completed (a dead end fails the test), shared by the tests of JsonSchema and StringFormat.

#include <doctest/doctest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/sampling/json_prefix.h"

namespace edge::engine::sampling {

// A random walk through `p`: each step a byte it takes (a closing one half the time, so that
// documents end), or, half the time one may come, one of `markers`. The text once complete;
// nullopt past 3000 bytes. A dead end fails the test.
inline std::optional<std::string> random_walk(JsonPrefix p, std::mt19937& rng,
                                              const std::vector<std::string>& markers = {}) {
    std::string out;
    while (!p.complete() && out.size() < 3000) {
        std::vector<std::string> next;
        for (const std::string& m : markers) {
            if (p.accepts(m)) {
                next.push_back(m);
            }
        }
        std::vector<std::string> closing;
        std::vector<std::string> any;
        for (int c = 0; c < 256; ++c) {
            const std::string b(1, static_cast<char>(c));
            if (p.accepts(b)) {
                any.push_back(b);
                if (c == '"' || c == '}' || c == ']' || c == ',') {
                    closing.push_back(b);
                }
            }
        }
        REQUIRE_MESSAGE(!any.empty(), "a dead end after " << out);
        const std::vector<std::string>& from = !next.empty() && rng() % 2 == 0      ? next
                                               : !closing.empty() && rng() % 2 == 0 ? closing
                                                                                    : any;
        const std::string& piece = from[rng() % from.size()];
        REQUIRE(p.feed(piece));
        out += piece;
    }
    if (!p.complete()) {
        return std::nullopt;
    }
    return out;
}

}  // namespace edge::engine::sampling
