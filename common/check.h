#pragma once

// EDGE_CHECK guards invariants of our own code. A failure is a bug: it prints the condition, the
// place and the message to stderr and aborts. Never use it for anything that came from the
// network, a file or the config; those get a Status.

#include <string_view>

namespace edge::detail {
[[noreturn]] void check_failed(const char* condition, const char* file, int line,
                               std::string_view message);
inline std::string_view check_message() { return {}; }
inline std::string_view check_message(std::string_view message) { return message; }
}  // namespace edge::detail

#define EDGE_CHECK(cond, ...)                                                       \
    do {                                                                            \
        if (!(cond)) [[unlikely]] {                                                 \
            ::edge::detail::check_failed(#cond, __FILE__, __LINE__, \
                                          ::edge::detail::check_message(__VA_ARGS__));  \
        }                                                                           \
    } while (false)
