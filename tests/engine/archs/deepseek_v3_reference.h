#pragma once

// A float64 DeepseekV3ForCausalLM written out plainly from Hugging Face's modeling code (the
// plain, non-absorbed MLA; q_pe and k_pe de-interleaved before rotate_half when rope_interleave;
// the router's dropped groups masked with 0.0), over a checkpoint's tensors held in memory, for
// the variants of micro-deepseek-v3 that its own reference.json does not cover. Shares nothing
// with the engine but the tensors' bytes: its configuration is a plain struct the tests also
// write into config.json, and YaRN's table is pasted from transformers' formula
// (tests/fixtures/yarn_reference.py). Slow (nested loops over doubles); for a few dozen tokens.

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/causal_lm.h"

namespace edge::engine::testing {

struct RefTensor {
    std::vector<int64_t> shape;
    std::vector<uint16_t> bf16;  // As stored.
    std::vector<double> values;  // The same values, widened.
};
using RefTensors = std::map<std::string, RefTensor>;

inline double bf16_value(uint16_t b) {
    return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline RefTensor make_ref_tensor(std::vector<int64_t> shape, std::vector<uint16_t> bf16) {
    RefTensor t{std::move(shape), std::move(bf16), {}};
    REQUIRE(std::accumulate(t.shape.begin(), t.shape.end(), int64_t{1}, std::multiplies<>()) ==
            static_cast<int64_t>(t.bf16.size()));
    t.values.reserve(t.bf16.size());
    for (uint16_t b : t.bf16) {
        t.values.push_back(bf16_value(b));
    }
    return t;
}

// YaRN as Hugging Face applies it to DeepSeek-V3: the rotary table and the factor on cos and
// sin from _compute_yarn_parameters, and the softmax scale times get_mscale(factor,
// mscale_all_dim)^2 from DeepseekV3Attention.
struct RefYarn {
    double factor = 1.0;
    int64_t original_max_position = 0;
    double beta_fast = 32.0;
    double beta_slow = 1.0;
    double mscale = 0.0;
    double mscale_all_dim = 0.0;
    std::vector<double> inv_freq;   // qk_rope_head_dim / 2 frequencies, pasted.
    double attention_factor = 1.0;  // On cos and sin, pasted.
};

// The fields of a DeepSeek-V3 config.json the forward reads; the defaults are
// micro-deepseek-v3's (tests/fixtures/README.md).
struct RefConfig {
    int64_t hidden = 128;
    int64_t layers = 3;
    int64_t heads = 4;
    int64_t vocab = 512;
    int64_t q_lora_rank = 64;  // 0: null in config.json, q_proj without a query LoRA.
    int64_t kv_lora_rank = 32;
    int64_t nope = 32;  // qk_nope_head_dim.
    int64_t rope = 16;  // qk_rope_head_dim.
    int64_t v = 32;     // v_head_dim.
    int64_t experts = 8;
    int64_t top_k = 2;
    int64_t n_group = 2;
    int64_t topk_group = 1;
    int64_t first_dense = 1;  // first_k_dense_replace.
    double routed_scaling = 2.827;
    double eps = 1e-6;  // rms_norm_eps; the two MLA sub-norms keep HF's default 1e-6.
    double theta = 50000.0;
    bool rope_interleave = true;
    std::optional<RefYarn> yarn;  // rope_scaling; none: null.
};

struct RefOutput {
    std::vector<double> logits;  // positions x vocab.
    // The smallest margin of any routing decision (the last kept group against the first
    // dropped one, the last chosen expert against the next): under about 1e-5 an f32 engine
    // could decide the other way and differ by tenths without being wrong.
    double min_route_gap = std::numeric_limits<double>::infinity();
    // Tokens and layers where the group limit chose other experts than a plain top-k would.
    int group_limited = 0;
};

namespace ref_detail {

inline const RefTensor& get(const RefTensors& t, const std::string& name) {
    const auto it = t.find(name);
    INFO("tensor " << name);
    REQUIRE(it != t.end());
    return it->second;
}

// w [rows, cols] times x [cols].
inline std::vector<double> matvec(const RefTensor& w, const std::vector<double>& x) {
    REQUIRE(w.shape.size() == 2);
    REQUIRE(w.shape[1] == static_cast<int64_t>(x.size()));
    std::vector<double> y(static_cast<size_t>(w.shape[0]), 0.0);
    for (size_t r = 0; r < y.size(); ++r) {
        const double* row = w.values.data() + r * x.size();
        for (size_t j = 0; j < x.size(); ++j) {
            y[r] += row[j] * x[j];
        }
    }
    return y;
}

inline std::vector<double> rms_norm(const std::vector<double>& x, const RefTensor& w, double eps) {
    REQUIRE(w.values.size() == x.size());
    double ss = 0.0;
    for (double v : x) {
        ss += v * v;
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        y[i] = x[i] * inv * w.values[i];
    }
    return y;
}

inline std::vector<double> swiglu(const RefTensors& t, const std::string& p,
                                  const std::vector<double>& x) {
    std::vector<double> g = matvec(get(t, p + "gate_proj.weight"), x);
    const std::vector<double> u = matvec(get(t, p + "up_proj.weight"), x);
    for (size_t i = 0; i < g.size(); ++i) {
        g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    }
    return matvec(get(t, p + "down_proj.weight"), g);
}

// HF's rotary step on the rope part `v` (qk_rope_head_dim values) at `pos`: de-interleave when
// rope_interleave (even dims, then odd ones), then rotate_half with cos/sin of the table, times
// YaRN's attention factor. The result stays in the de-interleaved order; q and k share it.
inline void rope(const RefConfig& c, int64_t pos, double* v) {
    const int64_t half = c.rope / 2;
    std::vector<double> x(v, v + c.rope);
    if (c.rope_interleave) {
        for (int64_t j = 0; j < half; ++j) {
            x[j] = v[2 * j];
            x[half + j] = v[2 * j + 1];
        }
    }
    for (int64_t j = 0; j < half; ++j) {
        const double f = c.yarn ? c.yarn->inv_freq.at(j)
                                : std::pow(c.theta, -2.0 * static_cast<double>(j) /
                                                        static_cast<double>(c.rope));
        const double af = c.yarn ? c.yarn->attention_factor : 1.0;
        const double cs = std::cos(static_cast<double>(pos) * f) * af;
        const double sn = std::sin(static_cast<double>(pos) * f) * af;
        v[j] = x[j] * cs - x[half + j] * sn;
        v[half + j] = x[half + j] * cs + x[j] * sn;
    }
}

// Indices of `v` by descending value, equal values in index order; `gap` gets the margin
// between the k-th and the (k+1)-th when there is one.
inline std::vector<int64_t> top(const std::vector<double>& v, int64_t k, double* gap) {
    std::vector<int64_t> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return v[a] > v[b]; });
    if (k < static_cast<int64_t>(v.size())) {
        *gap = std::min(*gap, v[order[k - 1]] - v[order[k]]);
    }
    order.resize(static_cast<size_t>(k));
    return order;
}

// DeepseekV3MoE: sigmoid scores, the correction bias for choosing, group-limited top-k, the
// unbiased scores renormalised and scaled, plus the shared expert.
inline std::vector<double> moe(const RefConfig& c, const RefTensors& t, const std::string& p,
                               const std::vector<double>& x, RefOutput* out) {
    const std::vector<double> logits = matvec(get(t, p + "gate.weight"), x);
    const RefTensor& bias = get(t, p + "gate.e_score_correction_bias");
    std::vector<double> s(logits.size());
    std::vector<double> choice(logits.size());
    for (size_t e = 0; e < s.size(); ++e) {
        s[e] = 1.0 / (1.0 + std::exp(-logits[e]));
        choice[e] = s[e] + bias.values.at(e);
    }
    const int64_t per = c.experts / c.n_group;
    std::vector<double> group_score(static_cast<size_t>(c.n_group));
    for (int64_t g = 0; g < c.n_group; ++g) {
        std::vector<double> members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
        std::sort(members.rbegin(), members.rend());
        group_score[g] = members[0] + (per > 1 ? members[1] : 0.0);
    }
    const std::vector<int64_t> kept = top(group_score, c.topk_group, &out->min_route_gap);
    std::vector<double> masked(choice.size(), 0.0);
    for (int64_t g : kept) {
        std::copy(choice.begin() + g * per, choice.begin() + (g + 1) * per,
                  masked.begin() + g * per);
    }
    std::vector<int64_t> chosen = top(masked, c.top_k, &out->min_route_gap);
    double unlimited_gap = 0.0;
    std::vector<int64_t> unlimited = top(choice, c.top_k, &unlimited_gap);
    std::sort(chosen.begin(), chosen.end());
    std::sort(unlimited.begin(), unlimited.end());
    out->group_limited += chosen != unlimited ? 1 : 0;
    double sum = 0.0;
    for (int64_t e : chosen) {
        sum += s[e];
    }
    std::vector<double> y = swiglu(t, p + "shared_experts.", x);
    for (int64_t e : chosen) {
        const double w = s[e] / (sum + 1e-20) * c.routed_scaling;
        const std::vector<double> ye = swiglu(t, p + "experts." + std::to_string(e) + ".", x);
        for (size_t i = 0; i < y.size(); ++i) {
            y[i] += w * ye[i];
        }
    }
    return y;
}

// DeepseekV3Attention over all positions of the sequence at once (causal), added into `x`.
inline void attention(const RefConfig& c, const RefTensors& t, const std::string& p,
                      std::vector<std::vector<double>>& x) {
    const auto n = static_cast<int64_t>(x.size());
    const int64_t qk = c.nope + c.rope;
    double scale = 1.0 / std::sqrt(static_cast<double>(qk));
    if (c.yarn && c.yarn->mscale_all_dim != 0.0) {
        const double m = 0.1 * c.yarn->mscale_all_dim * std::log(c.yarn->factor) + 1.0;
        scale *= m * m;
    }
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int64_t i = 0; i < n; ++i) {
        const std::vector<double> h = rms_norm(x[i], get(t, p + "input_layernorm.weight"), c.eps);
        const std::string a = p + "self_attn.";
        if (c.q_lora_rank > 0) {
            const std::vector<double> qa = rms_norm(matvec(get(t, a + "q_a_proj.weight"), h),
                                                    get(t, a + "q_a_layernorm.weight"), 1e-6);
            q[i] = matvec(get(t, a + "q_b_proj.weight"), qa);
        } else {
            q[i] = matvec(get(t, a + "q_proj.weight"), h);
        }
        REQUIRE(static_cast<int64_t>(q[i].size()) == c.heads * qk);
        std::vector<double> ckv = matvec(get(t, a + "kv_a_proj_with_mqa.weight"), h);
        REQUIRE(static_cast<int64_t>(ckv.size()) == c.kv_lora_rank + c.rope);
        const std::vector<double> latent(ckv.begin(), ckv.begin() + c.kv_lora_rank);
        const std::vector<double> kv = matvec(get(t, a + "kv_b_proj.weight"),
                                              rms_norm(latent, get(t, a + "kv_a_layernorm.weight"),
                                                       1e-6));
        REQUIRE(static_cast<int64_t>(kv.size()) == c.heads * (c.nope + c.v));
        double* k_rope = ckv.data() + c.kv_lora_rank;
        rope(c, i, k_rope);
        for (int64_t hd = 0; hd < c.heads; ++hd) {
            rope(c, i, q[i].data() + hd * qk + c.nope);
            const double* kvh = kv.data() + hd * (c.nope + c.v);
            k[i].insert(k[i].end(), kvh, kvh + c.nope);
            k[i].insert(k[i].end(), k_rope, k_rope + c.rope);
            v[i].insert(v[i].end(), kvh + c.nope, kvh + c.nope + c.v);
        }
    }
    for (int64_t i = 0; i < n; ++i) {
        std::vector<double> o(static_cast<size_t>(c.heads * c.v), 0.0);
        for (int64_t hd = 0; hd < c.heads; ++hd) {
            std::vector<double> w(static_cast<size_t>(i + 1));
            for (int64_t u = 0; u <= i; ++u) {
                double d = 0.0;
                for (int64_t j = 0; j < qk; ++j) {
                    d += q[i][hd * qk + j] * k[u][hd * qk + j];
                }
                w[u] = d * scale;
            }
            const double mx = *std::max_element(w.begin(), w.end());
            double z = 0.0;
            for (double& e : w) {
                e = std::exp(e - mx);
                z += e;
            }
            for (int64_t u = 0; u <= i; ++u) {
                for (int64_t e = 0; e < c.v; ++e) {
                    o[hd * c.v + e] += w[u] / z * v[u][hd * c.v + e];
                }
            }
        }
        const std::vector<double> y = matvec(get(t, p + "self_attn.o_proj.weight"), o);
        for (size_t j = 0; j < y.size(); ++j) {
            x[i][j] += y[j];
        }
    }
}

}  // namespace ref_detail

