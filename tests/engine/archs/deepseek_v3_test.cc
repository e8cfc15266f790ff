// DeepSeek-V3 (MLA) against micro-deepseek-v3's reference outputs: greedy tokens exact, logits
// within 1e-4, single and batched, teacher-forced; the absorbed and plain attention paths agree,
// and the auto path takes the cheaper one per chunk (absorbed for a short chunk on a long prefix)
// and plain only within kMlaPlainMaxExpandedBytes; the KV cache holds kv_lora_rank +
// qk_rope_head_dim floats per token and layer; weight_bytes counts the widened kv_b_proj; the MLA
// sub-norms keep eps 1e-6; YaRN tables; MTP layers are skipped with a log line.

#include "engine/model/archs/deepseek_v3.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "common/log.h"
#include "engine/cpu/rope_scaling.h"
#include "engine/model/archs/deepseek_v3_config.h"
#include "engine/model/loader.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "reference_check.h"

namespace edge::engine {
namespace {

using testing::fixture_dir;

LoadOptions small_options(int threads) {
    LoadOptions options;
    options.threads = threads;
    options.max_slots = 4;
    options.max_context = 512;
    return options;
}

std::unique_ptr<CausalLM> load_path(MlaPath path, int threads) {
    const std::string dir = fixture_dir("micro-deepseek-v3");
    auto json = ConfigJson::read(dir);
    REQUIRE(json.ok());
    auto model = load_deepseek_v3(dir, *json, small_options(threads), path);
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    return std::move(model).value();
}

void check_fixture(MlaPath path, int threads) {
    auto prompts = testing::read_reference(fixture_dir("micro-deepseek-v3"));
    auto model = load_path(path, threads);
    SUBCASE("one prompt at a time") {
        testing::check_runs(prompts, testing::run_greedy(*model, prompts, false));
    }
    SUBCASE("all prompts batched") {
        testing::check_runs(prompts, testing::run_greedy(*model, prompts, true));
    }
    SUBCASE("teacher-forced batch") { testing::check_teacher_forced(*model, prompts); }
}

TEST_CASE("deepseek_v3: micro-deepseek-v3 matches the reference through load_model") {
    auto model = load_model(fixture_dir("micro-deepseek-v3"), small_options(2));
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    auto prompts = testing::read_reference(fixture_dir("micro-deepseek-v3"));
    testing::check_runs(prompts, testing::run_greedy(**model, prompts, true));
}

TEST_CASE(
    "deepseek_v3: reference with the auto path (plain prefill and absorbed decode) on 1 thread") {
    check_fixture(MlaPath::kAuto, 1);
}
TEST_CASE("deepseek_v3: reference with the absorbed path on 2 threads") {
    check_fixture(MlaPath::kAbsorbed, 2);
}
TEST_CASE("deepseek_v3: reference with the plain path on 2 threads") {
    check_fixture(MlaPath::kPlain, 2);
}

TEST_CASE("deepseek_v3: absorbed and plain paths give the same logits") {
    auto prompts = testing::read_reference(fixture_dir("micro-deepseek-v3"));
    auto plain = load_path(MlaPath::kPlain, 1);
    auto absorbed = load_path(MlaPath::kAbsorbed, 1);
    const auto a = testing::run_greedy(*plain, prompts, true);
    const auto b = testing::run_greedy(*absorbed, prompts, true);
    double max_diff = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        CHECK(a[i].tokens == b[i].tokens);
        for (size_t s = 0; s < a[i].step_logits.size(); ++s) {
            for (size_t v = 0; v < a[i].step_logits[s].size(); ++v) {
                max_diff = std::max<double>(
                    max_diff, std::fabs(a[i].step_logits[s][v] - b[i].step_logits[s][v]));
            }
        }
    }
    INFO("max |plain - absorbed| " << max_diff);
    CHECK(max_diff <= 1e-4);
    CHECK(max_diff > 0.0);  // Two different computations, not one path run twice.
}

TEST_CASE("deepseek_v3: the auto path picks plain only for chunks long next to their prefix") {
    MlaConfig ds;  // DeepSeek-V3 and Kimi K2: break-even near 512 x 256 / 768 = 171 tokens.
    ds.kv_lora_rank = 512;
    ds.qk_nope_head_dim = 128;
    ds.qk_rope_head_dim = 64;
    ds.v_head_dim = 128;
    // The multiply-add rule alone (no bound on the expansion; see the next case for the bound).
    auto picks = [](const MlaConfig& m, int64_t tokens, int64_t context) {
        return mla_auto_picks_plain(m, 128, tokens, context, std::numeric_limits<int64_t>::max());
    };
    CHECK(picks(ds, 4096, 4096));        // Fresh prefill.
    CHECK(picks(ds, 2, 2));              // Fresh, two tokens.
    CHECK_FALSE(picks(ds, 1, 1));        // A single token: always absorbed.
    CHECK_FALSE(picks(ds, 1, 60001));    // A decode step.
    CHECK_FALSE(picks(ds, 20, 60020));   // A short turn on a long history.
    CHECK_FALSE(picks(ds, 160, 60160));  // Just under the break-even.
    CHECK(picks(ds, 180, 60180));        // Just over it.
    CHECK(picks(ds, 1000, 61000));       // A long chunk.
    CHECK(picks(ds, 2048, 3000));        // Long next to its prefix.
    MlaConfig micro;  // micro-deepseek-v3: 2c = nope + v, so any cached prefix tips to absorbed.
    micro.kv_lora_rank = 32;
    micro.qk_nope_head_dim = 32;
    micro.qk_rope_head_dim = 16;
    micro.v_head_dim = 32;
    CHECK(mla_auto_picks_plain(micro, 4, 64, 64));
    CHECK_FALSE(mla_auto_picks_plain(micro, 4, 6, 206));
    CHECK_FALSE(mla_auto_picks_plain(micro, 4, 200, 201));
}

TEST_CASE("deepseek_v3: the auto path expands at most kMlaPlainMaxExpandedBytes") {
    // DeepSeek-V3 / Kimi K2: 128 heads x (128 + 128) floats = 128 KiB a position, so the default
    // bound of 256 MiB admits 2048 positions. Past it the chunk goes absorbed even where the
    // multiply-add rule prefers plain: a 2048-token chunk at 128k positions would expand 16 GiB.
    MlaConfig ds;
    ds.kv_lora_rank = 512;
    ds.qk_nope_head_dim = 128;
    ds.qk_rope_head_dim = 64;
    ds.v_head_dim = 128;
    constexpr int64_t kNoBound = std::numeric_limits<int64_t>::max();
    CHECK(kMlaPlainMaxExpandedBytes == int64_t{2048} * 128 * 256 * 4);
    CHECK(mla_auto_picks_plain(ds, 128, 2048, 2048));  // A fresh default-sized chunk: at the bound.
    CHECK_FALSE(mla_auto_picks_plain(ds, 128, 2049, 2049));
    CHECK(mla_auto_picks_plain(ds, 128, 2048, 131072, kNoBound));  // The rule alone says plain.
    CHECK_FALSE(mla_auto_picks_plain(ds, 128, 2048, 131072));
    CHECK_FALSE(mla_auto_picks_plain(ds, 128, 1000, 61000));
    // 16 heads (DeepSeek-V2-Lite's count): 16 KiB a position, 16384 positions.
    CHECK(mla_auto_picks_plain(ds, 16, 2048, 16384));
    CHECK_FALSE(mla_auto_picks_plain(ds, 16, 2048, 16385));
    // An explicit bound: micro-deepseek-v3 expands 4 x 64 floats = 1 KiB a position.
    MlaConfig micro;
    micro.kv_lora_rank = 32;
    micro.qk_nope_head_dim = 32;
    micro.qk_rope_head_dim = 16;
    micro.v_head_dim = 32;
    CHECK(mla_auto_picks_plain(micro, 4, 100, 100, 100 * 1024));
    CHECK_FALSE(mla_auto_picks_plain(micro, 4, 101, 101, 100 * 1024));
}

TEST_CASE("deepseek_v3: a chunk past the expansion bound takes the absorbed path") {
    // micro-deepseek-v3 with the bound lowered to 100 positions (1 KiB each): a fresh prefill of
    // 64 tokens still takes plain (the auto model's logits equal the plain model's bit for bit),
    // one of 200 takes absorbed (they equal the absorbed model's) and stays within the tolerance
    // of plain.
    const std::string dir = fixture_dir("micro-deepseek-v3");
    auto json = ConfigJson::read(dir);
    REQUIRE(json.ok());
    auto bounded = load_deepseek_v3(dir, *json, small_options(2), MlaPath::kAuto, 100 * 1024);
    REQUIRE_MESSAGE(bounded.ok(), bounded.status().to_string());
    CausalLM& model_auto = **bounded;
    auto model_absorbed = load_path(MlaPath::kAbsorbed, 2);
    auto model_plain = load_path(MlaPath::kPlain, 2);
    auto run = [](CausalLM& m, int n) {
        std::vector<TokenId> ids(static_cast<size_t>(n));
        for (size_t i = 0; i < ids.size(); ++i) {
            ids[i] = static_cast<TokenId>((i * 37 + 11) % 509);
        }
        auto slot = m.acquire_slot();
        REQUIRE(slot.ok());
        std::vector<float> logits;
        SequenceChunk ch{*slot, 0, ids, true};
        REQUIRE(m.forward({&ch, 1}, &logits).ok());
        m.release_slot(*slot);
        return logits;
    };
    const std::vector<float> short_auto = run(model_auto, 64);
    CHECK(short_auto == run(*model_plain, 64));
    CHECK(short_auto != run(*model_absorbed, 64));
    const std::vector<float> a = run(model_auto, 200);
    const std::vector<float> b = run(*model_absorbed, 200);
    const std::vector<float> p = run(*model_plain, 200);
    REQUIRE(a.size() == static_cast<size_t>(200 * model_auto.spec().vocab_size));
    CHECK(a == b);
    double max_diff = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        max_diff = std::max<double>(max_diff, std::fabs(a[i] - p[i]));
    }
    INFO("max |auto - plain| " << max_diff);
    CHECK(max_diff <= 3e-4);  // Every logit of 200 positions (1.1e-4 seen): f32 rounding.
}

