#include "engine/cuda/host/cpu_twins.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "engine/cpu/convert.h"
#include "engine/cpu/ops.h"
#include "engine/cpu/router.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine::cuda::twin {
namespace {

// quant::dequantize_row, plus f16 (which it leaves to the CPU matmul kernels).
void dequant_row(const Weight& w, int64_t r, float* out) {
    if (w.format == WeightFormat::kF16) {
        for (int64_t c = 0; c < w.cols; ++c) {
            out[c] = cpu::f16_to_f32(cpu::load_u16(w.data, r * w.cols + c));
        }
        return;
    }
    quant::dequantize_row(w, r, out);
}

}  // namespace

void embedding(const Weight& table, const int32_t* ids, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) {
        dequant_row(table, ids[i], out + i * table.cols);
    }
}

void rms_norm_rows(const float* x, const float* weight, int64_t rows, int64_t cols, float eps,
                   float* out) {
    for (int64_t r = 0; r < rows; ++r) {
        cpu::rms_norm(x + r * cols, weight, cols, eps, out + r * cols);
    }
}

void rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
          int64_t rot_dim, const double* inv_freq, bool neox, float mscale) {
    const int64_t half = rot_dim / 2;
    std::vector<float> cs(half), sn(half);
    for (int64_t t = 0; t < tokens; ++t) {
        cpu::rope_angles(positions[t], inv_freq, half, cs.data(), sn.data());
        for (int64_t i = 0; i < half; ++i) {
            cs[i] *= mscale;
            sn[i] *= mscale;
        }
        for (int64_t h = 0; h < heads; ++h) {
            float* head = x + (t * heads + h) * head_dim;
            if (neox) {
                cpu::rope_neox(head, rot_dim, cs.data(), sn.data());
            } else {
                cpu::rope_interleaved(head, rot_dim, cs.data(), sn.data());
            }
        }
    }
}

void add_bias_rows(float* x, const float* bias, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
            x[r * cols + c] += bias[c];
        }
    }
}

void paged_kv_write(const PagedKvLayout& layout, int32_t layer, const float* k, const float* v,
                    const int32_t* seq_of_token, const int32_t* pos_of_token, int64_t tokens,
                    const int32_t* block_table, int32_t max_blocks_per_seq, float* pool) {
    const int32_t hd = layout.head_dim;
    for (int64_t t = 0; t < tokens; ++t) {
        const int32_t* table = block_table + static_cast<int64_t>(seq_of_token[t]) *
                                                 max_blocks_per_seq;
        for (int32_t h = 0; h < layout.kv_heads; ++h) {
            const int64_t at = layout.position_offset(table, h, pos_of_token[t]);
            const float* ks = k + (t * layout.kv_heads + h) * hd;
            const float* vs = v + (t * layout.kv_heads + h) * hd;
            std::copy(ks, ks + hd, pool + layout.plane_offset(layer, 0) + at);
            std::copy(vs, vs + hd, pool + layout.plane_offset(layer, 1) + at);
        }
    }
}

void paged_attention(const PagedKvLayout& layout, int32_t layer, const float* q, int64_t tokens,
                     int32_t q_heads, const int32_t* seq_of_token, const int32_t* pos_of_token,
                     const int32_t* block_table, int32_t max_blocks_per_seq, const float* pool,
                     float scale, float* out) {
    const int32_t hd = layout.head_dim;
    const int32_t group = q_heads / layout.kv_heads;
    std::vector<float> keys, values, scores;
    for (int64_t t = 0; t < tokens; ++t) {
        const int32_t n_ctx = pos_of_token[t] + 1;
        const int32_t* table = block_table + static_cast<int64_t>(seq_of_token[t]) *
                                                 max_blocks_per_seq;
        keys.resize(static_cast<size_t>(n_ctx) * hd);
        values.resize(keys.size());
        scores.resize(static_cast<size_t>(group) * n_ctx);
        for (int32_t g = 0; g < layout.kv_heads; ++g) {
            for (int32_t p = 0; p < n_ctx; ++p) {
                const int64_t at = layout.position_offset(table, g, p);
                const float* ks = pool + layout.plane_offset(layer, 0) + at;
                const float* vs = pool + layout.plane_offset(layer, 1) + at;
                std::copy(ks, ks + hd, keys.data() + static_cast<int64_t>(p) * hd);
                std::copy(vs, vs + hd, values.data() + static_cast<int64_t>(p) * hd);
            }
            const int64_t head0 = (t * q_heads + static_cast<int64_t>(g) * group) * hd;
            cpu::attention_gqa(q + head0, group, hd, keys.data(), values.data(), hd, n_ctx, scale,
                               scores.data(), out + head0);
        }
    }
}

