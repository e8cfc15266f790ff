#pragma once

// SystemdNotifier speaks systemd's Type=notify protocol: datagrams such as "READY=1",
// "STOPPING=1", "WATCHDOG=1" sent to the unix socket named by $NOTIFY_SOCKET (a path, or an
// abstract name starting with '@'). Built from the environment values the caller passes in; a
// notifier without a socket does nothing. Thread-safe (each send is one sendto()).

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace edge::daemon {

class SystemdNotifier {
public:
    // notify_socket: $NOTIFY_SOCKET or "" ; watchdog_usec / watchdog_pid: $WATCHDOG_USEC and
    // $WATCHDOG_PID or "" (the watchdog applies when the pid is empty or ours).
    SystemdNotifier(std::string notify_socket, std::string_view watchdog_usec,
                    std::string_view watchdog_pid);

    bool enabled() const { return !socket_path_.empty(); }
    Status notify(std::string_view state) const;

    // Half the watchdog timeout (how often to send WATCHDOG=1), when a watchdog is configured.
    std::optional<std::chrono::microseconds> watchdog_interval() const { return interval_; }

private:
    std::string socket_path_;
    std::optional<std::chrono::microseconds> interval_;
};

}  // namespace edge::daemon
