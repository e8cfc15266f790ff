// The MLA twins (host/mla_twin.h) against the CPU DeepSeek-V3 model on micro-deepseek-v3's real
// weights. The seam is a one-layer model: config.json with num_hidden_layers 1 (layer 0 is a
// dense-MLP layer, first_k_dense_replace 1), so the CPU model's logits are embedding -> input
// norm -> MLA -> o_proj -> dense SwiGLU -> final norm -> lm_head, and the test computes the same
// with the twins around twin::mla_attention_layer. Two sequences interleaved over a shuffled block
// table: prefill chunks in one step, then decode rows of both sequences over three blocks, every
// row's logits compared (the CPU model in its plain and absorbed modes), with and without YaRN
// (mscale on the softmax scale and on cos/sin). Plus the layout math and the input checks.

#include "engine/cuda/host/mla_twin.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/ops.h"
#include "engine/cuda/host/cpu_twins.h"
#include "engine/cuda/host/mla_layout.h"
#include "engine/model/archs/deepseek_v3.h"
#include "engine/model/archs/deepseek_v3_config.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/stored_tensor.h"
#include "engine/model/weight_loader.h"
#include "tests/testing/test_certs.h"

namespace edge::engine::cuda {
namespace {

const std::string kMicro = EDGE_SOURCE_DIR "/tests/fixtures/micro-deepseek-v3";

// Largest |logit| difference allowed between the twins (double accumulation) and the CPU model
// (f32 accumulation); logits have sigma ~2. Dropping YaRN's mscale or the k_pe rotation moves
// them by more than 0.1 (checked below for both mscales). Measured: 4.5e-5.
constexpr float kTolerance = 2e-4f;

std::string fixture_config() { return testing::read_file(kMicro + "/config.json"); }

std::string replaced(std::string text, const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    REQUIRE_MESSAGE(at != std::string::npos, from);
    return text.replace(at, from.size(), to);
}

// The fixture's config.json cut to one layer, optionally with YaRN rope scaling whose mscale
// differs from mscale_all_dim (so both the softmax scale and cos/sin are scaled).
ConfigJson one_layer_config(bool yarn) {
    std::string text =
        replaced(fixture_config(), "\"num_hidden_layers\": 3", "\"num_hidden_layers\": 1");
    if (yarn) {
        text = replaced(text, "\"rope_scaling\": null",
                        "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 8.0, "
                        "\"original_max_position_embeddings\": 256, \"beta_fast\": 32, "
                        "\"beta_slow\": 1, \"mscale\": 1.0, \"mscale_all_dim\": 0.707}");
    }
    auto json = ConfigJson::parse(text, kMicro + "/config.json");
    REQUIRE_MESSAGE(json.ok(), json.status().to_string());
    return *json;
}

// The twin-side one-layer model.
struct TwinModel {
    MlaDims d;
    MlaConfig mla;
    int64_t vocab = 0;
    int64_t inter = 0;
    std::unique_ptr<Checkpoint> ck;
    std::unique_ptr<WeightLoader> wl;
    Weight embed, lm_head, gate, up, down;
    std::vector<float> input_norm, post_norm, final_norm;
    MlaLayerWeights attn;
};

std::unique_ptr<TwinModel> twin_model(const ConfigJson& json) {
    auto m = std::make_unique<TwinModel>();
    auto c = SigmoidMoeConfig::from_json(json, kDeepseekV3Defaults);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    auto mla = MlaConfig::from_json(json, *c);
    REQUIRE_MESSAGE(mla.ok(), mla.status().to_string());
    m->mla = *mla;
    m->d = mla_dims(*c, *mla);
    REQUIRE(check_mla_dims(m->d).ok());
    m->vocab = c->vocab_size;
    m->inter = c->intermediate_size;
    auto ck = Checkpoint::open_dir(kMicro);
    REQUIRE_MESSAGE(ck.ok(), ck.status().to_string());
    m->ck = std::move(ck).value();
    auto wl = WeightLoader::create(*m->ck, json, "none");
    REQUIRE_MESSAGE(wl.ok(), wl.status().to_string());
    m->wl = std::move(wl).value();
    const int64_t H = m->d.hidden;
    auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
        auto w = m->wl->matrix(name, rows, cols);
        REQUIRE_MESSAGE(w.ok(), w.status().to_string());
        return *w;
    };
    auto vec = [&](const std::string& name, int64_t n) {
        auto v = read_float_vector(*m->ck, name, n);
        REQUIRE_MESSAGE(v.ok(), v.status().to_string());
        return *v;
    };
    m->embed = matrix("model.embed_tokens.weight", m->vocab, H);
    m->lm_head = matrix("lm_head.weight", m->vocab, H);
    m->final_norm = vec("model.norm.weight", H);
    const std::string p = "model.layers.0.";
    m->input_norm = vec(p + "input_layernorm.weight", H);
    m->post_norm = vec(p + "post_attention_layernorm.weight", H);
    m->gate = matrix(p + "mlp.gate_proj.weight", m->inter, H);
    m->up = matrix(p + "mlp.up_proj.weight", m->inter, H);
    m->down = matrix(p + "mlp.down_proj.weight", H, m->inter);
    auto attn = read_mla_layer(*m->ck, *m->wl, p + "self_attn.", m->d);
    REQUIRE_MESSAGE(attn.ok(), attn.status().to_string());
    m->attn = *attn;
    return m;
}

void dense(const Weight& w, const float* in, int64_t rows, float* out) {
    const int32_t off[2] = {0, static_cast<int32_t>(rows)};
    twin::grouped_matmul(std::span<const Weight>(&w, 1), off, in, out);
}

// The paged latent cache of the twin side: two sequences over a shuffled block table.
struct TwinCache {
    static constexpr int32_t kMaxBlocks = 4;
    MlaLatentLayout layout;
    std::vector<float> pool;
    std::vector<int32_t> table = {5, 2, 7, 0, 1, 6, 3, 4};  // Sequence 0 then sequence 1.

