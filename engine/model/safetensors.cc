#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "common/file.h"
#include "common/json_text.h"
#include "common/log.h"
#include "engine/load_progress.h"

namespace edge::engine {
namespace {

namespace json = boost::json;

struct DTypeName {
    std::string_view name;
    DType dtype;
    int64_t size;
};
constexpr DTypeName kDTypes[] = {
    {"BF16", DType::kBF16, 2}, {"F16", DType::kF16, 2},  {"F32", DType::kF32, 4},
    {"F8_E4M3", DType::kF8E4M3, 1}, {"I8", DType::kI8, 1}, {"I32", DType::kI32, 4},
    {"I64", DType::kI64, 8},
};

std::string quote(std::string_view s) {
    std::string out = "'";
    for (char c : s.substr(0, 200)) {
        unsigned char u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
            out += '?';
        } else {
            out += c;
        }
    }
    return out + "'";
}

// Reads a JSON number that must be a non-negative integer.
bool non_negative_int(const json::value& v, int64_t* out) {
    if (v.is_int64()) {
        if (v.get_int64() < 0) {
            return false;
        }
        *out = v.get_int64();
        return true;
    }
    if (v.is_uint64()) {
        if (v.get_uint64() > static_cast<uint64_t>(INT64_MAX)) {
            return false;
        }
        *out = static_cast<int64_t>(v.get_uint64());
        return true;
    }
    return false;
}

Result<TensorInfo> parse_entry(std::string_view file, const std::string& name,
                               const json::value& v, uint64_t data_size) {
    auto bad = [&](const std::string& what) {
        return Status(StatusCode::kDataLoss,
                      std::string(file) + ": tensor " + quote(name) + ": " + what);
    };
    if (!v.is_object()) {
        return bad("header entry is not an object");
    }
    const json::object& o = v.get_object();
    TensorInfo info;
    info.name = name;

    const json::value* dt = o.if_contains("dtype");
    if (dt == nullptr || !dt->is_string()) {
        return bad("missing or non-string 'dtype'");
    }
    std::string_view dts(dt->get_string());
    const DTypeName* found = nullptr;
    for (const DTypeName& d : kDTypes) {
        if (d.name == dts) {
            found = &d;
        }
    }
    if (found == nullptr) {
        return bad("unsupported dtype " + quote(dts));
    }
    info.dtype = found->dtype;

    const json::value* sh = o.if_contains("shape");
    if (sh == nullptr || !sh->is_array()) {
        return bad("missing or non-array 'shape'");
    }
    if (sh->get_array().size() > 8) {
        return bad("shape has more than 8 dimensions");
    }
    int64_t numel = 1;
    for (const json::value& d : sh->get_array()) {
        int64_t dim = 0;
        if (!non_negative_int(d, &dim)) {
            return bad("shape has a dimension that is not a non-negative integer");
        }
        info.shape.push_back(dim);
        if (__builtin_mul_overflow(numel, dim, &numel)) {
            return bad("shape " + shape_string(info.shape) + " overflows");
        }
    }
    int64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, found->size, &nbytes)) {
        return bad("shape " + shape_string(info.shape) + " overflows");
    }

    const json::value* off = o.if_contains("data_offsets");
    if (off == nullptr || !off->is_array() || off->get_array().size() != 2) {
        return bad("missing 'data_offsets' [begin, end]");
    }
    if (!non_negative_int(off->get_array()[0], &info.begin) ||
        !non_negative_int(off->get_array()[1], &info.end)) {
        return bad("data_offsets are not non-negative integers");
    }
    if (info.end < info.begin) {
        return bad("data_offsets end " + std::to_string(info.end) + " before begin " +
                   std::to_string(info.begin));
    }
    if (static_cast<uint64_t>(info.end) > data_size) {
        return bad("data_offsets end " + std::to_string(info.end) +
                   " is past the data section (" + std::to_string(data_size) +
                   " bytes; file truncated?)");
    }
    if (info.end - info.begin != nbytes) {
        return bad("data_offsets span " + std::to_string(info.end - info.begin) +
                   " bytes but dtype " + std::string(found->name) + " shape " +
                   shape_string(info.shape) + " needs " + std::to_string(nbytes));
    }
    if (info.begin % found->size != 0) {
        return bad("data offset " + std::to_string(info.begin) + " is not aligned to " +
                   std::to_string(found->size) + " bytes");
    }
    return info;
}