void route(const float* logits, const float* bias, const RouterParams& p, int64_t tokens,
           int32_t* idx, float* w) {
    const int64_t E = p.experts;
    const int64_t K = p.top_k;
    std::vector<float> probs(E);
    std::vector<float> scratch(2 * E + std::max(p.n_group, 1));
    for (int64_t t = 0; t < tokens; ++t) {
        int32_t* top = idx + t * K;
        if (p.scoring == RouterScoring::kSigmoid) {
            cpu::GroupRouterConfig c;
            c.experts = E;
            c.top_k = K;
            c.n_group = p.n_group;
            c.topk_group = p.topk_group;
            c.norm_topk_prob = p.norm_topk_prob;
            c.scaling_factor = p.scaling_factor;
            cpu::route_sigmoid_grouped(logits + t * E, bias, c, top, w + t * K, scratch.data());
            continue;
        }
        std::copy(logits + t * E, logits + (t + 1) * E, probs.begin());
        cpu::softmax(probs.data(), E);
        // The selection loop of the CPU MoE block (qwen3_moe.cc): ties to the lower index.
        float sum = 0.0f;
        for (int64_t j = 0; j < K; ++j) {
            int32_t best = -1;
            for (int32_t e = 0; e < E; ++e) {
                const bool taken = std::find(top, top + j, e) != top + j;
                if (!taken && (best < 0 || probs[e] > probs[best])) {
                    best = e;
                }
            }
            top[j] = best;
            sum += probs[best];
        }
        for (int64_t j = 0; j < K; ++j) {
            w[t * K + j] = p.norm_topk_prob ? probs[top[j]] / sum : probs[top[j]];
        }
    }
}

void permute(const int32_t* idx, int64_t tokens, int32_t K, int32_t E, const float* x, int64_t H,
             int32_t* offsets, int32_t* row_of, float* permuted) {
    std::vector<int32_t> fill(E, 0);
    std::fill(offsets, offsets + E + 1, 0);
    for (int64_t a = 0; a < tokens * K; ++a) {
        ++offsets[idx[a] + 1];
    }
    for (int32_t e = 0; e < E; ++e) {
        offsets[e + 1] += offsets[e];
    }
    for (int64_t a = 0; a < tokens * K; ++a) {
        const int32_t e = idx[a];
        const int32_t row = offsets[e] + fill[e]++;
        row_of[a] = row;
        std::copy(x + (a / K) * H, x + (a / K + 1) * H, permuted + static_cast<int64_t>(row) * H);
    }
}

void unpermute(const float* y, const int32_t* row_of, const float* w, int64_t tokens, int32_t K,
               int64_t H, bool accumulate, float* out) {
    for (int64_t t = 0; t < tokens; ++t) {
        float* o = out + t * H;
        if (!accumulate) {
            std::fill(o, o + H, 0.0f);
        }
        for (int32_t j = 0; j < K; ++j) {
            const float* src = y + static_cast<int64_t>(row_of[t * K + j]) * H;
            const float wj = w[t * K + j];
            for (int64_t d = 0; d < H; ++d) {
                o[d] += wj * src[d];
            }
        }
    }
}

void grouped_matmul(std::span<const Weight> weights, const int32_t* offsets, const float* x,
                    float* y) {
    std::vector<float> row;
    for (size_t g = 0; g < weights.size(); ++g) {
        const Weight& w = weights[g];
        row.resize(w.cols);
        for (int64_t r = 0; r < w.rows; ++r) {
            dequant_row(w, r, row.data());
            for (int64_t t = offsets[g]; t < offsets[g + 1]; ++t) {
                double acc = 0.0;
                for (int64_t c = 0; c < w.cols; ++c) {
                    acc += static_cast<double>(row[c]) * x[t * w.cols + c];
                }
                y[t * w.rows + r] = static_cast<float>(acc);
            }
        }
    }
}

void gather_rows(const float* x, const int32_t* idx, int64_t n, int64_t cols, float* out) {
    for (int64_t i = 0; i < n; ++i) {
        std::copy(x + int64_t{idx[i]} * cols, x + (int64_t{idx[i]} + 1) * cols, out + i * cols);
    }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
    cpu::silu_mul(gate, up, n, out);
}

int32_t argmax(const float* logits, int64_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

int32_t sample_top_p(const float* logits, int64_t n, float temperature, float top_p, float u) {
    if (temperature <= 0.0f) {
        return argmax(logits, n);
    }
    const float mx = logits[argmax(logits, n)];
    std::vector<float> e(n);
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        e[i] = std::exp((logits[i] - mx) / temperature);
        total += e[i];
    }
    std::vector<float> sorted = e;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const double target = static_cast<double>(top_p) * total;
    double cum = 0.0;
    float t = sorted.back();
    for (float s : sorted) {
        cum += s;
        if (cum >= target) {
            t = s;
            break;
        }
    }
    double mass = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        mass += e[i] >= t ? e[i] : 0.0f;
    }
    const double goal = static_cast<double>(u) * mass;
    double walk = 0.0;
    int32_t last = 0;
    for (int32_t i = 0; i < n; ++i) {
        if (e[i] >= t) {
            walk += e[i];
            last = i;
            if (walk > goal) {
                return i;
            }
        }
    }
    return last;
}

}  // namespace edge::engine::cuda::twin
