#pragma once

// The CausalLM that serves a model with a whole-step forward on a StepRunner: the device
// (engine/cuda/device_causal_lm.h: DeviceDecoder in serving mode) or its CPU twin
// (host/twin_step_runner.h, which runs the same steps with the kernels' CPU twins, so the CPU
// tests exercise this orchestration end to end). Plain C++ without CUDA.
//
// forward(): the host KvCache (PagedCausalLM) checks the batch and reserves its blocks; blocks it
// copied on write are copied by the runner too; the chunks become device steps
// (plan_device_steps: rows per bucket, padded rows on the scratch block); each step runs, the
// LM head only on the rows whose logits the batch asks for (gathered into compact rows), and
// those logits are copied back for the engine's sampler; the lengths are committed last, so a
// failed step changes no length.
//
// Threading: as CausalLM (one driving thread).

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "common/result.h"
#include "engine/cuda/host/checkpoint_model.h"
#include "engine/cuda/host/serving_plan.h"
#include "engine/model/causal_lm.h"
#include "engine/model/loader.h"

namespace edge::engine::cuda {

// One device (or twin) of the serving steps. Threading: one driving thread.
class StepRunner {
  public:
    virtual ~StepRunner() = default;
    // Copies each move's KV block (every layer, keys and values) from `from` to `to`.
    virtual Status copy_kv_blocks(std::span<const BlockMove> moves) = 0;
    // Runs `bucket` rows of the staging prefix `staging` (StepLayout of the runner's options)
    // and the final norm and LM head on `logit_bucket` rows gathered by the staging's logit rows
    // (0: none); the logits stay for copy_logits().
    virtual Status run_rows(int32_t bucket, int32_t logit_bucket,
                            std::span<const int32_t> staging) = 0;
    // Copies the logits of `runs` (compact logits rows of the last run_rows) to `out` at each
    // run's out_row (vocab floats per row).
    virtual Status copy_logits(std::span<const RowRun> runs, float* out) = 0;
};

// Builds the runner of a model read for serving with these options.
using StepRunnerFactory = std::function<Result<std::unique_ptr<StepRunner>>(
    const CheckpointModel& model, const ServingDecoderOptions& options)>;

// The model in `dir` served with runners from `factory`. kUnimplemented naming why for a model or
// configuration the whole-step forward does not run (device_serving_refusal,
// read_checkpoint_model); other errors as load_model's or the factory's.
Result<std::unique_ptr<CausalLM>> load_serving_causal_lm(const std::string& dir,
                                                         const LoadOptions& options,
                                                         const StepRunnerFactory& factory);

}  // namespace edge::engine::cuda
