#pragma once

// The micro-qwen3-moe fixture's tokenizer, loaded once per test binary, for scheduler tests that
// need real text decoding around a FakeCausalLM.

#include <doctest/doctest.h>

#include "engine/tokenizer/tokenizer.h"

namespace edge::engine::testing {

inline const tokenizer::Tokenizer& micro_tokenizer() {
    static const auto tok = [] {
        auto t = tokenizer::Tokenizer::load_file(EDGE_SOURCE_DIR
                                                 "/tests/fixtures/micro-qwen3-moe/tokenizer.json");
        REQUIRE(t.ok());
        return std::move(t).value();
    }();
    return *tok;
}

}  // namespace edge::engine::testing