TEST_CASE("deepseek_v3: weight_bytes counts the f32 copy of a BF16 kv_b_proj") {
    // The absorbed path (and auto) widens each layer's BF16 kv_b_proj [4 x (32 + 32), 32] to f32;
    // the plain path reads it as stored. 3 layers x 256 x 32 floats.
    auto plain = load_path(MlaPath::kPlain, 1);
    auto absorbed = load_path(MlaPath::kAbsorbed, 1);
    auto automatic = load_path(MlaPath::kAuto, 1);
    CHECK(plain->spec().weight_bytes > 0);
    CHECK(absorbed->spec().weight_bytes - plain->spec().weight_bytes == 3 * 256 * 32 * 4);
    CHECK(automatic->spec().weight_bytes == absorbed->spec().weight_bytes);
}

TEST_CASE("deepseek_v3: a short chunk on a long cached context takes the absorbed path") {
    // 200 cached positions (fed one token at a time: a decode step is absorbed on every path
    // but plain, so the auto and absorbed models hold the same cache bit for bit), then a chunk
    // of 6 tokens with all its logits. The rule sends it down the absorbed path: the auto model's
    // logits equal the absorbed model's exactly, and the plain model's within the tolerance.
    constexpr int kCached = 200;
    constexpr int kChunk = 6;
    auto model_auto = load_path(MlaPath::kAuto, 2);
    auto model_absorbed = load_path(MlaPath::kAbsorbed, 2);
    auto model_plain = load_path(MlaPath::kPlain, 2);
    std::vector<TokenId> ids(kCached + kChunk);
    for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<TokenId>((i * 37 + 11) % 509);
    }
    const std::span<const TokenId> all(ids);
    auto run = [&](CausalLM& m, bool one_by_one) {
        auto slot = m.acquire_slot();
        REQUIRE(slot.ok());
        std::vector<float> logits;
        if (one_by_one) {
            for (int p = 0; p < kCached; ++p) {
                SequenceChunk ch{*slot, p, all.subspan(p, 1), false};
                REQUIRE(m.forward({&ch, 1}, &logits).ok());
            }
        } else {
            SequenceChunk ch{*slot, 0, all.first(kCached), false};
            REQUIRE(m.forward({&ch, 1}, &logits).ok());
        }
        SequenceChunk ch{*slot, kCached, all.subspan(kCached, kChunk), true};
        REQUIRE(m.forward({&ch, 1}, &logits).ok());
        return logits;
    };
    const std::vector<float> a = run(*model_auto, true);
    const std::vector<float> b = run(*model_absorbed, true);
    const std::vector<float> p = run(*model_plain, false);
    REQUIRE(a.size() == static_cast<size_t>(kChunk * model_auto->spec().vocab_size));
    REQUIRE(b.size() == a.size());
    REQUIRE(p.size() == a.size());
    CHECK(a == b);
    double max_diff = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        max_diff = std::max<double>(max_diff, std::fabs(a[i] - p[i]));
    }
    INFO("max |auto - plain| " << max_diff);
    CHECK(max_diff <= 1e-4);
    CHECK(max_diff > 0.0);  // The plain model computed it another way.
}

