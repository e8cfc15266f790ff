#pragma once

// PagedKvLayout is the memory layout of the paged KV cache the CUDA kernels read and write, and
// the index math over it (shared by the kernels and the host, see hd.h).
//
// Layout (f32, one pool for the whole cache):
//   pool = [layer][K or V][physical block][kv head][token in block][head_dim]
// A block holds kKvBlockTokens (16) consecutive positions of one sequence. Each sequence has a
// block table: block_table[seq * max_blocks_per_seq + p / 16] is the physical block that holds
// position p, at row p % 16 of that block. This is the block size and table shape of the CPU
// paged cache (engine/model/kv_cache*: 16 tokens per block, one int32 table per sequence); one
// head's 16 rows of a block are contiguous, so a warp reads a block of keys as one run.
//
// A value type; thread-safe. Callers validate tables with check_block_table() before a launch.

#include <cstdint>
#include <span>

#include "common/status.h"
#include "engine/cuda/host/hd.h"

namespace edge::engine::cuda {

inline constexpr int32_t kKvBlockTokens = 16;

struct PagedKvLayout {
    int32_t layers = 0;      // Decoder layers.
    int32_t kv_heads = 0;    // Key/value heads per layer.
    int32_t head_dim = 0;    // Values per head.
    int32_t num_blocks = 0;  // Physical blocks in the pool (each kKvBlockTokens positions).

    // Floats of one physical block of one layer's K (or V): kv_heads * 16 * head_dim.
    EDGE_HD int64_t block_floats() const {
        return static_cast<int64_t>(kv_heads) * kKvBlockTokens * head_dim;
    }
    // Floats of one layer's K (or V) pool.
    EDGE_HD int64_t plane_floats() const { return block_floats() * num_blocks; }
    // Floats of the whole pool (K and V of every layer).
    EDGE_HD int64_t pool_floats() const { return plane_floats() * 2 * layers; }
    // Offset of the K (which = 0) or V (which = 1) plane of `layer` in the pool.
    EDGE_HD int64_t plane_offset(int32_t layer, int32_t which) const {
        return (static_cast<int64_t>(layer) * 2 + which) * plane_floats();
    }
    // Offset, within a plane, of the head_dim values of (physical block, head, row in block).
    EDGE_HD int64_t row_offset(int32_t block, int32_t head, int32_t row) const {
        return (static_cast<int64_t>(block) * kv_heads + head) * kKvBlockTokens * head_dim +
               static_cast<int64_t>(row) * head_dim;
    }
    // Offset, within a plane, of position `pos` of the sequence whose table row is `table`.
    EDGE_HD int64_t position_offset(const int32_t* table, int32_t head, int32_t pos) const {
        return row_offset(table[pos / kKvBlockTokens], head, pos % kKvBlockTokens);
    }
};

// Blocks a sequence of `length` positions needs.
EDGE_HD int32_t kv_blocks_for(int32_t length) {
    return (length + kKvBlockTokens - 1) / kKvBlockTokens;
}

// Checks that every block a sequence of each length uses is a valid physical block: `table` holds
// lengths.size() rows of `max_blocks_per_seq` entries. kInvalidArgument naming the sequence and
// entry otherwise (a bad table would make a kernel read or write outside the pool).
Status check_block_table(const PagedKvLayout& layout, std::span<const int32_t> table,
                         int32_t max_blocks_per_seq, std::span<const int32_t> lengths);

}  // namespace edge::engine::cuda
