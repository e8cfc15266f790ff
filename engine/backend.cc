#include "engine/backend.h"

#include "engine/cpu/cpu_backend.h"
#if defined(EDGE_HAVE_CUDA)
#include "engine/cuda/cuda_backend.h"
#endif

namespace edge::engine {

// The one place that decides which backends exist: the CPU always, CUDA when it was compiled in
// (EDGE_HAVE_CUDA) and a device is present at run time.
std::vector<std::string> available_backends() {
    std::vector<std::string> names = {"cpu"};
#if defined(EDGE_HAVE_CUDA)
    if (cuda::cuda_device_count() > 0) {
        names.push_back("cuda");
    }
#endif
    return names;
}

Status device_health() {
#if defined(EDGE_HAVE_CUDA)
    return cuda::cuda_device_health();
#else
    return ok_status();
#endif
}

Result<std::unique_ptr<Backend>> create_backend(std::string_view name,
                                                const BackendOptions& options) {
    if (name == "cpu") {
        return std::unique_ptr<Backend>(std::make_unique<cpu::CpuBackend>(options));
    }
#if defined(EDGE_HAVE_CUDA)
    if (name == "cuda") {
        cuda::CudaBackendOptions co;
        co.host_threads = options.threads;
        return cuda::create_cuda_backend(co);
    }
#endif
    return not_found_error("backend '" + std::string(name) + "' is not compiled in");
}

}  // namespace edge::engine