// Maps `size` bytes of `fd` read-only at a 2 MiB-aligned address; populate_weights() then faults
// every page in (so the first forward pays no fault per page and resident memory after load is
// the weights). The alignment and MADV_HUGEPAGE let the kernel map the page cache's large folios
// with 2 MiB page-table entries: decode streams the whole file once per token, and with 4 KiB
// entries the TLB misses cost a measurable share of the bandwidth (bench_decode --profile single
// at 2 threads: ~3% more tokens/s). Pages read from disk now come in as 2 MiB folios (the fault
// readahead of a VM_HUGEPAGE mapping); what the page cache already holds in smaller folios is
// mapped as it is (FilePmdMapped in /proc/PID/smaps shows how much got 2 MiB entries). All hints
// are best-effort: a kernel or filesystem without them leaves an ordinary mapping.
void* map_weights(int fd, uint64_t size) {
    constexpr uint64_t kHuge = uint64_t{2} << 20;
    void* p = MAP_FAILED;
    void* reserve = mmap(nullptr, size + kHuge, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reserve != MAP_FAILED) {
        const auto base = reinterpret_cast<uintptr_t>(reserve);
        const uintptr_t aligned = (base + kHuge - 1) & ~(kHuge - 1);
        p = mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
        if (p == MAP_FAILED) {
            munmap(reserve, size + kHuge);
        } else {
            // Give back the unused head and tail of the reservation.
            const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
            const uintptr_t end = (aligned + size + page - 1) & ~(page - 1);
            if (aligned > base) {
                munmap(reserve, aligned - base);
            }
            if (base + size + kHuge > end) {
                munmap(reinterpret_cast<void*>(end), base + size + kHuge - end);
            }
        }
    }
    if (p == MAP_FAILED) {
        return mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    }
#if defined(MADV_HUGEPAGE)
    madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

// "PATH: bytes A..B" for messages about a range of a file.
std::string byte_range(const std::string& path, uint64_t begin, uint64_t end) {
    return path + ": bytes " + std::to_string(begin) + ".." + std::to_string(end);
}

// kDataLoss when `fd` is now shorter than `end` bytes: touching the mapping past the end of the
// file would raise SIGBUS.
Status check_file_reaches(int fd, const std::string& path, uint64_t begin, uint64_t end) {
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        const int err = errno;
        return internal_error(path + ": fstat failed: " + std::strerror(err));
    }
    if (static_cast<uint64_t>(st.st_size) < end) {
        return data_loss_error(byte_range(path, begin, end) + " cannot be read: the file is now " +
                               std::to_string(st.st_size) + " bytes (truncated while loading)");
    }
    return ok_status();
}

// Faults in [p, p + size), the mapping of `fd` (named `path`), 256 MiB at a time, noting each
// step as load progress (a terabyte checkpoint takes minutes to read: the daemon's load heartbeat
// watches the count). MADV_POPULATE_READ reports a range it cannot read (the file shrank after it
// was mapped, or the disk returned an I/O error) as EFAULT, where touching the pages would raise
// SIGBUS and kill the daemon: that is a kDataLoss naming the file and the range. Only a kernel
// without MADV_POPULATE_READ (before 5.14: EINVAL) gets the fallback of touching every page,
// after checking that the file still covers the step.
Status populate_weights(int fd, const std::string& path, const uint8_t* p, uint64_t size) {
    constexpr uint64_t kStep = uint64_t{256} << 20;  // A multiple of 2 MiB (huge pages).
    const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
#if defined(MADV_POPULATE_READ)
    bool touch = false;
#else
    bool touch = true;
#endif
    for (uint64_t at = 0; at < size; at += kStep) {
        const uint64_t n = std::min(kStep, size - at);
        void* start = const_cast<uint8_t*>(p + at);
#if defined(MADV_POPULATE_READ)
        if (!touch) {
            int rc = 0;
            do {
                rc = madvise(start, n, MADV_POPULATE_READ);
            } while (rc != 0 && errno == EINTR);
            const int err = rc == 0 ? 0 : errno;
            if (err == EINVAL || err == ENOSYS) {
                touch = true;
            } else if (err == ENOMEM) {
                return resource_exhausted_error(byte_range(path, at, at + n) +
                                                ": out of memory reading the file into memory");
            } else if (err != 0) {
                return data_loss_error(byte_range(path, at, at + n) +
                                       " cannot be read (truncated or I/O error while loading): " +
                                       std::strerror(err));
            }
        }
#endif
        if (touch) {
            // Narrows, but cannot close, the window in which a truncation SIGBUSes the touch.
            EDGE_RETURN_IF_ERROR(check_file_reaches(fd, path, at, at + n));
            madvise(start, n, MADV_WILLNEED);
            volatile uint8_t sink = 0;
            for (uint64_t off = 0; off < n; off += page) {
                sink = sink + static_cast<const volatile uint8_t*>(start)[off];
            }
        }
        note_weight_bytes_read(static_cast<int64_t>(n));
    }
    return ok_status();
}

}  // namespace

