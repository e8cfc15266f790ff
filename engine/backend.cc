#include "engine/backend.h"

#include "engine/cpu/cpu_backend.h"

namespace edge::engine {

// The one place that decides which backends exist. The CUDA backend joins here, behind
// EDGE_HAVE_CUDA, when it is written.
std::vector<std::string> available_backends() { return {"cpu"}; }

Result<std::unique_ptr<Backend>> create_backend(std::string_view name,
                                                const BackendOptions& options) {
    if (name == "cpu") {
        return std::unique_ptr<Backend>(std::make_unique<cpu::CpuBackend>(options));
    }
    return not_found_error("backend '" + std::string(name) + "' is not compiled in");
}

}  // namespace edge::engine
