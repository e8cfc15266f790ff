#include "engine/cuda/host/serving_plan.h"

#include <algorithm>

#include "engine/cuda/host/paged_kv_layout.h"
#include "engine/cuda/host/router_rule.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_loader.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine::cuda {

Result<int64_t> serving_kv_budget(int64_t kv_cache_bytes, int64_t block_bytes) {
    if (kv_cache_bytes <= 0) {
        return kv_cache_bytes;
    }
    if (block_bytes <= 0 || kv_cache_bytes / block_bytes < 2) {
        return invalid_argument_error(
            "load options: kv_cache_bytes " + std::to_string(kv_cache_bytes) +
            " holds no KV block of " + std::to_string(block_bytes) +
            " bytes besides the device's scratch block; raise engine.kv_cache_bytes");
    }
    return kv_cache_bytes - block_bytes;
}

int32_t serving_max_rows(int32_t max_slots) {
    int32_t rows = 64;
    while (rows < max_slots && rows < 512) {
        rows *= 2;
    }
    return rows;
}

int32_t serving_max_logit_rows(int32_t max_slots, int32_t max_rows) {
    int32_t rows = 16;
    while (rows < max_slots && rows < max_rows) {
        rows *= 2;
    }
    return std::max(1, std::min(rows, max_rows));
}

Result<std::vector<int32_t>> row_buckets(int32_t max_rows) {
    if (max_rows <= 0) {
        return invalid_argument_error("device serving: max_rows " + std::to_string(max_rows) +
                                      " must be positive");
    }
    std::vector<int32_t> buckets;
    for (int32_t b = 1; b < max_rows; b *= 2) {
        buckets.push_back(b);
        if (b >= kHalfStepBuckets && b + b / 2 < max_rows) {
            buckets.push_back(b + b / 2);
        }
    }
    buckets.push_back(max_rows);
    return buckets;
}

Result<int32_t> choose_bucket(std::span<const int32_t> buckets, int32_t rows) {
    if (rows > 0) {
        for (int32_t b : buckets) {
            if (b >= rows) {
                return b;
            }
        }
    }
    return invalid_argument_error("device serving: no bucket for " + std::to_string(rows) +
                                  " rows (largest " +
                                  std::to_string(buckets.empty() ? 0 : buckets.back()) + ")");
}

Status check_staging(const StepLayout& layout, std::span<const int32_t> staging, int32_t bucket,
                     int32_t logit_bucket, int32_t vocab, int32_t pool_blocks) {
    const int64_t size = static_cast<int64_t>(staging.size());
    const int64_t mb = layout.max_blocks_per_seq;
    if (mb <= 0 || layout.max_rows <= 0 || layout.max_logit_rows <= 0 ||
        layout.max_logit_rows > layout.max_rows || size < layout.table_offset() + mb ||
        size > layout.total_ints() || (size - layout.table_offset()) % mb != 0) {
        return invalid_argument_error("device step: staging of " + std::to_string(size) +
                                      " ints does not fit the layout (" +
                                      std::to_string(layout.max_rows) + " rows, " +
                                      std::to_string(layout.max_logit_rows) + " logits rows, " +
                                      std::to_string(mb) + " blocks per sequence)");
    }
    if (bucket <= 0 || bucket > layout.max_rows) {
        return invalid_argument_error("device step: bucket " + std::to_string(bucket) +
                                      " outside 1.." + std::to_string(layout.max_rows));
    }
    const int32_t max_logits = std::min(bucket, layout.max_logit_rows);
    if (logit_bucket < 0 || logit_bucket > max_logits) {
        return invalid_argument_error("device step: logit bucket " +
                                      std::to_string(logit_bucket) + " outside 0.." +
                                      std::to_string(max_logits));
    }
    for (int32_t i = 0; i < logit_bucket; ++i) {
        const int32_t row = staging[static_cast<size_t>(layout.logit_rows_offset() + i)];
        if (row < 0 || row >= bucket) {
            return invalid_argument_error("device step: logits row " + std::to_string(i) +
                                          " gathers row " + std::to_string(row) +
                                          ", outside the bucket's " + std::to_string(bucket) +
                                          " rows");
        }
    }
    const int64_t table_rows = (size - layout.table_offset()) / mb;
    for (int32_t r = 0; r < bucket; ++r) {
        const int32_t token = staging[static_cast<size_t>(layout.tokens_offset() + r)];
        const int32_t pos = staging[static_cast<size_t>(layout.positions_offset() + r)];
        const int32_t seq = staging[static_cast<size_t>(layout.seqs_offset() + r)];
        if (token < 0 || token >= vocab || seq < 0 || seq >= table_rows || pos < 0 ||
            int64_t{pos} >= mb * kKvBlockTokens) {
            return invalid_argument_error(
                "device step: row " + std::to_string(r) + " (token " + std::to_string(token) +
                ", position " + std::to_string(pos) + ", table row " + std::to_string(seq) +
                ") is outside vocab " + std::to_string(vocab) + ", " + std::to_string(table_rows) +
                " table rows or " + std::to_string(mb * kKvBlockTokens) + " positions");
        }
    }
    for (int64_t i = layout.table_offset(); i < size; ++i) {
        const int32_t b = staging[static_cast<size_t>(i)];
        if (b < 0 || b >= pool_blocks) {
            return invalid_argument_error("device step: block-table entry " +
                                          std::to_string(i - layout.table_offset()) + " is " +
                                          std::to_string(b) + ", outside the pool's " +
                                          std::to_string(pool_blocks) + " blocks");
        }
    }
    return ok_status();
}

