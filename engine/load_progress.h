#pragma once

// A process-wide count of the weight matrices the engine has taken in while loading models
// (viewed in place, quantized or copied), so that whoever waits for a load can tell a slow one
// from a stuck one: the daemon keeps extending systemd's start timeout while it moves
// (daemon/load_heartbeat.h). Only ever grows. Thread-safe.

#include <cstdint>

namespace edge::engine {

// One more matrix is being taken in.
void note_matrix_loading();
// Matrices noted so far in this process.
int64_t matrices_loading_noted();

}  // namespace edge::engine
