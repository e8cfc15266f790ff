#include "engine/cpu/ops.h"

#include <cmath>
#include <string_view>
#include <vector>

#include "engine/cpu/ops_kernels.h"

namespace edge::engine::cpu {

std::vector<OpsVariant> ops_variants() {
    std::vector<OpsVariant> out;
    out.push_back({"scalar", rms_norm_scalar, rope_neox_scalar, rope_interleaved_scalar,
                   softmax_scalar, exp_sum_scalar, silu_mul_scalar});
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        out.push_back({"avx2", rms_norm_avx2, rope_neox_avx2, rope_interleaved_avx2, softmax_avx2,
                       exp_sum_avx2, silu_mul_avx2});
    }
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        out.push_back({"avx512", rms_norm_avx512, rope_neox_avx512, rope_interleaved_avx512,
                       softmax_avx512, exp_sum_avx512, silu_mul_avx512});
    }
#endif
    return out;
}

namespace {

// The variant ops.h's functions call: the last (widest) one this CPU runs, chosen once.
const OpsVariant& ops() {
    static const OpsVariant chosen = ops_variants().back();
    return chosen;
}

}  // namespace

std::string_view ops_isa_name() { return ops().name; }

bool ops_use_avx512() {
    static const bool use = ops_isa_name() == "avx512";
    return use;
}

bool ops_use_avx2() {
    static const bool use = ops_isa_name() == "avx2";
    return use;
}

void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out) {
    ops().rms_norm(x, weight, n, eps, out);
}

void rope_neox(float* head, int64_t rot_dim, const float* cos, const float* sin) {
    ops().rope_neox(head, rot_dim, cos, sin);
}

void rope_interleaved(float* head, int64_t rot_dim, const float* cos, const float* sin) {
    ops().rope_interleaved(head, rot_dim, cos, sin);
}

void softmax(float* x, int64_t n) { ops().softmax(x, n); }

double exp_sum(const float* x, int64_t n, float shift, float* out) {
    return ops().exp_sum(x, n, shift, out);
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
    ops().silu_mul(gate, up, n, out);
}

void rms_norm_scalar(const float* x, const float* weight, int64_t n, float eps, float* out) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        ss += static_cast<double>(x[i]) * x[i];
    }
    float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) {
        out[i] = x[i] * inv * weight[i];
    }
}

void rope_angles(int64_t pos, const double* inv_freq, int64_t half, float* cos_out,
                 float* sin_out) {
    for (int64_t i = 0; i < half; ++i) {
        double a = static_cast<double>(pos) * inv_freq[i];
        cos_out[i] = static_cast<float>(std::cos(a));
        sin_out[i] = static_cast<float>(std::sin(a));
    }
}

void rope_neox_scalar(float* head, int64_t rot_dim, const float* cos, const float* sin) {
    const int64_t half = rot_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
        float a = head[i];
        float b = head[i + half];
        head[i] = a * cos[i] - b * sin[i];
        head[i + half] = b * cos[i] + a * sin[i];
    }
}

void rope_interleaved_scalar(float* head, int64_t rot_dim, const float* cos, const float* sin) {
    for (int64_t i = 0; i < rot_dim / 2; ++i) {
        float a = head[2 * i];
        float b = head[2 * i + 1];
        head[2 * i] = a * cos[i] - b * sin[i];
        head[2 * i + 1] = b * cos[i] + a * sin[i];
    }
}

void softmax_scalar(float* x, int64_t n) {
    if (n <= 0) {
        return;
    }
    float mx = x[0];
    for (int64_t i = 1; i < n; ++i) {
        mx = std::fmax(mx, x[i]);
    }
    float inv = static_cast<float>(1.0 / exp_sum_scalar(x, n, mx, x));
    for (int64_t i = 0; i < n; ++i) {
        x[i] *= inv;
    }
}

double exp_sum_scalar(const float* x, int64_t n, float shift, float* out) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        out[i] = std::exp(x[i] - shift);
        sum += out[i];
    }
    return sum;
}

void silu_mul_scalar(const float* gate, const float* up, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) {
        float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

void attention_gqa(const float* q, int64_t n_q, int64_t head_dim, const float* keys,
                   const float* values, int64_t kv_stride, int64_t n_ctx, float scale,
                   float* scores, float* out) {
    for (int64_t h = 0; h < n_q; ++h) {
        const float* qh = q + h * head_dim;
        float* s = scores + h * n_ctx;
        for (int64_t p = 0; p < n_ctx; ++p) {
            const float* k = keys + p * kv_stride;
            float dot = 0.0f;
            for (int64_t d = 0; d < head_dim; ++d) {
                dot += qh[d] * k[d];
            }
            s[p] = dot * scale;
        }
        softmax(s, n_ctx);
        float* o = out + h * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) {
            o[d] = 0.0f;
        }
        for (int64_t p = 0; p < n_ctx; ++p) {
            const float* v = values + p * kv_stride;
            const float w = s[p];
            for (int64_t d = 0; d < head_dim; ++d) {
                o[d] += w * v[d];
            }
        }
    }
}

}  // namespace edge::engine::cpu