std::vector<RowRun> logit_runs(const DeviceStep& step, int64_t out_row) {
    if (step.logit_rows.empty()) {
        return {};
    }
    return {RowRun{0, static_cast<int32_t>(step.logit_rows.size()), out_row}};
}

namespace {

// Starts a step in `step` (rows 0) with the staging prefix sized for no table row yet.
void begin_step(const StepLayout& layout, DeviceStep* step) {
    step->rows = 0;
    step->bucket = 0;
    step->staging.assign(static_cast<size_t>(layout.table_offset()), 0);
    step->logit_rows.clear();
}

// Appends the table row of a chunk's slot (unused entries: the scratch block).
void add_table_row(const StepLayout& layout, std::span<const int32_t> table, int32_t scratch,
                   DeviceStep* step) {
    const size_t at = step->staging.size();
    step->staging.resize(at + static_cast<size_t>(layout.max_blocks_per_seq), scratch);
    std::copy(table.begin(), table.end(), step->staging.begin() + static_cast<int64_t>(at));
}

// Pads rows [rows, bucket), writes the gather indices (logit_rows, then row 0 up to
// max_logit_rows) and appends the pad table row.
Status finish_step(const StepLayout& layout, std::span<const int32_t> buckets,
                   std::span<const int32_t> logit_buckets, int32_t scratch, DeviceStep* step) {
    EDGE_ASSIGN_OR_RETURN(step->bucket, choose_bucket(buckets, step->rows));
    step->logit_bucket = 0;
    if (!step->logit_rows.empty()) {
        EDGE_ASSIGN_OR_RETURN(
            step->logit_bucket,
            choose_bucket(logit_buckets, static_cast<int32_t>(step->logit_rows.size())));
    }
    for (int32_t i = 0; i < layout.max_logit_rows; ++i) {
        step->staging[static_cast<size_t>(layout.logit_rows_offset() + i)] =
            i < static_cast<int32_t>(step->logit_rows.size())
                ? step->logit_rows[static_cast<size_t>(i)]
                : 0;
    }
    const int64_t table_rows =
        (static_cast<int64_t>(step->staging.size()) - layout.table_offset()) /
        layout.max_blocks_per_seq;
    for (int32_t r = step->rows; r < step->bucket; ++r) {
        step->staging[static_cast<size_t>(layout.tokens_offset() + r)] = 0;
        step->staging[static_cast<size_t>(layout.positions_offset() + r)] = 0;
        step->staging[static_cast<size_t>(layout.seqs_offset() + r)] =
            static_cast<int32_t>(table_rows);
    }
    step->staging.resize(step->staging.size() + static_cast<size_t>(layout.max_blocks_per_seq),
                         scratch);
    return ok_status();
}

}  // namespace

