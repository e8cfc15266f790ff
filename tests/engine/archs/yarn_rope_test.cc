// YaRN rope_scaling for Qwen3-MoE and GLM-4.5 (transformers' _compute_yarn_parameters, the recipe
// Qwen's documentation gives for long contexts): the tables against numbers computed apart from
// the engine, the scaled cos/sin in a forward, and the scalings and values that are refused.

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "engine/cpu/rope_scaling.h"
#include "engine/model/archs/glm4_moe.h"
#include "engine/model/archs/glm4_moe_common.h"
#include "engine/model/archs/qwen3_moe.h"
#include "engine/model/loader.h"
#include "engine/model/model_config.h"
#include "reference_check.h"
#include "tests/testing/test_certs.h"

namespace edge::engine {
namespace {

namespace json = boost::json;

const std::string kConfigs = std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/configs/";

// `name`'s config.json with rope_scaling set to `scaling` (JSON text).
ConfigJson with_scaling(const std::string& name, const std::string& scaling) {
    auto base = ConfigJson::read(kConfigs + name);
    REQUIRE_MESSAGE(base.ok(), base.status().to_string());
    json::object root = base->root();
    root["rope_scaling"] = json::parse(scaling);
    auto c = ConfigJson::parse(json::serialize(root), name + "/config.json");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    return std::move(c).value();
}

Result<Qwen3MoeConfig> qwen3(const std::string& scaling) {
    return Qwen3MoeConfig::from_json(with_scaling("qwen3-30b-a3b", scaling));
}

Result<Glm4AttentionConfig> glm4(const std::string& scaling) {
    const ConfigJson json = with_scaling("intellect-3-base", scaling);
    auto c = SigmoidMoeConfig::from_json(json, kGlm4MoeDefaults);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    return Glm4AttentionConfig::from_json(json, *c);
}

void check_relative(double got, double want) {
    CAPTURE(got);
    CAPTURE(want);
    CHECK(std::fabs(got - want) <= 1e-12 * std::fabs(want));
}

// Qwen3-30B-A3B (head_dim 128, rope_theta 1e6) with Qwen's recipe: factor 4, original 32768.
// From tests/fixtures/yarn_reference.py (transformers' formula in float64 Python); the ramp
// runs over dims [23, 40].
constexpr double kQwen3AttentionFactor = 1.138629436111989;
// clang-format off
const std::vector<double> kQwen3InvFreq = {
    1.0, 0.8058421877614819,
    0.6493816315762113, 0.5232991146814947,
    0.4216965034285823, 0.3398208328942559,
    0.27384196342643613, 0.220673406908459,
    0.17782794100389226, 0.14330125702369628,
    0.1154781984689458, 0.0930572040929699,
    0.07498942093324558, 0.06042963902381328,
    0.04869675251658631, 0.03924189758484536,
    0.03162277660168379, 0.025482967479793464,
    0.020535250264571463, 0.016548170999431816,
    0.01333521432163324, 0.010746078283213174,
    0.008659643233600653, 0.006978305848598663,
    0.005375321490790102, 0.004131738022518394,
    0.003168422574711092, 0.0024234223804076435,
    0.001848276564706878, 0.0014051124815959123,
    0.0010643609812470017, 0.0008029597275452302,
    0.0006029411764705882, 0.00045032357551376927,
    0.00033424054566422634, 0.0002462584069089387,
    0.00017984115587395423, 0.00012993149493015669,
    9.262301704129459e-05, 6.490394320837028e-05,
    4.445698525097307e-05, 3.582531425592407e-05,
    2.8869549617236455e-05, 2.3264301023242475e-05,
    1.8747355233311396e-05, 1.5107409755953319e-05,
    1.2174188129146578e-05, 9.810474396211341e-06,
    7.905694150420949e-06, 6.370741869948367e-06,
    5.133812566142866e-06, 4.137042749857953e-06,
    3.33380358040831e-06, 2.6865195708032935e-06,
    2.1649108084001634e-06, 1.744576462149666e-06,
    1.4058533129758728e-06, 1.1328959094002045e-06,
    9.129353181370943e-07, 7.356817940523205e-07,
    5.928434264154138e-07, 4.777382437426101e-07,
    3.84981631514873e-07, 3.102344401879299e-07,
};
// clang-format on

const char* const kQwenRecipe =
    R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})";

