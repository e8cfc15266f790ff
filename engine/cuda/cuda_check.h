#pragma once

// Turning CUDA runtime errors into Status (internal to engine/cuda; includes CUDA headers). Every
// CUDA call in the backend goes through EDGE_CUDA_RETURN_IF_ERROR (or cuda_error_status), which
// names the call, file:line and the error; sticky errors (the context is unusable afterwards) are
// also recorded for cuda_device_health(). Thread-safe.

#include <cuda_runtime.h>

#include "common/status.h"

namespace edge::engine::cuda {

// OK for cudaSuccess, else kInternal (kUnavailable for sticky errors) with the call and location.
Status cuda_error_status(cudaError_t error, const char* call, const char* file, int line);

// Whether `error` leaves the CUDA context unusable for the rest of the process.
bool cuda_error_is_sticky(cudaError_t error);

// For cleanup calls whose failure cannot be returned (destructors): a sticky error is still
// recorded for cuda_device_health(); anything else is dropped.
void check_cleanup(cudaError_t error, const char* call);

// Records a sticky failure from elsewhere (a kernel's own error flag, NCCL) so health fails.
void mark_device_unhealthy(const Status& status);

}  // namespace edge::engine::cuda

#define EDGE_CUDA_RETURN_IF_ERROR(call)                                                       \
    do {                                                                                      \
        const cudaError_t edge_cuda_error_ = (call);                                          \
        if (edge_cuda_error_ != cudaSuccess) {                                                \
            return ::edge::engine::cuda::cuda_error_status(edge_cuda_error_, #call, __FILE__, \
                                                           __LINE__);                         \
        }                                                                                     \
    } while (0)

// After a kernel launch: the launch's own error (bad configuration) without synchronizing.
#define EDGE_CUDA_RETURN_IF_LAUNCH_FAILED(what) EDGE_CUDA_RETURN_IF_ERROR(cudaGetLastError())