Result<std::vector<DeviceStep>> plan_device_steps(std::span<const SequenceChunk> batch,
                                                  const SlotTables& tables,
                                                  const StepLayout& layout,
                                                  std::span<const int32_t> buckets,
                                                  int32_t scratch_block) {
    std::vector<DeviceStep> steps;
    if (layout.max_rows <= 0 || layout.max_blocks_per_seq <= 0 || buckets.empty() ||
        buckets.back() != layout.max_rows || layout.max_logit_rows <= 0 ||
        layout.max_logit_rows > layout.max_rows) {
        return invalid_argument_error("device serving: bad step layout (max_rows " +
                                      std::to_string(layout.max_rows) + ", max_blocks_per_seq " +
                                      std::to_string(layout.max_blocks_per_seq) +
                                      ", max_logit_rows " +
                                      std::to_string(layout.max_logit_rows) + ")");
    }
    EDGE_ASSIGN_OR_RETURN(const std::vector<int32_t> logit_buckets,
                          row_buckets(layout.max_logit_rows));
    if (tables.size() != batch.size()) {
        return invalid_argument_error("device serving: " + std::to_string(tables.size()) +
                                      " block tables for " + std::to_string(batch.size()) +
                                      " chunks");
    }
    for (size_t i = 0; i < batch.size(); ++i) {
        const SequenceChunk& ch = batch[i];
        const std::vector<int32_t>& table = tables[i];
        const std::string where = "device serving: chunk " + std::to_string(i) + " (slot " +
                                  std::to_string(ch.slot) + ")";
        const int64_t end = int64_t{ch.start_pos} + static_cast<int64_t>(ch.tokens.size());
        if (ch.start_pos < 0 || ch.tokens.empty() ||
            end > int64_t{kKvBlockTokens} * static_cast<int64_t>(table.size())) {
            return invalid_argument_error(where + ": positions " + std::to_string(ch.start_pos) +
                                          ".." + std::to_string(end - 1) + " need more than its " +
                                          std::to_string(table.size()) + " KV blocks");
        }
        if (static_cast<int64_t>(table.size()) > layout.max_blocks_per_seq) {
            return invalid_argument_error(where + ": " + std::to_string(table.size()) +
                                          " KV blocks, more than the device table's " +
                                          std::to_string(layout.max_blocks_per_seq));
        }
        for (size_t b = 0; b < table.size(); ++b) {
            if (table[b] < 0 || table[b] >= scratch_block) {
                return invalid_argument_error(where + ": KV block entry " + std::to_string(b) +
                                              " is " + std::to_string(table[b]) +
                                              ", outside the device pool's " +
                                              std::to_string(scratch_block) + " blocks");
            }
        }
    }
    DeviceStep step;
    begin_step(layout, &step);
    for (size_t i = 0; i < batch.size(); ++i) {
        const SequenceChunk& ch = batch[i];
        const int32_t n = static_cast<int32_t>(ch.tokens.size());
        int32_t seq = -1;  // This chunk's table row in the current step, once added.
        for (int32_t j = 0; j < n; ++j) {
            const bool wants_logits = ch.all_logits || j == n - 1;
            if (step.rows == layout.max_rows ||
                (wants_logits &&
                 static_cast<int32_t>(step.logit_rows.size()) == layout.max_logit_rows)) {
                EDGE_RETURN_IF_ERROR(
                    finish_step(layout, buckets, logit_buckets, scratch_block, &step));
                steps.push_back(std::move(step));
                begin_step(layout, &step);
                seq = -1;
            }
            if (seq < 0) {
                seq = static_cast<int32_t>(
                    (static_cast<int64_t>(step.staging.size()) - layout.table_offset()) /
                    layout.max_blocks_per_seq);
                add_table_row(layout, tables[i], scratch_block, &step);
            }
            const int32_t r = step.rows++;
            step.staging[static_cast<size_t>(layout.tokens_offset() + r)] = ch.tokens[j];
            step.staging[static_cast<size_t>(layout.positions_offset() + r)] = ch.start_pos + j;
            step.staging[static_cast<size_t>(layout.seqs_offset() + r)] = seq;
            if (wants_logits) {
                step.logit_rows.push_back(r);
            }
        }
    }
    if (step.rows > 0) {
        EDGE_RETURN_IF_ERROR(finish_step(layout, buckets, logit_buckets, scratch_block, &step));
        steps.push_back(std::move(step));
    }
    return steps;
}

