// paged_attention_simd.h's algorithm in AVX2 + FMA. Compiled with -mavx2 -mfma
// (engine/CMakeLists.txt); called only after cpuid reports them.

#include <immintrin.h>

#include "engine/cpu/avx2_reduce.h"
#include "engine/model/paged_attention_simd.h"

namespace edge::engine::detail {
namespace {

struct Avx2 {
    using Vec = __m256;
    static constexpr int64_t kLanes = 8;
    static constexpr int kValueVecs = 2;  // 4 heads x 2: 8 of the 16 registers.
    static Vec zero() { return _mm256_setzero_ps(); }
    static Vec load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
    static Vec set1(float x) { return _mm256_set1_ps(x); }
    static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
    static float sum(Vec v) { return cpu::hsum_avx2(v); }
};

}  // namespace

void attend_avx2(const KvSeqView& s, int32_t layer, int32_t kv_head, const float* q, int64_t n_q,
                 int64_t n_ctx, float scale, float* scores, float* out) {
    attend_simd<Avx2>(s, layer, kv_head, q, n_q, n_ctx, scale, scores, out);
}

}  // namespace edge::engine::detail
