#pragma once

// The host-side planning of serving on the device (engine/cuda/device_causal_lm.h), plain C++ so
// the CPU tests cover it: which batch-size bucket (one CUDA graph each) a step runs in, how the
// scheduler's chunks become device rows (one row per token: prefill chunks and decode tokens
// alike), how the slots' KV block tables are translated into the device table, how padded rows
// are masked, which rows' logits are computed and go back to the host, which KV blocks the host
// cache moved (copy-on-write of a shared block) and whether a model is served on the device at
// all.
//
// Device rows of one step, staged in one int32 buffer uploaded with one copy (StepLayout):
//   tokens[max_rows], positions[max_rows], sequence of each row[max_rows],
//   logit rows[max_logit_rows], block table[(max_rows + 1) rows][max_blocks_per_seq]
// Row r runs token tokens[r] at position positions[r] of table row seqs[r]. Table row i < chunks
// is the i-th chunk's slot table, its unused entries pointing at the scratch block. Padded rows
// (from the real row count up to the bucket) run token 0 at position 0 of the pad table row,
// whose every entry is the scratch block: they write only the scratch block, read only what
// they wrote, and their logits are never copied back, so they cannot change a real row.
// Logits: only the rows that want them (a chunk's last token, every token of an all_logits
// chunk) go through the final norm and the LM head. The step gathers their final hidden states
// by the logit rows (compact logits row i is device row logit_rows[i]), padded with row 0 up to
// the step's logit bucket (a power of two up to max_logit_rows, 0 when no row wants logits), so
// each (row bucket, logit bucket) pair is one CUDA graph of fixed shapes; the logits buffer holds
// max_logit_rows rows, not max_rows.
//
// Pure functions and values; thread-safe.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/cuda/host/checkpoint_model.h"
#include "engine/model/causal_lm.h"

namespace edge::engine::cuda {

// The device side of serving: a decoder of up to max_rows rows per step over a paged KV pool
// whose blocks the caller assigns.
struct ServingDecoderOptions {
    int32_t max_rows = 64;           // Rows of the largest bucket (row_buckets(max_rows)).
    int32_t kv_blocks = 0;           // Physical KV blocks the caller assigns; the pool has one
                                     // more, the scratch block padded rows write.
    int32_t max_blocks_per_seq = 0;  // Block-table entries per sequence.
    int32_t max_logit_rows = 0;      // Rows whose logits one step computes at most (LM head
                                     // rows, logits buffer rows), in 1..max_rows.
};

// The part of the KV budget `kv_cache_bytes` (engine.kv_cache_bytes) the host cache's blocks
// take when a block (every layer's keys and values) takes `block_bytes`: the budget less one
// block, so that the device pool, those blocks and the scratch block, fits the budget. 0 (none
// set: the cache holds every slot's whole context, the scratch block beyond it) is passed on.
// kInvalidArgument naming the budget when it holds no block besides the scratch block.
Result<int64_t> serving_kv_budget(int64_t kv_cache_bytes, int64_t block_bytes);

// Rows (tokens) one device step runs at most, for a model serving `max_slots` sequences: the
// next power of two of max(max_slots, 64), at most 512. Larger batches (long prefill chunks)
// run as several steps.
int32_t serving_max_rows(int32_t max_slots);

// Logits rows one device step computes at most for `max_slots` sequences and `max_rows` rows:
// the next power of two of max(max_slots, 16), at most max_rows. A step that would want more
// (chunks asking for every row's logits) is split; a step of one row per sequence never is.
int32_t serving_max_logit_rows(int32_t max_slots, int32_t max_rows);

// The batch-size buckets, each captured once as a CUDA graph: 1, 2, 4, 8, 16, then from
// kHalfStepBuckets on each power of two and the one and a half times it (16, 24, 32, 48, 64,
// 96, ...), up to max_rows (the last is max_rows itself when it is not in that series). A step
// runs its bucket's rows, its padding computed and masked, so the half steps bound the waste at
// a third of a step rather than a half where the rows cost most: a serving step of 32 decoding
// sequences and a 16-token prefill chunk runs 48 rows, not 64. kInvalidArgument for
// max_rows <= 0.
inline constexpr int32_t kHalfStepBuckets = 16;
Result<std::vector<int32_t>> row_buckets(int32_t max_rows);

// The smallest bucket holding `rows`; kInvalidArgument for rows <= 0 or more than the largest.
Result<int32_t> choose_bucket(std::span<const int32_t> buckets, int32_t rows);

// Where each part of a step's staging buffer starts (int32 offsets).
struct StepLayout {
    int32_t max_rows = 0;            // Rows of the largest bucket.
    int32_t max_blocks_per_seq = 0;  // Block-table entries per table row.
    int32_t max_logit_rows = 0;      // Gather indices (logits rows) per step, 1..max_rows.

