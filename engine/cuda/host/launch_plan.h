#pragma once

// Launch shapes of the CUDA kernels, planned on the host from the problem's sizes and checked
// against what the kernels support, so a shape the kernels cannot run is a Status before any
// launch (and the planning is testable without a GPU). Pure functions; thread-safe.

#include <cstdint>

#include "common/result.h"
#include "engine/cpu/weight.h"
#include "engine/cuda/host/paged_kv_layout.h"

namespace edge::engine::cuda {

struct LaunchShape {
    int64_t grid_x = 1;        // Blocks along x (< 2^31).
    int64_t grid_y = 1;        // Blocks along y (<= 65535).
    int32_t block = 32;        // Threads per block (a multiple of 32, <= 1024).
    int32_t shared_bytes = 0;  // Dynamic shared memory per block.
};

// Grouped matmul: each warp computes one output row for the tokens of its group, kMatmulTokenTile
// tokens at a time, reading the stored weight row once per tile and dequantizing in registers.
inline constexpr int32_t kMatmulWarps = 4;      // Warps (output rows) per block.
inline constexpr int32_t kMatmulTokenTile = 8;  // Tokens accumulated per pass over a row.

struct MatmulPlan {
    LaunchShape shape;
    bool vectorized = false;  // Reads 8 consecutive elements per load (cols % 8 == 0).
    // One block row per row of x (grid_y = x_rows), in the group that holds it, instead of one
    // per group: when x has fewer rows than there are groups (a few tokens' experts), most
    // groups are empty and their blocks would only be scheduled to exit.
    bool by_row = false;
};

// Whether the grouped matmul kernel reads `format` at all.
bool cuda_matmul_supports(WeightFormat format);

// Plan for `groups` weights of rows x cols each (one group per expert; 1 for a dense matmul),
// over x_rows rows of x in all (0: not known, one block row per group).
// kInvalidArgument for an unsupported format, an int4 width that is not a multiple of its group,
// or sizes beyond the grid limits.
Result<MatmulPlan> plan_grouped_matmul(WeightFormat format, int64_t rows, int64_t cols,
                                       int64_t groups, int64_t x_rows = 0);

// Attention over the paged KV cache: one block per (query token, query head), scores in tiles of
// kAttentionTile positions (one a thread) with an online softmax, so any context length runs in
// fixed shared memory. head_dim must be a multiple of 32 and at most kMaxAttentionHeadDim.
inline constexpr int32_t kAttentionThreads = 128;
inline constexpr int32_t kAttentionTile = kAttentionThreads;
inline constexpr int32_t kMaxAttentionHeadDim = 256;
// Its shared memory: the tile's weights, the block reductions' kAttentionThreads / 32 values,
// the tile's physical block ids, the query row, and each thread's four output sums.
inline constexpr int64_t attention_shared_floats(int64_t head_dim) {
    return kAttentionTile + kAttentionThreads / 32 + kAttentionTile / kKvBlockTokens + head_dim +
           4 * kAttentionThreads;
}
Result<LaunchShape> plan_attention(int64_t tokens, int64_t q_heads, int64_t kv_heads,
                                   int64_t head_dim);

// One block per row of `cols` values (RMSNorm, embedding, argmax, sampling): threads cover the
// row with a stride, a multiple of 32 between 32 and `max_threads`.
LaunchShape plan_rows(int64_t rows, int64_t cols, int32_t max_threads = 256);

// Flat loops over n elements with grid-stride: 256 threads, at most `max_blocks` blocks.
LaunchShape plan_elementwise(int64_t n, int64_t max_blocks = 4096);

}  // namespace edge::engine::cuda
