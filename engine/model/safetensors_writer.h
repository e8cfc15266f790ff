#pragma once

// Writing safetensors files: make-model's and quantize's checkpoints and the tests' corrupt
// variants. The tensors tile the data section with no gap, as the format requires (Hugging
// Face's reader refuses a hole or trailing bytes); the header is padded with spaces so the data
// starts on a 64-byte boundary, and the tensors whose size is a multiple of 64 bytes come first,
// in the order given, then the others: every matrix with line-multiple rows is line-aligned.
//
// Threading: free functions; no shared state.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/file.h"  // fsync_path
#include "common/result.h"
#include "engine/model/safetensors.h"

namespace edge::engine {

struct TensorToWrite {
    std::string name;
    DType dtype = DType::kBF16;
    std::vector<int64_t> shape;
    std::string_view bytes;  // Exactly numel * dtype_size bytes; the memory is the caller's.
    // When set, called instead of copying `bytes`, to fill numel * dtype_size bytes in place
    // (so a large checkpoint is made tensor by tensor, never all in memory). An error stops the
    // write and is returned, with the tensor's name.
    std::function<Status(char* out)> fill;
};

// numel * dtype_size of `t`.
uint64_t tensor_bytes(const TensorToWrite& t);

// Called after each tensor's bytes are written (for progress reports).
using TensorWritten = std::function<void(const TensorToWrite&)>;

// Writes `path`; kInvalidArgument when a tensor's bytes do not match its shape or a name is given
// twice (before anything is written), kInternal on I/O.
// The bytes go to `path`.partial, synced to disk (fsync_path) and renamed over `path` only once
// all are written: a failed write (a fill's error included) leaves no truncated model, and a
// reader that maps the old file keeps its bytes. The directory is not synced: the caller does
// that once after its last rename.
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const TensorWritten& written = {});

// Hugging Face's name for shard `index` (1-based) of `count`: model-00001-of-00003.safetensors.
std::string shard_file_name(int index, int count);
// Whether `name` has that form (model-NNNNN-of-NNNNN.safetensors).
bool is_shard_file_name(std::string_view name);

// A checkpoint's weights in `dir`, as Hugging Face's save_pretrained lays them out: all in
// model.safetensors when they fit in `max_shard_bytes`, else in shards of at most that many bytes
// (shard_file_name; a tensor larger than that alone in its shard), tensors in the given order,
// then model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}) written after
// every shard. Each file is written as write_safetensors writes one, and `dir` is synced after
// the last (so the files are durable before the caller writes the config.json that points at
// them); when one fails (a fill's error included) the files this call wrote are removed. A name
// given twice, in any shards, is refused (kInvalidArgument) before the first is written.
// Returns the files written.
Result<std::vector<std::string>> write_checkpoint_weights(const std::string& dir,
                                                          const std::vector<TensorToWrite>& tensors,
                                                          uint64_t max_shard_bytes,
                                                          const TensorWritten& written = {});

// Writes `text` to `path` (replacing it) as write_safetensors writes one: synced, then renamed
// over it; the directory is the caller's to sync. kInternal on I/O.
Status write_text_file(const std::string& path, std::string_view text);

// The files of a checkpoint that make-model and quantize write or copy (config.json first).
inline constexpr const char* kCheckpointFiles[] = {
    "config.json",         "generation_config.json", "tokenizer.json",   "tokenizer_config.json",
    "tiktoken.model",      "tokenizer.model",        "special_tokens_map.json", "vocab.json",
    "merges.txt",          "vocab.txt",              "chat_template.jinja",     "added_tokens.json",
    "model.safetensors"};

// An exclusive flock(2) on DIR/.edgeserve-writing.lock, held by the process writing a checkpoint
// into DIR; the lock file is removed on release. Move-only.
class CheckpointDirLock {
  public:
    CheckpointDirLock() = default;
    CheckpointDirLock(CheckpointDirLock&& other) noexcept;
    CheckpointDirLock& operator=(CheckpointDirLock&& other) noexcept;
    CheckpointDirLock(const CheckpointDirLock&) = delete;
    CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;
    ~CheckpointDirLock() { release(); }

    // Locks `dir` (which must exist) without waiting: kFailedPrecondition when another process
    // holds it.
    static Result<CheckpointDirLock> acquire(const std::string& dir);
    static constexpr const char* kFileName = ".edgeserve-writing.lock";

  private:
    void release();
    int fd_ = -1;
    std::string path_;
};

// Creates `out_dir` for a checkpoint about to be written (make-model, quantize), which then
// writes config.json last: it marks a complete checkpoint, so an interrupted write leaves a
// directory that fails to load ("config.json: cannot open") rather than a mix that loads.
// A checkpoint's files here are kCheckpointFiles, model.safetensors.index.json and shards named
// as shard_file_name names them. Refused with kInvalidArgument: `out_dir` is `input_dir` (the
// checkpoint being read); or, unless `overwrite`, it holds any checkpoint file (a checkpoint, or
// an interrupted write of one). With `overwrite` they are removed, config.json first, so none
// of the old checkpoint's outlives it beside the new weights. The `.partial` files of checkpoint
// files an interrupted write left are removed either way; other files stay.
//
// The directory is locked for the writer (CheckpointDirLock) before anything in it is touched,
// and stays locked while the returned lock lives: a second writer into it is refused
// (kFailedPrecondition, "another quantize (or make-model) is writing DIR") instead of deleting
// the first one's .partial file.
Result<CheckpointDirLock> prepare_checkpoint_dir(const std::string& out_dir,
                                                 const std::string& input_dir = {},
                                                 bool overwrite = false);

// Writes a file made of an 8-byte little-endian header length, `header` and `data` as given
// (no checks: for building corrupt files in tests).
Status write_raw_safetensors(const std::string& path, std::string_view header,
                             std::string_view data);

}  // namespace edge::engine
