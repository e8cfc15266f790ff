#pragma once

// The CUDA backend: the Backend interface (engine/backend.h) run on one NVIDIA GPU. Matmuls run
// on the device with the stored weight formats dequantized in registers (BF16, F16, F32, FP8
// block-128, INT8 per row, INT4 group 32/128); each weight is copied to the device once, on first
// use, into an arena taken with one cudaMalloc sized from CudaBackendOptions::memory (never
// managed memory) and shared by every backend of the process on that device, and stays there
// until release_weights() names it (an expert moved to another rank) or the backend goes.
// The device kernels for the rest of a forward (embedding, RMSNorm, RoPE, paged
// attention, routing, permute, grouped expert matmuls, SwiGLU, sampling) are in
// engine/cuda/kernels/kernels.h; engine/cuda/device_decoder.h runs a whole decode step on the
// device as a CUDA graph.
//
// This header includes no CUDA header, so it may be included anywhere; it exists only in builds
// with EDGE_HAVE_CUDA. Every CUDA call is checked; a sticky device error (the context is lost)
// makes health() and cuda_device_health() return it for the rest of the process, so the daemon's
// /readyz fails and systemd restarts the process. A matmul that fails without losing the device
// (the arena is full, a weight the kernels do not take) writes NaN and reports through
// take_error() instead: a capacity problem fails the step, not the process's readiness.
//
// Threading: as Backend (one driving thread); cuda_device_count() and cuda_device_health() are
// thread-safe.

#include <cstdint>
#include <memory>

#include "common/result.h"
#include "engine/backend.h"
#include "engine/cuda/host/device_memory_plan.h"

namespace edge::engine::cuda {

struct CudaBackendOptions {
    int32_t device = 0;         // CUDA device ordinal.
    int32_t host_threads = 0;   // Threads for the host-side loops (for_each_task); 0: per core.
    DeviceMemoryConfig memory;  // Size of the device arena (weights, staging buffers). Backends
                                // on one device share one arena; the first one sizes it.
};

// CUDA devices visible to this process; 0 without a driver or a device (never an error).
int cuda_device_count();

// The first sticky CUDA error any component of this process has seen, else OK. Thread-safe.
Status cuda_device_health();

// kUnavailable without a device; kResourceExhausted when the arena does not fit.
Result<std::unique_ptr<Backend>> create_cuda_backend(const CudaBackendOptions& options);

}  // namespace edge::engine::cuda
