#include "engine/model/archs/deepseek_v3.h"

#include <algorithm>
#include <cmath>

#include "engine/cpu/ops.h"
#include "engine/model/archs/deepseek_v3_config.h"
#include "engine/model/model_config.h"

namespace edge::engine {
namespace {

struct MlaLayer {
    Weight q;    // q_proj, or q_b_proj after the query LoRA.
    Weight q_a;  // q_a_proj (with q_lora_rank).
    std::vector<float> q_a_norm;
    Weight kv_a;  // kv_a_proj_with_mqa: [latent + rope, hidden].
    std::vector<float> kv_a_norm;
    Weight kv_b;  // [heads * (nope + v), latent].
    // kv_b as f32 for the absorbed path: kv_b's own data when it is F32 (an FP8 checkpoint's,
    // widened on load), else the widened copy in kv_b_widened.
    const float* kv_b_f32 = nullptr;
    std::vector<float> kv_b_widened;
    Weight o;
};

class DeepseekV3 final : public SigmoidMoeModel {
  public:
    DeepseekV3(SigmoidMoeConfig c, MlaConfig m, MlaPath path, int64_t plain_max_bytes,
               std::unique_ptr<Checkpoint> ckpt, std::unique_ptr<Backend> backend)
        : SigmoidMoeModel(std::move(c), std::move(ckpt), std::move(backend)),
          m_(std::move(m)),
          path_(path),
          plain_max_bytes_(plain_max_bytes) {}

    Status load(const std::string& dir, const ConfigJson& json, const LoadOptions& options) {
        attn_.resize(c_.num_hidden_layers);
        c_.max_position_embeddings = m_.rope_max_positions;  // What load_common serves.
        row_ = m_.kv_lora_rank + m_.qk_rope_head_dim;
        const int64_t per_token = c_.num_hidden_layers * row_ * 4;
        // The cache row [latent, k_rope] is stored as one "head" split in two halves: the first
        // half in the keys array, the second in the values array (exactly row_ floats a token).
        EDGE_RETURN_IF_ERROR(load_common(dir, json, options, kDeepseekV3Architecture, 1,
                                         static_cast<int32_t>(row_ / 2), per_token));
        // The f32 copies of a BF16/F16 kv_b_proj are weights held in memory the loader did not
        // allocate: counted here so that weight_bytes reports them.
        for (const MlaLayer& L : attn_) {
            spec_.weight_bytes += static_cast<int64_t>(L.kv_b_widened.size() * sizeof(float));
        }
        return ok_status();
    }

  protected:
    Status load_attention(int64_t l, const std::string& p) override;
    void attention(int32_t li, int64_t n) override;

  private:
    void store_row(int32_t slot, int32_t li, int32_t pos, const float* row);
    void gather_rows(int32_t slot, int32_t li, int32_t count, float* out);
    void attend_absorbed(const MlaLayer& L, int32_t li, int32_t slot, int32_t ctx, int64_t h,
                         const float* qh, float* scratch, float* oh) const;
    void attend_plain(int32_t li, int64_t begin, int64_t end, const float* q, float* out);

