#include "engine/model/paged_attention.h"

#include <immintrin.h>

#include <algorithm>

#include "engine/cpu/avx2_reduce.h"
#include "engine/cpu/ops.h"
#include "engine/cpu/ops_kernels.h"

// GCC 12 reports its own _mm512_undefined_* placeholders inside the reduce intrinsics as "may be
// used uninitialized" (a known false positive); silenced for the AVX-512 function only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace edge::engine {
namespace {

// AVX-512 form for head_dim a multiple of 16 (only called after cpuid reports AVX-512F/BW/VL/DQ):
// each key and value row is loaded once for up to four query heads of the group. Sums are taken
// in another order than the scalar loop, so results agree with it to f32 rounding.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))) void attend_avx512(
    const KvCache& kv, int32_t slot, int32_t layer, int32_t kv_head, const float* q, int64_t n_q,
    int64_t n_ctx, float scale, float* scores, float* out) {
    const int64_t hd = kv.shape().head_dim;
    const int64_t bt = kv.block_tokens();
    const auto table = kv.blocks(slot);
    const int64_t vecs = hd / 16;
    for (int64_t h0 = 0; h0 < n_q; h0 += 4) {
        const int64_t nh = std::min<int64_t>(4, n_q - h0);
        for (int64_t b0 = 0; b0 < n_ctx; b0 += bt) {
            const float* keys = kv.block_keys(table[b0 / bt], layer, kv_head);
            const int64_t end = std::min(bt, n_ctx - b0);
            for (int64_t p = 0; p < end; ++p) {
                const float* k = keys + p * hd;
                __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                                 _mm512_setzero_ps()};
                for (int64_t v = 0; v < vecs; ++v) {
                    const __m512 kv16 = _mm512_loadu_ps(k + v * 16);
                    for (int64_t h = 0; h < nh; ++h) {
                        acc[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q + (h0 + h) * hd + v * 16), kv16,
                                                 acc[h]);
                    }
                }
                for (int64_t h = 0; h < nh; ++h) {
                    scores[(h0 + h) * n_ctx + b0 + p] = _mm512_reduce_add_ps(acc[h]) * scale;
                }
            }
        }
        for (int64_t h = 0; h < nh; ++h) {
            cpu::softmax(scores + (h0 + h) * n_ctx, n_ctx);
        }
        for (int64_t v = 0; v < vecs; ++v) {
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                             _mm512_setzero_ps()};
            for (int64_t b0 = 0; b0 < n_ctx; b0 += bt) {
                const float* values = kv.block_values(table[b0 / bt], layer, kv_head);
                const int64_t end = std::min(bt, n_ctx - b0);
                for (int64_t p = 0; p < end; ++p) {
                    const __m512 val = _mm512_loadu_ps(values + p * hd + v * 16);
                    for (int64_t h = 0; h < nh; ++h) {
                        const __m512 w = _mm512_set1_ps(scores[(h0 + h) * n_ctx + b0 + p]);
                        acc[h] = _mm512_fmadd_ps(w, val, acc[h]);
                    }
                }
            }
            for (int64_t h = 0; h < nh; ++h) {
                _mm512_storeu_ps(out + (h0 + h) * hd + v * 16, acc[h]);
            }
        }
    }
}

