#pragma once

// The check most CPU-twin tests end with: the checkpoint in `dir` loaded by the CPU model and by
// the device serving path on the CPU twin (create_twin_step_runner) gives the same logits and
// tokens through the serving script (serving_script.h), within `tol`.

#include <doctest/doctest.h>

#include <string>

#include "engine/cuda/host/serving_model.h"
#include "engine/cuda/host/twin_step_runner.h"
#include "tests/gpu/host/serving_script.h"

namespace edge::engine::cuda::testing {

inline void check_twin_equals_cpu(const std::string& dir, double tol = 1e-3) {
    auto cpu = load_model(dir, serving_script_options("cpu"));
    REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
    auto twin = load_serving_causal_lm(dir, serving_script_options("cuda"),
                                       create_twin_step_runner);
    REQUIRE_MESSAGE(twin.ok(), twin.status().to_string());
    run_serving_script(**cpu, **twin, tol);
}

}  // namespace edge::engine::cuda::testing
