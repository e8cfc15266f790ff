#include "engine/model/paged_attention.h"

#include <algorithm>

#include "engine/cpu/ops.h"
#include "engine/cpu/ops_kernels.h"
#include "engine/model/paged_attention_simd.h"

namespace edge::engine {

void paged_attention_gqa(const KvCache& kv, int32_t slot, int32_t layer, int32_t kv_head,
                         const float* q, int64_t n_q, int64_t n_ctx, float scale, float* scores,
                         float* out) {
    const int64_t hd = kv.shape().head_dim;
    if (hd % 16 == 0 && cpu::ops_use_avx512()) {
        detail::attend_avx512(detail::kv_seq_view(kv, slot), layer, kv_head, q, n_q, n_ctx, scale,
                              scores, out);
        return;
    }
    if (hd % 8 == 0 && cpu::ops_use_avx2()) {
        detail::attend_avx2(detail::kv_seq_view(kv, slot), layer, kv_head, q, n_q, n_ctx, scale,
                            scores, out);
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