    MlaConfig m_;
    MlaPath path_;
    int64_t plain_max_bytes_;  // kAuto's bound on attend_plain's expanded rows.
    int64_t row_ = 0;
    std::vector<MlaLayer> attn_;
    std::vector<float> qa_, q_, kva_, out_, o_, rows_, scratch_, expanded_, lat_;
    std::vector<int32_t> absorbed_;  // This layer's tokens for the absorbed path (kept capacity).
};

Status DeepseekV3::load_attention(int64_t l, const std::string& p) {
    MlaLayer& L = attn_[l];
    const int64_t H = c_.hidden_size;
    const int64_t nh = c_.num_attention_heads;
    const int64_t qk = m_.qk_nope_head_dim + m_.qk_rope_head_dim;
    if (m_.q_lora_rank > 0) {
        EDGE_ASSIGN_OR_RETURN(L.q_a, weight(p + "q_a_proj.weight", m_.q_lora_rank, H));
        EDGE_ASSIGN_OR_RETURN(L.q_a_norm, vector(p + "q_a_layernorm.weight", m_.q_lora_rank));
        EDGE_ASSIGN_OR_RETURN(L.q, weight(p + "q_b_proj.weight", nh * qk, m_.q_lora_rank));
    } else {
        EDGE_ASSIGN_OR_RETURN(L.q, weight(p + "q_proj.weight", nh * qk, H));
    }
    EDGE_ASSIGN_OR_RETURN(L.kv_a, weight(p + "kv_a_proj_with_mqa.weight", row_, H));
    EDGE_ASSIGN_OR_RETURN(L.kv_a_norm, vector(p + "kv_a_layernorm.weight", m_.kv_lora_rank));
    const int64_t kvb_rows = nh * (m_.qk_nope_head_dim + m_.v_head_dim);
    EDGE_ASSIGN_OR_RETURN(L.kv_b, weight(p + "kv_b_proj.weight", kvb_rows, m_.kv_lora_rank));
    if (path_ != MlaPath::kPlain) {
        if (L.kv_b.format == WeightFormat::kF32) {
            L.kv_b_f32 = static_cast<const float*>(L.kv_b.data);  // No second f32 copy.
        } else {
            L.kv_b_widened.resize(static_cast<size_t>(kvb_rows * m_.kv_lora_rank));
            for (size_t i = 0; i < L.kv_b_widened.size(); ++i) {
                L.kv_b_widened[i] =
                    stored_element(L.kv_b.data, L.kv_b.format, static_cast<int64_t>(i));
            }
            L.kv_b_f32 = L.kv_b_widened.data();
        }
    }
    EDGE_ASSIGN_OR_RETURN(L.o, weight(p + "o_proj.weight", H, nh * m_.v_head_dim));
    return ok_status();
}

void DeepseekV3::store_row(int32_t slot, int32_t li, int32_t pos, const float* row) {
    const int64_t half = row_ / 2;
    std::copy(row, row + half, kv_->key(slot, li, 0, pos));
    std::copy(row + half, row + row_, kv_->value(slot, li, 0, pos));
}

// Reads the slot's cached rows through its block table, one block at a time.
void DeepseekV3::gather_rows(int32_t slot, int32_t li, int32_t count, float* out) {
    const int64_t half = row_ / 2;
    const int32_t bt = kv_->block_tokens();
    const auto table = kv_->blocks(slot);
    for (int32_t b0 = 0; b0 < count; b0 += bt) {
        const float* k = kv_->block_keys(table[b0 / bt], li, 0);
        const float* v = kv_->block_values(table[b0 / bt], li, 0);
        const int32_t rows = std::min(bt, count - b0);
        for (int32_t p = 0; p < rows; ++p) {
            float* dst = out + static_cast<int64_t>(b0 + p) * row_;
            std::copy(k + p * half, k + (p + 1) * half, dst);
            std::copy(v + p * half, v + (p + 1) * half, dst + half);
        }
    }
}

// One head of one token in the latent space, over the first ctx cached rows of `slot`, read in
// place through its block table (a row [latent, k_rope] is split in half across the keys and the
// values arrays). qh is the head's [nope + rope]; oh receives its [v]. scratch holds
// row_ + ctx + latent floats.
void DeepseekV3::attend_absorbed(const MlaLayer& L, int32_t li, int32_t slot, int32_t ctx,
                                 int64_t h, const float* qh, float* scratch, float* oh) const {
    const int64_t c = m_.kv_lora_rank;
    const int64_t nope = m_.qk_nope_head_dim;
    const int64_t r = m_.qk_rope_head_dim;
    const int64_t vd = m_.v_head_dim;
    const int64_t half = row_ / 2;
    const int64_t lat_k = std::min(c, half);  // Latent floats in the keys half; the rest in values.
    const float scale = static_cast<float>(m_.softmax_scale);
    const float* kb = L.kv_b_f32 + h * (nope + vd) * c;  // [nope][latent]
    float* qfull = scratch;                              // [latent + rope]
    std::fill(qfull, qfull + c, 0.0f);
    for (int64_t d = 0; d < nope; ++d) {
        const float qd = qh[d];
        const float* kr = kb + d * c;
        for (int64_t j = 0; j < c; ++j) {
            qfull[j] += qd * kr[j];
        }
    }
    std::copy(qh + nope, qh + nope + r, qfull + c);
    float* w = scratch + row_;  // [ctx]
    float* olat = w + ctx;      // [latent]
    const int32_t bt = kv_->block_tokens();
    const auto table = kv_->blocks(slot);
    for (int32_t b0 = 0; b0 < ctx; b0 += bt) {
        const float* k = kv_->block_keys(table[b0 / bt], li, 0);
        const float* v = kv_->block_values(table[b0 / bt], li, 0);
        const int32_t rows = std::min(bt, ctx - b0);
        for (int32_t p = 0; p < rows; ++p) {
            const float* kp = k + p * half;
            const float* vp = v + p * half;
            float s = 0.0f;
            for (int64_t j = 0; j < half; ++j) {
                s += qfull[j] * kp[j];
            }
            for (int64_t j = 0; j < half; ++j) {
                s += qfull[half + j] * vp[j];
            }
            w[b0 + p] = s * scale;
        }
    }
    cpu::softmax(w, ctx);
    std::fill(olat, olat + c, 0.0f);
    for (int32_t b0 = 0; b0 < ctx; b0 += bt) {
        const float* k = kv_->block_keys(table[b0 / bt], li, 0);
        const float* v = kv_->block_values(table[b0 / bt], li, 0);
        const int32_t rows = std::min(bt, ctx - b0);
        for (int32_t p = 0; p < rows; ++p) {
            const float wp = w[b0 + p];
            const float* kp = k + p * half;
            const float* vp = v + p * half;
            for (int64_t j = 0; j < lat_k; ++j) {
                olat[j] += wp * kp[j];
            }
            for (int64_t j = 0; j < c - lat_k; ++j) {
                olat[lat_k + j] += wp * vp[j];
            }
        }
    }
    const float* vb = kb + nope * c;  // [v][latent]
    for (int64_t e = 0; e < vd; ++e) {
        float s = 0.0f;
        for (int64_t j = 0; j < c; ++j) {
            s += vb[e * c + j] * olat[j];
        }
        oh[e] = s;
    }
}

// Tokens [begin, end) of one slot (consecutive positions): expands the slot's cached latents up to
// the last token's position through kv_b_proj, then attends per token and head.
void DeepseekV3::attend_plain(int32_t li, int64_t begin, int64_t end, const float* q, float* out) {
    const MlaLayer& L = attn_[li];
    const int64_t c = m_.kv_lora_rank;
    const int64_t nope = m_.qk_nope_head_dim;
    const int64_t r = m_.qk_rope_head_dim;
    const int64_t vd = m_.v_head_dim;
    const int64_t nh = c_.num_attention_heads;
    const int64_t ew = nh * (nope + vd);
    const int32_t slot = tok_slot_[begin];
    const int32_t ctx = tok_pos_[end - 1] + 1;
    float* rows = grow(rows_, static_cast<size_t>(ctx) * row_);
    gather_rows(slot, li, ctx, rows);
    float* lat = grow(lat_, static_cast<size_t>(ctx) * c);
    for (int32_t p = 0; p < ctx; ++p) {
        std::copy(rows + p * row_, rows + p * row_ + c, lat + p * c);
    }
    float* kvx = grow(expanded_, static_cast<size_t>(ctx) * ew);
    backend_->matmul(L.kv_b, lat, ctx, kvx, ew);
    const float scale = static_cast<float>(m_.softmax_scale);
    const int64_t per_worker = ctx;
    float* scratch = grow(scratch_, static_cast<size_t>(backend_->threads()) * per_worker);
    backend_->for_each_task((end - begin) * nh, [&](int64_t task, int worker) {
        const int64_t i = begin + task / nh;
        const int64_t h = task % nh;
        const int32_t n_ctx = tok_pos_[i] + 1;
        const float* qh = q + i * nh * (nope + r) + h * (nope + r);
        float* w = scratch + static_cast<size_t>(worker) * per_worker;
        for (int32_t p = 0; p < n_ctx; ++p) {
            const float* kn = kvx + p * ew + h * (nope + vd);
            const float* kr = rows + p * row_ + c;
            float s = 0.0f;
            for (int64_t d = 0; d < nope; ++d) {
                s += qh[d] * kn[d];
            }
            for (int64_t d = 0; d < r; ++d) {
                s += qh[nope + d] * kr[d];
            }
            w[p] = s * scale;
        }
        cpu::softmax(w, n_ctx);
        float* oh = out + i * nh * vd + h * vd;
        std::fill(oh, oh + vd, 0.0f);
        for (int32_t p = 0; p < n_ctx; ++p) {
            const float* vp = kvx + p * ew + h * (nope + vd) + nope;
            for (int64_t e = 0; e < vd; ++e) {
                oh[e] += w[p] * vp[e];
            }
        }
    });
}

void DeepseekV3::attention(int32_t li, int64_t n) {
    const MlaLayer& L = attn_[li];
    const int64_t H = c_.hidden_size;
    const int64_t nh = c_.num_attention_heads;
    const int64_t c = m_.kv_lora_rank;
    const int64_t nope = m_.qk_nope_head_dim;
    const int64_t r = m_.qk_rope_head_dim;
    const int64_t qk = nope + r;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    float* x = x_.data();
    float* h = grow(h_, n * H);
    for (int64_t i = 0; i < n; ++i) {
        cpu::rms_norm(x + i * H, input_norm_[li].data(), H, eps, h + i * H);
    }
    float* q = grow(q_, n * nh * qk);
    float* kv = grow(kva_, n * row_);
    if (m_.q_lora_rank > 0) {
        float* qa = grow(qa_, n * m_.q_lora_rank);
        const MatmulJob a[] = {{&L.q_a, h, n, qa, m_.q_lora_rank}, {&L.kv_a, h, n, kv, row_}};
        backend_->matmul_batch(a);
        for (int64_t i = 0; i < n; ++i) {
            float* qi = qa + i * m_.q_lora_rank;
            cpu::rms_norm(qi, L.q_a_norm.data(), m_.q_lora_rank, kMlaSubNormEps, qi);
        }
        backend_->matmul(L.q, qa, n, q, nh * qk);
    } else {
        const MatmulJob a[] = {{&L.q, h, n, q, nh * qk}, {&L.kv_a, h, n, kv, row_}};
        backend_->matmul_batch(a);
    }
    // Norm the latent, rotate the rope parts, and store [latent, k_rope] in the cache.
    const float ms = static_cast<float>(m_.rope_mscale);
    for (int64_t i = 0; i < n; ++i) {
        float cs[512];
        float sn[512];
        const int64_t half = r / 2;
        float* kvi = kv + i * row_;
        cpu::rms_norm(kvi, L.kv_a_norm.data(), c, kMlaSubNormEps, kvi);
        for (int64_t off = 0; off < half; off += 256) {
            // Tables in blocks of 256 frequencies (qk_rope_head_dim is 64 in the real models).
            const int64_t len = std::min<int64_t>(256, half - off);
            cpu::rope_angles(tok_pos_[i], m_.inv_freq.data() + off, len, cs, sn);
            for (int64_t t = 0; t < len; ++t) {
                cs[t] *= ms;
                sn[t] *= ms;
            }
            auto rotate = [&](float* v) {
                if (m_.rope_interleave) {
                    cpu::rope_interleaved(v + 2 * off, 2 * len, cs, sn);
                } else {
                    // Rotate-half pairs (j, j + half): rotate the block's pairs one by one.
                    for (int64_t t = 0; t < len; ++t) {
                        const float a = v[off + t];
                        const float b = v[off + t + half];
                        v[off + t] = a * cs[t] - b * sn[t];
                        v[off + t + half] = b * cs[t] + a * sn[t];
                    }
                }
            };
            rotate(kvi + c);
            for (int64_t hh = 0; hh < nh; ++hh) {
                rotate(q + i * nh * qk + hh * qk + nope);
            }
        }
        store_row(tok_slot_[i], li, tok_pos_[i], kvi);
    }
    const int64_t vd = m_.v_head_dim;
    float* out = grow(out_, n * nh * vd);
    // Walk the tokens chunk by chunk (consecutive tokens of one slot). A chunk for the plain path
    // runs at once (it expands its slot's latents, then splits over tokens and heads); the
    // absorbed path's tokens of all chunks run together below, one task per token and head, so a
    // decode step (one token per slot) keeps every thread busy.
    absorbed_.clear();
    int64_t begin = 0;
    while (begin < n) {
        int64_t end = begin + 1;
        while (end < n && tok_slot_[end] == tok_slot_[begin]) {
            ++end;
        }
        const bool plain =
            path_ == MlaPath::kPlain ||
            (path_ == MlaPath::kAuto &&
             mla_auto_picks_plain(m_, nh, end - begin, tok_pos_[end - 1] + 1, plain_max_bytes_));
        if (plain) {
            attend_plain(li, begin, end, q, out);
        } else {
            for (int64_t i = begin; i < end; ++i) {
                absorbed_.push_back(static_cast<int32_t>(i));
            }
        }
        begin = end;
    }
    if (!absorbed_.empty()) {
        const int64_t per_worker = row_ + longest_context() + c;
        float* scratch = grow(scratch_, static_cast<size_t>(backend_->threads()) * per_worker);
        const auto tasks = static_cast<int64_t>(absorbed_.size()) * nh;
        backend_->for_each_task(tasks, [&](int64_t task, int worker) {
            const int64_t i = absorbed_[task / nh];
            const int64_t hh = task % nh;
            attend_absorbed(L, li, tok_slot_[i], tok_pos_[i] + 1, hh, q + i * nh * qk + hh * qk,
                            scratch + static_cast<size_t>(worker) * per_worker,
                            out + i * nh * vd + hh * vd);
        });
    }
    float* o = grow(o_, n * H);
    backend_->matmul(L.o, out, n, o, H);
    for (int64_t i = 0; i < n * H; ++i) {
        x[i] += o[i];
    }
}

}  // namespace

// Multiply-adds per head for a chunk of `tokens` tokens after `prefix` cached positions, token i
// attending over n_i = prefix + i + 1 positions, S = sum of n_i (c latent, r rope, v value dims):
//   plain:    ctx * c * (nope + v)              expand every cached latent (ctx = prefix + tokens)
//             + S * (nope + r + v)              scores and weighted sum per token
//   absorbed: tokens * c * (nope + v)           q_nope into the latent space, latent out to v
//             + S * (2c + r)                    scores and weighted sum over [latent, rope] rows
// The terms in tokens * c * (nope + v) cancel, so plain is no dearer exactly when
//   prefix * c * (nope + v) <= S * (2c - nope - v).
// A fresh prefill (prefix 0) takes plain; on a long prefix the break-even chunk length tends to
// c (nope + v) / (2c - nope - v): about 171 tokens for DeepSeek-V3 and Kimi K2 (c 512, nope and v
// 128), so a short new turn on a long cached history attends in the latent space instead of
// expanding the whole history. Memory traffic is not counted (it too favours absorbed on a long
// prefix: plain writes and reads ctx x heads x (nope + v) floats). One token (a decode step) is
// always absorbed: at best plain saves nothing there. Nor does plain run when its expanded rows
// (context x heads x (nope + v) floats, zero-filled on first use and kept) would pass
// max_expanded_bytes (kMlaPlainMaxExpandedBytes says why the bound).
bool mla_auto_picks_plain(const MlaConfig& m, int64_t heads, int64_t tokens, int64_t context,
                          int64_t max_expanded_bytes) {
    if (tokens <= 1) {
        return false;
    }
    const int64_t c = m.kv_lora_rank;
    const int64_t nope = m.qk_nope_head_dim;
    const int64_t vd = m.v_head_dim;
    const auto per_position = static_cast<int64_t>(heads * (nope + vd) * sizeof(float));
    if (per_position > 0 && context > max_expanded_bytes / per_position) {
        return false;
    }
    const int64_t prefix = context - tokens;
    const int64_t sum_ctx = tokens * prefix + tokens * (tokens + 1) / 2;
    return prefix * c * (nope + vd) <= sum_ctx * (2 * c - nope - vd);
}

Status check_deepseek_v3_config(const ConfigJson& json, int64_t* max_positions) {
    EDGE_ASSIGN_OR_RETURN(SigmoidMoeConfig c,
                          SigmoidMoeConfig::from_json(json, kDeepseekV3Defaults));
    EDGE_ASSIGN_OR_RETURN(MlaConfig m, MlaConfig::from_json(json, c));
    if (max_positions != nullptr) {
        *max_positions = m.rope_max_positions;
    }
    return ok_status();
}

Result<std::unique_ptr<CausalLM>> load_deepseek_v3(const std::string& dir, const ConfigJson& json,
                                                   const LoadOptions& options, MlaPath path,
                                                   int64_t plain_max_expanded_bytes) {
    EDGE_ASSIGN_OR_RETURN(SigmoidMoeConfig c,
                          SigmoidMoeConfig::from_json(json, kDeepseekV3Defaults));
    EDGE_ASSIGN_OR_RETURN(MlaConfig m, MlaConfig::from_json(json, c));
    EDGE_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::open_dir(dir));
    BackendOptions bo;
    bo.threads = options.threads;
    bo.activation_precision = options.activation_precision;
    bo.cpu_kernels = options.cpu_kernels;
    EDGE_ASSIGN_OR_RETURN(auto backend, create_backend(options.backend, bo));
    auto model =
        std::make_unique<DeepseekV3>(std::move(c), std::move(m), path, plain_max_expanded_bytes,
                                     std::move(ckpt), std::move(backend));
    EDGE_RETURN_IF_ERROR(model->load(dir, json, options));
    return std::unique_ptr<CausalLM>(std::move(model));
}

}  // namespace edge::engine
