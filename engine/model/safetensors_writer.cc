#include "engine/model/safetensors_writer.h"

#include <boost/json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

namespace edge::engine {

Status write_raw_safetensors(const std::string& path, std::string_view header,
                             std::string_view data) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) {
        return internal_error(path + ": cannot create");
    }
    uint64_t len = header.size();
    char le[8];
    for (int i = 0; i < 8; ++i) {
        le[i] = static_cast<char>((len >> (8 * i)) & 0xff);
    }
    out.write(le, 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.close();
    if (!out) {
        return internal_error(path + ": write failed");
    }
    return ok_status();
}

namespace {

// Tensor data starts on a cache-line boundary (the header padded with spaces, as the format
// allows; the tensors whose size is a multiple of 64 first, so no padding between tensors is
// needed, which the format forbids), so every row of a mapped matrix whose row bytes are a
// multiple of 64 is line-aligned: with the 8-byte alignment the format requires, each bench-preset
// tensor started 40 bytes into a line and batched decode ran ~10% slower (bench_decode, batched
// 32 sequences: 312-327 against 353-355 tokens/s).
constexpr uint64_t kDataAlign = 64;

// Closes `out` (written to `partial`), syncs it and renames it over `path`; on failure removes
// it, so `path` stays as it was.
Status replace_with_partial(std::ofstream& out, const std::string& partial,
                            const std::string& path) {
    out.close();
    std::error_code ec;
    if (!out) {
        std::filesystem::remove(partial, ec);
        return internal_error(partial + ": write failed");
    }
    // Before the rename: renamed first, a power loss could leave `path` naming a file whose
    // bytes never reached the disk.
    if (Status synced = fsync_path(partial); !synced.ok()) {
        std::filesystem::remove(partial, ec);
        return synced;
    }
    std::filesystem::rename(partial, path, ec);
    if (ec) {
        std::error_code cleanup;  // Its own: the rename's error is the one to report.
        std::filesystem::remove(partial, cleanup);
        return internal_error(path + ": cannot replace with " + partial + ": " + ec.message());
    }
    return ok_status();
}

// Refuses a name given twice: the header, a JSON object, would keep one entry and the data
// section both tensors' bytes, leaving bytes no entry points at, which the reader refuses (after
// the whole write); or, across shards, the index would map the name to one of them.
Status check_unique_names(const std::string& where, const std::vector<TensorToWrite>& tensors) {
    std::set<std::string_view> names;
    for (const TensorToWrite& t : tensors) {
        if (!names.insert(t.name).second) {
            return invalid_argument_error(where + ": tensor '" + t.name +
                                          "' is given twice; a checkpoint holds one tensor of "
                                          "each name");
        }
    }
    return ok_status();
}

}  // namespace

uint64_t tensor_bytes(const TensorToWrite& t) {
    int64_t numel = 1;
    for (int64_t d : t.shape) {
        numel *= d;
    }
    return static_cast<uint64_t>(numel * dtype_size(t.dtype));
}

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& given,
                         const TensorWritten& written) {
    EDGE_RETURN_IF_ERROR(check_unique_names(path, given));
    // Line-multiple tensors first (each then starts on a line), in the given order, then the
    // rest by element size, largest first: each of those then starts at a multiple of its own
    // element size, which the reader requires (an F32 tensor written after a BF16 one of odd
    // length would not be). The order within one element size is the given one.
    std::vector<const TensorToWrite*> tensors;
    tensors.reserve(given.size());
    for (const TensorToWrite& t : given) {
        if (tensor_bytes(t) % kDataAlign == 0) {
            tensors.push_back(&t);
        }
    }
    const auto lines = static_cast<std::ptrdiff_t>(tensors.size());
    for (const TensorToWrite& t : given) {
        if (tensor_bytes(t) % kDataAlign != 0) {
            tensors.push_back(&t);
        }
    }
    std::stable_sort(tensors.begin() + lines, tensors.end(),
                     [](const TensorToWrite* a, const TensorToWrite* b) {
                         return dtype_size(a->dtype) > dtype_size(b->dtype);
                     });
    boost::json::object header;
    uint64_t offset = 0;
    for (const TensorToWrite* tp : tensors) {
        const TensorToWrite& t = *tp;
        const uint64_t nbytes = tensor_bytes(t);
        if (!t.fill && nbytes != t.bytes.size()) {
            return invalid_argument_error(path + ": tensor '" + t.name + "' has " +
                                          std::to_string(t.bytes.size()) + " bytes for shape " +
                                          shape_string(t.shape));
        }
        boost::json::array shape;
        for (int64_t d : t.shape) {
            shape.push_back(d);
        }
        header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                          {"shape", shape},
                          {"data_offsets", {offset, offset + nbytes}}};
        offset += nbytes;
    }
    std::string text = boost::json::serialize(header);
    while ((8 + text.size()) % kDataAlign != 0) {
        text += ' ';
    }
    const std::string partial = path + ".partial";
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) {
        return internal_error(partial + ": cannot create: " + std::strerror(errno));
    }
    uint64_t len = text.size();
    char le[8];
    for (int i = 0; i < 8; ++i) {
        le[i] = static_cast<char>((len >> (8 * i)) & 0xff);
    }
    out.write(le, 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    std::vector<char> buffer;
    for (const TensorToWrite* tp : tensors) {
        const TensorToWrite& t = *tp;
        const uint64_t nbytes = tensor_bytes(t);
        if (t.fill) {
            buffer.resize(nbytes);
            if (Status filled = t.fill(buffer.data()); !filled.ok()) {
                out.close();
                std::error_code ec;
                std::filesystem::remove(partial, ec);
                return filled.with_context(path + ": tensor '" + t.name + "'");
            }
            out.write(buffer.data(), static_cast<std::streamsize>(nbytes));
        } else {
            out.write(t.bytes.data(), static_cast<std::streamsize>(nbytes));
        }
        if (written) {
            written(t);
        }
    }
    return replace_with_partial(out, partial, path);
}

