#include "daemon/socket_activation.h"

#include <fcntl.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <string>

#include "tls/http_server.h"

namespace edge::daemon {
namespace {

// A decimal number without sign or padding; nullopt-like -1 when malformed.
int64_t parse_decimal(std::string_view s) {
    if (s.empty() || s.size() > 18) {
        return -1;
    }
    int64_t value = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size() || value < 0) {
        return -1;
    }
    return value;
}

}  // namespace

Result<std::vector<int>> parse_listen_fds(std::string_view listen_pid, std::string_view listen_fds,
                                          pid_t self) {
    if (listen_pid.empty() || listen_fds.empty()) {
        return std::vector<int>{};
    }
    int64_t pid = parse_decimal(listen_pid);
    if (pid <= 0) {
        return invalid_argument_error("LISTEN_PID='" + std::string(listen_pid) +
                                      "' is not a process id");
    }
    if (pid != self) {
        return std::vector<int>{};
    }
    int64_t count = parse_decimal(listen_fds);
    if (count < 0 || count > 1024) {
        return invalid_argument_error("LISTEN_FDS='" + std::string(listen_fds) +
                                      "' is not a descriptor count (0..1024)");
    }
    std::vector<int> fds;
    for (int64_t i = 0; i < count; ++i) {
        fds.push_back(kListenFdsStart + static_cast<int>(i));
    }
    return fds;
}

Result<std::vector<int>> take_listen_fds() {
    const char* pid = std::getenv("LISTEN_PID");
    const char* fds = std::getenv("LISTEN_FDS");
    Result<std::vector<int>> parsed = parse_listen_fds(pid ? pid : "", fds ? fds : "", getpid());
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (!parsed.ok()) {
        return parsed;
    }
    for (int fd : *parsed) {
        int flags = fcntl(fd, F_GETFD);
        if (flags < 0) {
            return invalid_argument_error("LISTEN_FDS names descriptor " + std::to_string(fd) +
                                          ", which is not open");
        }
        fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
        // Checked now, before the models load (minutes, for a large checkpoint, each time
        // Restart=on-failure tries again), not when the listener takes it over.
        EDGE_RETURN_IF_ERROR(tls::check_listening_socket(fd));
    }
    return parsed;
}

}  // namespace edge::daemon