    explicit TwinCache(const MlaDims& d) : layout(mla_latent_layout(d, 1, 8)) {
        pool.assign(static_cast<size_t>(layout.pool_floats()), 0.0f);
    }
};

// One step of the twin one-layer model: logits [rows][vocab].
std::vector<float> twin_step(const TwinModel& m, TwinCache& cache, const std::vector<int32_t>& ids,
                             const std::vector<int32_t>& seqs, const std::vector<int32_t>& pos,
                             const MlaDims& d) {
    const int64_t B = static_cast<int64_t>(ids.size());
    const int64_t H = d.hidden;
    std::vector<float> x(B * H), h(B * H), attn(B * d.heads * d.v_head_dim), o(B * H);
    std::vector<float> g(B * m.inter), u(B * m.inter), act(B * m.inter);
    std::vector<float> logits(B * m.vocab);
    twin::embedding(m.embed, ids.data(), B, x.data());
    twin::rms_norm_rows(x.data(), m.input_norm.data(), B, H, d.eps, h.data());
    const Status s = twin::mla_attention_layer(
        m.attn, d, cache.layout, 0, h.data(), B, seqs.data(), pos.data(), 2, cache.table.data(),
        TwinCache::kMaxBlocks, m.mla.inv_freq.data(), cache.pool.data(), attn.data());
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    dense(m.attn.o, attn.data(), B, o.data());
    for (int64_t i = 0; i < B * H; ++i) {
        x[i] += o[i];
    }
    twin::rms_norm_rows(x.data(), m.post_norm.data(), B, H, d.eps, h.data());
    dense(m.gate, h.data(), B, g.data());
    dense(m.up, h.data(), B, u.data());
    twin::silu_mul(g.data(), u.data(), B * m.inter, act.data());
    dense(m.down, act.data(), B, o.data());
    for (int64_t i = 0; i < B * H; ++i) {
        x[i] += o[i];
    }
    twin::rms_norm_rows(x.data(), m.final_norm.data(), B, H, d.eps, h.data());
    dense(m.lm_head, h.data(), B, logits.data());
    return logits;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    float worst = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, std::fabs(a[i] - b[i]));
    }
    return worst;
}

