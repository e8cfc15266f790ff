#include "engine/cuda/host/serving_model.h"

#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/host/paged_kv_layout.h"
#include "engine/model/paged_causal_lm.h"

namespace edge::engine::cuda {
namespace {

class ServingCausalLM final : public PagedCausalLM {
  public:
    const ModelSpec& spec() const override { return spec_; }

    Status load(const std::string& dir, const LoadOptions& options,
                const StepRunnerFactory& factory) {
        const std::string refusal = device_serving_refusal(
            DeviceServingRequest{options.backend, options.sharding.ranks, options.kv_block_tokens});
        if (!refusal.empty()) {
            return unimplemented_error(refusal);
        }
        EDGE_ASSIGN_OR_RETURN(CheckpointModel model,
                              read_checkpoint_model(dir, options.quantization));
        EDGE_ASSIGN_OR_RETURN(spec_, serving_model_spec(dir, model, options.max_context));
        // The device pool holds a scratch block past the blocks the host cache assigns; the
        // budget covers both, so the cache (and the scheduler, which counts its blocks) gets
        // one block less of it.
        scratch_bytes_ = spec_.kv_bytes_per_token * kKvBlockTokens;
        EDGE_ASSIGN_OR_RETURN(const int64_t kv_budget,
                              serving_kv_budget(options.kv_cache_bytes, scratch_bytes_));
        EDGE_RETURN_IF_ERROR(create_kv_cache(model.layers, model.kv_heads, model.head_dim,
                                             options.max_slots, spec_.max_context,
                                             options.kv_block_tokens, kv_budget));
        ServingDecoderOptions so;
        so.max_rows = serving_max_rows(options.max_slots);
        so.kv_blocks = kv_->num_blocks();
        so.max_blocks_per_seq = kv_blocks_for(spec_.max_context);
        so.max_logit_rows = serving_max_logit_rows(options.max_slots, so.max_rows);
        EDGE_ASSIGN_OR_RETURN(buckets_, row_buckets(so.max_rows));
        layout_ = StepLayout{so.max_rows, so.max_blocks_per_seq, so.max_logit_rows};
        scratch_block_ = so.kv_blocks;
        EDGE_ASSIGN_OR_RETURN(runner_, factory(model, so));
        return ok_status();
    }

    // The device pool's figures: the host cache's blocks and the scratch block.
    KvCacheStats kv_stats() const override {
        KvCacheStats s = PagedCausalLM::kv_stats();
        s.budget_bytes += scratch_bytes_;
        s.allocated_bytes += scratch_bytes_;
        return s;
    }

    // The host cache only keeps the block tables here; the keys and values are on the device.
    Result<SavedSlot> save_slot(int32_t slot, int64_t max_bytes) const override {
        return CausalLM::save_slot(slot, max_bytes);
    }
    Status restore_slot(int32_t slot, const SavedSlot& saved) override {
        return CausalLM::restore_slot(slot, saved);
    }

    Status forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) override {
        // A lost device fails every step from then on (the scheduler ends the requests).
        EDGE_RETURN_IF_ERROR(device_health());
        // The tables before the reservation, to find blocks the host cache copies on write.
        std::vector<std::vector<int32_t>> before(batch.size());
        for (size_t i = 0; i < batch.size(); ++i) {
            if (kv_->in_use(batch[i].slot)) {
                const std::span<const int32_t> t = kv_->blocks(batch[i].slot);
                before[i].assign(t.begin(), t.end());
            }
        }
        int64_t total = 0;
        EDGE_RETURN_IF_ERROR(prepare_batch(batch, &total));
        std::vector<BlockMove> moves;
        SlotTables tables(batch.size());
        int64_t out_rows = 0;
        for (size_t i = 0; i < batch.size(); ++i) {
            const std::span<const int32_t> t = kv_->blocks(batch[i].slot);
            tables[i].assign(t.begin(), t.end());
            for (const BlockMove& m :
                 moved_blocks(before[i], tables[i], batch[i].start_pos, kv_->block_tokens())) {
                moves.push_back(m);
            }
            out_rows += batch[i].all_logits ? static_cast<int64_t>(batch[i].tokens.size()) : 1;
        }
        EDGE_ASSIGN_OR_RETURN(std::vector<DeviceStep> steps,
                              plan_device_steps(batch, tables, layout_, buckets_, scratch_block_));
        // The plan brings back exactly the rows asked, checked before anything runs: the copies
        // below write past the vector otherwise, and leave rows unset with fewer.
        int64_t planned_rows = 0;
        for (const DeviceStep& step : steps) {
            planned_rows += static_cast<int64_t>(step.logit_rows.size());
        }
        if (planned_rows != out_rows) {
            return internal_error("device serving: the steps bring back " +
                                  std::to_string(planned_rows) + " logits rows for " +
                                  std::to_string(out_rows) + " asked");
        }
        EDGE_RETURN_IF_ERROR(runner_->copy_kv_blocks(moves));
        // Not zero-filled: the steps' copies write every row (checked above), as the CPU
        // model's forward does.
        logits->resize(static_cast<size_t>(out_rows * spec_.vocab_size));
        int64_t out_row = 0;
        for (const DeviceStep& step : steps) {
            EDGE_RETURN_IF_ERROR(runner_->run_rows(step.bucket, step.logit_bucket, step.staging));
            const std::vector<RowRun> runs = logit_runs(step, out_row);
            EDGE_RETURN_IF_ERROR(runner_->copy_logits(runs, logits->data()));
            out_row += static_cast<int64_t>(step.logit_rows.size());
        }
        commit_batch(batch);
        return ok_status();
    }

  private:
    ModelSpec spec_;
    std::unique_ptr<StepRunner> runner_;
    std::vector<int32_t> buckets_;
    StepLayout layout_;
    int32_t scratch_block_ = 0;
    int64_t scratch_bytes_ = 0;  // One block of every layer's keys and values.
};

}  // namespace

Result<std::unique_ptr<CausalLM>> load_serving_causal_lm(const std::string& dir,
                                                         const LoadOptions& options,
                                                         const StepRunnerFactory& factory) {
    auto model = std::make_unique<ServingCausalLM>();
    EDGE_RETURN_IF_ERROR(model->load(dir, options, factory));
    return std::unique_ptr<CausalLM>(std::move(model));
}

}  // namespace edge::engine::cuda