// The logits at every position of `ids` (positions 0..n-1, no BOS).
inline RefOutput reference_forward(const RefConfig& c, const RefTensors& t,
                                   const std::vector<TokenId>& ids) {
    using namespace ref_detail;
    RefOutput out;
    const RefTensor& embed = get(t, "model.embed_tokens.weight");
    std::vector<std::vector<double>> x;
    for (TokenId id : ids) {
        const double* row = embed.values.data() + static_cast<int64_t>(id) * c.hidden;
        x.emplace_back(row, row + c.hidden);
    }
    for (int64_t l = 0; l < c.layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        attention(c, t, p, x);
        for (auto& xi : x) {
            const std::vector<double> h =
                rms_norm(xi, get(t, p + "post_attention_layernorm.weight"), c.eps);
            const std::vector<double> y =
                l < c.first_dense ? swiglu(t, p + "mlp.", h) : moe(c, t, p + "mlp.", h, &out);
            for (size_t j = 0; j < y.size(); ++j) {
                xi[j] += y[j];
            }
        }
    }
    for (const auto& xi : x) {
        const std::vector<double> l =
            matvec(get(t, "lm_head.weight"), rms_norm(xi, get(t, "model.norm.weight"), c.eps));
        out.logits.insert(out.logits.end(), l.begin(), l.end());
    }
    return out;
}

}  // namespace edge::engine::testing