TEST_CASE("yarn: Qwen3-30B-A3B's tables equal transformers' formula") {
    auto c = qwen3(kQwenRecipe);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    REQUIRE(c->rope.inv_freq.size() == kQwen3InvFreq.size());
    for (size_t i = 0; i < kQwen3InvFreq.size(); ++i) {
        CAPTURE(i);
        check_relative(c->rope.inv_freq[i], kQwen3InvFreq[i]);
    }
    check_relative(c->rope.mscale, kQwen3AttentionFactor);
    REQUIRE(c->rope.yarn.has_value());
    // Served as vLLM serves the recipe: 32768 x 4, above the config's 40960.
    CHECK(c->max_position_embeddings == 40960);
    CHECK(c->rope.max_positions == 131072);
    CHECK(c->rope.yarn->beta_fast == 32.0);
    CHECK(c->rope.yarn->beta_slow == 1.0);
    CHECK(c->rope.yarn->truncate);
    // The older spelling of the type, and transformers v5's rope_parameters, read the same.
    auto old_spelling =
        qwen3(R"({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})");
    REQUIRE_MESSAGE(old_spelling.ok(), old_spelling.status().to_string());
    CHECK(old_spelling->rope.inv_freq == c->rope.inv_freq);
    auto v5_root = ConfigJson::read(kConfigs + "qwen3-30b-a3b");
    REQUIRE(v5_root.ok());
    json::object root = v5_root->root();
    root.erase("rope_theta");
    root["rope_parameters"] = json::parse(R"({"rope_type": "yarn", "rope_theta": 1000000.0,
        "factor": 4.0, "original_max_position_embeddings": 32768})");
    auto v5 = ConfigJson::parse(json::serialize(root), "qwen3-30b-a3b/config.json");
    REQUIRE_MESSAGE(v5.ok(), v5.status().to_string());
    auto from_v5 = Qwen3MoeConfig::from_json(*v5);
    REQUIRE_MESSAGE(from_v5.ok(), from_v5.status().to_string());
    CHECK(from_v5->rope.inv_freq == c->rope.inv_freq);
    CHECK(from_v5->rope.mscale == c->rope.mscale);
    // Without original_max_position_embeddings the pretrained length is max_position_embeddings
    // (40960); attention_factor, when given, is the cos/sin factor itself.
    auto no_original = qwen3(R"({"rope_type": "yarn", "factor": 4.0, "attention_factor": 0.5})");
    REQUIRE_MESSAGE(no_original.ok(), no_original.status().to_string());
    CHECK(no_original->rope.yarn->original_max_position == 40960);
    CHECK(no_original->rope.max_positions == 4 * 40960);
    CHECK(no_original->rope.mscale == 0.5);
    cpu::YarnConfig y;
    y.factor = 4.0;
    y.original_max_position = 40960;
    CHECK(no_original->rope.inv_freq == cpu::yarn_inv_freq(1e6, 128, y));
    // mscale / mscale_all_dim, both set: their get_mscale ratio.
    auto ratio = qwen3(R"({"rope_type": "yarn", "factor": 4.0, "mscale": 2.0,
                           "mscale_all_dim": 1.0})");
    REQUIRE_MESSAGE(ratio.ok(), ratio.status().to_string());
    check_relative(ratio->rope.mscale, (0.2 * std::log(4.0) + 1.0) / (0.1 * std::log(4.0) + 1.0));
    // beta 0 is transformers' `or` default, as absent.
    auto zero_betas = qwen3(R"({"rope_type": "yarn", "factor": 4.0, "beta_fast": 0,
        "beta_slow": 0, "original_max_position_embeddings": 32768})");
    REQUIRE_MESSAGE(zero_betas.ok(), zero_betas.status().to_string());
    CHECK(zero_betas->rope.inv_freq == c->rope.inv_freq);
    // No scaling: the plain table, cos/sin unscaled.
    auto plain = qwen3("null");
    REQUIRE(plain.ok());
    CHECK(plain->rope.inv_freq == cpu::rope_inv_freq(1e6, 128));
    CHECK(plain->rope.mscale == 1.0);
    CHECK(plain->rope.max_positions == 40960);
    CHECK_FALSE(plain->rope.yarn.has_value());
}

