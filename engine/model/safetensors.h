#pragma once

// Reading safetensors checkpoints: the header parser (a plain function over bytes, so the fuzzer
// can drive it), a read-only memory-mapped file, and a Checkpoint that joins one or several files
// (model.safetensors, or the shards named by model.safetensors.index.json) into one tensor table.
// Every offset, shape and dtype from a header is checked against the file size with overflow-safe
// arithmetic; a corrupt or truncated file is a Status naming the file and the tensor.
//
// Threading: immutable after open; any number of threads may read tensors at once.
// Lifetime: TensorView::data points into a mapping owned by the Checkpoint; the Checkpoint must
// outlive every view taken from it.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace edge::engine {

enum class DType { kBF16, kF16, kF32, kF8E4M3, kI8, kI32, kI64 };

// The safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);
// Bytes per element.
int64_t dtype_size(DType dtype);

// One entry of a safetensors header. Offsets are relative to the start of the data section.
struct TensorInfo {
    std::string name;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    int64_t begin = 0;  // First byte, relative to the data section.
    int64_t end = 0;    // One past the last byte.
};

struct SafetensorsHeader {
    int64_t data_offset = 0;            // Where the data section starts in the file (8 + header).
    std::vector<TensorInfo> tensors;    // Sorted by `begin`.
};

// Largest JSON header accepted, bytes (real checkpoints use well under 10 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;
// Longest tensor name taken (Kimi K2's longest is under 80 bytes).
inline constexpr size_t kMaxTensorNameBytes = 1024;

// Parses and validates the header of a safetensors file. `prefix` holds the first bytes of the file
// (at least 8 + header length of them), `file_size` is the size of the whole file and `file_name`
// is used in error messages. Checks: header length within the file, valid JSON object, known
// dtypes, non-negative shapes whose byte size fits in int64 and equals the offsets' span, offsets
// inside the data section, aligned to the element size and not overlapping, and a data section
// that starts at a multiple of 8 bytes (so every tensor is aligned in the file, and in a mapping).
Result<SafetensorsHeader> parse_safetensors_header(std::string_view prefix, uint64_t file_size,
                                                   std::string_view file_name);

// A whole file mapped read-only. Not copyable; unmaps on destruction. The file stays open until
// populate() or destruction, so populate() can check its size against the mapping's.
class MappedFile {
public:
    static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const std::string& path() const { return path_; }
    const uint8_t* data() const { return data_; }
    uint64_t size() const { return size_; }
    // Reads the whole file into the mapping now, in steps noted as load progress
    // (engine/load_progress.h); open() reads nothing but what is touched. kDataLoss naming the
    // file and the byte range when the file cannot be read (truncated after open(), or a disk
    // I/O error) or its size changed since open(): a read through the mapping would raise SIGBUS
    // instead. Call at most once; it closes the file.
    [[nodiscard]] Status populate();

private:
    MappedFile(std::string path, int fd, const uint8_t* data, uint64_t size)
        : path_(std::move(path)), fd_(fd), data_(data), size_(size) {}
    std::string path_;
    int fd_ = -1;  // The open file until populate(), else -1.
    const uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
};

// Drops the whole pages inside [data, data + bytes) of a read-only file mapping (the bytes of a
// MappedFile) from this process's resident set (MADV_DONTNEED). The bytes stay readable: a later
// read faults them back in from the page cache or the file. For tensors the loader has copied
// (quantized on load, or repacked into row tiles), so that resident memory is what the model
// reads. Partial pages at either end are kept (a neighbouring tensor may live there).
void release_mapped_pages(const void* data, int64_t bytes);

// A tensor as stored: raw bytes of `dtype` in row-major order of `shape`.
struct TensorView {
    const TensorInfo* info = nullptr;
    const std::string* file = nullptr;  // Path of the file it lives in.
    const void* data = nullptr;
    int64_t nbytes = 0;

    DType dtype() const { return info->dtype; }
    const std::vector<int64_t>& shape() const { return info->shape; }
    int64_t numel() const;
};

// All tensors of a checkpoint directory, mapped.
class Checkpoint {
public:
    // Opens `dir`/model.safetensors.index.json and its shards when the index exists, else
    // `dir`/model.safetensors. Each file's header is checked before anything else of it is read;
    // with `populate` (to serve or convert it) the whole file is then read into memory, else
    // (to check it) only the header's pages are.
    static Result<std::unique_ptr<Checkpoint>> open_dir(const std::string& dir,
                                                        bool populate = true);
    // Opens the given files as one checkpoint (a tensor name may appear only once).
    static Result<std::unique_ptr<Checkpoint>> open_files(const std::vector<std::string>& paths,
                                                          bool populate = true);

    // The tensor, or kNotFound naming it and the checkpoint.
    Result<TensorView> tensor(std::string_view name) const;
    // The tensor checked to have exactly `dtype` among `allowed` and `shape`.
    Result<TensorView> tensor(std::string_view name, const std::vector<DType>& allowed,
                              const std::vector<int64_t>& shape) const;
    bool has(std::string_view name) const;
    // The header entry of `name` (dtype, shape, bytes), or nullptr; unlike tensor() it does not
    // count as reading the tensor (unread_names()).
    const TensorInfo* info(std::string_view name) const;
    // Where `name`'s bytes are mapped (nullptr when unknown); like info(), not a read.
    const void* mapped_data(std::string_view name) const;

    // Tensor names in sorted order.
    std::vector<std::string> names() const;
    // The names no tensor() call has asked for yet, in name order.
    std::vector<std::string> unread_names() const;
    // Sum of all tensors' bytes.
    int64_t total_bytes() const;
    // For digests of the weights' content: up to `n` bytes from each of the start, the middle and
    // the end of every tensor, in name order, read with pread without readahead (a read through
    // the mapping would fault in whole huge pages: on a large checkpoint, much of it). Only the
    // sampled pages are read (three per tensor); a read error ends the sample early (the caller
    // feeds it to a hash, where a short sample still differs). `feed` gets each piece.
    void content_sample(size_t n, const std::function<void(std::string_view)>& feed) const;
    // Description for messages ("dir/model.safetensors" or the index path).
    const std::string& description() const { return description_; }

private:
    struct Entry {
        size_t file = 0;
        const TensorInfo* info = nullptr;
    };
    Status add_file(const std::string& path, bool populate);

    std::string description_;
    mutable std::mutex read_mu_;
    mutable std::set<std::string_view> read_;  // Names tensor() handed out (entries_' keys).
    std::vector<std::unique_ptr<MappedFile>> files_;
    std::vector<std::unique_ptr<SafetensorsHeader>> headers_;
    std::map<std::string, Entry, std::less<>> entries_;
};

// Logs `checkpoint_tensors_unused` (count, bytes, the first names) when the model read only some
// of `checkpoint`'s tensors: config.json may not describe the checkpoint (num_hidden_layers,
// num_experts), or they belong to a part the engine does not run (DeepSeek-V3's multi-token
// prediction layer, ~12 GB; an lm_head stored beside tied embeddings). Their pages, which the
// mapping brought in with the rest, are released (release_mapped_pages); returns their bytes,
// which the model no longer counts as held. Call once loading is done, and not for one rank of a
// sharded model (the other ranks' tensors are unread by it, not unused).
int64_t release_unread_tensors(const Checkpoint& checkpoint);

// Human-readable "[a, b, c]".
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace edge::engine