// The same with AVX2 + FMA for head_dim a multiple of 8 (only called after cpuid reports them).
__attribute__((target("avx2,fma"))) void attend_avx2(const KvCache& kv, int32_t slot, int32_t layer,
                                                     int32_t kv_head, const float* q, int64_t n_q,
                                                     int64_t n_ctx, float scale, float* scores,
                                                     float* out) {
    const int64_t hd = kv.shape().head_dim;
    const int64_t bt = kv.block_tokens();
    const auto table = kv.blocks(slot);
    const int64_t vecs = hd / 8;
    for (int64_t h0 = 0; h0 < n_q; h0 += 4) {
        const int64_t nh = std::min<int64_t>(4, n_q - h0);
        for (int64_t b0 = 0; b0 < n_ctx; b0 += bt) {
            const float* keys = kv.block_keys(table[b0 / bt], layer, kv_head);
            const int64_t end = std::min(bt, n_ctx - b0);
            for (int64_t p = 0; p < end; ++p) {
                const float* k = keys + p * hd;
                __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                                 _mm256_setzero_ps()};
                for (int64_t v = 0; v < vecs; ++v) {
                    const __m256 k8 = _mm256_loadu_ps(k + v * 8);
                    for (int64_t h = 0; h < nh; ++h) {
                        acc[h] =
                            _mm256_fmadd_ps(_mm256_loadu_ps(q + (h0 + h) * hd + v * 8), k8, acc[h]);
                    }
                }
                for (int64_t h = 0; h < nh; ++h) {
                    scores[(h0 + h) * n_ctx + b0 + p] = cpu::hsum_avx2(acc[h]) * scale;
                }
            }
        }
        for (int64_t h = 0; h < nh; ++h) {
            cpu::softmax(scores + (h0 + h) * n_ctx, n_ctx);
        }
        for (int64_t v = 0; v < vecs; ++v) {
            __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                             _mm256_setzero_ps()};
            for (int64_t b0 = 0; b0 < n_ctx; b0 += bt) {
                const float* values = kv.block_values(table[b0 / bt], layer, kv_head);
                const int64_t end = std::min(bt, n_ctx - b0);
                for (int64_t p = 0; p < end; ++p) {
                    const __m256 val = _mm256_loadu_ps(values + p * hd + v * 8);
                    for (int64_t h = 0; h < nh; ++h) {
                        const __m256 w = _mm256_set1_ps(scores[(h0 + h) * n_ctx + b0 + p]);
                        acc[h] = _mm256_fmadd_ps(w, val, acc[h]);
                    }
                }
            }
            for (int64_t h = 0; h < nh; ++h) {
                _mm256_storeu_ps(out + (h0 + h) * hd + v * 8, acc[h]);
            }
        }
    }
}

}  // namespace

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

void paged_attention_gqa(const KvCache& kv, int32_t slot, int32_t layer, int32_t kv_head,
                         const float* q, int64_t n_q, int64_t n_ctx, float scale, float* scores,
                         float* out) {
    const int64_t hd = kv.shape().head_dim;
    if (hd % 16 == 0 && cpu::ops_use_avx512()) {
        attend_avx512(kv, slot, layer, kv_head, q, n_q, n_ctx, scale, scores, out);
        return;
    }
    if (hd % 8 == 0 && cpu::ops_use_avx2()) {
        attend_avx2(kv, slot, layer, kv_head, q, n_q, n_ctx, scale, scores, out);
        return;
    }
    const int64_t bt = kv.block_tokens();
    const auto table = kv.blocks(slot);
    for (int64_t h = 0; h < n_q; ++h) {
        const float* qh = q + h * hd;
        float* s = scores + h * n_ctx;
        for (int64_t b0 = 0; b0 < n_ctx; b0 += bt) {
            const float* keys = kv.block_keys(table[b0 / bt], layer, kv_head);
            const int64_t end = std::min(bt, n_ctx - b0);
            for (int64_t p = 0; p < end; ++p) {
                const float* k = keys + p * hd;
                float dot = 0.0f;
                for (int64_t d = 0; d < hd; ++d) {
                    dot += qh[d] * k[d];
                }
                s[b0 + p] = dot * scale;
            }
        }
        cpu::softmax(s, n_ctx);
        float* o = out + h * hd;
        std::fill(o, o + hd, 0.0f);
        for (int64_t b0 = 0; b0 < n_ctx; b0 += bt) {
            const float* values = kv.block_values(table[b0 / bt], layer, kv_head);
            const int64_t end = std::min(bt, n_ctx - b0);
            for (int64_t p = 0; p < end; ++p) {
                const float* v = values + p * hd;
                const float w = s[b0 + p];
                for (int64_t d = 0; d < hd; ++d) {
                    o[d] += w * v[d];
                }
            }
        }
    }
}

namespace {

void gather(const KvCache& kv, int32_t slot, int32_t layer, int32_t kv_head, int32_t count,
            bool values, float* out) {
    const int64_t hd = kv.shape().head_dim;
    const int32_t bt = kv.block_tokens();
    const auto table = kv.blocks(slot);
    for (int32_t b0 = 0; b0 < count; b0 += bt) {
        const float* src = values ? kv.block_values(table[b0 / bt], layer, kv_head)
                                  : kv.block_keys(table[b0 / bt], layer, kv_head);
        const int64_t rows = std::min(bt, count - b0);
        std::copy(src, src + rows * hd, out + static_cast<int64_t>(b0) * hd);
    }
}

}  // namespace

void gather_keys(const KvCache& kv, int32_t slot, int32_t layer, int32_t kv_head, int32_t count,
                 float* out) {
    gather(kv, slot, layer, kv_head, count, false, out);
}

void gather_values(const KvCache& kv, int32_t slot, int32_t layer, int32_t kv_head, int32_t count,
                   float* out) {
    gather(kv, slot, layer, kv_head, count, true, out);
}

}  // namespace edge::engine
