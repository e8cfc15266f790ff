#pragma once

// Socket activation: systemd (or any supervisor speaking the same protocol) passes listening
// sockets as descriptors 3, 4, ... and names how many in $LISTEN_FDS, for the process $LISTEN_PID.
// parse_listen_fds() reads those values (passed in, so it is pure and testable);
// take_listen_fds() reads and then clears the environment so children do not inherit them, and
// marks the descriptors close-on-exec. Call take_listen_fds() once, from the main thread, before
// any other thread starts (it changes the environment).

#include <sys/types.h>

#include <string_view>
#include <vector>

#include "common/result.h"

namespace edge::daemon {

// First descriptor systemd passes (SD_LISTEN_FDS_START).
inline constexpr int kListenFdsStart = 3;

// The inherited descriptors: empty when `listen_pid` is empty or names another process (the
// variables were meant for a parent), or `listen_fds` is empty or "0". Errors for malformed
// numbers or an absurd count.
Result<std::vector<int>> parse_listen_fds(std::string_view listen_pid, std::string_view listen_fds,
                                          pid_t self);

// parse_listen_fds() on $LISTEN_PID/$LISTEN_FDS for getpid(); unsets LISTEN_PID, LISTEN_FDS and
// LISTEN_FDNAMES; sets FD_CLOEXEC on each descriptor returned; an error unless each is a listening
// TCP socket (tls::check_listening_socket()).
Result<std::vector<int>> take_listen_fds();

}  // namespace edge::daemon
