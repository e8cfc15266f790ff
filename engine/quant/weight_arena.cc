#include "engine/quant/weight_arena.h"

#include <sys/mman.h>

#include <string>

#include "common/check.h"

namespace edge::engine::quant {
namespace {

constexpr size_t kHuge = size_t{2} << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

WeightArena::WeightArena(size_t chunk_bytes)
    : chunk_bytes_(round_up(chunk_bytes == 0 ? kHuge : chunk_bytes, kHuge)) {}

WeightArena::~WeightArena() {
    for (const Chunk& c : chunks_) {
        munmap(c.base, c.size);
    }
}

uint8_t* WeightArena::map_chunk(size_t size) {
    // Mapped 2 MiB larger, then trimmed to a 2 MiB-aligned start, so huge pages can back it.
    void* raw = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    EDGE_CHECK(raw != MAP_FAILED,
               "out of memory for " + std::to_string(size) + " bytes of weights");
    const auto base = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = round_up(base, kHuge);
    if (aligned > base) {
        munmap(raw, aligned - base);
    }
    const uintptr_t tail = aligned + size;
    if (base + size + kHuge > tail) {
        munmap(reinterpret_cast<void*>(tail), base + size + kHuge - tail);
    }
    void* chunk = reinterpret_cast<void*>(aligned);
#if defined(MADV_HUGEPAGE)
    madvise(chunk, size, MADV_HUGEPAGE);  // Best-effort: 4 KiB pages without it.
#endif
    chunks_.push_back({chunk, size});
    reserved_ += size;
    return static_cast<uint8_t*>(chunk);
}

uint8_t* WeightArena::allocate(size_t n) {
    n = round_up(n == 0 ? 1 : n, 64);
    std::lock_guard<std::mutex> lock(mu_);
    if (n > chunk_bytes_) {
        return map_chunk(round_up(n, kHuge));  // Alone; the current chunk stays current.
    }
    if (n > left_) {
        next_ = map_chunk(chunk_bytes_);
        left_ = chunk_bytes_;
    }
    uint8_t* p = next_;
    next_ += n;
    left_ -= n;
    return p;
}

}  // namespace edge::engine::quant
