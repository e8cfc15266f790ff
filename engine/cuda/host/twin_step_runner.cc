#include "engine/cuda/host/twin_step_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/cuda/host/cpu_twins.h"
#include "engine/cuda/host/mla_twin.h"
#include "engine/cuda/host/paged_kv_layout.h"

namespace edge::engine::cuda {
namespace {

class TwinStepRunner final : public StepRunner {
  public:
    TwinStepRunner(const CheckpointModel& model, const ServingDecoderOptions& options)
        : m_(model),
          o_(options),
          layout_{options.max_rows, options.max_blocks_per_seq, options.max_logit_rows},
          kv_{model.layers, model.kv_heads, model.head_dim, options.kv_blocks + 1},
          mla_kv_(mla_latent_layout(model.mla, model.layers, options.kv_blocks + 1)) {}

    Status init() {
        EDGE_ASSIGN_OR_RETURN(buckets_, row_buckets(o_.max_rows));
        EDGE_ASSIGN_OR_RETURN(logit_buckets_, row_buckets(o_.max_logit_rows));
        const bool mla = m_.attention == AttentionKind::kMla;
        pool_.assign(static_cast<size_t>(mla ? mla_kv_.pool_floats() : kv_.pool_floats()), 0.0f);
        return ok_status();
    }

    Status copy_kv_blocks(std::span<const BlockMove> moves) override {
        for (const BlockMove& mv : moves) {
            if (mv.from < 0 || mv.from >= o_.kv_blocks || mv.to < 0 || mv.to >= o_.kv_blocks) {
                return invalid_argument_error("twin runner: KV block move outside the pool");
            }
            for (int32_t l = 0; l < m_.layers; ++l) {
                if (m_.attention == AttentionKind::kMla) {
                    std::memcpy(pool_.data() + mla_kv_.row_offset(l, mv.to, 0),
                                pool_.data() + mla_kv_.row_offset(l, mv.from, 0),
                                static_cast<size_t>(mla_kv_.block_floats()) * sizeof(float));
                    continue;
                }
                for (int32_t which = 0; which < 2; ++which) {
                    float* plane = pool_.data() + kv_.plane_offset(l, which);
                    std::memcpy(plane + kv_.row_offset(mv.to, 0, 0),
                                plane + kv_.row_offset(mv.from, 0, 0),
                                static_cast<size_t>(kv_.block_floats()) * sizeof(float));
                }
            }
        }
        return ok_status();
    }

    Status run_rows(int32_t bucket, int32_t logit_bucket,
                    std::span<const int32_t> staging) override {
        bool is_bucket = false;
        for (int32_t b : buckets_) {
            is_bucket = is_bucket || b == bucket;
        }
        if (!is_bucket) {
            return invalid_argument_error("twin runner: " + std::to_string(bucket) +
                                          " rows is not a bucket");
        }
        bool is_logit_bucket = logit_bucket == 0;
        for (int32_t b : logit_buckets_) {
            is_logit_bucket = is_logit_bucket || b == logit_bucket;
        }
        if (!is_logit_bucket) {
            return invalid_argument_error("twin runner: " + std::to_string(logit_bucket) +
                                          " logits rows is not a logit bucket");
        }
        EDGE_RETURN_IF_ERROR(
            check_staging(layout_, staging, bucket, logit_bucket, m_.vocab, kv_.num_blocks));
        // The device buffer after the upload: the prefix replaced, the rest as it was.
        staging_.resize(static_cast<size_t>(layout_.total_ints()), 0);
        std::copy(staging.begin(), staging.end(), staging_.begin());
        logit_rows_ = 0;
        EDGE_RETURN_IF_ERROR(step(bucket, logit_bucket));
        logit_rows_ = logit_bucket;
        return ok_status();
    }

    Status copy_logits(std::span<const RowRun> runs, float* out) override {
        const int64_t V = m_.vocab;
        for (const RowRun& r : runs) {
            if (r.first_row < 0 || r.rows <= 0 || r.first_row + r.rows > logit_rows_ ||
                r.out_row < 0) {
                return invalid_argument_error("twin runner: logits outside the last step's " +
                                              std::to_string(logit_rows_) + " logits rows");
            }
            std::memcpy(out + r.out_row * V, logits_.data() + int64_t{r.first_row} * V,
                        static_cast<size_t>(int64_t{r.rows} * V) * sizeof(float));
        }
        return ok_status();
    }

  private:
    static float* grow(std::vector<float>& v, int64_t n) {
        v.resize(static_cast<size_t>(n));
        return v.data();
    }
    static int32_t* grow(std::vector<int32_t>& v, int64_t n) {
        v.resize(static_cast<size_t>(n));
        return v.data();
    }
    void dense(const Weight& w, const float* in, int64_t rows, float* out) {
        const int32_t off[2] = {0, static_cast<int32_t>(rows)};
        twin::grouped_matmul(std::span<const Weight>(&w, 1), off, in, out);
    }