void release_mapped_pages(const void* data, int64_t bytes) {
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto begin = reinterpret_cast<uintptr_t>(data);
    const uintptr_t first = (begin + page - 1) & ~(page - 1);
    const uintptr_t last = (begin + static_cast<uintptr_t>(bytes)) & ~(page - 1);
    if (bytes > 0 && last > first) {
        madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
    }
}

std::string_view dtype_name(DType dtype) {
    for (const DTypeName& d : kDTypes) {
        if (d.dtype == dtype) {
            return d.name;
        }
    }
    return "?";
}

int64_t dtype_size(DType dtype) {
    for (const DTypeName& d : kDTypes) {
        if (d.dtype == dtype) {
            return d.size;
        }
    }
    return 1;
}

std::string shape_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        s += (i ? ", " : "") + std::to_string(shape[i]);
    }
    return s + "]";
}

int64_t TensorView::numel() const { return nbytes / dtype_size(info->dtype); }

Result<SafetensorsHeader> parse_safetensors_header(std::string_view prefix, uint64_t file_size,
                                                   std::string_view file_name) {
    const std::string file(file_name);
    if (file_size < 8 || prefix.size() < 8) {
        return data_loss_error(file + ": " + std::to_string(file_size) +
                               " bytes is too short for a safetensors header");
    }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) {
        header_len = (header_len << 8) | static_cast<uint8_t>(prefix[i]);
    }
    if (header_len > kMaxSafetensorsHeaderBytes) {
        return data_loss_error(file + ": header length " + std::to_string(header_len) +
                               " is larger than the limit " +
                               std::to_string(kMaxSafetensorsHeaderBytes));
    }
    if (header_len > file_size - 8 || header_len > prefix.size() - 8) {
        return data_loss_error(file + ": header length " + std::to_string(header_len) +
                               " is past the end of the file (" + std::to_string(file_size) +
                               " bytes; truncated?)");
    }
    std::string_view text = prefix.substr(8, header_len);
    EDGE_ASSIGN_OR_RETURN(
        const json::object root,
        parse_json_object(text, file + ": header (from byte 8)", StatusCode::kDataLoss));
    SafetensorsHeader header;
    header.data_offset = static_cast<int64_t>(8 + header_len);
    const uint64_t data_size = file_size - 8 - header_len;
    for (const auto& kv : root) {
        std::string name(kv.key());
        if (name == "__metadata__") {
            if (!kv.value().is_object()) {
                return data_loss_error(file + ": __metadata__ is not an object");
            }
            continue;
        }
        if (name.empty()) {
            return data_loss_error(file + ": tensor with an empty name");
        }
        if (name.size() > kMaxTensorNameBytes) {
            // Real names are module paths of a few dozen bytes; a megabyte-long one only costs
            // every later step that matches or copies it.
            return data_loss_error(file + ": tensor name of " + std::to_string(name.size()) +
                                   " bytes (at most " + std::to_string(kMaxTensorNameBytes) +
                                   "), beginning " + quote(name.substr(0, 64)));
        }
        EDGE_ASSIGN_OR_RETURN(TensorInfo info, parse_entry(file, name, kv.value(), data_size));
        header.tensors.push_back(std::move(info));
    }
    std::sort(header.tensors.begin(), header.tensors.end(),
              [](const TensorInfo& a, const TensorInfo& b) {
                  return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
              });
    // The tensors tile the data section exactly, as the format requires. Bytes that belong to
    // no tensor are most likely a tensor named twice in the header (JSON keeps the last entry,
    // so the first one's bytes are orphaned) or a corrupt offset.
    int64_t covered = 0;
    const TensorInfo* prev = nullptr;
    for (const TensorInfo& t : header.tensors) {
        if (prev != nullptr && t.begin < prev->end) {
            return data_loss_error(file + ": tensor " + quote(t.name) + " (bytes " +
                                   std::to_string(t.begin) + ".." + std::to_string(t.end) +
                                   ") overlaps tensor " + quote(prev->name) + " (bytes " +
                                   std::to_string(prev->begin) + ".." +
                                   std::to_string(prev->end) + ")");
        }
        if (t.begin != covered) {
            return data_loss_error(
                file + ": data bytes " + std::to_string(covered) + ".." +
                std::to_string(t.begin) + " belong to no tensor (before " + quote(t.name) +
                "; a tensor named twice in the header, or a corrupt data_offsets?)");
        }
        covered = t.end;
        prev = &t;
    }
    if (static_cast<uint64_t>(covered) != data_size) {
        return data_loss_error(file + ": data bytes " + std::to_string(covered) + ".." +
                               std::to_string(data_size) +
                               " after the last tensor belong to no tensor (a tensor named "
                               "twice in the header, or bytes appended to the file?)");
    }
    // The offsets above are aligned within the data section; the section itself must start at a
    // multiple of 8 for the tensors to be aligned in the mapping (BF16 and F32 weights are read
    // through typed pointers). The safetensors library pads its headers to that; checked last, so
    // the checks of the entries still run on a file that fails only this one.
    if (header.data_offset % 8 != 0) {
        return data_loss_error(
            file + ": header length " + std::to_string(header_len) +
            " puts the data section at byte " + std::to_string(header.data_offset) +
            ", not a multiple of 8, so its tensors would be misaligned; re-save the checkpoint "
            "with the safetensors library (which pads the header to a multiple of 8)");
    }
    return header;
}

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
    // O_NONBLOCK: a FIFO in a file's place would block the open until a writer came (the check
    // below then refuses it); it changes nothing for a regular file.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        return Status(err == ENOENT ? StatusCode::kNotFound : StatusCode::kPermissionDenied,
                      path + ": cannot open: " + std::strerror(err));
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return invalid_argument_error(path + ": not a regular file");
    }
    uint64_t size = static_cast<uint64_t>(st.st_size);
    const uint8_t* data = nullptr;
    if (size > 0) {
        void* p = map_weights(fd, size);
        if (p == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            return internal_error(path + ": mmap failed: " + std::strerror(err));
        }
        data = static_cast<const uint8_t*>(p);
    }
    return std::unique_ptr<MappedFile>(new MappedFile(path, fd, data, size));
}

