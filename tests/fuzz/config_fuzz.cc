// libFuzzer: the YAML config loader.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "daemon/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string_view text(reinterpret_cast<const char*>(data), size);
    auto config = edge::daemon::parse_config(text, "/fuzz/edgeserve.yaml");
    (void)config.ok();
    return 0;
}