TEST_CASE("deepseek_v3: KV cache holds the latent and the rope key only") {
    auto model = load_path(MlaPath::kAuto, 1);
    CHECK(model->spec().architecture == "DeepseekV3ForCausalLM");
    // (kv_lora_rank 32 + qk_rope_head_dim 16) x 4 bytes x 3 layers.
    CHECK(model->spec().kv_bytes_per_token == (32 + 16) * 4 * 3);
    // A budget of exactly 5 tokens holds 5 tokens and refuses the 6th.
    LoadOptions options = small_options(1);
    options.kv_cache_bytes = 5 * (32 + 16) * 4 * 3;
    options.kv_block_tokens = 1;  // Blocks of one token: the budget is exactly 5 blocks.
    auto small = load_model(fixture_dir("micro-deepseek-v3"), options);
    REQUIRE(small.ok());
    auto slot = (*small)->acquire_slot();
    REQUIRE(slot.ok());
    const std::vector<TokenId> five = {1, 2, 3, 4, 5};
    SequenceChunk ch{*slot, 0, five, false};
    std::vector<float> logits;
    CHECK((*small)->forward({&ch, 1}, &logits).ok());
    const std::vector<TokenId> one = {6};
    SequenceChunk more{*slot, 5, one, false};
    CHECK((*small)->forward({&more, 1}, &logits).code() == StatusCode::kResourceExhausted);
}

