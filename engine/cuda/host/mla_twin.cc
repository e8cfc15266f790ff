#include "engine/cuda/host/mla_twin.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "engine/cpu/convert.h"
#include "engine/cuda/host/cpu_twins.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine::cuda::twin {
namespace {

// Row r of w as f32 (quant::dequantize_row, f16 by hand as it leaves that to the matmuls).
void weight_row(const Weight& w, int64_t r, float* out) {
    if (w.format == WeightFormat::kF16) {
        for (int64_t c = 0; c < w.cols; ++c) {
            out[c] = cpu::f16_to_f32(cpu::load_u16(w.data, r * w.cols + c));
        }
        return;
    }
    quant::dequantize_row(w, r, out);
}

void dense(const Weight& w, const float* in, int64_t rows, float* out) {
    const int32_t off[2] = {0, static_cast<int32_t>(rows)};
    grouped_matmul(std::span<const Weight>(&w, 1), off, in, out);
}

}  // namespace

void mla_latent_write(const MlaLatentLayout& layout, int32_t layer, const MlaDims& d,
                      const float* kv, const float* norm, const int32_t* seq_of_token,
                      const int32_t* pos_of_token, int64_t rows, const int32_t* block_table,
                      int32_t max_blocks_per_seq, float* pool) {
    const int64_t c = layout.latent;
    const int64_t width = layout.row_floats();
    for (int64_t t = 0; t < rows; ++t) {
        const float* src = kv + t * width;
        const int32_t* table =
            block_table + static_cast<int64_t>(seq_of_token[t]) * max_blocks_per_seq;
        float* dst = pool + layout.position_offset(layer, table, pos_of_token[t]);
        double ss = 0.0;
        for (int64_t j = 0; j < c; ++j) {
            ss += static_cast<double>(src[j]) * src[j];
        }
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + d.eps));
        for (int64_t j = 0; j < c; ++j) {
            dst[j] = src[j] * inv * norm[j];
        }
        std::copy(src + c, src + width, dst + c);
    }
}

void mla_absorb(const Weight& kv_b, const MlaDims& d, const float* q, int64_t rows, float* q_full) {
    const int64_t c = d.kv_lora_rank;
    std::vector<float> wk(static_cast<size_t>(d.nope) * c);
    for (int32_t h = 0; h < d.heads; ++h) {
        for (int32_t i = 0; i < d.nope; ++i) {
            weight_row(kv_b, h * d.kv_b_rows_per_head() + i, wk.data() + i * c);
        }
        for (int64_t t = 0; t < rows; ++t) {
            const float* qh = q + (t * d.heads + h) * d.qk();
            float* qf = q_full + (t * d.heads + h) * d.row();
            for (int64_t j = 0; j < c; ++j) {
                double acc = 0.0;
                for (int32_t i = 0; i < d.nope; ++i) {
                    acc += static_cast<double>(qh[i]) * wk[i * c + j];
                }
                qf[j] = static_cast<float>(acc);
            }
            std::copy(qh + d.nope, qh + d.qk(), qf + c);
        }
    }
}

void mla_attention(const MlaLatentLayout& layout, int32_t layer, const MlaDims& d,
                   const float* q_full, int64_t rows, const int32_t* seq_of_token,
                   const int32_t* pos_of_token, const int32_t* block_table,
                   int32_t max_blocks_per_seq, const float* pool, float* o_lat) {
    const int32_t heads = d.heads;
    const double scale = d.softmax_scale;
    const int64_t c = layout.latent;
    const int64_t width = layout.row_floats();
    std::vector<double> w;
    std::vector<double> acc(static_cast<size_t>(c));
    for (int64_t t = 0; t < rows; ++t) {
        const int32_t n_ctx = pos_of_token[t] + 1;
        const int32_t* table =
            block_table + static_cast<int64_t>(seq_of_token[t]) * max_blocks_per_seq;
        w.resize(static_cast<size_t>(n_ctx));
        for (int32_t h = 0; h < heads; ++h) {
            const float* qf = q_full + (t * heads + h) * width;
            double mx = -INFINITY;
            for (int32_t p = 0; p < n_ctx; ++p) {
                const float* row = pool + layout.position_offset(layer, table, p);
                double s = 0.0;
                for (int64_t j = 0; j < width; ++j) {
                    s += static_cast<double>(qf[j]) * row[j];
                }
                w[p] = s * scale;
                mx = std::max(mx, w[p]);
            }
            double sum = 0.0;
            for (int32_t p = 0; p < n_ctx; ++p) {
                w[p] = std::exp(w[p] - mx);
                sum += w[p];
            }
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int32_t p = 0; p < n_ctx; ++p) {
                const float* row = pool + layout.position_offset(layer, table, p);
                for (int64_t j = 0; j < c; ++j) {
                    acc[j] += w[p] * row[j];
                }
            }
            float* o = o_lat + (t * heads + h) * c;
            for (int64_t j = 0; j < c; ++j) {
                o[j] = static_cast<float>(acc[j] / sum);
            }
        }
    }
}

