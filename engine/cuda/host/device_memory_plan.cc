#include "engine/cuda/host/device_memory_plan.h"

#include <string>

namespace edge::engine::cuda {
namespace {

std::string mib(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

Result<int64_t> plan_arena_bytes(const DeviceMemoryConfig& config, int64_t free_bytes,
                                 int64_t total_bytes) {
    if (config.alignment <= 0 || (config.alignment & (config.alignment - 1)) != 0) {
        return invalid_argument_error("device memory: alignment " +
                                      std::to_string(config.alignment) +
                                      " is not a power of two");
    }
    if (config.arena_bytes < 0 || config.reserve_bytes < 0) {
        return invalid_argument_error("device memory: arena_bytes and reserve_bytes must be >= 0");
    }
    if (free_bytes < 0 || total_bytes < free_bytes) {
        return invalid_argument_error("device memory: inconsistent device report (free " +
                                      std::to_string(free_bytes) + " of " +
                                      std::to_string(total_bytes) + " bytes)");
    }
    int64_t want = config.arena_bytes;
    if (want == 0) {
        if (!(config.free_fraction > 0.0 && config.free_fraction <= 1.0)) {
            return invalid_argument_error("device memory: free_fraction must be in (0, 1]");
        }
        want = static_cast<int64_t>(static_cast<double>(free_bytes) * config.free_fraction) -
               config.reserve_bytes;
        if (want <= 0) {
            return resource_exhausted_error("device memory: " + mib(free_bytes) + " free of " +
                                            mib(total_bytes) + " leaves nothing after the " +
                                            mib(config.reserve_bytes) + " reserve");
        }
    }
    // Overflow-safe: want and reserve are both < 2^62 here or the comparison below fails.
    if (want > free_bytes || config.reserve_bytes > free_bytes - want) {
        return resource_exhausted_error("device memory: arena of " + mib(want) + " plus " +
                                        mib(config.reserve_bytes) + " reserve does not fit in " +
                                        mib(free_bytes) + " free of " + mib(total_bytes));
    }
    return want & ~(config.alignment - 1);
}

ArenaPlanner::ArenaPlanner(int64_t capacity, int64_t alignment)
    : capacity_(capacity), alignment_(alignment) {
    capacity_ -= capacity_ % alignment_;
    if (capacity_ > 0) {
        free_[0] = capacity_;
    }
}

Result<int64_t> ArenaPlanner::allocate(int64_t bytes, std::string_view what) {
    if (bytes <= 0 || bytes > capacity_) {
        if (bytes <= 0) {
            return invalid_argument_error("device arena: " + std::string(what) +
                                          ": size must be > 0");
        }
        return resource_exhausted_error("device arena: " + std::string(what) + " needs " +
                                        std::to_string(bytes) + " bytes; the arena has " +
                                        std::to_string(capacity_));
    }
    const int64_t size = (bytes + alignment_ - 1) & ~(alignment_ - 1);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second >= size) {
            const int64_t offset = it->first;
            const int64_t rest = it->second - size;
            free_.erase(it);
            if (rest > 0) {
                free_[offset + size] = rest;
            }
            live_[offset] = size;
            used_ += size;
            high_water_ = std::max(high_water_, used_);
            return offset;
        }
    }
    return resource_exhausted_error("device arena: " + std::string(what) + " needs " +
                                    std::to_string(size) + " bytes; " +
                                    std::to_string(capacity_ - used_) + " are free, largest " +
                                    std::to_string(largest_free()) + " contiguous");
}

Status ArenaPlanner::release(int64_t offset) {
    auto it = live_.find(offset);
    if (it == live_.end()) {
        return invalid_argument_error("device arena: offset " + std::to_string(offset) +
                                      " was not allocated");
    }
    int64_t start = offset;
    int64_t size = it->second;
    live_.erase(it);
    used_ -= size;
    auto next = free_.find(start + size);
    if (next != free_.end()) {
        size += next->second;
        free_.erase(next);
    }
    auto prev = free_.lower_bound(start);
    if (prev != free_.begin()) {
        --prev;
        if (prev->first + prev->second == start) {
            start = prev->first;
            size += prev->second;
            free_.erase(prev);
        }
    }
    free_[start] = size;
    return ok_status();
}

int64_t ArenaPlanner::largest_free() const {
    int64_t best = 0;
    for (const auto& [offset, size] : free_) {
        best = std::max(best, size);
    }
    return best;
}

}  // namespace edge::engine::cuda