TEST_CASE("yarn: GLM-4.5 scales its partial rotary dims") {
    auto a = glm4(R"({"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 32768})");
    REQUIRE_MESSAGE(a.ok(), a.status().to_string());
    REQUIRE(a->rotary_dim == 64);  // head_dim 128, partial_rotary_factor 0.5.
    cpu::YarnConfig y;
    y.factor = 4.0;
    y.original_max_position = 32768;
    // transformers' dim is head_dim * partial_rotary_factor: the ramp is over 64 dims.
    CHECK(a->rope.inv_freq == cpu::yarn_inv_freq(1e6, 64, y));
    CHECK(a->rope.inv_freq != cpu::rope_inv_freq(1e6, 64));
    check_relative(a->rope.mscale, kQwen3AttentionFactor);  // The same factor 4.
}

void require_error(const Status& s, StatusCode code, const std::string& file,
                   const std::string& text) {
    REQUIRE_FALSE(s.ok());
    CAPTURE(s.message());
    CHECK(s.code() == code);
    CHECK(s.message().find(file + "/config.json: field 'rope_scaling") != std::string::npos);
    CHECK(s.message().find(text) != std::string::npos);
}

TEST_CASE("yarn: other scalings and bad values are refused, naming the file and field") {
    for (const char* type : {"linear", "dynamic", "longrope", "llama3"}) {
        for (const char* key : {"rope_type", "type"}) {
            CAPTURE(std::string(type));
            const std::string scaling =
                std::string("{\"") + key + "\": \"" + type + "\", \"factor\": 4.0}";
            const std::string named = std::string("'rope_scaling.") + key + "' '" + type + "'";
            require_error(qwen3(scaling).status(), StatusCode::kUnimplemented, "qwen3-30b-a3b",
                          named + " is not supported for Qwen3MoeForCausalLM (only yarn)");
            require_error(glm4(scaling).status(), StatusCode::kUnimplemented, "intellect-3-base",
                          named + " is not supported for Glm4MoeForCausalLM");
        }
    }
    struct Bad {
        const char* fields;  // Added to {"rope_type": "yarn", ...}.
        const char* message;
    };
    const Bad bad[] = {
        {R"("original_max_position_embeddings": 32768)", "field 'rope_scaling.factor' is missing"},
        {R"("factor": 0.5)", "field 'rope_scaling.factor' is 5E-1, expected a number of 1 or"},
        {R"("factor": 0.999)", "field 'rope_scaling.factor' is 9.99E-1, expected a number of 1"},
        {R"("factor": "4")", "field 'rope_scaling.factor' is not a finite number"},
        {R"("factor": true)", "field 'rope_scaling.factor' is not a finite number"},
        {R"("factor": 4, "beta_fast": -32)", "field 'rope_scaling.beta_fast' is -32, expected 0"},
        {R"("factor": 4, "beta_slow": -1)", "field 'rope_scaling.beta_slow' is -1, expected 0"},
        {R"("factor": 4, "original_max_position_embeddings": 0)",
         "field 'rope_scaling.original_max_position_embeddings' is 0, expected a whole number"},
        {R"("factor": 4, "original_max_position_embeddings": -4096)",
         "field 'rope_scaling.original_max_position_embeddings' is -4096, expected"},
        {R"("factor": 4, "original_max_position_embeddings": 32768.5)",
         "field 'rope_scaling.original_max_position_embeddings' is 3.27685E4, expected a whole"},
        {R"("factor": 4, "original_max_position_embeddings": 131072)",
         "field 'rope_scaling.original_max_position_embeddings' is 131072, expected at most "
         "max_position_embeddings (40960)"},
        {R"("factor": 4, "attention_factor": 0)",
         "field 'rope_scaling.attention_factor' is 0, expected a number above 0"},
        {R"("factor": 4, "mscale": -1, "mscale_all_dim": 1)",
         "field 'rope_scaling.mscale' is -1, expected 0 or more"},
        // Far above 1 they made q.k, or cos/sin, overflow a float: every logit NaN.
        {R"("factor": 4, "attention_factor": 1e20)",
         "field 'rope_scaling.attention_factor' is 1E20, expected a number above 0 and at most "
         "1000"},
        {R"("factor": 4, "attention_factor": 1000.5)",
         "field 'rope_scaling.attention_factor' is 1.0005E3, expected a number above 0 and at"},
        {R"("factor": 4, "mscale": 1e21, "mscale_all_dim": 1)",
         "field 'rope_scaling.mscale' is 1E21, expected 0 or more and at most 1000"},
        {R"("factor": 4, "mscale": 1, "mscale_all_dim": 1001)",
         "field 'rope_scaling.mscale_all_dim' is 1001, expected 0 or more and at most 1000"},
        {R"("factor": 4, "truncate": "no")", "field 'rope_scaling.truncate' is not true or false"},
    };
    for (const Bad& b : bad) {
        CAPTURE(std::string(b.fields));
        const std::string scaling = std::string(R"({"rope_type": "yarn", )") + b.fields + "}";
        require_error(qwen3(scaling).status(), StatusCode::kInvalidArgument, "qwen3-30b-a3b",
                      b.message);
    }
    require_error(qwen3("[4]").status(), StatusCode::kInvalidArgument, "qwen3-30b-a3b",
                  "field 'rope_scaling' is not an object");
    require_error(qwen3(R"({"factor": 4})").status(), StatusCode::kInvalidArgument, "qwen3-30b-a3b",
                  "field 'rope_scaling' has no 'rope_type'");
    require_error(glm4(R"({"rope_type": "yarn", "factor": 0.25})").status(),
                  StatusCode::kInvalidArgument, "intellect-3-base",
                  "field 'rope_scaling.factor' is 2.5E-1");
    require_error(glm4(R"({"rope_type": "yarn", "factor": 4, "attention_factor": 1e20})").status(),
                  StatusCode::kInvalidArgument, "intellect-3-base",
                  "field 'rope_scaling.attention_factor' is 1E20, expected a number above 0");
}

