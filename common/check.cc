#include "common/check.h"

#include <cstdio>
#include <cstdlib>

namespace edge::detail {

void check_failed(const char* condition, const char* file, int line, std::string_view message) {
    std::fprintf(stderr, "EDGE_CHECK failed at %s:%d: %s %.*s\n", file, line, condition,
                 static_cast<int>(message.size()), message.data());
    std::fflush(stderr);
    std::abort();
}

}  // namespace edge::detail
