#include "engine/cuda/host/paged_kv_layout.h"

#include <string>

namespace edge::engine::cuda {

Status check_block_table(const PagedKvLayout& layout, std::span<const int32_t> table,
                         int32_t max_blocks_per_seq, std::span<const int32_t> lengths) {
    if (max_blocks_per_seq <= 0 ||
        table.size() / static_cast<size_t>(max_blocks_per_seq) < lengths.size()) {
        return invalid_argument_error("paged KV: block table of " + std::to_string(table.size()) +
                                      " entries is too small for " +
                                      std::to_string(lengths.size()) + " sequences of " +
                                      std::to_string(max_blocks_per_seq) + " blocks");
    }
    for (size_t s = 0; s < lengths.size(); ++s) {
        if (lengths[s] < 0 || kv_blocks_for(lengths[s]) > max_blocks_per_seq) {
            return invalid_argument_error("paged KV: sequence " + std::to_string(s) +
                                          " has length " + std::to_string(lengths[s]) +
                                          "; its table holds " +
                                          std::to_string(max_blocks_per_seq) + " blocks of " +
                                          std::to_string(kKvBlockTokens));
        }
        for (int32_t b = 0; b < kv_blocks_for(lengths[s]); ++b) {
            const int32_t block = table[s * static_cast<size_t>(max_blocks_per_seq) + b];
            if (block < 0 || block >= layout.num_blocks) {
                return invalid_argument_error(
                    "paged KV: sequence " + std::to_string(s) + " entry " + std::to_string(b) +
                    " names block " + std::to_string(block) + " of a pool of " +
                    std::to_string(layout.num_blocks));
            }
        }
    }
    return ok_status();
}

}  // namespace edge::engine::cuda
