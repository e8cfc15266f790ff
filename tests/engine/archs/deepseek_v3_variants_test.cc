// DeepSeek-V3 paths that micro-deepseek-v3's reference.json does not take, each against an oracle
// computed apart from the engine:
//   - rope_interleave false: the fixture's checkpoint with the rope rows of q_b_proj and
//     kv_a_proj_with_mqa de-interleaved, as Hugging Face de-interleaves q_pe and k_pe before
//     rotate_half, must reproduce the fixture's reference.json;
//   - q_lora_rank null (q_proj), a v_head_dim, kv_lora_rank and qk_rope_head_dim unlike
//     qk_nope_head_dim and one another, YaRN rope_scaling, and the router limited to 2 of 4
//     groups: the engine's logits (plain and absorbed paths) against the float64 forward of
//     deepseek_v3_reference.h, which is first shown to reproduce reference.json itself.

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <boost/json.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "deepseek_v3_reference.h"
#include "engine/model/archs/deepseek_v3.h"
#include "engine/model/loader.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/safetensors_writer.h"
#include "reference_check.h"
#include "tests/testing/test_certs.h"

namespace edge::engine {
namespace {

namespace json = boost::json;
using testing::RefConfig;
using testing::RefTensor;
using testing::RefTensors;

const std::string kFixture = "micro-deepseek-v3";

RefTensors read_fixture_tensors() {
    const std::string path = testing::fixture_dir(kFixture) + "/model.safetensors";
    const std::string bytes = edge::testing::read_file(path);
    auto header = parse_safetensors_header(bytes, bytes.size(), path);
    REQUIRE_MESSAGE(header.ok(), header.status().to_string());
    RefTensors out;
    for (const TensorInfo& t : header->tensors) {
        REQUIRE(t.dtype == DType::kBF16);
        std::vector<uint16_t> bf16(static_cast<size_t>((t.end - t.begin) / 2));
        std::memcpy(bf16.data(), bytes.data() + header->data_offset + t.begin, bf16.size() * 2);
        out[t.name] = testing::make_ref_tensor(t.shape, std::move(bf16));
    }
    return out;
}

// Seeded bf16-exact weights with the fixture's scales: uniform with mean `mean` and standard
// deviation `sd` (splitmix64, so the values are the same on every platform).
class Bf16Random {
  public:
    explicit Bf16Random(uint64_t seed) : state_(seed) {}

    RefTensor tensor(std::vector<int64_t> shape, double sd, double mean = 0.0) {
        int64_t n = 1;
        for (int64_t d : shape) {
            n *= d;
        }
        std::vector<uint16_t> bf16(static_cast<size_t>(n));
        for (uint16_t& b : bf16) {
            const double u = static_cast<double>(next() >> 11) * 0x1p-53 * 2.0 - 1.0;
            const auto f = static_cast<float>(mean + sd * std::sqrt(3.0) * u);
            b = static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16);  // Exact in bf16.
        }
        return testing::make_ref_tensor(std::move(shape), std::move(bf16));
    }

    // A linear layer [out, in], N(0, 1)/sqrt(in)-scaled as the fixture's.
    RefTensor linear(int64_t out, int64_t in) {
        return tensor({out, in}, 1.0 / std::sqrt(static_cast<double>(in)));
    }

