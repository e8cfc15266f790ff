#include "engine/cuda/device_allocator.h"

#include <cuda_runtime.h>

#include "engine/cuda/cuda_check.h"

namespace edge::engine::cuda {

Result<std::unique_ptr<DeviceAllocator>> DeviceAllocator::create(const DeviceMemoryConfig& config,
                                                                 int32_t device) {
    EDGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    EDGE_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    EDGE_ASSIGN_OR_RETURN(int64_t bytes,
                          plan_arena_bytes(config, static_cast<int64_t>(free_bytes),
                                           static_cast<int64_t>(total_bytes)));
    void* base = nullptr;
    EDGE_CUDA_RETURN_IF_ERROR(cudaMalloc(&base, static_cast<size_t>(bytes)));
    return std::unique_ptr<DeviceAllocator>(
        new DeviceAllocator(static_cast<char*>(base), bytes, config.alignment, device));
}

DeviceAllocator::~DeviceAllocator() {
    if (base_ != nullptr) {
        check_cleanup(cudaSetDevice(device_), "cudaSetDevice");
        check_cleanup(cudaFree(base_), "cudaFree");
    }
}

int64_t DeviceAllocator::capacity() const {
    std::lock_guard<std::mutex> lock(mu_);
    return planner_.capacity();
}

int64_t DeviceAllocator::used() const {
    std::lock_guard<std::mutex> lock(mu_);
    return planner_.used();
}

Result<void*> DeviceAllocator::allocate(int64_t bytes, std::string_view what) {
    std::lock_guard<std::mutex> lock(mu_);
    EDGE_ASSIGN_OR_RETURN(int64_t offset, planner_.allocate(bytes, what));
    return static_cast<void*>(base_ + offset);
}

void DeviceAllocator::release(void* p) {
    if (p != nullptr) {
        std::lock_guard<std::mutex> lock(mu_);
        // Only our own pointers come back here; a failure would be our bug, so it is ignored
        // rather than crashing a serving process.
        (void)planner_.release(static_cast<char*>(p) - base_);
    }
}

}  // namespace edge::engine::cuda
