#pragma once

// DeviceAllocator takes one cudaMalloc'd arena of the planned size (host/device_memory_plan.h)
// and hands out aligned ranges of it; internal to engine/cuda. Never managed memory. Frees the
// arena on destruction.
//
// Threading: not synchronized; owned by one backend's driving thread.

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "common/result.h"
#include "engine/cuda/host/device_memory_plan.h"

namespace edge::engine::cuda {

class DeviceAllocator {
public:
    // Plans from cudaMemGetInfo on the current device and takes the arena.
    static Result<std::unique_ptr<DeviceAllocator>> create(const DeviceMemoryConfig& config);
    ~DeviceAllocator();
    DeviceAllocator(const DeviceAllocator&) = delete;
    DeviceAllocator& operator=(const DeviceAllocator&) = delete;

    // `bytes` of device memory; kResourceExhausted naming `what` when the arena is full.
    Result<void*> allocate(int64_t bytes, std::string_view what);
    void release(void* p);

    int64_t capacity() const { return planner_.capacity(); }
    int64_t used() const { return planner_.used(); }

private:
    DeviceAllocator(char* base, int64_t bytes, int64_t alignment)
        : base_(base), planner_(bytes, alignment) {}
    char* base_;
    ArenaPlanner planner_;
};

}  // namespace edge::engine::cuda