int32_t token_at(int32_t seq, int32_t pos) {
    return static_cast<int32_t>((seq * 131 + pos * 37 + 11) % 509);
}

// Runs the schedule on the CPU model (mode `path`) and on the twins (dims `d`, normally the
// model's own) and returns the largest logit difference over every row of every step.
float schedule_diff(const ConfigJson& json, MlaPath path, const TwinModel& tm, const MlaDims& d) {
    LoadOptions options;
    options.threads = 2;
    options.max_slots = 2;
    options.max_context = 128;
    auto model = load_deepseek_v3(kMicro, json, options, path);
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    CausalLM& cpu = **model;
    auto a = cpu.acquire_slot();
    auto b = cpu.acquire_slot();
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    const int32_t slot[2] = {*a, *b};
    TwinCache cache(d);
    int32_t len[2] = {0, 0};
    float worst = 0.0f;
    // Each step: (sequence, tokens) chunks; rows are the chunks' tokens in order.
    auto step = [&](const std::vector<std::pair<int32_t, int32_t>>& chunks) {
        std::vector<std::vector<TokenId>> toks(chunks.size());
        std::vector<SequenceChunk> batch;
        std::vector<int32_t> ids, seqs, pos;
        for (size_t c = 0; c < chunks.size(); ++c) {
            const auto [seq, n] = chunks[c];
            for (int32_t i = 0; i < n; ++i) {
                toks[c].push_back(token_at(seq, len[seq] + i));
                ids.push_back(toks[c].back());
                seqs.push_back(seq);
                pos.push_back(len[seq] + i);
            }
            batch.push_back(SequenceChunk{slot[seq], len[seq], toks[c], true});
            len[seq] += n;
        }
        std::vector<float> want;
        const Status s = cpu.forward(batch, &want);
        REQUIRE_MESSAGE(s.ok(), s.to_string());
        worst = std::max(worst, max_diff(twin_step(tm, cache, ids, seqs, pos, d), want));
    };
    step({{0, 5}, {1, 3}});         // Prefill chunks of both sequences in one step.
    step({{1, 6}});                 // More prefill of sequence 1.
    for (int i = 0; i < 30; ++i) {  // Decode rows of both, across blocks 0..2 of each.
        step({{0, 1}, {1, 1}});
    }
    step({{0, 4}, {1, 1}});  // A prefill chunk next to a decode row.
    CHECK(len[0] == 39);
    CHECK(len[1] == 40);
    return worst;
}

TEST_CASE("mla twin: one-layer logits equal the CPU DeepSeek-V3 (plain and absorbed)") {
    for (bool yarn : {false, true}) {
        CAPTURE(yarn);
        const ConfigJson json = one_layer_config(yarn);
        auto tm = twin_model(json);
        if (yarn) {
            REQUIRE(tm->d.rope_mscale != 1.0f);
            REQUIRE(tm->d.softmax_scale > 1.1f / std::sqrt(48.0f));
        }
        for (MlaPath path : {MlaPath::kPlain, MlaPath::kAbsorbed, MlaPath::kAuto}) {
            CAPTURE(static_cast<int>(path));
            const float diff = schedule_diff(json, path, *tm, tm->d);
            MESSAGE("max |logit diff| " << diff);
            CHECK(diff < kTolerance);
        }
    }
}

TEST_CASE("mla twin: dropping YaRN's mscale from the softmax scale is caught") {
    const ConfigJson json = one_layer_config(true);
    auto tm = twin_model(json);
    MlaDims wrong = tm->d;
    wrong.softmax_scale = 1.0f / std::sqrt(static_cast<float>(wrong.qk()));
    CHECK(schedule_diff(json, MlaPath::kAbsorbed, *tm, wrong) > 0.1f);
    wrong = tm->d;
    wrong.rope_mscale = 1.0f;
    CHECK(schedule_diff(json, MlaPath::kAbsorbed, *tm, wrong) > 0.1f);
}