std::vector<BlockMove> moved_blocks(std::span<const int32_t> before, std::span<const int32_t> after,
                                    int32_t old_length, int32_t block_tokens) {
    std::vector<BlockMove> moves;
    if (block_tokens <= 0 || old_length <= 0) {
        return moves;
    }
    const size_t written =
        static_cast<size_t>((int64_t{old_length} + block_tokens - 1) / block_tokens);
    const size_t n = std::min({written, before.size(), after.size()});
    for (size_t b = 0; b < n; ++b) {
        if (before[b] != after[b]) {
            moves.push_back(BlockMove{before[b], after[b]});
        }
    }
    return moves;
}

std::string device_serving_refusal(const DeviceServingRequest& request) {
    if (request.backend != "cuda") {
        return "engine.backend resolved to \"" + request.backend + "\", not \"cuda\"";
    }
    if (request.sharding_ranks > 1) {
        return "engine.sharding.ranks is " + std::to_string(request.sharding_ranks) +
               " (the whole-step device forward runs one GPU; sharded models run the engine's "
               "forward on the CUDA backend)";
    }
    if (request.kv_block_tokens != kKvBlockTokens) {
        return "engine.kv_block_tokens is " + std::to_string(request.kv_block_tokens) +
               " (the device KV cache uses blocks of " + std::to_string(kKvBlockTokens) +
               " tokens)";
    }
    return "";
}

ServingPath serving_path_after(const Status& device_load) {
    if (device_load.ok()) {
        return ServingPath::kDevice;
    }
    return device_load.code() == StatusCode::kUnimplemented ? ServingPath::kFallback
                                                            : ServingPath::kFail;
}

Status device_load_failure(const Status& device_load, bool cuda_arena_held) {
    if (device_load.code() != StatusCode::kResourceExhausted || !cuda_arena_held) {
        return device_load;
    }
    return Status(device_load.code(),
                  std::string(device_load.message()) +
                      " (an earlier model, served by the engine's forward on the CUDA backend, "
                      "holds most of the device's memory in its arena: list the models the "
                      "device forward runs before it in `models`)");
}

Result<ModelSpec> serving_model_spec(const std::string& dir, const CheckpointModel& model,
                                     int32_t max_context) {
    EDGE_ASSIGN_OR_RETURN(ConfigJson json, ConfigJson::read(dir));
    if (max_context < 0) {
        return invalid_argument_error(dir + ": max_context " + std::to_string(max_context) +
                                      " is negative");
    }
    EDGE_RETURN_IF_ERROR(check_max_context(json, model.max_position, max_context));
    ModelSpec spec;
    spec.architecture = model.architecture;
    spec.vocab_size = model.vocab;
    spec.max_context = max_context > 0 ? max_context : model.max_position;
    for (int64_t id : model.eos_token_ids) {
        spec.eos_token_ids.push_back(static_cast<TokenId>(id));
    }
    spec.bos_token_id = static_cast<TokenId>(
        model.bos_token_id >= 0 && model.bos_token_id < model.vocab ? model.bos_token_id : -1);
    spec.version = version_digest(json, *model.checkpoint, model.loader->policy());
    spec.weight_bytes = model.loader->resident_bytes();
    spec.kv_bytes_per_token = int64_t{model.layers} * 2 * model.kv_heads * model.head_dim * 4;
    return spec;
}