void mla_expand(const Weight& kv_b, const MlaDims& d, const float* o_lat, int64_t rows,
                float* out) {
    const int64_t c = d.kv_lora_rank;
    std::vector<float> wv(c);
    for (int32_t h = 0; h < d.heads; ++h) {
        for (int32_t e = 0; e < d.v_head_dim; ++e) {
            weight_row(kv_b, h * d.kv_b_rows_per_head() + d.nope + e, wv.data());
            for (int64_t t = 0; t < rows; ++t) {
                const float* o = o_lat + (t * d.heads + h) * c;
                double acc = 0.0;
                for (int64_t j = 0; j < c; ++j) {
                    acc += static_cast<double>(wv[j]) * o[j];
                }
                out[(t * d.heads + h) * d.v_head_dim + e] = static_cast<float>(acc);
            }
        }
    }
}

Status mla_attention_layer(const MlaLayerWeights& w, const MlaDims& d,
                           const MlaLatentLayout& layout, int32_t layer, const float* x,
                           int64_t rows, const int32_t* seq_of_token, const int32_t* pos_of_token,
                           int32_t sequences, const int32_t* block_table,
                           int32_t max_blocks_per_seq, const double* inv_freq, float* pool,
                           float* out) {
    EDGE_RETURN_IF_ERROR(check_mla_dims(d));
    EDGE_RETURN_IF_ERROR(check_mla_layout(layout, layer, d));
    if (rows <= 0) {
        return ok_status();
    }
    if (sequences <= 0 || max_blocks_per_seq <= 0) {
        return invalid_argument_error("mla: no sequences or an empty block table");
    }
    std::vector<int32_t> lengths(static_cast<size_t>(sequences), 0);
    for (int64_t t = 0; t < rows; ++t) {
        if (seq_of_token[t] < 0 || seq_of_token[t] >= sequences || pos_of_token[t] < 0) {
            return invalid_argument_error("mla: row " + std::to_string(t) + " names sequence " +
                                          std::to_string(seq_of_token[t]) + " at position " +
                                          std::to_string(pos_of_token[t]) + " of " +
                                          std::to_string(sequences) + " sequences");
        }
        int32_t& len = lengths[static_cast<size_t>(seq_of_token[t])];
        len = std::max(len, pos_of_token[t] + 1);
    }
    EDGE_RETURN_IF_ERROR(check_mla_block_table(
        layout,
        std::span<const int32_t>(block_table, static_cast<size_t>(sequences) * max_blocks_per_seq),
        max_blocks_per_seq, lengths));
    std::vector<float> scratch(static_cast<size_t>(mla_scratch_floats(d, rows)));
    float* qa = scratch.data();
    float* q = qa + rows * d.q_lora_rank;
    float* kv = q + rows * d.heads * d.qk();
    float* q_full = kv + rows * d.row();
    float* o_lat = q_full + rows * d.heads * d.row();
    if (d.q_lora_rank > 0) {
        dense(w.q_a, x, rows, qa);
        rms_norm_rows(qa, w.q_a_norm.data(), rows, d.q_lora_rank, d.eps, qa);
        dense(w.q, qa, rows, q);
    } else {
        dense(w.q, x, rows, q);
    }
    dense(w.kv_a, x, rows, kv);
    // The rope dims are the last `rope` values of each q head and of each kv row: rotate them in
    // place as heads of width qk (or row) starting `nope` (or latent) floats in.
    rope(q + d.nope, pos_of_token, rows, d.heads, d.qk(), d.rope, inv_freq, !d.interleave,
         d.rope_mscale);
    rope(kv + d.kv_lora_rank, pos_of_token, rows, 1, d.row(), d.rope, inv_freq, !d.interleave,
         d.rope_mscale);
    mla_latent_write(layout, layer, d, kv, w.kv_a_norm.data(), seq_of_token, pos_of_token, rows,
                     block_table, max_blocks_per_seq, pool);
    mla_absorb(w.kv_b, d, q, rows, q_full);
    mla_attention(layout, layer, d, q_full, rows, seq_of_token, pos_of_token, block_table,
                  max_blocks_per_seq, pool, o_lat);
    mla_expand(w.kv_b, d, o_lat, rows, out);
    return ok_status();
}

}  // namespace edge::engine::cuda::twin