TEST_CASE("deepseek_v3: YaRN frequencies") {
    const auto plain = cpu::rope_inv_freq(10000.0, 64);
    cpu::YarnConfig y;
    y.factor = 1.0;
    CHECK(cpu::yarn_inv_freq(10000.0, 64, y) == plain);
    y.factor = 40.0;
    y.original_max_position = 4096;
    const auto yarn = cpu::yarn_inv_freq(10000.0, 64, y);
    REQUIRE(yarn.size() == 32);
    // High frequencies extrapolate (unchanged), low ones are interpolated (divided by factor),
    // and the ramp in between is monotone.
    CHECK(yarn[0] == doctest::Approx(plain[0]));
    CHECK(yarn[31] == doctest::Approx(plain[31] / 40.0));
    for (size_t i = 0; i < yarn.size(); ++i) {
        CHECK(yarn[i] <= plain[i] * (1 + 1e-12));
        CHECK(yarn[i] >= plain[i] / 40.0 * (1 - 1e-12));
    }
    CHECK(cpu::yarn_get_mscale(40.0, 1.0) == doctest::Approx(0.1 * std::log(40.0) + 1.0));
    CHECK(cpu::yarn_get_mscale(1.0, 1.0) == 1.0);
}

// Writes micro-deepseek-v3 with one config.json field replaced into a temp dir.
struct ConfigVariant {
    std::filesystem::path dir;
    ConfigVariant(const std::string& from, const std::string& to) {
        const std::string src = fixture_dir("micro-deepseek-v3");
        dir = std::filesystem::temp_directory_path() /
              ("dsv3_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
        std::filesystem::create_directories(dir);
        std::filesystem::copy_file(src + "/model.safetensors", dir / "model.safetensors");
        std::ifstream in(src + "/config.json");
        std::stringstream ss;
        ss << in.rdbuf();
        std::string c = ss.str();
        const size_t at = c.find(from);
        REQUIRE(at != std::string::npos);
        c.replace(at, from.size(), to);
        std::ofstream(dir / "config.json") << c;
    }
    ~ConfigVariant() { std::filesystem::remove_all(dir); }
    static inline int counter = 0;
};

TEST_CASE("deepseek_v3: YaRN rope_scaling loads and changes the logits and bad types are named") {
    const std::string yarn =
        "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 32.0, \"beta_fast\": 1.0, "
        "\"beta_slow\": 1.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, "
        "\"original_max_position_embeddings\": 64}";
    ConfigVariant v("\"rope_scaling\": null", yarn);
    auto model = load_model(v.dir.string(), small_options(1));
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    auto base = load_path(MlaPath::kAuto, 1);
    const std::vector<TokenId> ids = {5, 6, 7, 8, 9, 10, 11, 12};
    std::vector<float> a;
    std::vector<float> b;
    auto sa = (*model)->acquire_slot();
    auto sb = base->acquire_slot();
    SequenceChunk ca{*sa, 0, ids, false};
    SequenceChunk cb{*sb, 0, ids, false};
    REQUIRE((*model)->forward({&ca, 1}, &a).ok());
    REQUIRE(base->forward({&cb, 1}, &b).ok());
    double diff = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        diff = std::max<double>(diff, std::fabs(a[i] - b[i]));
        REQUIRE(std::isfinite(a[i]));
    }
    CHECK(diff > 1e-3);

