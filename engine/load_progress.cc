#include "engine/load_progress.h"

#include <atomic>

namespace edge::engine {
namespace {

std::atomic<int64_t> g_matrices{0};

}  // namespace

void note_matrix_loading() { g_matrices.fetch_add(1, std::memory_order_relaxed); }

int64_t matrices_loading_noted() { return g_matrices.load(std::memory_order_relaxed); }

}  // namespace edge::engine
