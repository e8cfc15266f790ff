#pragma once

// Device reads of stored weights, dequantized in registers: one element (load1) or eight
// consecutive elements of a row starting at a multiple of 8 (load8, for rows whose width is a
// multiple of 8). Index math and decoding come from host/quant_layout.h, the same functions the
// CPU tests check against quant::dequantize_row. Plus the format dispatcher for launches.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "engine/cpu/weight.h"
#include "engine/cuda/host/quant_layout.h"

namespace edge::engine::cuda::kernels {

template <WeightFormat F>
struct FormatTag {
    static constexpr WeightFormat kFormat = F;
};

// Calls body(FormatTag<F>{}) for the runtime format; returns false for one it does not know.
template <typename Body>
bool dispatch_format(WeightFormat format, Body&& body) {
    switch (format) {
        case WeightFormat::kF32: body(FormatTag<WeightFormat::kF32>{}); return true;
        case WeightFormat::kBF16: body(FormatTag<WeightFormat::kBF16>{}); return true;
        case WeightFormat::kF16: body(FormatTag<WeightFormat::kF16>{}); return true;
        case WeightFormat::kFP8E4M3Block128:
            body(FormatTag<WeightFormat::kFP8E4M3Block128>{});
            return true;
        case WeightFormat::kInt8Row: body(FormatTag<WeightFormat::kInt8Row>{}); return true;
        case WeightFormat::kInt4G32: body(FormatTag<WeightFormat::kInt4G32>{}); return true;
        case WeightFormat::kInt4G128: body(FormatTag<WeightFormat::kInt4G128>{}); return true;
    }
    return false;
}

template <WeightFormat F>
constexpr int64_t int4_group() {
    return F == WeightFormat::kInt4G32 ? 32 : 128;
}

template <WeightFormat F>
__device__ __forceinline__ float load1(const void* data, const float* scales, int64_t r, int64_t c,
                                       int64_t cols) {
    if constexpr (F == WeightFormat::kF32) {
        return static_cast<const float*>(data)[r * cols + c];
    } else if constexpr (F == WeightFormat::kBF16) {
        return bf16_value(static_cast<const uint16_t*>(data)[r * cols + c]);
    } else if constexpr (F == WeightFormat::kF16) {
        return __half2float(static_cast<const __half*>(data)[r * cols + c]);
    } else if constexpr (F == WeightFormat::kFP8E4M3Block128) {
        return fp8_e4m3_value(static_cast<const uint8_t*>(data)[r * cols + c]) *
               scales[fp8_scale_index(r, c, cols)];
    } else if constexpr (F == WeightFormat::kInt8Row) {
        return static_cast<float>(static_cast<const int8_t*>(data)[r * cols + c]) * scales[r];
    } else {
        const uint8_t b = static_cast<const uint8_t*>(data)[int4_byte_index(r, c, cols)];
        return static_cast<float>(int4_value(b, c)) *
               scales[int4_scale_index(r, c, cols, int4_group<F>())];
    }
}

// Eight elements (r, c .. c + 7); c % 8 == 0 and cols % 8 == 0, so every load is aligned.
template <WeightFormat F>
__device__ __forceinline__ void load8(const void* data, const float* scales, int64_t r, int64_t c,
                                      int64_t cols, float* out) {
    if constexpr (F == WeightFormat::kF32) {
        const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(data) +
                                                          r * cols + c);
        const float4 a = p[0];
        const float4 b = p[1];
        out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
        out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
    } else if constexpr (F == WeightFormat::kBF16 || F == WeightFormat::kF16) {
        const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(data) +
                                                        r * cols + c);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if constexpr (F == WeightFormat::kBF16) {
                out[2 * i] = __uint_as_float(w[i] << 16);
                out[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
            } else {
                __half2 h;
                memcpy(&h, &w[i], sizeof(h));
                const float2 f = __half22float2(h);
                out[2 * i] = f.x;
                out[2 * i + 1] = f.y;
            }
        }
    } else if constexpr (F == WeightFormat::kFP8E4M3Block128) {
        const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(data) +
                                                        r * cols + c);
        const float s = scales[fp8_scale_index(r, c, cols)];
        const uint32_t w[2] = {u.x, u.y};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t word = w[i / 2];
            const __nv_fp8x2_storage_t pair =
                static_cast<__nv_fp8x2_storage_t>((word >> (16 * (i % 2))) & 0xFFFFu);
            const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
            __half2 h;
            memcpy(&h, &raw, sizeof(h));
            const float2 f = __half22float2(h);
            out[2 * i] = f.x * s;
            out[2 * i + 1] = f.y * s;
        }
    } else if constexpr (F == WeightFormat::kInt8Row) {
        const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const int8_t*>(data) +
                                                        r * cols + c);
        const float s = scales[r];
        const uint32_t w[2] = {u.x, u.y};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            out[i] = static_cast<float>(static_cast<int8_t>((w[i / 4] >> (8 * (i % 4))) & 0xFF)) * s;
        }
    } else {
        const uint32_t u = *reinterpret_cast<const uint32_t*>(
            static_cast<const uint8_t*>(data) + int4_byte_index(r, c, cols));
        const float s = scales[int4_scale_index(r, c, cols, int4_group<F>())];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            out[i] = static_cast<float>(static_cast<int32_t>((u >> (4 * i)) & 0xFu) - 8) * s;
        }
    }
}

}  // namespace edge::engine::cuda::kernels
