#pragma once

// What the engine's subcommands (generate, quantize, quant-eval, make-model) share on their
// command lines. Free functions; no shared state.

#include <charconv>
#include <cstdio>
#include <string_view>
#include <system_error>

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

// The whole of `s` as a number of type T: false for "", "12abc", "+1" or a value T cannot hold.
// The tools' command lines read their numbers with it.
template <typename T>
bool parse_whole_number(std::string_view s, T* out) {
    const char* end = s.data() + s.size();
    auto [ptr, ec] = std::from_chars(s.data(), end, *out);
    return ec == std::errc() && ptr == end;
}

// Exit status of a usage error (a bad, missing or unknown argument), as for the daemon's own
// subcommands; 1 is a failure of the work itself.
inline constexpr int kExitUsage = 2;

// Reports a usage error as every subcommand does: "edgeserve COMMAND: WHAT" (one line naming the
// flag) and then `usage` on stderr. Returns kExitUsage.
inline int usage_error(std::string_view command, std::string_view what, const char* usage) {
    std::fprintf(stderr, "edgeserve %.*s: %.*s\n%s", static_cast<int>(command.size()),
                 command.data(), static_cast<int>(what.size()), what.data(), usage);
    return kExitUsage;
}

}  // namespace edge::engine
