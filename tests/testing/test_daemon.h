#pragma once

// An in-process Daemon from a test config (see daemon_yaml.h): parses it, creates the Daemon on
// the given generator and clock, and fails the test (REQUIRE) naming the error when either step
// fails. Header-only, so that only suites linking edge_daemon include it. Call from the test's
// thread.

#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "common/clock.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "engine/generator.h"

namespace edge::testing {

// Not started: the caller may set a route planner or health probe first, then start() it.
inline std::unique_ptr<daemon::Daemon> make_daemon(const std::string& yaml,
                                                   const std::string& path,
                                                   engine::Generator& generator, Clock& clock) {
    auto config = daemon::parse_config(yaml, path);
    REQUIRE_MESSAGE(config.ok(), config.status().to_string());
    auto d = daemon::Daemon::create(*config, generator, clock);
    REQUIRE_MESSAGE(d.ok(), d.status().to_string());
    return std::move(d).value();
}

}  // namespace edge::testing
