#pragma once

// EDGE_HD marks the small helpers (index math, dequantization of one element, the routing rule)
// that the CUDA kernels and the host both run, so the CPU tests exercise the very code the device
// runs. A compile gate only: empty for the host compiler, `__host__ __device__` under nvcc.

#if defined(__CUDACC__)
#define EDGE_HD __host__ __device__ __forceinline__
#else
#define EDGE_HD inline
#endif
