#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "engine/load_progress.h"
#include "engine/model/safetensors.h"

// MappedFile and release_mapped_pages (declared in safetensors.h): a checkpoint file mapped
// read-only, read into memory on populate(), and the pages of tensors no longer read given back.

namespace edge::engine {
namespace {

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
    void* reserve =
        mmap(nullptr, size + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
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

}  // namespace edge::engine
