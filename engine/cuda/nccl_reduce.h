#pragma once

// The device half of NcclCommunicator::all_reduce_sum (internal to engine/cuda): sums `ranks`
// gathered blocks of n values in rank order, ((b0 + b1) + b2) ..., into `out`, so every rank
// computes bit-identical results. Launches on `stream` without synchronizing.

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"

namespace edge::engine::cuda {

template <typename T>
Status sum_ranks_in_order(const T* gathered, int32_t ranks, int64_t n, T* out,
                          cudaStream_t stream);

}  // namespace edge::engine::cuda
