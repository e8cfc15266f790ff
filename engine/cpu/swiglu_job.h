#pragma once

// SwiGluJob: one token through one SwiGLU MLP (an expert), for Backend::swiglu_single:
//   gate = W_gate x, up = W_up x, act = silu(gate) * up, out = W_down act.
// A plain view; the weights and buffers are the caller's and must outlive the call. gate, up and
// act hold W_gate.rows floats each, out W_down.rows floats; x holds W_gate.cols floats.

#include "engine/cpu/weight.h"

namespace edge::engine {

struct SwiGluJob {
    const Weight* gate = nullptr;
    const Weight* up = nullptr;
    const Weight* down = nullptr;
    const float* x = nullptr;
    float* gate_out = nullptr;
    float* up_out = nullptr;
    float* act = nullptr;
    float* out = nullptr;
};

}  // namespace edge::engine
