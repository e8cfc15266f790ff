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

// Query heads one call of attend_heads takes at most: each key and value row is loaded once for
// all of them.
constexpr int64_t kAttendHeads = 4;

// Prefetches `rows` rows of hd floats from `p` into L1 (L2 with T1). The cache's blocks are
// scattered, so the hardware prefetchers stop at each block's end.
template <bool T1 = false>
inline void prefetch_rows(const float* p, int64_t rows, int64_t hd) {
    const char* r = reinterpret_cast<const char*>(p);
    for (int64_t b = 0; b < rows * hd * static_cast<int64_t>(sizeof(float)); b += 64) {
        __builtin_prefetch(r + b, 0, T1 ? 2 : 3);
    }
}

// attend_simd for NH query heads. The accumulators are indexed by compile-time heads (and value
// vectors) so that they stay in registers: with a run-time head count GCC kept them on the stack,
// a store and a load around every FMA (perf: attention took 8.5% of a 32-sequence decode step of
// the bench preset, ~7 ms of 80).
template <typename V, int NH>
void attend_heads(const KvSeqView& s, int32_t layer, int32_t kv_head, const float* q, int64_t n_ctx,
                  float scale, float* scores, float* out) {
    using Vec = typename V::Vec;
    constexpr int64_t kL = V::kLanes;
    constexpr int VC = V::kValueVecs;  // Value vectors per pass: NH * VC accumulators.
    const KvCache& kv = *s.kv;
    const int64_t hd = s.head_dim;
    const int64_t bt = s.block_tokens;
    const int32_t* table = s.table;
    const int64_t vecs = hd / kL;
    const int64_t blocks = (n_ctx + bt - 1) / bt;
    auto block_rows = [&](int64_t b) { return n_ctx - b * bt < bt ? n_ctx - b * bt : bt; };
    // Keys two blocks ahead into L2 and one ahead into L1, a row each per row read, and this
    // block's values into L2 for the pass after the softmax; the first two blocks' keys at once
    // (their misses overlap). A block of 16 rows of 64 takes ~300 cycles, less than a miss to
    // memory with the other core streaming weights.
    auto ahead = [&](int64_t b, int64_t p) {
        return b < blocks && p < block_rows(b) ? kv.block_keys(table[b], layer, kv_head) + p * hd
                                               : nullptr;
    };
    prefetch_rows(ahead(0, 0), block_rows(0), hd);
    if (blocks > 1) {
        prefetch_rows<true>(ahead(1, 0), block_rows(1), hd);
    }
    for (int64_t b = 0; b < blocks; ++b) {
        const float* keys = kv.block_keys(table[b], layer, kv_head);
        const float* values = kv.block_values(table[b], layer, kv_head);
        const int64_t end = block_rows(b);
        for (int64_t p = 0; p < end; ++p) {
            if (const float* k1 = ahead(b + 1, p)) {
                prefetch_rows(k1, 1, hd);
            }
            if (const float* k2 = ahead(b + 2, p)) {
                prefetch_rows<true>(k2, 1, hd);
            }
            prefetch_rows<true>(values + p * hd, 1, hd);
            const float* k = keys + p * hd;
            Vec acc[NH];
#pragma GCC unroll 4
            for (int h = 0; h < NH; ++h) {
                acc[h] = V::zero();
            }
            for (int64_t v = 0; v < vecs; ++v) {
                const Vec kv_vec = V::load(k + v * kL);
#pragma GCC unroll 4
                for (int h = 0; h < NH; ++h) {
                    acc[h] = V::fma(V::load(q + h * hd + v * kL), kv_vec, acc[h]);
                }
            }
#pragma GCC unroll 4
            for (int h = 0; h < NH; ++h) {
                scores[h * n_ctx + b * bt + p] = V::sum(acc[h]) * scale;
            }
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < NH; ++h) {
        cpu::softmax(scores + h * n_ctx, n_ctx);
    }
    // VC value vectors at a time (fewer where the head ends), each position's row read once.
    for (int64_t v0 = 0; v0 < vecs; v0 += VC) {
        const int64_t nv = vecs - v0 < VC ? vecs - v0 : VC;
        Vec acc[NH][VC];
#pragma GCC unroll 4
        for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 4
            for (int c = 0; c < VC; ++c) {
                acc[h][c] = V::zero();
            }
        }
        for (int64_t b = 0; b < blocks; ++b) {
            const float* values = kv.block_values(table[b], layer, kv_head) + v0 * kL;
            const int64_t end = block_rows(b);
            for (int64_t p = 0; p < end; ++p) {
                const float* row = values + p * hd;
                Vec val[VC];
#pragma GCC unroll 4
                for (int c = 0; c < VC; ++c) {
                    // Past the head's end (nv < VC): zeros, never stored.
                    val[c] = c < nv ? V::load(row + c * kL) : V::zero();
                }
#pragma GCC unroll 4
                for (int h = 0; h < NH; ++h) {
                    const Vec w = V::set1(scores[h * n_ctx + b * bt + p]);
#pragma GCC unroll 4
                    for (int c = 0; c < VC; ++c) {
                        acc[h][c] = V::fma(w, val[c], acc[h][c]);
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 4
            for (int c = 0; c < VC; ++c) {
                if (c < nv) {
                    V::store(out + h * hd + (v0 + c) * kL, acc[h][c]);
                }
            }
        }
    }
}

// V: Vec, kLanes, kValueVecs, zero(), load(p), store(p, v), set1(x), fma(a, b, c) = a * b + c,
// sum(v).
template <typename V>
void attend_simd(const KvSeqView& s, int32_t layer, int32_t kv_head, const float* q, int64_t n_q,
                 int64_t n_ctx, float scale, float* scores, float* out) {
    const int64_t hd = s.head_dim;
    for (int64_t h0 = 0; h0 < n_q; h0 += kAttendHeads) {
        const float* qh = q + h0 * hd;
        float* sh = scores + h0 * n_ctx;
        float* oh = out + h0 * hd;
        switch (n_q - h0 < kAttendHeads ? n_q - h0 : kAttendHeads) {
            case 1:
                attend_heads<V, 1>(s, layer, kv_head, qh, n_ctx, scale, sh, oh);
                break;
            case 2:
                attend_heads<V, 2>(s, layer, kv_head, qh, n_ctx, scale, sh, oh);
                break;
            case 3:
                attend_heads<V, 3>(s, layer, kv_head, qh, n_ctx, scale, sh, oh);
                break;
            default:
                attend_heads<V, 4>(s, layer, kv_head, qh, n_ctx, scale, sh, oh);
                break;
        }
    }
}

}  // namespace
}  // namespace edge::engine::detail