TEST_CASE("mla layout: rows, blocks and layers are contiguous and disjoint") {
    MlaDims d;
    d.kv_lora_rank = 512;
    d.rope = 64;
    const MlaLatentLayout l = mla_latent_layout(d, 3, 10);
    CHECK(l.row_floats() == 576);
    CHECK(l.block_floats() == 576 * 16);
    CHECK(l.layer_floats() == 576 * 16 * 10);
    CHECK(l.pool_floats() == 576 * 16 * 10 * 3);
    CHECK(l.row_offset(0, 0, 1) == 576);
    CHECK(l.row_offset(0, 1, 0) == 576 * 16);
    CHECK(l.row_offset(2, 9, 15) + 576 == l.pool_floats());
    const int32_t table[3] = {4, 9, 2};
    CHECK(l.position_offset(1, table, 0) == l.row_offset(1, 4, 0));
    CHECK(l.position_offset(1, table, 17) == l.row_offset(1, 9, 1));
    CHECK(l.position_offset(1, table, 47) == l.row_offset(1, 2, 15));
}

TEST_CASE("mla checks: bad dims, layouts and block tables are clear errors, nothing written") {
    const ConfigJson json = one_layer_config(false);
    auto tm = twin_model(json);
    MlaDims d = tm->d;
    CHECK(d.hidden == 128);
    CHECK(d.heads == 4);
    CHECK(d.q_lora_rank == 64);
    CHECK(d.kv_lora_rank == 32);
    CHECK(d.nope == 32);
    CHECK(d.rope == 16);
    CHECK(d.v_head_dim == 32);
    CHECK(d.softmax_scale == doctest::Approx(1.0 / std::sqrt(48.0)));
    MlaDims bad = d;
    bad.rope = 15;
    CHECK(check_mla_dims(bad).to_string().find("qk_rope_head_dim 15") != std::string::npos);
    bad = d;
    bad.kv_lora_rank = kMlaMaxLatent + 1;
    CHECK(check_mla_dims(bad).to_string().find("kv_lora_rank") != std::string::npos);
    bad = d;
    bad.softmax_scale = 0.0f;
    CHECK_FALSE(check_mla_dims(bad).ok());

    TwinCache cache(d);
    std::vector<float> h(3 * d.hidden, 0.5f), out(3 * d.heads * d.v_head_dim);
    const std::vector<int32_t> seqs = {0, 1, 1};
    auto run = [&](const MlaLatentLayout& layout, const std::vector<int32_t>& table,
                   const std::vector<int32_t>& pos, int32_t sequences = 2) {
        return twin::mla_attention_layer(tm->attn, d, layout, 0, h.data(), 3, seqs.data(),
                                         pos.data(), sequences, table.data(), TwinCache::kMaxBlocks,
                                         tm->mla.inv_freq.data(), cache.pool.data(), out.data());
    };
    CHECK(run(cache.layout, cache.table, {0, 0, 1}).ok());
    std::vector<int32_t> table = cache.table;
    table[5] = 8;  // Sequence 1's second block is outside the pool of 8.
    const std::vector<float> before = cache.pool;
    Status s = run(cache.layout, table, {3, 15, 16});
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.to_string().find("sequence 1 entry 1") != std::string::npos);
    CHECK(cache.pool == before);
    s = run(cache.layout, cache.table, {3, 64, 1});  // Position 64 needs a fifth block.
    CHECK(s.to_string().find("sequence 1 has length 65") != std::string::npos);
    s = run(cache.layout, cache.table, {0, 0, 1}, 1);  // Sequence 1 of 1.
    CHECK(s.to_string().find("names sequence 1") != std::string::npos);
    MlaLatentLayout wrong = cache.layout;
    wrong.rope = 8;
    CHECK(run(wrong, cache.table, {0, 0, 1}).to_string().find("qk_rope_head_dim 16") !=
          std::string::npos);
    wrong = cache.layout;
    CHECK_FALSE(twin::mla_attention_layer(tm->attn, d, wrong, 1, h.data(), 3, seqs.data(),
                                          seqs.data(), 2, cache.table.data(), 4,
                                          tm->mla.inv_freq.data(), cache.pool.data(), out.data())
                    .ok());
    CHECK(cache.pool == before);
}

}  // namespace
}  // namespace edge::engine::cuda