    int64_t tokens_offset() const { return 0; }
    int64_t positions_offset() const { return max_rows; }
    int64_t seqs_offset() const { return int64_t{2} * max_rows; }
    int64_t logit_rows_offset() const { return int64_t{3} * max_rows; }
    int64_t table_offset() const { return logit_rows_offset() + max_logit_rows; }
    // Table rows: one per chunk (at most max_rows) plus the pad row.
    int64_t table_rows() const { return int64_t{max_rows} + 1; }
    // Ints of the whole staging buffer.
    int64_t total_ints() const { return table_offset() + table_rows() * max_blocks_per_seq; }
};

// One device step: the staging ints to upload and what to read back.
struct DeviceStep {
    int32_t rows = 0;    // Real rows (tokens) of the step.
    int32_t bucket = 0;  // Rows the graph runs (>= rows); rows [rows, bucket) are padding.
    // Logits rows the graph computes: 0 when no row wants logits, else the smallest bucket of
    // row_buckets(max_logit_rows) holding logit_rows (never more than `bucket`).
    int32_t logit_bucket = 0;
    // Staging buffer prefix to upload: layout.table_offset() + (chunks + 1) * max_blocks ints.
    std::vector<int32_t> staging;
    // Device rows whose logits the caller wants, in output order (ascending): the gather
    // indices (compact logits row i is logit_rows[i]); at most layout.max_logit_rows.
    std::vector<int32_t> logit_rows;
};

// Checks a staging prefix before it is uploaded (a bad entry would make a kernel read or write
// outside its buffers): its size (the table rows it carries, at least one, fit the layout),
// every one of `bucket` rows (a token below `vocab`, a table row it carries, a position the
// table covers), the logit bucket (0..min(bucket, max_logit_rows)) and each of its gather
// indices (a row below `bucket`), and every table entry in [0, pool_blocks).
// kInvalidArgument naming the row or entry.
Status check_staging(const StepLayout& layout, std::span<const int32_t> staging, int32_t bucket,
                     int32_t logit_bucket, int32_t vocab, int32_t pool_blocks);

// A run of consecutive compact logits rows copied back with one copy.
struct RowRun {
    int32_t first_row = 0;  // First compact logits row of the step (not a device row).
    int32_t rows = 0;       // Consecutive rows.
    int64_t out_row = 0;    // Row of the caller's logits the run starts at.
};

// The copies of `step`'s logits into the caller's output, which continues from `out_row`: the
// compact rows [0, logit_rows.size()) are already in output order, so one run (none when the
// step computes no logits).
std::vector<RowRun> logit_runs(const DeviceStep& step, int64_t out_row);

// The KV block table of each chunk's slot after the host cache reserved the batch (entries
// cover at least the chunk's last position).
using SlotTables = std::vector<std::vector<int32_t>>;

// The device steps of `batch` (already validated by the model: positions and tokens in range):
// its tokens in chunk order, max_rows per step (and at most max_logit_rows rows wanting logits:
// a step ends before the row that would pass it), each padded to its bucket, the gather indices
// padded with row 0 to the logit bucket. `tables[i]` is the table of batch[i]'s slot;
// `scratch_block` is the pad block (the last physical block of the device pool).
// kInvalidArgument for a bad layout (max_logit_rows outside 1..max_rows) or when a table is
// shorter than the chunk's positions need, has a block outside [0, scratch_block), or is longer
// than max_blocks_per_seq.
Result<std::vector<DeviceStep>> plan_device_steps(std::span<const SequenceChunk> batch,
                                                  const SlotTables& tables,
                                                  const StepLayout& layout,
                                                  std::span<const int32_t> buckets,
                                                  int32_t scratch_block);

// A physical KV block whose contents moved to another block (copy-on-write in the host cache):
// the device pool must copy `from` into `to` before the step writes.
struct BlockMove {
    int32_t from = 0;
    int32_t to = 0;
    bool operator==(const BlockMove&) const = default;
};

// The moves between a slot's table before and after a reservation: entries below
// ceil(old_length / block_tokens) that changed.
std::vector<BlockMove> moved_blocks(std::span<const int32_t> before, std::span<const int32_t> after,
                                    int32_t old_length, int32_t block_tokens);

// What serving on the device needs beyond the checkpoint itself (read_checkpoint_model checks
// that): the CUDA backend, no expert-parallel sharding, 16-token KV blocks. Empty when served on
// the device, else why not (for the fallback's log line).
struct DeviceServingRequest {
    std::string backend;           // The resolved engine.backend ("cpu" or "cuda").
    int32_t sharding_ranks = 1;    // engine.sharding.ranks.
    int32_t kv_block_tokens = 16;  // engine.kv_block_tokens.
};
std::string device_serving_refusal(const DeviceServingRequest& request);

// What the engine does after trying the device forward for a model (load_device_causal_lm's
// status): serve it on the device (OK), fall back to load_model() on the CUDA backend with a log
// line naming the reason (kUnimplemented: a model or configuration the device forward does not
// run), or fail the start (anything else: a broken checkpoint, a device out of memory or lost).
enum class ServingPath { kDevice, kFallback, kFail };
ServingPath serving_path_after(const Status& device_load);

// The start's error for a device forward that failed (kFail above). With `cuda_arena_held`, an
// earlier model of the process runs on the CUDA backend, whose arena (one per device, shared by
// every CUDA backend, sized when the first is made to most of the free memory) holds what this
// model's own arena needs: a kResourceExhausted then says to list the models the device forward
// runs first. It still fails the start: the per-op path sharing that arena would start, then
// fail steps once both models' weights outgrow it.
Status device_load_failure(const Status& device_load, bool cuda_arena_held);

// The ModelSpec of the checkpoint in `dir` as read into `model` (the CPU model's: same
// architecture name, vocabulary, eos/bos ids, version digest, resident weight bytes and KV bytes
// per token), with `max_context` positions (0: max_position_embeddings; more is
// kInvalidArgument).
Result<ModelSpec> serving_model_spec(const std::string& dir, const CheckpointModel& model,
                                     int32_t max_context);

// Device bytes serving `model` takes: its weights as uploaded, a KV pool of `pool_blocks`
// blocks, the activations and staging of `max_rows` rows, the logits of `max_logit_rows` rows
// and the per-allocation alignment, with a margin (the arena is taken once, so this errs high).
int64_t serving_arena_bytes(const CheckpointModel& model, int32_t max_rows,
                            int32_t max_logit_rows, int32_t pool_blocks,
                            int32_t max_blocks_per_seq, int64_t alignment);

}  // namespace edge::engine::cuda
