#pragma once

// How much device memory the CUDA backend takes and how it hands it out. The backend makes one
// cudaMalloc of the planned size at start (never managed memory) and carves weights, the KV pool
// and workspaces out of it with an ArenaPlanner, so running out of memory is a Status at load
// time, never a failed cudaMalloc in the middle of a decode step.
//
// DeviceMemoryConfig and the plan are values. ArenaPlanner is not synchronized: one owner (the
// backend's driving thread).

#include <cstdint>
#include <map>
#include <string_view>

#include "common/result.h"

namespace edge::engine::cuda {

struct DeviceMemoryConfig {
    int64_t arena_bytes = 0;        // Bytes to take with one cudaMalloc; 0: see free_fraction.
    double free_fraction = 0.90;    // When arena_bytes is 0: this fraction of the memory free at
                                    // start, minus reserve_bytes. In (0, 1].
    int64_t reserve_bytes = int64_t{1} << 30;  // Bytes left free for cuBLAS, NCCL buffers and
                                               // CUDA graphs outside the arena.
    int64_t alignment = 256;        // Alignment of every allocation, bytes (a power of two).
};

// The arena size for a device with `free_bytes` free of `total_bytes`: kInvalidArgument for a bad
// config, kResourceExhausted naming both figures when the request does not fit.
Result<int64_t> plan_arena_bytes(const DeviceMemoryConfig& config, int64_t free_bytes,
                                 int64_t total_bytes);

// First-fit allocator of offsets in [0, capacity) with coalescing frees. Offsets are multiples of
// the alignment.
class ArenaPlanner {
public:
    ArenaPlanner(int64_t capacity, int64_t alignment);

    // Offset of `bytes` (rounded up to the alignment); kResourceExhausted naming `what`, the size
    // and the free space when no free range is large enough; kInvalidArgument for bytes <= 0.
    Result<int64_t> allocate(int64_t bytes, std::string_view what);
    // Returns a range from allocate(); kInvalidArgument for an offset it did not hand out.
    Status release(int64_t offset);

    int64_t capacity() const { return capacity_; }
    int64_t used() const { return used_; }
    int64_t high_water() const { return high_water_; }
    // Largest allocation that would succeed now.
    int64_t largest_free() const;

private:
    int64_t capacity_;
    int64_t alignment_;
    int64_t used_ = 0;
    int64_t high_water_ = 0;
    std::map<int64_t, int64_t> free_;  // offset -> bytes.
    std::map<int64_t, int64_t> live_;  // offset -> bytes.
};

}  // namespace edge::engine::cuda