TEST_CASE("yarn: attention_factor and mscale are taken up to 1000") {
    // The bound refuses overflow, not a large but finite scale.
    auto q = qwen3(R"({"rope_type": "yarn", "factor": 4, "attention_factor": 1000})");
    REQUIRE_MESSAGE(q.ok(), q.status().to_string());
    CHECK(q->rope.mscale == 1000.0);
    auto g = glm4(R"({"rope_type": "yarn", "factor": 4, "attention_factor": 1000})");
    REQUIRE_MESSAGE(g.ok(), g.status().to_string());
    CHECK(g->rope.mscale == 1000.0);
    auto m = qwen3(R"({"rope_type": "yarn", "factor": 4, "mscale": 1000, "mscale_all_dim": 1000})");
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->rope.mscale == 1.0);
}

TEST_CASE("yarn: factor 1 is read as transformers reads it") {
    // transformers warns only below 1. Factor 1 interpolates by 1: the plain table; cos/sin
    // scaled by attention_factor when given, else by get_mscale(1) = 1.
    auto one = qwen3(R"({"rope_type": "yarn", "factor": 1.0,
                         "original_max_position_embeddings": 32768})");
    REQUIRE_MESSAGE(one.ok(), one.status().to_string());
    CHECK(one->rope.inv_freq == cpu::rope_inv_freq(1e6, 128));
    CHECK(one->rope.mscale == 1.0);
    CHECK(one->rope.max_positions == 40960);
    auto ratio = qwen3(R"({"rope_type": "yarn", "factor": 1, "mscale": 2.0,
                           "mscale_all_dim": 1.0})");
    REQUIRE_MESSAGE(ratio.ok(), ratio.status().to_string());
    CHECK(ratio->rope.mscale == 1.0);
    auto given = qwen3(R"({"rope_type": "yarn", "factor": 1.0, "attention_factor": 0.8})");
    REQUIRE_MESSAGE(given.ok(), given.status().to_string());
    CHECK(given->rope.inv_freq == cpu::rope_inv_freq(1e6, 128));
    CHECK(given->rope.mscale == 0.8);
}

TEST_CASE("yarn: beta_fast below beta_slow is read as transformers reads it") {
    // transformers only warns when beta_fast is below beta_slow, and its ramp then runs
    // backwards over dims [24, 39]: those below interpolated, those above kept. Values from its
    // formula in float64 Python (Qwen's recipe with the betas swapped).
    auto swapped = qwen3(R"({"rope_type": "yarn", "factor": 4.0, "beta_fast": 1,
                             "beta_slow": 32, "original_max_position_embeddings": 32768})");
    REQUIRE_MESSAGE(swapped.ok(), swapped.status().to_string());
    REQUIRE(swapped->rope.inv_freq.size() == 64);
    const std::pair<size_t, double> want[] = {{0, 0.25},
                                              {22, 0.0021649108084001636},
                                              {23, 0.0017445764621496658},
                                              {30, 0.0008469595893327206},
                                              {40, 0.00017782794100389227},
                                              {63, 1.2409377607517195e-06}};
    for (const auto& [i, v] : want) {
        CAPTURE(i);
        check_relative(swapped->rope.inv_freq[i], v);
    }
    check_relative(swapped->rope.mscale, kQwen3AttentionFactor);
}

