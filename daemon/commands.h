#pragma once

// The edgeserve subcommands implemented by the daemon folder. Each takes the arguments after the
// subcommand name (argv[0] is the subcommand) and returns the process exit status. main.cc holds
// the table that dispatches to them; other folders add their own `int xxx_main(int, char**)`.

#include <chrono>

#include "common/status.h"

namespace edge::engine {
class Generator;
}  // namespace edge::engine

namespace edge::daemon {

class Daemon;

// Exit status of `edgeserve run` after a device fault (a sticky GPU error): non-zero so systemd's
// Restart=on-failure restarts the process, and distinct from a start error (1) in the journal.
inline constexpr int kExitDeviceFault = 3;
// How often the run loop asks Daemon::check_health().
inline constexpr std::chrono::milliseconds kHealthPollInterval{1000};
// The drain after a device fault: long enough for in-flight requests to receive their error,
// short because the device cannot serve them anyway (also bounded by limits.drain_deadline_ms).
inline constexpr std::chrono::milliseconds kDeviceFaultDrain{5000};

// `edgeserve run --config FILE`: the daemon, until SIGTERM/SIGINT (exit 0), a start error (1) or
// a device fault (kExitDeviceFault).
int run_main(int argc, char** argv);

// The run loop's path once check_health() failed with `fault`: logs it, drains for `drain`
// (gossip already says draining), stops the daemon and then `generator`; returns
// kExitDeviceFault for main().
int exit_on_device_fault(Daemon& daemon, engine::Generator& generator, const Status& fault,
                         std::chrono::milliseconds drain);

// `edgeserve check-config [--no-files] FILE`: validates the YAML and (unless --no-files) the
// files it names (daemon/preflight.h); prints "ok" (0) or the error (1); usage errors exit 2.
int check_config_main(int argc, char** argv);

}  // namespace edge::daemon