std::string shard_file_name(int index, int count) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", index, count);
    return name;
}

bool is_shard_file_name(std::string_view name) {
    // model-NNNNN-of-NNNNN.safetensors; Hugging Face pads to five digits, more are accepted.
    constexpr std::string_view kPrefix = "model-", kMiddle = "-of-", kSuffix = ".safetensors";
    if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) {
        return false;
    }
    name = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
    const size_t mid = name.find(kMiddle);
    auto digits = [](std::string_view d) {
        return d.size() >= 5 && std::all_of(d.begin(), d.end(), [](char c) {
                   return c >= '0' && c <= '9';
               });
    };
    return mid != std::string_view::npos && digits(name.substr(0, mid)) &&
           digits(name.substr(mid + kMiddle.size()));
}

Result<std::vector<std::string>> write_checkpoint_weights(const std::string& dir,
                                                          const std::vector<TensorToWrite>& tensors,
                                                          uint64_t max_shard_bytes,
                                                          const TensorWritten& written) {
    // Checked for all the shards before the first is written (each write checks only its own).
    EDGE_RETURN_IF_ERROR(check_unique_names(dir, tensors));
    // Greedy in the given order: a shard takes tensors until the next would pass the limit.
    std::vector<std::vector<TensorToWrite>> shards(1);
    uint64_t in_shard = 0;
    uint64_t total = 0;
    for (const TensorToWrite& t : tensors) {
        const uint64_t n = tensor_bytes(t);
        if (!shards.back().empty() && in_shard + n > max_shard_bytes) {
            shards.emplace_back();
            in_shard = 0;
        }
        shards.back().push_back(t);
        in_shard += n;
        total += n;
    }
    if (shards.size() == 1) {
        EDGE_RETURN_IF_ERROR(write_safetensors(dir + "/model.safetensors", shards[0], written));
        // The rename is durable only once the directory is.
        if (Status synced = fsync_path(dir); !synced.ok()) {
            std::error_code ec;
            std::filesystem::remove(dir + "/model.safetensors", ec);
            return synced;
        }
        return std::vector<std::string>{"model.safetensors"};
    }
    if (shards.size() > 99999) {
        return invalid_argument_error(dir + ": " + std::to_string(shards.size()) +
                                      " shards of at most " + std::to_string(max_shard_bytes) +
                                      " bytes; choose a larger shard size");
    }
    const int count = static_cast<int>(shards.size());
    std::vector<std::string> files;
    boost::json::object weight_map;
    // A failure leaves none of this write's files (the failed one's .partial is gone already).
    auto undo = [&](Status failed) {
        std::error_code ec;
        for (const std::string& f : files) {
            std::filesystem::remove(dir + "/" + f, ec);
        }
        return failed;
    };
    for (int i = 0; i < count; ++i) {
        const std::string name = shard_file_name(i + 1, count);
        if (Status st = write_safetensors(dir + "/" + name, shards[i], written); !st.ok()) {
            return undo(std::move(st));
        }
        files.push_back(name);
        for (const TensorToWrite& t : shards[i]) {
            weight_map[t.name] = name;
        }
    }
    boost::json::object index{{"metadata", {{"total_size", total}}},
                              {"weight_map", std::move(weight_map)}};
    if (Status st = write_text_file(dir + "/model.safetensors.index.json",
                                    boost::json::serialize(index) + "\n");
        !st.ok()) {
        return undo(std::move(st));
    }
    files.push_back("model.safetensors.index.json");
    // One directory sync for all the renames above.
    if (Status synced = fsync_path(dir); !synced.ok()) {
        return undo(std::move(synced));
    }
    return files;
}

Status write_text_file(const std::string& path, std::string_view text) {
    // Written beside and renamed over: a failed write leaves the old file whole.
    const std::string partial = path + ".partial";
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) {
        return internal_error(partial + ": cannot create: " + std::strerror(errno));
    }
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    return replace_with_partial(out, partial, path);
}

