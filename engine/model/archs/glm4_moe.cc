#include "engine/model/archs/glm4_moe.h"

#include <algorithm>
#include <cmath>

#include "engine/cpu/ops.h"
#include "engine/model/archs/glm4_moe_common.h"
#include "engine/model/model_config.h"
#include "engine/model/paged_attention.h"

namespace edge::engine {
namespace {

struct AttnLayer {
    Weight q, k, v, o;
    std::vector<float> q_bias, k_bias, v_bias;  // Empty without attention_bias.
    std::vector<float> q_norm, k_norm;          // Empty without use_qk_norm.
};

class Glm4Moe final : public SigmoidMoeModel {
  public:
    Glm4Moe(SigmoidMoeConfig c, Glm4AttentionConfig a, std::unique_ptr<Checkpoint> ckpt,
            std::unique_ptr<Backend> backend)
        : SigmoidMoeModel(std::move(c), std::move(ckpt), std::move(backend)), a_(std::move(a)) {}

    Status load(const std::string& dir, const ConfigJson& json, const LoadOptions& options) {
        attn_.resize(c_.num_hidden_layers);
        c_.max_position_embeddings = a_.rope.max_positions;  // What load_common serves.
        const int64_t per_token =
            c_.num_hidden_layers * 2 * a_.num_key_value_heads * a_.head_dim * 4;
        return load_common(dir, json, options, kGlm4MoeArchitecture,
                           static_cast<int32_t>(a_.num_key_value_heads),
                           static_cast<int32_t>(a_.head_dim), per_token);
    }

  protected:
    Status load_attention(int64_t l, const std::string& p) override {
        AttnLayer& L = attn_[l];
        const int64_t H = c_.hidden_size;
        const int64_t qdim = c_.num_attention_heads * a_.head_dim;
        const int64_t kvdim = a_.num_key_value_heads * a_.head_dim;
        EDGE_ASSIGN_OR_RETURN(L.q, weight(p + "q_proj.weight", qdim, H));
        EDGE_ASSIGN_OR_RETURN(L.k, weight(p + "k_proj.weight", kvdim, H));
        EDGE_ASSIGN_OR_RETURN(L.v, weight(p + "v_proj.weight", kvdim, H));
        EDGE_ASSIGN_OR_RETURN(L.o, weight(p + "o_proj.weight", H, qdim));
        if (a_.attention_bias) {
            EDGE_ASSIGN_OR_RETURN(L.q_bias, vector(p + "q_proj.bias", qdim));
            EDGE_ASSIGN_OR_RETURN(L.k_bias, vector(p + "k_proj.bias", kvdim));
            EDGE_ASSIGN_OR_RETURN(L.v_bias, vector(p + "v_proj.bias", kvdim));
        }
        if (a_.use_qk_norm) {
            EDGE_ASSIGN_OR_RETURN(L.q_norm, vector(p + "q_norm.weight", a_.head_dim));
            EDGE_ASSIGN_OR_RETURN(L.k_norm, vector(p + "k_norm.weight", a_.head_dim));
        }
        return ok_status();
    }

    void attention(int32_t li, int64_t n) override;

  private:
    Glm4AttentionConfig a_;
    std::vector<AttnLayer> attn_;
    std::vector<float> q_, k_, v_, out_, scores_, rope_, o_;
};

void add_bias(float* rows, int64_t n, const std::vector<float>& bias) {
    const int64_t d = static_cast<int64_t>(bias.size());
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < d; ++j) {
            rows[i * d + j] += bias[j];
        }
    }
}

void Glm4Moe::attention(int32_t li, int64_t n) {
    const AttnLayer& L = attn_[li];
    const int64_t H = c_.hidden_size;
    const int64_t hd = a_.head_dim;
    const int64_t nh = c_.num_attention_heads;
    const int64_t nkv = a_.num_key_value_heads;
    const int64_t group = nh / nkv;
    const int64_t qdim = nh * hd;
    const int64_t kvdim = nkv * hd;
    const int64_t rot = a_.rotary_dim;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    float* x = x_.data();
    float* h = grow(h_, n * H);
    for (int64_t i = 0; i < n; ++i) {
        cpu::rms_norm(x + i * H, input_norm_[li].data(), H, eps, h + i * H);
    }
    float* q = grow(q_, n * qdim);
    float* k = grow(k_, n * kvdim);
    float* v = grow(v_, n * kvdim);
    const MatmulJob qkv[] = {{&L.q, h, n, q, qdim}, {&L.k, h, n, k, kvdim}, {&L.v, h, n, v, kvdim}};
    backend_->matmul_batch(qkv);
    if (a_.attention_bias) {
        add_bias(q, n, L.q_bias);
        add_bias(k, n, L.k_bias);
        add_bias(v, n, L.v_bias);
    }
    float* rope = grow(rope_, static_cast<size_t>(backend_->threads()) * rot);
    backend_->for_each_task(n, [&](int64_t i, int worker) {
        float* cs = rope + worker * rot;
        float* sn = cs + rot / 2;
        const int32_t pos = tok_pos_[i];
        a_.rope.angles(pos, cs, sn);
        for (int64_t head = 0; head < nh; ++head) {
            float* qh = q + i * qdim + head * hd;
            if (a_.use_qk_norm) {
                cpu::rms_norm(qh, L.q_norm.data(), hd, eps, qh);
            }
            cpu::rope_neox(qh, rot, cs, sn);
        }
        for (int64_t head = 0; head < nkv; ++head) {
            float* kh = k + i * kvdim + head * hd;
            if (a_.use_qk_norm) {
                cpu::rms_norm(kh, L.k_norm.data(), hd, eps, kh);
            }
            cpu::rope_neox(kh, rot, cs, sn);
            const int32_t slot = tok_slot_[i];
            const auto hi = static_cast<int32_t>(head);
            std::copy(kh, kh + hd, kv_->key(slot, li, hi, pos));
            const float* vh = v + i * kvdim + head * hd;
            std::copy(vh, vh + hd, kv_->value(slot, li, hi, pos));
        }
    });
    float* out = grow(out_, n * qdim);
    const auto score_rows = static_cast<size_t>(group * longest_context());  // Per worker.
    float* scores = grow(scores_, static_cast<size_t>(backend_->threads()) * score_rows);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    backend_->for_each_task(n * nkv, [&](int64_t task, int worker) {
        const int64_t i = task / nkv;
        const auto g = static_cast<int32_t>(task % nkv);
        const int32_t slot = tok_slot_[i];
        paged_attention_gqa(
            *kv_, slot, li, g, q + i * qdim + g * group * hd, group, tok_pos_[i] + 1, scale,
            scores + static_cast<size_t>(worker) * score_rows, out + i * qdim + g * group * hd);
    });
    float* o = grow(o_, n * H);
    backend_->matmul(L.o, out, n, o, H);
    for (int64_t i = 0; i < n * H; ++i) {
        x[i] += o[i];
    }
}

}  // namespace