    // A dense SwiGLU over B rows of h_, added into x_ (gate_/up_/act_/o_buf_ as scratch).
    void mlp(const CheckpointMlp& w, int64_t B) {
        const int64_t H = m_.hidden, I = w.gate.rows;
        dense(w.gate, h_.data(), B, gate_.data());
        dense(w.up, h_.data(), B, up_.data());
        twin::silu_mul(gate_.data(), up_.data(), B * I, act_.data());
        dense(w.down, act_.data(), B, o_buf_.data());
        for (int64_t i = 0; i < B * H; ++i) {
            x_[static_cast<size_t>(i)] += o_buf_[static_cast<size_t>(i)];
        }
    }

    // kGqa attention of layer li over B rows: x_ += o(attention(rope(norm(qkv(norm(x_)))))).
    void gqa_attention(int32_t li, int64_t B, const int32_t* positions, const int32_t* seqs,
                       const int32_t* table) {
        const CheckpointLayer& L = m_.layer[static_cast<size_t>(li)];
        const int64_t H = m_.hidden, hd = m_.head_dim;
        const int64_t qd = int64_t{m_.heads} * hd, kvd = int64_t{m_.kv_heads} * hd;
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        float *x = x_.data(), *h = h_.data(), *q = q_.data(), *k = k_.data(), *v = v_.data();
        twin::rms_norm_rows(x, L.input_norm.data(), B, H, m_.rms_eps, h);
        dense(L.q, h, B, q);
        dense(L.k, h, B, k);
        dense(L.v, h, B, v);
        if (!L.q_bias.empty()) {
            twin::add_bias_rows(q, L.q_bias.data(), B, qd);
            twin::add_bias_rows(k, L.k_bias.data(), B, kvd);
            twin::add_bias_rows(v, L.v_bias.data(), B, kvd);
        }
        if (!L.q_norm.empty()) {
            twin::rms_norm_rows(q, L.q_norm.data(), B * m_.heads, hd, m_.rms_eps, q);
            twin::rms_norm_rows(k, L.k_norm.data(), B * m_.kv_heads, hd, m_.rms_eps, k);
        }
        const auto ms = static_cast<float>(m_.rope_mscale);
        twin::rope(q, positions, B, m_.heads, hd, m_.rot_dim, m_.inv_freq.data(), true, ms);
        twin::rope(k, positions, B, m_.kv_heads, hd, m_.rot_dim, m_.inv_freq.data(), true, ms);
        twin::paged_kv_write(kv_, li, k, v, seqs, positions, B, table, layout_.max_blocks_per_seq,
                             pool_.data());
        twin::paged_attention(kv_, li, q, B, m_.heads, seqs, positions, table,
                              layout_.max_blocks_per_seq, pool_.data(), scale, attn_.data());
        dense(L.o, attn_.data(), B, o_buf_.data());
        for (int64_t i = 0; i < B * H; ++i) {
            x[i] += o_buf_[static_cast<size_t>(i)];
        }
    }

    // kMla attention of layer li over B rows: x_ += o(twin::mla_attention_layer(norm(x_))).
    Status mla_attention(int32_t li, int64_t B, const int32_t* positions, const int32_t* seqs,
                         const int32_t* table) {
        const CheckpointLayer& L = m_.layer[static_cast<size_t>(li)];
        const int64_t H = m_.hidden;
        float *x = x_.data(), *h = h_.data();
        float* attn = grow(attn_, B * m_.heads * m_.mla.v_head_dim);
        twin::rms_norm_rows(x, L.input_norm.data(), B, H, m_.rms_eps, h);
        EDGE_RETURN_IF_ERROR(twin::mla_attention_layer(
            L.mla, m_.mla, mla_kv_, li, h, B, seqs, positions,
            static_cast<int32_t>(layout_.table_rows()), table, layout_.max_blocks_per_seq,
            m_.inv_freq.data(), pool_.data(), attn));
        dense(L.mla.o, attn, B, o_buf_.data());
        for (int64_t i = 0; i < B * H; ++i) {
            x[i] += o_buf_[static_cast<size_t>(i)];
        }
        return ok_status();
    }

