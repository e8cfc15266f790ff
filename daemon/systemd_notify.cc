#include "daemon/systemd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace edge::daemon {

SystemdNotifier::SystemdNotifier(std::string notify_socket, std::string_view watchdog_usec,
                                 std::string_view watchdog_pid)
    : socket_path_(std::move(notify_socket)) {
    uint64_t usec = 0;
    auto [end, ec] =
        std::from_chars(watchdog_usec.data(), watchdog_usec.data() + watchdog_usec.size(), usec);
    bool pid_ok = true;
    if (!watchdog_pid.empty()) {
        int64_t pid = 0;
        auto [pend, pec] =
            std::from_chars(watchdog_pid.data(), watchdog_pid.data() + watchdog_pid.size(), pid);
        pid_ok = pec == std::errc() && pid == static_cast<int64_t>(getpid());
    }
    if (!watchdog_usec.empty() && ec == std::errc() && usec > 0 && pid_ok) {
        interval_ = std::chrono::microseconds(usec / 2);
    }
}

Status SystemdNotifier::notify(std::string_view state) const {
    if (socket_path_.empty()) {
        return ok_status();
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (socket_path_.size() >= sizeof(addr.sun_path) ||
        (socket_path_[0] != '/' && socket_path_[0] != '@')) {
        return invalid_argument_error("NOTIFY_SOCKET '" + socket_path_ +
                                      "' is not an absolute path or abstract name");
    }
    std::memcpy(addr.sun_path, socket_path_.data(), socket_path_.size());
    if (addr.sun_path[0] == '@') {
        addr.sun_path[0] = '\0';
    }
    socklen_t len =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_path_.size());
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return unavailable_error(std::string("socket(AF_UNIX): ") + std::strerror(errno));
    }
    ssize_t sent = sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                          reinterpret_cast<sockaddr*>(&addr), len);
    int err = errno;
    close(fd);
    if (sent < 0) {
        return unavailable_error("sendto(" + socket_path_ + "): " + std::strerror(err));
    }
    return ok_status();
}

}  // namespace edge::daemon
