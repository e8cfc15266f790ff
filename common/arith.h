#pragma once

// Small integer arithmetic shared by the engine's block and tile counts.

#include <cstdint>

namespace edge {

// a / b rounded up, for a >= 0 and b > 0.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace edge
