#pragma once

// TwinStepRunner runs the serving steps of DeviceDecoder (engine/cuda/device_decoder.cu,
// enqueue_step without feed-back) on the CPU, op by op with the kernels' CPU twins
// (host/cpu_twins.h) over a host copy of the device buffers: the same staging buffer, the same
// paged KV pool layout with its scratch block, the same padded rows. With it the CPU tests run
// the whole serving path (host/serving_model.h) against the CPU model, everything but the CUDA
// kernels themselves (which the gpu tests compare with these twins). Slow (the twins favour
// clarity): for the fixture checkpoints only.
//
// Threading: one driving thread.

#include <memory>

#include "common/result.h"
#include "engine/cuda/host/checkpoint_model.h"
#include "engine/cuda/host/serving_model.h"

namespace edge::engine::cuda {

// A runner over `model` (kept alive by the runner) with `options`.
Result<std::unique_ptr<StepRunner>> create_twin_step_runner(const CheckpointModel& model,
                                                            const ServingDecoderOptions& options);

}  // namespace edge::engine::cuda