  private:
    uint64_t next() {
        uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    uint64_t state_;
};

std::string layer(int64_t l) { return "model.layers." + std::to_string(l) + ".self_attn."; }

// Writes `t` and the fixture's config.json with `c`'s MLA, router and RoPE fields into `dir`.
void write_variant(const edge::testing::TempDir& dir, const RefConfig& c, const RefTensors& t) {
    std::vector<TensorToWrite> tensors;
    for (const auto& [name, tensor] : t) {
        tensors.push_back({name, DType::kBF16, tensor.shape,
                           std::string_view(reinterpret_cast<const char*>(tensor.bf16.data()),
                                            tensor.bf16.size() * 2),
                           {}});
    }
    const Status st = write_safetensors(dir.file("model.safetensors"), tensors);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    const std::string src = testing::fixture_dir(kFixture) + "/config.json";
    json::object root = json::parse(edge::testing::read_file(src)).as_object();
    root["q_lora_rank"] = c.q_lora_rank > 0 ? json::value(c.q_lora_rank) : json::value(nullptr);
    root["kv_lora_rank"] = c.kv_lora_rank;
    root["qk_nope_head_dim"] = c.nope;
    root["qk_rope_head_dim"] = c.rope;
    root["v_head_dim"] = c.v;
    root["n_group"] = c.n_group;
    root["topk_group"] = c.topk_group;
    root["rope_interleave"] = c.rope_interleave;
    if (c.yarn) {
        root["rope_scaling"] = {{"type", "yarn"},
                                {"factor", c.yarn->factor},
                                {"original_max_position_embeddings",
                                 c.yarn->original_max_position},
                                {"beta_fast", c.yarn->beta_fast},
                                {"beta_slow", c.yarn->beta_slow},
                                {"mscale", c.yarn->mscale},
                                {"mscale_all_dim", c.yarn->mscale_all_dim}};
    } else {
        root["rope_scaling"] = nullptr;
    }
    dir.write("config.json", json::serialize(root));
}

LoadOptions small_options() {
    LoadOptions options;
    options.threads = 2;
    options.max_slots = 4;  // run_greedy holds one slot per reference prompt.
    options.max_context = 64;
    return options;
}

// The engine's logits at every position of `ids`, on one MLA path.
std::vector<float> engine_logits(const std::string& dir, MlaPath path,
                                 const std::vector<TokenId>& ids) {
    auto config = ConfigJson::read(dir);
    REQUIRE_MESSAGE(config.ok(), config.status().to_string());
    auto model = load_deepseek_v3(dir, *config, small_options(), path);
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    auto slot = (*model)->acquire_slot();
    REQUIRE(slot.ok());
    SequenceChunk chunk{*slot, 0, ids, true};
    std::vector<float> logits;
    const Status st = (*model)->forward({&chunk, 1}, &logits);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    return logits;
}

template <typename A, typename B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
    REQUIRE(a.size() == b.size());
    double d = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        REQUIRE(std::isfinite(static_cast<double>(a[i])));
        d = std::max(d, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    }
    return d;
}

// 32 tokens: long enough that YaRN's interpolated dims turn visibly apart from the plain ones.
std::vector<TokenId> prompt_ids() {
    std::vector<TokenId> ids(32);
    for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<TokenId>((i * 37 + 11) % 509);
    }
    return ids;
}

// The variant written to a temp dir: the engine's logits on the plain and the absorbed path
// within the fixtures' tolerance (1e-4) of the float64 forward. Returns that forward.
testing::RefOutput check_variant(const RefConfig& c, const RefTensors& t) {
    const std::vector<TokenId> ids = prompt_ids();
    const testing::RefOutput want = testing::reference_forward(c, t, ids);
    INFO("smallest routing margin " << want.min_route_gap);
    REQUIRE(want.min_route_gap >= 1e-4);  // No near-tie an f32 engine could take the other way.
    edge::testing::TempDir dir;
    write_variant(dir, c, t);
    for (MlaPath path : {MlaPath::kPlain, MlaPath::kAbsorbed}) {
        const std::string path_name = path == MlaPath::kPlain ? "plain" : "absorbed";
        CAPTURE(path_name);
        const double diff = max_abs_diff(engine_logits(dir.path(), path, ids), want.logits);
        INFO("max |engine - float64| over " << want.logits.size() << " logits: " << diff);
        CHECK(diff <= testing::kRefTolerance);
    }
    return want;
}