Status MappedFile::populate() {
    const int fd = std::exchange(fd_, -1);
    if (fd < 0) {
        return failed_precondition_error(path_ + ": populate() called twice");
    }
    Status status = ok_status();
    if (data_ != nullptr) {
        status = populate_weights(fd, path_, data_, size_);
    }
    if (status.ok()) {
        // A file rewritten in place while it was read: pages read before the change hold the
        // old bytes, and a shrink makes later reads of the tail SIGBUS.
        struct stat st {};
        if (fstat(fd, &st) != 0) {
            const int err = errno;
            status = internal_error(path_ + ": fstat failed: " + std::strerror(err));
        } else if (static_cast<uint64_t>(st.st_size) != size_) {
            status =
                data_loss_error(path_ + ": changed size while loading (" + std::to_string(size_) +
                                " bytes when opened, " + std::to_string(st.st_size) +
                                " now): is it being rewritten? Load it again once it is "
                                "complete");
        }
    }
    ::close(fd);
    return status;
}

MappedFile::~MappedFile() {
    if (data_ != nullptr) {
        munmap(const_cast<uint8_t*>(data_), size_);
    }
    if (fd_ >= 0) {
        ::close(fd_);
    }
}

Status Checkpoint::add_file(const std::string& path, bool populate) {
    EDGE_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
    std::string_view bytes(reinterpret_cast<const char*>(file->data()), file->size());
    // The header first (only its pages are read): a corrupt file is refused before its weights
    // are read.
    EDGE_ASSIGN_OR_RETURN(SafetensorsHeader header,
                          parse_safetensors_header(bytes, file->size(), path));
    if (populate) {
        EDGE_RETURN_IF_ERROR(file->populate());
    }
    auto owned = std::make_unique<SafetensorsHeader>(std::move(header));
    size_t index = files_.size();
    for (const TensorInfo& info : owned->tensors) {
        if (entries_.count(info.name) != 0) {
            return data_loss_error(path + ": tensor '" + info.name + "' is also in " +
                                   files_[entries_.find(info.name)->second.file]->path());
        }
        entries_.emplace(info.name, Entry{index, &info});
    }
    files_.push_back(std::move(file));
    headers_.push_back(std::move(owned));
    return ok_status();
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open_files(const std::vector<std::string>& paths,
                                                           bool populate) {
    auto ckpt = std::unique_ptr<Checkpoint>(new Checkpoint());
    for (const std::string& p : paths) {
        EDGE_RETURN_IF_ERROR(ckpt->add_file(p, populate));
    }
    ckpt->description_ = paths.size() == 1 ? paths[0] : std::to_string(paths.size()) + " files";
    return ckpt;
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open_dir(const std::string& dir, bool populate) {
    const std::string index_path = dir + "/model.safetensors.index.json";
    std::error_code missing;
    if (!std::filesystem::exists(index_path, missing)) {
        return open_files({dir + "/model.safetensors"}, populate);
    }
    EDGE_ASSIGN_OR_RETURN(std::string index_text, read_small_file(index_path));
    EDGE_ASSIGN_OR_RETURN(const json::object root,
                          parse_json_object(index_text, index_path, StatusCode::kDataLoss));
    const json::value* map = root.if_contains("weight_map");
    if (map == nullptr || !map->is_object()) {
        return data_loss_error(index_path + ": missing object 'weight_map'");
    }
    std::vector<std::string> shards;
    std::map<std::string, std::string> wanted;
    for (const auto& kv : map->get_object()) {
        if (!kv.value().is_string()) {
            return data_loss_error(index_path + ": weight_map entry '" + std::string(kv.key()) +
                                   "' is not a file name");
        }
        std::string shard(kv.value().get_string());
        if (shard.empty() || shard.find('/') != std::string::npos || shard == "." ||
            shard == "..") {
            return data_loss_error(index_path + ": weight_map entry '" + std::string(kv.key()) +
                                   "' names an invalid file '" + shard + "'");
        }
        if (std::find(shards.begin(), shards.end(), shard) == shards.end()) {
            shards.push_back(shard);
        }
        wanted[std::string(kv.key())] = shard;
    }
    std::vector<std::string> paths;
    for (const std::string& s : shards) {
        paths.push_back(dir + "/" + s);
    }
    EDGE_ASSIGN_OR_RETURN(auto ckpt, open_files(paths, populate));
    for (const auto& [name, shard] : wanted) {
        auto it = ckpt->entries_.find(name);
        if (it == ckpt->entries_.end()) {
            return data_loss_error(index_path + ": tensor '" + name + "' is not in " + shard);
        }
        if (ckpt->files_[it->second.file]->path() != dir + "/" + shard) {
            return data_loss_error(index_path + ": tensor '" + name + "' is listed in " + shard +
                                   " but found in " + ckpt->files_[it->second.file]->path());
        }
    }
    ckpt->description_ = index_path;
    return ckpt;
}

bool Checkpoint::has(std::string_view name) const { return entries_.find(name) != entries_.end(); }

const TensorInfo* Checkpoint::info(std::string_view name) const {
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : it->second.info;
}

std::vector<std::string> Checkpoint::unread_names() const {
    std::lock_guard lock(read_mu_);
    std::vector<std::string> out;
    for (const auto& [name, entry] : entries_) {
        if (!read_.contains(name)) {
            out.push_back(name);
        }
    }
    return out;
}

int64_t release_unread_tensors(const Checkpoint& checkpoint) {
    const std::vector<std::string> unread = checkpoint.unread_names();
    if (unread.empty()) {
        return 0;
    }
    int64_t bytes = 0;
    std::string first;
    for (size_t i = 0; i < unread.size(); ++i) {
        if (const TensorInfo* t = checkpoint.info(unread[i])) {
            bytes += t->end - t->begin;
            release_mapped_pages(checkpoint.mapped_data(unread[i]), t->end - t->begin);
        }
        if (i < 4) {
            first += (first.empty() ? "" : ", ") + unread[i];
        }
    }
    log::warn("checkpoint_tensors_unused",
              {{"checkpoint", checkpoint.description()},
               {"count", static_cast<uint64_t>(unread.size())},
               {"bytes", bytes},
               {"first", first},
               {"detail", "the model does not read them: config.json may not describe this "
                          "checkpoint (num_hidden_layers, num_experts, ...), or they belong to a "
                          "part the engine does not run (DeepSeek-V3's multi-token prediction "
                          "layer); their pages are released"}});
    return bytes;
}

void Checkpoint::content_sample(size_t n,
                                const std::function<void(std::string_view)>& feed) const {
    struct Fds {
        std::vector<int> fd;
        ~Fds() {
            for (int f : fd) {
                if (f >= 0) {
                    ::close(f);
                }
            }
        }
    } fds{std::vector<int>(files_.size(), -1)};
    std::vector<char> buf(n);
    for (const auto& [name, entry] : entries_) {
        int& fd = fds.fd[entry.file];
        if (fd < 0) {
            fd = ::open(files_[entry.file]->path().c_str(), O_RDONLY | O_CLOEXEC);
            if (fd < 0) {
                return;
            }
            ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
        }
        const int64_t base = headers_[entry.file]->data_offset + entry.info->begin;
        const int64_t size = entry.info->end - entry.info->begin;
        const int64_t take = std::min<int64_t>(static_cast<int64_t>(n), size);
        for (int64_t at : {int64_t{0}, (size - take) / 2, size - take}) {
            if (::pread(fd, buf.data(), static_cast<size_t>(take), base + at) != take) {
                return;
            }
            feed(std::string_view(buf.data(), static_cast<size_t>(take)));
        }
    }
}

const void* Checkpoint::mapped_data(std::string_view name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
        return nullptr;
    }
    return files_[it->second.file]->data() + headers_[it->second.file]->data_offset +
           it->second.info->begin;
}

Result<TensorView> Checkpoint::tensor(std::string_view name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
        return not_found_error(description_ + ": tensor '" + std::string(name) + "' is missing");
    }
    {
        std::lock_guard lock(read_mu_);
        read_.insert(it->first);
    }
    const MappedFile& f = *files_[it->second.file];
    const SafetensorsHeader& h = *headers_[it->second.file];
    TensorView v;
    v.info = it->second.info;
    v.file = &f.path();
    v.data = f.data() + h.data_offset + v.info->begin;
    v.nbytes = v.info->end - v.info->begin;
    return v;
}

