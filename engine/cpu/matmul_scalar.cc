#include "engine/cpu/convert.h"
#include "engine/cpu/matmul_kernels.h"

namespace edge::engine::cpu {
namespace {

template <typename Load>
void matmul_scalar(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy, int64_t r0,
                   int64_t r1, Load load) {
    const int64_t k = w.cols;
    for (int64_t t = 0; t < n; ++t) {
        const float* xt = x + t * k;
        for (int64_t r = r0; r < r1; ++r) {
            float acc = 0.0f;
            for (int64_t c = 0; c < k; ++c) {
                acc += load(r * k + c) * xt[c];
            }
            y[t * ldy + r] = acc;
        }
    }
}

}  // namespace

void matmul_f32_scalar(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                       int64_t r0, int64_t r1) {
    const void* p = w.data;
    matmul_scalar(w, x, n, y, ldy, r0, r1, [p](int64_t i) { return load_f32(p, i); });
}

void matmul_bf16_scalar(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                        int64_t r0, int64_t r1) {
    const void* p = w.data;
    matmul_scalar(w, x, n, y, ldy, r0, r1, [p](int64_t i) { return bf16_to_f32(load_u16(p, i)); });
}

void matmul_f16_scalar(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                       int64_t r0, int64_t r1) {
    const void* p = w.data;
    matmul_scalar(w, x, n, y, ldy, r0, r1, [p](int64_t i) { return f16_to_f32(load_u16(p, i)); });
}

void matmul_bf16_scalar_bf16act(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy,
                                int64_t r0, int64_t r1) {
    const int64_t k = w.cols;
    for (int64_t t = 0; t < n; ++t) {
        const float* xt = x + t * k;
        for (int64_t r = r0; r < r1; ++r) {
            double acc = 0.0;
            for (int64_t c = 0; c < k; ++c) {
                acc += static_cast<double>(bf16_to_f32(load_u16(w.data, r * k + c))) *
                       static_cast<double>(bf16_to_f32(f32_to_bf16(xt[c])));
            }
            y[t * ldy + r] = static_cast<float>(acc);
        }
    }
}

}  // namespace edge::engine::cpu