TEST_CASE("deepseek_v3 variants: the float64 forward reproduces micro-deepseek-v3's reference") {
    // The oracle of the cases below, on the fixture itself: within 1e-5 of reference.json's
    // step-0 logits (all 512, every prompt) and of the teacher-forced top-5 at all 35 positions
    // (llama.cpp's f32 run; the README measures 3.8e-6 against its own float64 forward).
    const RefTensors t = read_fixture_tensors();
    const RefConfig c;
    for (const testing::RefPrompt& p : testing::read_reference(testing::fixture_dir(kFixture))) {
        CAPTURE(p.key);
        const testing::RefOutput out = testing::reference_forward(c, t, p.prompt);
        const std::vector<double> last(out.logits.end() - c.vocab, out.logits.end());
        CHECK(max_abs_diff(last, p.step0_logits) <= 1e-5);
        if (p.teacher_ids.empty()) {
            continue;
        }
        const testing::RefOutput tf = testing::reference_forward(c, t, p.teacher_ids);
        double diff = 0.0;
        for (size_t pos = 0; pos < p.teacher_top5.size(); ++pos) {
            for (const auto& [id, value] : p.teacher_top5[pos]) {
                diff = std::max(diff, std::fabs(tf.logits[pos * c.vocab + id] - value));
            }
        }
        INFO("max |float64 - teacher-forced top-5| " << diff);
        CHECK(diff <= 1e-5);
    }
}

// Reorders `count` rows of `w` from `first` on as HF's interleave view does to q_pe and k_pe
// (view(..., count / 2, 2).transpose(-1, -2)): the even rows, then the odd ones.
void deinterleave_rows(RefTensor& w, int64_t first, int64_t count) {
    const int64_t cols = w.shape[1];
    const std::vector<uint16_t> old = w.bf16;
    for (int64_t j = 0; j < count; ++j) {
        const int64_t from = first + (j < count / 2 ? 2 * j : 2 * (j - count / 2) + 1);
        std::copy(old.begin() + from * cols, old.begin() + (from + 1) * cols,
                  w.bf16.begin() + (first + j) * cols);
    }
    w = testing::make_ref_tensor(w.shape, w.bf16);
}

TEST_CASE("deepseek_v3 variants: rope_interleave false on de-interleaved rope rows matches the "
          "reference") {
    // With rope_interleave true HF de-interleaves q_pe and k_pe, then applies rotate_half; and
    // q.k is the same in any common order of the rope dims. So the fixture's weights with each
    // head's rope rows of q_b_proj and the rope rows of kv_a_proj_with_mqa stored de-interleaved,
    // read with rope_interleave false (plain rotate_half), give the fixture's logits exactly.
    RefTensors t = read_fixture_tensors();
    const RefConfig base;
    for (int64_t l = 0; l < base.layers; ++l) {
        for (int64_t h = 0; h < base.heads; ++h) {
            deinterleave_rows(t.at(layer(l) + "q_b_proj.weight"),
                              h * (base.nope + base.rope) + base.nope, base.rope);
        }
        deinterleave_rows(t.at(layer(l) + "kv_a_proj_with_mqa.weight"), base.kv_lora_rank,
                          base.rope);
    }
    RefConfig c = base;
    c.rope_interleave = false;
    edge::testing::TempDir dir;
    write_variant(dir, c, t);
    auto model = load_model(dir.path(), small_options());
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    auto prompts = testing::read_reference(testing::fixture_dir(kFixture));
    // Auto path: plain prefill, absorbed decode steps.
    testing::check_runs(prompts, testing::run_greedy(**model, prompts, true));
    testing::check_teacher_forced(**model, prompts);

    // Not blind: the same rows read with rope_interleave true are far off.
    edge::testing::TempDir wrong_dir;
    write_variant(wrong_dir, base, t);
    const std::vector<float> wrong =
        engine_logits(wrong_dir.path(), MlaPath::kAuto, prompts[0].prompt);
    const std::vector<float> last(wrong.end() - base.vocab, wrong.end());
    CHECK(max_abs_diff(last, prompts[0].step0_logits) > 0.1);
}

TEST_CASE("deepseek_v3 variants: q_lora_rank null reads q_proj against the float64 forward") {
    // DeepSeek-V2-Lite's form: q = q_proj(x), no q_a_proj, q_a_layernorm or q_b_proj.
    RefTensors t = read_fixture_tensors();
    RefConfig c;
    Bf16Random rng(11);
    for (int64_t l = 0; l < c.layers; ++l) {
        for (const char* gone : {"q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"}) {
            REQUIRE(t.erase(layer(l) + gone) == 1);
        }
        t[layer(l) + "q_proj.weight"] = rng.linear(c.heads * (c.nope + c.rope), c.hidden);
    }
    c.q_lora_rank = 0;
    check_variant(c, t);
}