    // DeviceDecoder's serving step of B rows and LB logits rows, op by op.
    Status step(int64_t B, int64_t LB) {
        const int64_t H = m_.hidden, K = m_.top_k, I = m_.moe_inter, hd = m_.head_dim;
        const int64_t qd = int64_t{m_.heads} * hd, kvd = int64_t{m_.kv_heads} * hd;
        const int64_t inter = std::max({K * I, int64_t{m_.dense_inter}, int64_t{m_.shared_inter}});
        const int32_t* tokens = staging_.data() + layout_.tokens_offset();
        const int32_t* positions = staging_.data() + layout_.positions_offset();
        const int32_t* seqs = staging_.data() + layout_.seqs_offset();
        const int32_t* table = staging_.data() + layout_.table_offset();
        float* x = grow(x_, B * H);
        float* h = grow(h_, B * H);
        grow(o_buf_, B * H);
        grow(q_, B * qd);
        grow(attn_, B * qd);
        grow(k_, B * kvd);
        grow(v_, B * kvd);
        float* router = grow(router_, B * m_.experts);
        float* topk_w = grow(topk_w_, B * K);
        int32_t* topk_idx = grow(topk_idx_, B * K);
        int32_t* row_of = grow(row_of_, B * K);
        int32_t* offsets = grow(offsets_, m_.experts + 1);
        float* permuted = grow(permuted_, B * K * H);
        float* gate = grow(gate_, B * inter);
        float* up = grow(up_, B * inter);
        float* act = grow(act_, B * inter);
        float* down = grow(down_, B * K * H);
        twin::embedding(m_.embed, tokens, B, x);
        for (int32_t li = 0; li < m_.layers; ++li) {
            const CheckpointLayer& L = m_.layer[static_cast<size_t>(li)];
            switch (m_.attention) {
                case AttentionKind::kGqa:
                    gqa_attention(li, B, positions, seqs, table);
                    break;
                case AttentionKind::kMla:
                    EDGE_RETURN_IF_ERROR(mla_attention(li, B, positions, seqs, table));
                    break;
            }
            twin::rms_norm_rows(x, L.post_norm.data(), B, H, m_.rms_eps, h);
            if (!L.moe) {
                mlp(L.dense, B);
                continue;
            }
            if (L.shared.present()) {
                mlp(L.shared, B);
            }
            dense(L.router, h, B, router);
            twin::route(router, L.router_bias.empty() ? nullptr : L.router_bias.data(), m_.router,
                        B, topk_idx, topk_w);
            twin::permute(topk_idx, B, m_.top_k, m_.experts, h, H, offsets, row_of, permuted);
            twin::grouped_matmul(L.gate, offsets, permuted, gate);
            twin::grouped_matmul(L.up, offsets, permuted, up);
            twin::silu_mul(gate, up, B * K * I, act);
            twin::grouped_matmul(L.down, offsets, act, down);
            twin::unpermute(down, row_of, topk_w, B, m_.top_k, H, true, x);
        }
        if (LB == 0) {
            return ok_status();
        }
        // The rows that want logits, gathered, then the final norm and the LM head on those only.
        const int32_t* logit_rows = staging_.data() + layout_.logit_rows_offset();
        twin::gather_rows(x, logit_rows, LB, H, o_buf_.data());
        twin::rms_norm_rows(o_buf_.data(), m_.final_norm.data(), LB, H, m_.rms_eps, h);
        dense(m_.lm_head, h, LB, grow(logits_, LB * m_.vocab));
        return ok_status();
    }

    CheckpointModel m_;
    ServingDecoderOptions o_;
    StepLayout layout_;
    PagedKvLayout kv_;
    MlaLatentLayout mla_kv_;  // The pool's layout for kMla attention (else kv_'s).
    std::vector<int32_t> buckets_;
    std::vector<int32_t> logit_buckets_;
    std::vector<float> pool_;
    std::vector<int32_t> staging_;
    int32_t logit_rows_ = 0;  // Compact logits rows of the last step.
    std::vector<float> x_, h_, o_buf_, q_, attn_, k_, v_, router_, topk_w_, permuted_, gate_, up_,
        act_, down_, logits_;
    std::vector<int32_t> topk_idx_, row_of_, offsets_;
};

}  // namespace

Result<std::unique_ptr<StepRunner>> create_twin_step_runner(const CheckpointModel& model,
                                                            const ServingDecoderOptions& options) {
    if (options.max_rows <= 0 || options.kv_blocks <= 0 || options.max_blocks_per_seq <= 0 ||
        options.max_logit_rows <= 0 || options.max_logit_rows > options.max_rows) {
        return invalid_argument_error(
            "twin runner: max_rows, kv_blocks and max_blocks_per_seq must be positive and "
            "max_logit_rows in 1..max_rows");
    }
    auto runner = std::make_unique<TwinStepRunner>(model, options);
    EDGE_RETURN_IF_ERROR(runner->init());
    return std::unique_ptr<StepRunner>(std::move(runner));
}

}  // namespace edge::engine::cuda
