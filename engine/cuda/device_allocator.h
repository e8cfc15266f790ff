#pragma once

// DeviceAllocator takes one cudaMalloc'd arena of the planned size (host/device_memory_plan.h)
// on one device and hands out aligned ranges of it; internal to engine/cuda. Never managed
// memory. Frees the arena on destruction. Every backend of the process on the same device shares
// one (shared_arena() in cuda_backend.cc), so expert-parallel ranks never plan the same free
// memory twice.
//
// Threading: allocate/release are thread-safe (one mutex; called at weight upload and when a
// staging buffer grows, never per kernel).

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include "common/result.h"
#include "engine/cuda/host/device_memory_plan.h"

namespace edge::engine::cuda {

class DeviceAllocator {
public:
    // Plans from cudaMemGetInfo on `device` and takes the arena there.
    static Result<std::unique_ptr<DeviceAllocator>> create(const DeviceMemoryConfig& config,
                                                           int32_t device);
    ~DeviceAllocator();
    DeviceAllocator(const DeviceAllocator&) = delete;
    DeviceAllocator& operator=(const DeviceAllocator&) = delete;

    // `bytes` of device memory; kResourceExhausted naming `what` when the arena is full.
    Result<void*> allocate(int64_t bytes, std::string_view what);
    void release(void* p);

    int64_t capacity() const;
    int64_t used() const;
    int32_t device() const { return device_; }

private:
    DeviceAllocator(char* base, int64_t bytes, int64_t alignment, int32_t device)
        : base_(base), device_(device), planner_(bytes, alignment) {}
    char* base_;
    int32_t device_;
    mutable std::mutex mu_;
    ArenaPlanner planner_;  // Guarded by mu_.
};

}  // namespace edge::engine::cuda
