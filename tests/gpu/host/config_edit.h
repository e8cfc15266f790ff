#pragma once

// Test-only edits of a fixture's config.json text for the checkpoint-model tests: every
// `"field": value` replaced (the value runs to the next comma or line end), and the edited
// config read by read_checkpoint_model next to no weights, for its error. Plain string search,
// no regex. Header-only; call from the test's thread.

#include <doctest/doctest.h>

#include <string>

#include "common/status.h"
#include "engine/cuda/host/checkpoint_model.h"
#include "tests/testing/test_certs.h"

namespace edge::engine::cuda {

// `json` with the value of every `"field": ...` replaced by `value`; fails the test when the
// field is absent.
inline std::string config_with_field(const std::string& json, const std::string& field,
                              const std::string& value) {
    const std::string key = "\"" + field + "\": ";
    std::string out;
    size_t from = 0;
    for (size_t at = json.find(key); at != std::string::npos; at = json.find(key, from)) {
        const size_t start = at + key.size();
        const size_t end = json.find_first_of(",\n", start);
        out += json.substr(from, start - from) + value;
        from = end == std::string::npos ? json.size() : end;
    }
    REQUIRE_MESSAGE(from != 0, ("config has no field " + field));
    return out + json.substr(from);
}

// `config` with `field`'s value replaced, alone in `dir`, read as a checkpoint model.
inline Status read_config_with(const edge::testing::TempDir& dir, const std::string& config,
                               const std::string& field, const std::string& value) {
    dir.write("config.json", config_with_field(config, field, value));
    return read_checkpoint_model(dir.path(), "none").status();
}

}  // namespace edge::engine::cuda
