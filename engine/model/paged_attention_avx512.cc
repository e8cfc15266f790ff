// paged_attention_simd.h's algorithm in AVX-512. Compiled with -mavx512f/bw/vl/dq -mfma
// (engine/CMakeLists.txt); called only after cpuid reports them.

#include <immintrin.h>

#include "engine/model/paged_attention_simd.h"

namespace edge::engine::detail {
namespace {

struct Avx512 {
    using Vec = __m512;
    static constexpr int64_t kLanes = 16;
    static constexpr int kValueVecs = 4;  // 4 heads x 4: 16 of the 32 registers.
    static Vec zero() { return _mm512_setzero_ps(); }
    static Vec load(const float* p) { return _mm512_loadu_ps(p); }
    static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
    static Vec set1(float x) { return _mm512_set1_ps(x); }
    static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
    static float sum(Vec v) { return _mm512_reduce_add_ps(v); }
};

}  // namespace

void attend_avx512(const KvSeqView& s, int32_t layer, int32_t kv_head, const float* q, int64_t n_q,
                   int64_t n_ctx, float scale, float* scores, float* out) {
    attend_simd<Avx512>(s, layer, kv_head, q, n_q, n_ctx, scale, scores, out);
}

}  // namespace edge::engine::detail