CheckpointDirLock::CheckpointDirLock(CheckpointDirLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

CheckpointDirLock& CheckpointDirLock::operator=(CheckpointDirLock&& other) noexcept {
    if (this != &other) {
        release();
        fd_ = std::exchange(other.fd_, -1);
        path_ = std::move(other.path_);
    }
    return *this;
}

void CheckpointDirLock::release() {
    if (fd_ < 0) {
        return;
    }
    // Unlinked while still locked: a writer that opened the old file then finds it unlinked
    // (acquire compares inodes) and tries again on a fresh one.
    ::unlink(path_.c_str());
    ::close(fd_);
    fd_ = -1;
}

Result<CheckpointDirLock> CheckpointDirLock::acquire(const std::string& dir) {
    CheckpointDirLock lock;
    lock.path_ = dir + "/" + kFileName;
    for (int attempt = 0; attempt < 100; ++attempt) {
        const int fd = ::open(lock.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            return internal_error(lock.path_ + ": cannot create: " + std::strerror(errno));
        }
        if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
            const int err = errno;
            ::close(fd);
            if (err == EWOULDBLOCK) {
                return failed_precondition_error(
                    "another quantize (or make-model) is writing " + dir + " (it holds " +
                    lock.path_ + "); wait for it to finish or choose another directory");
            }
            return internal_error(lock.path_ + ": cannot lock: " + std::strerror(err));
        }
        // Locked; but the holder before may have unlinked this file as it released it.
        struct stat held {};
        struct stat named {};
        if (::fstat(fd, &held) == 0 && ::stat(lock.path_.c_str(), &named) == 0 &&
            held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
            lock.fd_ = fd;
            return lock;
        }
        ::close(fd);
    }
    return internal_error(lock.path_ + ": cannot lock: replaced by other writers 100 times");
}

Result<CheckpointDirLock> prepare_checkpoint_dir(const std::string& out_dir,
                                                 const std::string& input_dir, bool overwrite) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!input_dir.empty() && fs::equivalent(out_dir, input_dir, ec)) {
        return invalid_argument_error(out_dir + ": is the input checkpoint " + input_dir +
                                      "; write to another directory");
    }
    if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec)) {
        return invalid_argument_error(out_dir + ": exists and is not a directory");
    }
    fs::create_directories(out_dir, ec);
    if (ec) {
        return internal_error(out_dir + ": cannot create: " + ec.message());
    }
    // Before anything in it is listed or removed: the other writer's files are its own.
    EDGE_ASSIGN_OR_RETURN(CheckpointDirLock lock, CheckpointDirLock::acquire(out_dir));
    // The weights of a sharded checkpoint: its index and shards (kCheckpointFiles names the rest).
    const auto is_shard_or_index = [](const std::string& name) {
        return name == "model.safetensors.index.json" || is_shard_file_name(name);
    };
    const auto is_checkpoint_file = [&](const std::string& name) {
        return is_shard_or_index(name) ||
               std::find_if(std::begin(kCheckpointFiles), std::end(kCheckpointFiles),
                            [&](const char* f) { return name == f; }) !=
                   std::end(kCheckpointFiles);
    };
    std::vector<fs::path> partial;
    std::vector<fs::path> replaced;  // With `overwrite`: the old checkpoint's index and shards.
    for (const fs::directory_entry& e : fs::directory_iterator(out_dir, ec)) {
        const std::string name = e.path().filename().string();
        // Without --force nothing of a checkpoint (whole or interrupted) is replaced.
        if (!overwrite && is_checkpoint_file(name)) {
            return invalid_argument_error(out_dir + ": already holds " + name +
                                          " (a checkpoint, or an interrupted write of one); "
                                          "pass --force to replace it, or choose another " +
                                          "directory");
        }
        if (is_shard_or_index(name)) {
            replaced.push_back(e.path());
        }
        // An interrupted write's leftovers: ours by name.
        if (e.path().extension() == ".partial" && is_checkpoint_file(e.path().stem().string())) {
            partial.push_back(e.path());
        }
    }
    if (ec) {
        return internal_error(out_dir + ": cannot list: " + ec.message());
    }
    for (const fs::path& p : partial) {
        fs::remove(p, ec);
    }
    if (overwrite) {
        // config.json first: from then on the directory is no checkpoint.
        for (const char* name : kCheckpointFiles) {
            if (!fs::remove(fs::path(out_dir) / name, ec) && ec) {
                return internal_error(out_dir + "/" + name + ": cannot remove: " + ec.message());
            }
        }
        for (const fs::path& p : replaced) {
            if (!fs::remove(p, ec) && ec) {
                return internal_error(p.string() + ": cannot remove: " + ec.message());
            }
        }
    }
    return lock;
}

}  // namespace edge::engine