Result<TensorView> Checkpoint::tensor(std::string_view name, const std::vector<DType>& allowed,
                                      const std::vector<int64_t>& shape) const {
    EDGE_ASSIGN_OR_RETURN(TensorView v, tensor(name));
    if (std::find(allowed.begin(), allowed.end(), v.dtype()) == allowed.end()) {
        std::string want;
        for (DType d : allowed) {
            want += (want.empty() ? "" : "/") + std::string(dtype_name(d));
        }
        return invalid_argument_error(*v.file + ": tensor '" + std::string(name) + "' has dtype " +
                                      std::string(dtype_name(v.dtype())) + ", expected " + want);
    }
    if (v.shape() != shape) {
        return invalid_argument_error(*v.file + ": tensor '" + std::string(name) + "' has shape " +
                                      shape_string(v.shape()) + ", expected " +
                                      shape_string(shape));
    }
    return v;
}

std::vector<std::string> Checkpoint::names() const {
    std::vector<std::string> out;
    for (const auto& kv : entries_) {
        out.push_back(kv.first);
    }
    return out;
}

int64_t Checkpoint::total_bytes() const {
    int64_t total = 0;
    for (const auto& kv : entries_) {
        total += kv.second.info->end - kv.second.info->begin;
    }
    return total;
}

}  // namespace edge::engine
