#include "common/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace edge {

Result<std::string> read_small_file(const std::string& path, uint64_t max_bytes) {
    // O_NONBLOCK: opening a FIFO does not wait for a writer; fstat then refuses it.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        return not_found_error(path + ": cannot open: " + std::strerror(errno));
    }
    struct stat st {};
    std::string out;
    Status status;
    if (::fstat(fd, &st) != 0) {
        status = data_loss_error(path + ": cannot stat: " + std::strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        status = invalid_argument_error(path + ": not a regular file");
    } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
        status = invalid_argument_error(path + ": larger than " + std::to_string(max_bytes) +
                                        " bytes (" + std::to_string(st.st_size) + ")");
    } else {
        out.resize(static_cast<size_t>(st.st_size));
        size_t got = 0;
        while (got < out.size()) {
            const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                status = data_loss_error(path + ": read failed" +
                                         (n < 0 ? std::string(": ") + std::strerror(errno)
                                                : std::string(": shorter than its size")));
                break;
            }
            got += static_cast<size_t>(n);
        }
    }
    ::close(fd);
    if (!status.ok()) {
        return status;
    }
    return out;
}

namespace {

Status write_all(int fd, std::string_view text) {
    while (!text.empty()) {
        const ssize_t n = ::write(fd, text.data(), text.size());
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return unavailable_error(std::string("write: ") + std::strerror(errno));
        }
        text.remove_prefix(static_cast<size_t>(n));
    }
    return ok_status();
}

}  // namespace

Status fsync_path(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return internal_error(path + ": cannot open to fsync: " + std::strerror(errno));
    }
    const int synced = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (synced != 0) {
        return internal_error(path + ": fsync failed: " + std::strerror(err));
    }
    return ok_status();
}

Status write_file_atomically(const std::string& path, std::string_view text) {
    const std::string tmp = path + ".tmp";
    const auto fail = [&](const std::string& what) {
        return unavailable_error(what + ": " + std::strerror(errno));
    };
    // O_EXCL | O_NOFOLLOW: a file or symlink left at the temporary name (a crash mid-write, or
    // planted) is never written through; it is removed (unlink does not follow a symlink) and
    // the file created afresh.
    constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    int fd = ::open(tmp.c_str(), kFlags, 0600);
    if (fd < 0 && errno == EEXIST && ::unlink(tmp.c_str()) == 0) {
        fd = ::open(tmp.c_str(), kFlags, 0600);
    }
    if (fd < 0) {
        return fail("cannot create " + tmp);
    }
    Status st = write_all(fd, text).with_context(tmp);
    if (st.ok() && ::fsync(fd) != 0) {
        st = fail("fsync " + tmp);
    }
    if (::close(fd) != 0 && st.ok()) {
        st = fail("close " + tmp);
    }
    if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
        st = fail("rename " + tmp + " to " + path);
    }
    if (!st.ok()) {
        ::unlink(tmp.c_str());
        return st;
    }
    // The rename itself reaches the disk with the directory.
    std::string dir = std::filesystem::path(path).parent_path().string();
    if (dir.empty()) {
        dir = ".";
    }
    (void)fsync_path(dir);  // The file is in place; a directory that cannot sync changes nothing.
    return ok_status();
}

}  // namespace edge
