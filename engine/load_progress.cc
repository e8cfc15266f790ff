#include "engine/load_progress.h"

#include <atomic>

namespace edge::engine {
namespace {

std::atomic<int64_t> g_bytes_read{0};
std::atomic<int64_t> g_matrices{0};

}  // namespace

void note_weight_bytes_read(int64_t bytes) {
    g_bytes_read.fetch_add(bytes, std::memory_order_relaxed);
}

void note_matrix_loading() { g_matrices.fetch_add(1, std::memory_order_relaxed); }

LoadProgress load_progress() {
    return {g_bytes_read.load(std::memory_order_relaxed),
            g_matrices.load(std::memory_order_relaxed)};
}

}  // namespace edge::engine