int64_t serving_arena_bytes(const CheckpointModel& model, int32_t max_rows,
                            int32_t max_logit_rows, int32_t pool_blocks,
                            int32_t max_blocks_per_seq, int64_t alignment) {
    int64_t bytes = 0;
    int64_t allocations = 0;
    auto weight = [&](const Weight& w) {
        bytes += quant::weight_data_bytes(w.format, w.rows, w.cols) +
                 quant::weight_scale_count(w.format, w.rows, w.cols) * 4;
        allocations += 2;
    };
    weight(model.embed);
    if (model.lm_head.data != model.embed.data) {
        weight(model.lm_head);
    }
    const int64_t H = model.hidden, hd = model.head_dim, E = model.experts, K = model.top_k;
    const int64_t qd = int64_t{model.heads} * hd, kvd = int64_t{model.kv_heads} * hd;
    for (const CheckpointLayer& L : model.layer) {
        for (const Weight* w : {&L.q, &L.k, &L.v, &L.o, &L.router, &L.dense.gate, &L.dense.up,
                                &L.dense.down, &L.shared.gate, &L.shared.up, &L.shared.down,
                                &L.mla.q_a, &L.mla.q, &L.mla.kv_a, &L.mla.kv_b, &L.mla.o}) {
            if (w->data != nullptr) {
                weight(*w);
                allocations += 1;  // Its pointer table.
            }
        }
        for (const std::vector<float>* v :
             {&L.q_bias, &L.k_bias, &L.v_bias, &L.router_bias, &L.q_norm, &L.k_norm,
              &L.mla.q_a_norm, &L.mla.kv_a_norm}) {
            bytes += static_cast<int64_t>(v->size()) * 4;
            allocations += 1;
        }
        for (const auto* experts : {&L.gate, &L.up, &L.down}) {
            for (const Weight& w : *experts) {
                weight(w);
            }
            bytes += 2 * E * 8;  // Pointer tables.
            allocations += 2;
        }
        bytes += (2 * H + E + 1) * 4;  // Norms and expert offsets.
        allocations += 3;
    }
    bytes += H * 4 + hd / 2 * 8;  // Final norm, RoPE frequencies (rot_dim / 2 <= hd / 2).
    const PagedKvLayout kv{model.layers, model.kv_heads, model.head_dim, pool_blocks};
    bytes += kv.pool_floats() * 4;
    // The expert activations also hold the dense MLP's and the shared experts' (one row each).
    const int64_t inter = std::max({K * model.moe_inter, int64_t{model.dense_inter},
                                    int64_t{model.shared_inter}});
    const int64_t per_row = 3 * H + 2 * qd + 2 * kvd + E + 3 * K + 2 * K * H + 3 * inter;
    bytes += int64_t{max_rows} * per_row * 4;
    bytes += int64_t{max_logit_rows} * model.vocab * 4;  // Logits of the gathered rows only.
    if (model.attention == AttentionKind::kMla) {
        // The MLA scratch and output (the latent pool is the kv layout's size: kv_heads 1,
        // head_dim half a latent row).
        const int64_t out = int64_t{max_rows} * model.heads * model.mla.v_head_dim;
        bytes += (mla_scratch_floats(model.mla, max_rows) + out) * 4;
        bytes += static_cast<int64_t>(model.inv_freq.size()) * 8;
        allocations += 3;
    }
    const StepLayout layout{max_rows, max_blocks_per_seq, max_logit_rows};
    bytes += layout.total_ints() * 4 + 64 * 8;  // Staging and per-bucket offsets.
    allocations += 64;
    bytes += allocations * alignment;
    return bytes + bytes / 8 + (int64_t{64} << 20);
}

}  // namespace edge::engine::cuda