Result<Glm4AttentionConfig> Glm4AttentionConfig::from_json(const ConfigJson& j,
                                                           const SigmoidMoeConfig& c) {
    Glm4AttentionConfig a;
    EDGE_ASSIGN_OR_RETURN(a.num_key_value_heads,
                          get_int_in(j, "num_key_value_heads", 1, c.num_attention_heads));
    if (c.num_attention_heads % a.num_key_value_heads != 0) {
        return invalid_argument_error(j.path() + ": field 'num_key_value_heads' does not " +
                                      "divide num_attention_heads");
    }
    if (j.is_null("head_dim")) {
        a.head_dim = c.hidden_size / c.num_attention_heads;
    } else {
        EDGE_ASSIGN_OR_RETURN(a.head_dim, get_int_in(j, "head_dim", 2, 1 << 16));
    }
    EDGE_ASSIGN_OR_RETURN(double factor,
                          j.get_double("partial_rotary_factor", kGlm4MoePartialRotaryFactor));
    if (!(factor > 0.0 && factor <= 1.0)) {
        return invalid_argument_error(j.path() + ": field 'partial_rotary_factor' must be " +
                                      "in (0, 1]");
    }
    // Truncated, as transformers' int(head_dim * partial_rotary_factor) is.
    a.rotary_dim = static_cast<int64_t>(static_cast<double>(a.head_dim) * factor);
    if (a.rotary_dim % 2 != 0 || a.rotary_dim < 2) {
        return invalid_argument_error(j.path() + ": head_dim * partial_rotary_factor (" +
                                      std::to_string(a.rotary_dim) + ") must be even");
    }
    EDGE_ASSIGN_OR_RETURN(a.attention_bias, j.get_bool("attention_bias", false));
    EDGE_ASSIGN_OR_RETURN(a.use_qk_norm, j.get_bool("use_qk_norm", false));
    // YaRN over the rotary dims (transformers' dim = head_dim * partial_rotary_factor).
    EDGE_ASSIGN_OR_RETURN(a.rope, RotaryConfig::from_json(j, c.rope_theta, a.rotary_dim,
                                                          c.max_position_embeddings,
                                                          kGlm4MoeArchitecture));
    return a;
}

Status check_glm4_moe_config(const ConfigJson& json, int64_t* max_positions) {
    EDGE_ASSIGN_OR_RETURN(SigmoidMoeConfig c,
                          SigmoidMoeConfig::from_json(json, kGlm4MoeDefaults));
    EDGE_ASSIGN_OR_RETURN(Glm4AttentionConfig a, Glm4AttentionConfig::from_json(json, c));
    if (max_positions != nullptr) {
        *max_positions = a.rope.max_positions;
    }
    return ok_status();
}

Result<std::unique_ptr<CausalLM>> load_glm4_moe(const std::string& dir, const ConfigJson& json,
                                                const LoadOptions& options) {
    EDGE_ASSIGN_OR_RETURN(SigmoidMoeConfig c,
                          SigmoidMoeConfig::from_json(json, kGlm4MoeDefaults));
    EDGE_ASSIGN_OR_RETURN(Glm4AttentionConfig a, Glm4AttentionConfig::from_json(json, c));
    EDGE_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::open_dir(dir));
    BackendOptions bo;
    bo.threads = options.threads;
    bo.activation_precision = options.activation_precision;
    bo.cpu_kernels = options.cpu_kernels;
    EDGE_ASSIGN_OR_RETURN(auto backend, create_backend(options.backend, bo));
    auto model = std::make_unique<Glm4Moe>(std::move(c), std::move(a), std::move(ckpt),
                                           std::move(backend));
    EDGE_RETURN_IF_ERROR(model->load(dir, json, options));
    return std::unique_ptr<CausalLM>(std::move(model));
}

}  // namespace edge::engine
