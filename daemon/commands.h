#pragma once

// The edgeserve subcommands implemented by the daemon folder. Each takes the arguments after the
// subcommand name (argv[0] is the subcommand) and returns the process exit status. main.cc holds
// the table that dispatches to them; other folders add their own `int xxx_main(int, char**)`.

namespace edge::daemon {

// `edgeserve run --config FILE`: the daemon, until SIGTERM/SIGINT (exit 0) or a start error (1).
int run_main(int argc, char** argv);

// `edgeserve check-config FILE`: validates and prints "ok" (0) or the errors (1).
int check_config_main(int argc, char** argv);

}  // namespace edge::daemon
