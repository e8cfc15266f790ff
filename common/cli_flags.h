#pragma once

// SeenFlags refuses a command-line flag given twice. Without it a subcommand's parser lets the
// last one win silently, and `edgeserve rollout --model a --version v --model b` steers the whole
// cluster for a model the user may not have meant; the admin API refuses a repeated query
// parameter for the same reason. The daemon's and the engine's subcommands share it, so every
// one of them words the error alike. One per parse of a command line; not thread-safe.

#include <functional>
#include <set>
#include <string>
#include <string_view>

namespace edge {

class SeenFlags {
public:
    // Notes `flag` ("--model"). Returns "" the first time it comes, else "--model given twice":
    // the usage error to report, before anything is done.
    [[nodiscard]] std::string repeated(std::string_view flag) {
        if (seen_.emplace(flag).second) {
            return "";
        }
        return std::string(flag) + " given twice";
    }

private:
    std::set<std::string, std::less<>> seen_;
};

}  // namespace edge
