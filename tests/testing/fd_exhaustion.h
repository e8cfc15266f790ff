#pragma once

// FdExhaustion puts this process out of file descriptors for a test: it lowers RLIMIT_NOFILE to
// at most 512 and takes every descriptor left, so a server's next accept() fails. A test that
// needs a client socket makes it first (testing::tcp_socket) and connects it after: a descriptor
// left free for it could be taken in between by any other thread of the process. release() (or the
// destructor) gives them back and restores the limit. Not thread-safe; one at a time per process.

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace edge::testing {

class FdExhaustion {
public:
    FdExhaustion() {
        if (getrlimit(RLIMIT_NOFILE, &old_) != 0) {
            return;
        }
        rlimit low = old_;
        low.rlim_cur = std::min<rlim_t>(old_.rlim_cur, 512);
        restore_ = setrlimit(RLIMIT_NOFILE, &low) == 0;
        for (int fd; restore_ && (fd = ::dup(STDERR_FILENO)) >= 0;) {
            held_.push_back(fd);
        }
        filled_ = !held_.empty();
    }
    ~FdExhaustion() { release(); }
    FdExhaustion(const FdExhaustion&) = delete;
    FdExhaustion& operator=(const FdExhaustion&) = delete;

    // True when the descriptors were taken.
    bool filled() const { return filled_; }

    void release() {
        for (int fd : held_) {
            ::close(fd);
        }
        held_.clear();
        if (restore_) {
            setrlimit(RLIMIT_NOFILE, &old_);
            restore_ = false;
        }
    }

private:
    rlimit old_{};
    bool restore_ = false;
    bool filled_ = false;
    std::vector<int> held_;
};

}  // namespace edge::testing
