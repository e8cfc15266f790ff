#pragma once

// The per-ISA versions of the element-wise kernels behind ops.h: the scalar references (any CPU),
// the AVX2 versions (ops_avx2.cc, only called after cpuid reports AVX2 and FMA) and the AVX-512
// ones (ops_avx512.cc, AVX-512F/BW/VL/DQ). ops.h's functions call the widest this CPU runs,
// chosen once; this header is for them and for the parity tests.
// Same contracts as the ops.h functions of the same name; pure functions, thread-safe on disjoint
// outputs.

#include <cstdint>
#include <string_view>
#include <vector>

namespace edge::engine::cpu {

void rms_norm_scalar(const float* x, const float* weight, int64_t n, float eps, float* out);
void rope_neox_scalar(float* head, int64_t rot_dim, const float* cos, const float* sin);
void rope_interleaved_scalar(float* head, int64_t rot_dim, const float* cos, const float* sin);
void softmax_scalar(float* x, int64_t n);
double exp_sum_scalar(const float* x, int64_t n, float shift, float* out);
void silu_mul_scalar(const float* gate, const float* up, int64_t n, float* out);

void rms_norm_avx2(const float* x, const float* weight, int64_t n, float eps, float* out);
void rope_neox_avx2(float* head, int64_t rot_dim, const float* cos, const float* sin);
void rope_interleaved_avx2(float* head, int64_t rot_dim, const float* cos, const float* sin);
void softmax_avx2(float* x, int64_t n);
double exp_sum_avx2(const float* x, int64_t n, float shift, float* out);
void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* out);

void rms_norm_avx512(const float* x, const float* weight, int64_t n, float eps, float* out);
void rope_neox_avx512(float* head, int64_t rot_dim, const float* cos, const float* sin);
void rope_interleaved_avx512(float* head, int64_t rot_dim, const float* cos, const float* sin);
void softmax_avx512(float* x, int64_t n);
double exp_sum_avx512(const float* x, int64_t n, float shift, float* out);
void silu_mul_avx512(const float* gate, const float* up, int64_t n, float* out);

// e^x in the SIMD versions (ops_avx2.cc, ops_avx512.cc): x = n ln2 + r with n = round(x log2 e),
// r by ln2 in two parts (the high one exact in a few bits, so n * kLn2High is exact), and e^r by
// its degree-6 Taylor polynomial (truncation error below 1.2e-7 relative for |r| <= ln2 / 2),
// coefficients highest degree first, for Horner's rule.
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2High = 0.693359375f;
inline constexpr float kLn2Low = -2.12194440e-4f;
// Internal linkage (not `inline`): an -O0 build of the per-ISA files would otherwise emit the
// array there as a unique global, which tests/engine/isa_objects_check.sh refuses.
constexpr float kExpTaylor[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f,
                                 0.5f,          1.0f,          1.0f};

// One ISA's set of the kernels.
struct OpsVariant {
    const char* name;  // "scalar", "avx2", "avx512".
    void (*rms_norm)(const float*, const float*, int64_t, float, float*);
    void (*rope_neox)(float*, int64_t, const float*, const float*);
    void (*rope_interleaved)(float*, int64_t, const float*, const float*);
    void (*softmax)(float*, int64_t);
    double (*exp_sum)(const float*, int64_t, float, float*);
    void (*silu_mul)(const float*, const float*, int64_t, float*);
};

// Every variant this CPU runs, the scalar references first and the one ops.h uses last.
std::vector<OpsVariant> ops_variants();

// The name of the variant ops.h's functions use on this CPU.
std::string_view ops_isa_name();

// Whether that variant is AVX-512, or AVX2 (paged attention picks its own forms by them).
bool ops_use_avx512();
bool ops_use_avx2();

}  // namespace edge::engine::cpu
