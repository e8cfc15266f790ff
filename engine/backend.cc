#include "engine/backend.h"

#include <mutex>
#include <optional>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/matmul.h"
#if defined(EDGE_HAVE_CUDA)
#include "engine/cuda/cuda_backend.h"
#endif

namespace edge::engine {
namespace {

// Process-wide by nature: a lost device is lost for every model of the process.
std::mutex& fault_mutex() {
    static std::mutex m;
    return m;
}
Status& reported_fault() {
    static Status s;
    return s;
}

int visible_cuda_devices() {
#if defined(EDGE_HAVE_CUDA)
    return cuda::cuda_device_count();
#else
    return 0;
#endif
}

}  // namespace

void Backend::swiglu_batch(std::span<const SwiGluJob> jobs) {
    cpu::swiglu_two_steps(jobs, [this](std::span<const MatmulJob> mm) { matmul_batch(mm); });
}

// The one place that decides which backends exist: the CPU always, CUDA when it was compiled in
// (EDGE_HAVE_CUDA) and a device is present at run time.
std::vector<std::string> available_backends() {
    std::vector<std::string> names = {"cpu"};
    if (visible_cuda_devices() > 0) {
        names.push_back("cuda");
    }
    return names;
}

Status device_health() {
    {
        std::lock_guard<std::mutex> lock(fault_mutex());
        if (!reported_fault().ok()) {
            return reported_fault();
        }
    }
#if defined(EDGE_HAVE_CUDA)
    return cuda::cuda_device_health();
#else
    return ok_status();
#endif
}

void report_device_fault(const Status& fault) {
    if (fault.ok()) {
        return;
    }
    std::lock_guard<std::mutex> lock(fault_mutex());
    if (reported_fault().ok()) {
        reported_fault() = fault;
    }
}

void clear_reported_device_fault_for_testing() {
    std::lock_guard<std::mutex> lock(fault_mutex());
    reported_fault() = ok_status();
}

Result<std::string> resolve_backend(std::string_view requested) {
    if (requested == "cpu") {
        return std::string("cpu");
    }
    if (requested == "auto") {
        return std::string(visible_cuda_devices() > 0 ? "cuda" : "cpu");
    }
    if (requested == "cuda") {
#if defined(EDGE_HAVE_CUDA)
        if (visible_cuda_devices() == 0) {
            return unavailable_error(
                "engine.backend is \"cuda\" but no CUDA device is visible to this process (no "
                "driver, no GPU, or CUDA_VISIBLE_DEVICES hides them); use \"auto\" to fall back "
                "to the CPU");
        }
        return std::string("cuda");
#else
        return not_found_error(
            "engine.backend is \"cuda\" but this build has no CUDA backend (built without a CUDA "
            "compiler or with -DEDGE_CUDA=OFF); use \"cpu\" or \"auto\"");
#endif
    }
    return invalid_argument_error("engine.backend \"" + std::string(requested) +
                                  "\": expected cpu, cuda or auto");
}

Result<std::unique_ptr<Backend>> create_backend(std::string_view name,
                                                const BackendOptions& options) {
    if (name == "cpu") {
        std::optional<cpu::Isa> isa;
        if (options.cpu_kernels != "auto") {
            Result<cpu::Isa> chosen = cpu::isa_by_name(options.cpu_kernels);
            if (!chosen.ok()) {
                return chosen.status().with_context("engine.cpu_kernels");
            }
            isa = *chosen;
        }
        return std::unique_ptr<Backend>(std::make_unique<cpu::CpuBackend>(options, isa));
    }
#if defined(EDGE_HAVE_CUDA)
    if (name == "cuda") {
        const int devices = cuda::cuda_device_count();
        if (options.device < 0 || options.device >= devices) {
            // Only expert-parallel ranks ask for devices past 0 (rank r on GPU r).
            return unavailable_error(
                "cuda backend: device " + std::to_string(options.device) + " requested but " +
                std::to_string(devices) + " visible" +
                (options.device > 0 ? " (sharding on CUDA runs one rank per GPU: "
                                      "engine.sharding.ranks must not exceed the GPU count)"
                                    : ""));
        }
        cuda::CudaBackendOptions co;
        co.device = options.device;
        co.host_threads = options.threads;
        return cuda::create_cuda_backend(co);
    }
#endif
    return not_found_error("backend '" + std::string(name) + "' is not compiled in");
}

}  // namespace edge::engine
