#pragma once

// What the engine's subcommands (generate, quantize, quant-eval, make-model) share on their
// command lines. Pure functions.

#include <string_view>

namespace edge::engine {

// Whether argv[first..] asks for help (`--help` or `-h`): the subcommand then prints its usage on
// stdout and exits 0, whatever else is on the line.
inline bool wants_help(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "--help" || a == "-h") {
            return true;
        }
    }
    return false;
}

}  // namespace edge::engine