// `fixture` copied into a temp dir with rope_scaling set to `scaling`; the model loaded.
std::unique_ptr<CausalLM> load_with_scaling(const edge::testing::TempDir& dir,
                                            const std::string& fixture, const std::string& scaling,
                                            int32_t max_context = 64) {
    const std::string src = testing::fixture_dir(fixture);
    for (const auto& entry : std::filesystem::directory_iterator(src)) {
        std::filesystem::copy_file(entry.path(), dir.file(entry.path().filename().string()),
                                   std::filesystem::copy_options::overwrite_existing);
    }
    json::object root = json::parse(edge::testing::read_file(src + "/config.json")).as_object();
    root["rope_scaling"] = json::parse(scaling);
    dir.write("config.json", json::serialize(root));
    LoadOptions options;
    options.threads = 1;
    options.max_slots = 1;
    options.max_context = max_context;
    auto model = load_model(dir.path(), options);
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    return std::move(model).value();
}

// The logits of every token of one prompt.
std::vector<float> prompt_logits(CausalLM& model) {
    const std::vector<TokenId> ids = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    auto slot = model.acquire_slot();
    REQUIRE(slot.ok());
    SequenceChunk chunk{*slot, 0, ids, true};
    std::vector<float> logits;
    REQUIRE(model.forward({&chunk, 1}, &logits).ok());
    return logits;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double diff = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        REQUIRE(std::isfinite(a[i]));
        diff = std::max<double>(diff, std::fabs(a[i] - b[i]));
    }
    return diff;
}

TEST_CASE("yarn: a model serves original_max_position_embeddings x factor positions") {
    // Qwen's recipe names the pretrained length and the factor; the config's
    // max_position_embeddings may stay below their product (40960 against 131072 for
    // Qwen3-30B-A3B), and vLLM serves the product. A short original length keeps the KV cache
    // of the micro models small. DeepSeek-V3's MLA reads the same rope_scaling.
    for (const char* fixture : {"micro-qwen3-moe", "micro-glm4-moe", "micro-deepseek-v3"}) {
        CAPTURE(std::string(fixture));
        const std::string src = testing::fixture_dir(fixture);
        const int64_t max_pos = json::parse(edge::testing::read_file(src + "/config.json"))
                                    .at("max_position_embeddings")
                                    .to_number<int64_t>();
        edge::testing::TempDir plain_dir, yarn_dir;
        auto plain = load_with_scaling(plain_dir, fixture, "null", 0);
        CHECK(plain->spec().max_context == max_pos);
        auto yarn = load_with_scaling(
            yarn_dir, fixture,
            R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": )" +
                std::to_string(max_pos) + "}",
            0);
        CHECK(yarn->spec().max_context == 4 * max_pos);
    }
}

TEST_CASE("yarn: the micro models' forward rotates with the scaled cos/sin") {
    for (const char* fixture : {"micro-qwen3-moe", "micro-glm4-moe"}) {
        CAPTURE(std::string(fixture));
        edge::testing::TempDir none_dir, yarn_dir, unit_dir, factor_dir;
        const std::vector<float> none =
            prompt_logits(*load_with_scaling(none_dir, fixture, "null"));
        // A short original length, so the ramp falls inside the micro heads and the prompt
        // spans several of the slowest dims' wavelengths.
        const std::vector<float> yarn = prompt_logits(*load_with_scaling(
            yarn_dir, fixture,
            R"({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64})"));
        CHECK(max_abs_diff(yarn, none) > 1e-3);
        // Factor 1 + 1e-9 with attention_factor 1 is (all but) no scaling.
        const std::vector<float> unit = prompt_logits(*load_with_scaling(
            unit_dir, fixture,
            R"({"rope_type": "yarn", "factor": 1.000000001, "attention_factor": 1.0})"));
        CHECK(max_abs_diff(unit, none) < 1e-4);
        // The same frequencies with cos/sin scaled: q.k grows by attention_factor^2.
        const std::vector<float> scaled = prompt_logits(*load_with_scaling(
            factor_dir, fixture,
            R"({"rope_type": "yarn", "factor": 1.000000001, "attention_factor": 2.0})"));
        CHECK(max_abs_diff(scaled, none) > 1e-3);
    }
}

}  // namespace
}  // namespace edge::engine