TEST_CASE("deepseek_v3 variants: v_head_dim, kv_lora_rank and qk_rope_head_dim unlike "
          "qk_nope_head_dim against the float64 forward") {
    // nope 32, rope 8, v 16, latent 24 (q LoRA 64, 4 heads): every width distinct, so a width
    // used in another's place misreads a tensor or fails to load; and the latent key width
    // (24 + 8) differs from the q/k head width (32 + 8), which the fixture cannot tell apart in
    // the softmax scale.
    RefTensors t = read_fixture_tensors();
    RefConfig c;
    c.kv_lora_rank = 24;
    c.rope = 8;
    c.v = 16;
    Bf16Random rng(12);
    for (int64_t l = 0; l < c.layers; ++l) {
        const std::string p = layer(l);
        t[p + "q_b_proj.weight"] = rng.linear(c.heads * (c.nope + c.rope), c.q_lora_rank);
        t[p + "kv_a_proj_with_mqa.weight"] = rng.linear(c.kv_lora_rank + c.rope, c.hidden);
        t[p + "kv_a_layernorm.weight"] = rng.tensor({c.kv_lora_rank}, 0.1, 1.0);
        t[p + "kv_b_proj.weight"] = rng.linear(c.heads * (c.nope + c.v), c.kv_lora_rank);
        t[p + "o_proj.weight"] = rng.linear(c.hidden, c.heads * c.v);
    }
    check_variant(c, t);
}

TEST_CASE("deepseek_v3 variants: YaRN rope_scaling against the float64 forward") {
    // factor 8 over an original 256 positions (max_position_embeddings 2048 = 256 x 8, so the
    // transformers versions that take the factor from that ratio agree). On the 16 rope dims
    // (theta 50000) the ramp runs over dims [0, 3]: frequency 0 is kept, 1 and 2 blended, 3..7
    // divided by 8. mscale 1 and mscale_all_dim 0.8 differ, so both YaRN factors are in play:
    // cos/sin times get_mscale(8, 1) / get_mscale(8, 0.8), the softmax scale times
    // get_mscale(8, 0.8)^2 = 1.3604.
    const RefTensors t = read_fixture_tensors();
    RefConfig c;
    testing::RefYarn y;
    y.factor = 8.0;
    y.original_max_position = 256;
    y.beta_fast = 32.0;
    y.beta_slow = 1.0;
    y.mscale = 1.0;
    y.mscale_all_dim = 0.8;
    // tests/fixtures/yarn_reference.py: yarn(50000.0, 16, 8.0, 256, mscale=1.0,
    // mscale_all_dim=0.8), ramp [0, 3].
    y.inv_freq = {1.0,
                  0.18317509655030306,
                  0.027864179374017587,
                  0.002161704175255327,
                  0.0005590169943749475,
                  0.00014456187094290523,
                  3.738371953053051e-05,
                  9.667434966232062e-06};
    y.attention_factor = 1.0356570849393496;
    c.yarn = y;
    const testing::RefOutput want = check_variant(c, t);
    // Not blind: YaRN moves these logits far past the tolerance, and so do its two factors on
    // top of its table.
    const std::vector<TokenId> ids = prompt_ids();
    RefConfig table_only = c;
    table_only.yarn->attention_factor = 1.0;
    table_only.yarn->mscale_all_dim = 0.0;
    RefConfig plain;
    CHECK(max_abs_diff(testing::reference_forward(plain, t, ids).logits, want.logits) > 1e-2);
    CHECK(max_abs_diff(testing::reference_forward(table_only, t, ids).logits, want.logits) >
          1e-2);
}

TEST_CASE("deepseek_v3 variants: the router keeping 2 of 4 groups against the float64 forward") {
    // 8 experts in 4 groups of 2, the best 2 groups kept (a group scored by the sum of its two
    // biased scores), top-2 inside them.
    const RefTensors t = read_fixture_tensors();
    RefConfig c;
    c.n_group = 4;
    c.topk_group = 2;
    const testing::RefOutput want = check_variant(c, t);
    // Not blind: the group limit changes the experts of some tokens from a plain top-2.
    INFO("tokens x layers where the group limit changed the experts " << want.group_limited);
    CHECK(want.group_limited > 0);
}

}  // namespace
}  // namespace edge::engine
