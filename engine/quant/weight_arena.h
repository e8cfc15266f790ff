#pragma once

// WeightArena hands out the memory of weights made at load time (row tiles) from a few large
// chunks on 2 MiB boundaries with MADV_HUGEPAGE, instead of one malloc'd mapping per matrix in
// 4 KiB pages (a 256 KiB expert is past malloc's mmap threshold): the kernel then faults and
// clears a chunk 2 MiB at a time. Loading the bench preset quantized with experts-int4 took 2.9 s
// with the tiles malloc'd (half of it in page faults and the fill), 1.3 s from an arena
// (`edgeserve generate --model DIR --max-tokens 1`, this machine's 2 cores); single-stream decode
// in bench_decode_quant moved within its noise. Memory is given back only when the arena is
// destroyed; untouched pages of a chunk's tail never become resident. Thread-safe (the loader
// fills experts' tiles on several threads).

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace edge::engine::quant {

class WeightArena {
  public:
    // Chunks of at least `chunk_bytes` (rounded up to 2 MiB); a larger request gets its own.
    explicit WeightArena(size_t chunk_bytes = size_t{64} << 20);
    ~WeightArena();
    WeightArena(const WeightArena&) = delete;
    WeightArena& operator=(const WeightArena&) = delete;

    // `n` bytes on a 64-byte boundary, valid (and not reused) until the arena is destroyed.
    // Aborts when the system has no memory for a new chunk, as a failed malloc of weights does.
    uint8_t* allocate(size_t n);
    // Bytes of address space in chunks (resident only where written).
    size_t reserved_bytes() {
        std::lock_guard<std::mutex> lock(mu_);
        return reserved_;
    }

  private:
    uint8_t* map_chunk(size_t size);  // `size` a multiple of 2 MiB; mu_ held.

    struct Chunk {
        void* base;
        size_t size;
    };
    std::mutex mu_;  // Guards what follows.
    std::vector<Chunk> chunks_;
    size_t chunk_bytes_;
    uint8_t* next_ = nullptr;
    size_t left_ = 0;
    size_t reserved_ = 0;
};

}  // namespace edge::engine::quant
