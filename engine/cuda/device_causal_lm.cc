#include "engine/cuda/device_causal_lm.h"

#include "engine/cuda/device_decoder.h"
#include "engine/cuda/host/serving_model.h"

namespace edge::engine::cuda {
namespace {

// The serving steps on the current device: DeviceDecoder in serving mode.
class DeviceStepRunner final : public StepRunner {
  public:
    explicit DeviceStepRunner(std::unique_ptr<DeviceDecoder> decoder)
        : decoder_(std::move(decoder)) {}
    Status copy_kv_blocks(std::span<const BlockMove> moves) override {
        return decoder_->copy_kv_blocks(moves);
    }
    Status run_rows(int32_t bucket, int32_t logit_bucket,
                    std::span<const int32_t> staging) override {
        return decoder_->run_rows(bucket, logit_bucket, staging);
    }
    Status copy_logits(std::span<const RowRun> runs, float* out) override {
        return decoder_->copy_logits(runs, out);
    }

  private:
    std::unique_ptr<DeviceDecoder> decoder_;
};

}  // namespace

Result<std::unique_ptr<CausalLM>> load_device_causal_lm(const std::string& dir,
                                                        const LoadOptions& options) {
    return load_serving_causal_lm(
        dir, options,
        [](const CheckpointModel& model,
           const ServingDecoderOptions& so) -> Result<std::unique_ptr<StepRunner>> {
            DeviceMemoryConfig memory;
            // One arena of what this model needs (weights, KV pool, rows), so several models
            // of one process each take their own.
            memory.arena_bytes =
                serving_arena_bytes(model, so.max_rows, so.max_logit_rows, so.kv_blocks + 1,
                                    so.max_blocks_per_seq, memory.alignment);
            EDGE_ASSIGN_OR_RETURN(std::unique_ptr<DeviceDecoder> decoder,
                                  DeviceDecoder::create_for_serving(model, so, memory));
            return std::unique_ptr<StepRunner>(
                std::make_unique<DeviceStepRunner>(std::move(decoder)));
        });
}

}  // namespace edge::engine::cuda
