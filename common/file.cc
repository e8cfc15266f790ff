#include "common/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

}  // namespace edge