    ConfigVariant bad("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"dynamic\"}");
    auto r = load_model(bad.dir.string(), small_options(1));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().to_string().find("rope_scaling") != std::string::npos);
}

TEST_CASE("deepseek_v3: multi-token-prediction layers are skipped with a log line") {
    ConfigVariant v("\"num_nextn_predict_layers\": 0", "\"num_nextn_predict_layers\": 1");
    std::string lines;
    log::set_sink([&](std::string_view line) { lines += std::string(line) + "\n"; });
    auto model = load_model(v.dir.string(), small_options(1));
    log::set_sink(nullptr);
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    CHECK(lines.find("model_mtp_layers_skipped") != std::string::npos);
}

// Multiplies the BF16 tensors of the safetensors `file` whose names end in one of `suffixes` by
// 256, in place (exact: a power of two, and nothing near the ends of the BF16 range).
void scale_bf16_tensors(const std::filesystem::path& file,
                        const std::vector<std::string>& suffixes) {
    std::ifstream in(file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    auto header = parse_safetensors_header(bytes, bytes.size(), file.string());
    REQUIRE_MESSAGE(header.ok(), header.status().to_string());
    int scaled = 0;
    for (const TensorInfo& t : header->tensors) {
        const bool match = std::any_of(suffixes.begin(), suffixes.end(),
                                       [&](const auto& s) { return t.name.ends_with(s); });
        if (!match) {
            continue;
        }
        REQUIRE(t.dtype == DType::kBF16);
        for (int64_t at = header->data_offset + t.begin; at < header->data_offset + t.end;
             at += 2) {
            uint16_t b;
            std::memcpy(&b, bytes.data() + at, 2);
            const float f = std::bit_cast<float>(static_cast<uint32_t>(b) << 16) * 256.0f;
            const uint32_t u = std::bit_cast<uint32_t>(f);
            REQUIRE((u & 0xffffu) == 0);
            b = static_cast<uint16_t>(u >> 16);
            std::memcpy(bytes.data() + at, &b, 2);
        }
        ++scaled;
    }
    CHECK(scaled > 0);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

std::vector<float> prompt_logits(CausalLM& m) {
    const std::vector<TokenId> ids = {5, 6, 7, 8, 9, 10, 11, 12, 300, 301, 17, 2};
    auto slot = m.acquire_slot();
    REQUIRE(slot.ok());
    std::vector<float> logits;
    SequenceChunk ch{*slot, 0, ids, true};
    REQUIRE(m.forward({&ch, 1}, &logits).ok());
    return logits;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double d = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        d = std::max<double>(d, std::fabs(a[i] - b[i]));
    }
    return d;
}

TEST_CASE("deepseek_v3: q_a_layernorm and kv_a_layernorm keep eps 1e-6 whatever rms_norm_eps") {
    // Hugging Face builds the two MLA sub-norms with eps 1e-6 and every other norm with
    // rms_norm_eps. Scaling the residual stream by 256 (the embeddings and every projection that
    // writes into it: o_proj and the MLPs' down_proj) and rms_norm_eps by 256^2 leaves each
    // residual norm's output as it was (up to rounding), and the sub-norms read only normed
    // activations: the logits stay those of the fixture when the sub-norms keep 1e-6, and move
    // when they take rms_norm_eps (0.065536 here).
    auto base = load_path(MlaPath::kAuto, 1);
    const std::vector<float> want = prompt_logits(*base);
    ConfigVariant v("\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 0.065536");
    {
        // rms_norm_eps alone (weights as they are) does move the logits: the case below is not
        // blind to the epsilon.
        auto model = load_model(v.dir.string(), small_options(1));
        REQUIRE_MESSAGE(model.ok(), model.status().to_string());
        CHECK(max_abs_diff(prompt_logits(**model), want) > 1e-2);
    }
    scale_bf16_tensors(v.dir / "model.safetensors",
                       {"embed_tokens.weight", "o_proj.weight", "down_proj.weight"});
    auto model = load_model(v.dir.string(), small_options(1));
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    const double diff = max_abs_diff(prompt_logits(**model), want);
    INFO("max |scaled - fixture| " << diff);
    CHECK(diff <= 1e-5);
}

}  // namespace
}  // namespace edge::engine
