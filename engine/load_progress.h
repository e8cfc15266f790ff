#pragma once

// How far the engine's model loading has come, in this process: bytes of weights read from disk
// and weight matrices taken in (viewed in place, quantized or copied). Whoever waits for a load
// can then tell a slow one from a stuck one: the daemon keeps extending systemd's start timeout
// while these move (daemon/load_heartbeat.h). Process-wide counters that only grow, like a
// metric's: the loaders add to them wherever they run, and nothing reads them to decide what
// to load. Thread-safe.

#include <cstdint>

namespace edge::engine {

struct LoadProgress {
    int64_t bytes_read = 0;  // Weights read into memory (checkpoint files populated).
    int64_t matrices = 0;    // Weight matrices taken in.

    bool operator==(const LoadProgress&) const = default;
};

void note_weight_bytes_read(int64_t bytes);
void note_matrix_loading();
LoadProgress load_progress();

}  // namespace edge::engine
