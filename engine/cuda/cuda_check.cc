#include "engine/cuda/cuda_check.h"

#include <mutex>
#include <string>

#include "engine/cuda/cuda_backend.h"

namespace edge::engine::cuda {
namespace {

// Process-wide by nature: a sticky error poisons the process's CUDA context, whoever saw it.
std::mutex& health_mutex() {
    static std::mutex m;
    return m;
}
Status& health_status() {
    static Status s;
    return s;
}

}  // namespace

bool cuda_error_is_sticky(cudaError_t error) {
    // Every code whose documentation (driver_types.h) says the process must be terminated and
    // relaunched to use CUDA again, plus those that lose the device or its context (ECC, a
    // destroyed context, no device available). Not the other MPS codes (805-809: connection or
    // RPC failure, server not ready, client limits), of which it does not say that.
    switch (error) {
        case cudaErrorIllegalAddress:
        case cudaErrorLaunchFailure:
        case cudaErrorHardwareStackError:
        case cudaErrorIllegalInstruction:
        case cudaErrorMisalignedAddress:
        case cudaErrorInvalidAddressSpace:
        case cudaErrorInvalidPc:
        case cudaErrorAssert:
        case cudaErrorECCUncorrectable:
        case cudaErrorLaunchTimeout:
        case cudaErrorContextIsDestroyed:
        case cudaErrorDevicesUnavailable:
        case cudaErrorContained:
        case cudaErrorTensorMemoryLeak:
        case cudaErrorMpsClientTerminated:  // The MPS server ended this client.
        case cudaErrorExternalDevice:
            return true;
        default:
            return false;
    }
}

void mark_device_unhealthy(const Status& status) {
    std::lock_guard<std::mutex> lock(health_mutex());
    if (health_status().ok()) {
        health_status() = status;
    }
}

Status cuda_error_status(cudaError_t error, const char* call, const char* file, int line) {
    if (error == cudaSuccess) {
        return ok_status();
    }
    std::string msg = std::string(call) + " failed at " + file + ":" + std::to_string(line) +
                      ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
    if (cuda_error_is_sticky(error)) {
        Status s = unavailable_error("CUDA device lost: " + msg);
        mark_device_unhealthy(s);
        return s;
    }
    return internal_error(msg);
}

void check_cleanup(cudaError_t error, const char* call) {
    if (error != cudaSuccess && cuda_error_is_sticky(error)) {
        (void)cuda_error_status(error, call, "cleanup", 0);
    }
}

Status cuda_device_health() {
    std::lock_guard<std::mutex> lock(health_mutex());
    return health_status();
}

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // Clears the (non-sticky) "no driver/device" error.
        return 0;
    }
    return n;
}

}  // namespace edge::engine::cuda
