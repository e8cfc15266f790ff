#pragma once

// The SIMD forms of paged_attention_gqa (engine/model/paged_attention.cc calls them after cpuid):
// one algorithm, attend_simd<V>, written once over a vector type V and instantiated by a file
// compiled for V's ISA (paged_attention_avx2.cc, paged_attention_avx512.cc). A GCC function
// template takes one target attribute for all its instantiations, so the per-ISA forms are per-ISA
// files. Each key and value row is loaded once for up to four query heads of the group; sums are
// taken in another order than the scalar loop, so results agree with it to f32 rounding.
//
// attend_simd has internal linkage and calls only V's members, KvCache's out-of-line accessors
// and cpu::softmax, so the per-ISA files define no weak symbol (see engine/CMakeLists.txt). What
// it needs of KvCache's inline accessors (the head size, the block size and the slot's block
// table) the caller reads for it into a KvSeqView: called in the per-ISA files, an -O0 build
// would emit those accessors there as weak copies compiled with the ISA's flags.

#include <cstdint>

#include "engine/cpu/ops.h"
#include "engine/model/kv_cache.h"

namespace edge::engine::detail {

// One slot of the cache as attend_simd reads it.
struct KvSeqView {
    const KvCache* kv = nullptr;
    const int32_t* table = nullptr;  // kv->blocks(slot).data()
    int64_t head_dim = 0;            // kv->shape().head_dim
    int64_t block_tokens = 0;        // kv->block_tokens()
};

inline KvSeqView kv_seq_view(const KvCache& kv, int32_t slot) {
    return {&kv, kv.blocks(slot).data(), kv.shape().head_dim, kv.block_tokens()};
}

// head_dim a multiple of 8, AVX2 + FMA.
void attend_avx2(const KvSeqView& s, int32_t layer, int32_t kv_head, const float* q, int64_t n_q,
                 int64_t n_ctx, float scale, float* scores, float* out);
// head_dim a multiple of 16, AVX-512 F/BW/VL/DQ.
void attend_avx512(const KvSeqView& s, int32_t layer, int32_t kv_head, const float* q, int64_t n_q,
                   int64_t n_ctx, float scale, float* scores, float* out);

namespace {

// V: Vec, kLanes, zero(), load(p), store(p, v), set1(x), fma(a, b, c) = a * b + c, sum(v).
template <typename V>
void attend_simd(const KvSeqView& s, int32_t layer, int32_t kv_head, const float* q, int64_t n_q,
                 int64_t n_ctx, float scale, float* scores, float* out) {
    using Vec = typename V::Vec;
    constexpr int64_t kL = V::kLanes;
    const KvCache& kv = *s.kv;
    const int64_t hd = s.head_dim;
    const int64_t bt = s.block_tokens;
    const int32_t* table = s.table;
    const int64_t vecs = hd / kL;
    for (int64_t h0 = 0; h0 < n_q; h0 += 4) {
        const int64_t nh = n_q - h0 < 4 ? n_q - h0 : 4;
        for (int64_t b0 = 0; b0 < n_ctx; b0 += bt) {
            const float* keys = kv.block_keys(table[b0 / bt], layer, kv_head);
            const int64_t end = n_ctx - b0 < bt ? n_ctx - b0 : bt;
            for (int64_t p = 0; p < end; ++p) {
                const float* k = keys + p * hd;
                Vec acc[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
                for (int64_t v = 0; v < vecs; ++v) {
                    const Vec kv_vec = V::load(k + v * kL);
                    for (int64_t h = 0; h < nh; ++h) {
                        acc[h] = V::fma(V::load(q + (h0 + h) * hd + v * kL), kv_vec, acc[h]);
                    }
                }
                for (int64_t h = 0; h < nh; ++h) {
                    scores[(h0 + h) * n_ctx + b0 + p] = V::sum(acc[h]) * scale;
                }
            }
        }
        for (int64_t h = 0; h < nh; ++h) {
            cpu::softmax(scores + (h0 + h) * n_ctx, n_ctx);
        }
        for (int64_t v = 0; v < vecs; ++v) {
            Vec acc[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
            for (int64_t b0 = 0; b0 < n_ctx; b0 += bt) {
                const float* values = kv.block_values(table[b0 / bt], layer, kv_head);
                const int64_t end = n_ctx - b0 < bt ? n_ctx - b0 : bt;
                for (int64_t p = 0; p < end; ++p) {
                    const Vec val = V::load(values + p * hd + v * kL);
                    for (int64_t h = 0; h < nh; ++h) {
                        acc[h] = V::fma(V::set1(scores[(h0 + h) * n_ctx + b0 + p]), val, acc[h]);
                    }
                }
            }
            for (int64_t h = 0; h < nh; ++h) {
                V::store(out + (h0 + h) * hd + v * kL, acc[h]);
            }
        }
    }
}

}  // namespace
}  // namespace edge::engine::detail
