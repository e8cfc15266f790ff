// What a config.json field means when the file omits it: the default of the architecture's
// transformers config class, since transformers and vLLM read such a checkpoint with that default.
// Each case parses a config.json holding only the fields without a usable default and checks
// every other field against the class (Qwen3MoeConfig, Glm4MoeConfig, DeepseekV3Config).

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "engine/cpu/rope_scaling.h"
#include "engine/model/archs/deepseek_v3_config.h"
#include "engine/model/archs/glm4_moe.h"
#include "engine/model/archs/glm4_moe_common.h"
#include "engine/model/archs/qwen3_moe.h"
#include "engine/model/model_config.h"

namespace edge::engine {
namespace {

ConfigJson parse(const std::string& text) {
    auto json = ConfigJson::parse(text, "defaults/config.json");
    REQUIRE_MESSAGE(json.ok(), json.status().to_string());
    return std::move(json).value();
}

// The shape fields every architecture requires; `extra` adds the architecture's own.
std::string minimal_config(const std::string& architecture, const std::string& extra) {
    return "{\"architectures\": [\"" + architecture +
           "\"], \"hidden_size\": 128, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
           "\"vocab_size\": 512, \"max_position_embeddings\": 2048, "
           "\"intermediate_size\": 256, \"num_experts_per_tok\": 2, "
           "\"moe_intermediate_size\": 64, " +
           extra + "}";
}

TEST_CASE("config defaults: Qwen3MoeConfig") {
    const ConfigJson json = parse(
        minimal_config(kQwen3MoeArchitecture, "\"num_key_value_heads\": 2, \"num_experts\": 8"));
    auto c = Qwen3MoeConfig::from_json(json);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->head_dim == 128 / 4);  // getattr(config, "head_dim", hidden_size // heads).
    CHECK(c->rope_theta == 10000.0);
    CHECK(c->rms_norm_eps == 1e-6);
    CHECK_FALSE(c->norm_topk_prob);
    CHECK_FALSE(c->tie_word_embeddings);
    CHECK_FALSE(c->attention_bias);
    CHECK(c->decoder_sparse_step == 1);
    CHECK(c->mlp_only_layers.empty());
    for (int64_t l = 0; l < 4; ++l) {
        CHECK(c->is_moe_layer(l));
    }
    CHECK(c->eos_token_ids.empty());  // eos_token_id / bos_token_id: None.
    CHECK(c->bos_token_id == -1);
}

TEST_CASE("config defaults: Glm4MoeConfig") {
    const ConfigJson json = parse(minimal_config(
        kGlm4MoeArchitecture, "\"num_key_value_heads\": 2, \"n_routed_experts\": 8"));
    auto c = SigmoidMoeConfig::from_json(json, kGlm4MoeDefaults);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->n_shared_experts == 1);
    CHECK(c->n_group == 1);
    CHECK(c->topk_group == 1);
    CHECK(c->first_k_dense_replace == 1);
    CHECK_FALSE(c->is_moe_layer(0));
    CHECK(c->is_moe_layer(1));
    CHECK(c->routed_scaling_factor == 1.0);
    CHECK(c->rope_theta == 10000.0);
    CHECK(c->rms_norm_eps == 1e-5);
    CHECK(c->norm_topk_prob);
    CHECK_FALSE(c->tie_word_embeddings);
    CHECK(c->num_nextn_predict_layers == 0);  // Not a Glm4MoeConfig field: no MTP layer read.
    CHECK(c->eos_token_ids.empty());
    CHECK(c->bos_token_id == -1);
    auto a = Glm4AttentionConfig::from_json(json, *c);
    REQUIRE_MESSAGE(a.ok(), a.status().to_string());
    CHECK(a->head_dim == 128 / 4);
    CHECK(a->rotary_dim == 128 / 4 / 2);  // partial_rotary_factor 0.5.
    CHECK_FALSE(a->attention_bias);
    CHECK_FALSE(a->use_qk_norm);
}

TEST_CASE("config: GLM-4.5's rotary dims are head_dim x partial_rotary_factor truncated") {
    // transformers: dim = int(head_dim * partial_rotary_factor), in doubles. 100 x 0.29 is
    // 28.999999999999996: 28 rotary dims, where rounding made 29 (odd, refused); 96 x 0.55 is
    // 52.8: 52, not 53.
    for (const auto& [head_dim, factor, dims] :
         {std::tuple<int, const char*, int64_t>{100, "0.29", 28},
          {96, "0.55", 52},
          {128, "0.5", 64}}) {
        CAPTURE(head_dim);
        CAPTURE(factor);
        const ConfigJson json = parse(minimal_config(
            kGlm4MoeArchitecture,
            "\"num_key_value_heads\": 2, \"n_routed_experts\": 8, \"head_dim\": " +
                std::to_string(head_dim) + ", \"partial_rotary_factor\": " + factor));
        auto c = SigmoidMoeConfig::from_json(json, kGlm4MoeDefaults);
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        auto a = Glm4AttentionConfig::from_json(json, *c);
        REQUIRE_MESSAGE(a.ok(), a.status().to_string());
        CHECK(a->rotary_dim == dims);
    }
}

const std::string kMla =
    "\"n_routed_experts\": 16, \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 32, "
    "\"qk_rope_head_dim\": 16, \"v_head_dim\": 32";

TEST_CASE("config defaults: DeepseekV3Config") {
    const ConfigJson json = parse(minimal_config(kDeepseekV3Architecture, kMla));
    auto c = SigmoidMoeConfig::from_json(json, kDeepseekV3Defaults);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->n_shared_experts == 1);
    CHECK(c->n_group == 8);
    CHECK(c->topk_group == 4);
    CHECK(c->first_k_dense_replace == 3);
    CHECK_FALSE(c->is_moe_layer(2));
    CHECK(c->is_moe_layer(3));
    CHECK(c->routed_scaling_factor == 2.5);
    CHECK(c->rope_theta == 10000.0);
    CHECK(c->rms_norm_eps == 1e-6);
    CHECK(c->norm_topk_prob);
    CHECK_FALSE(c->tie_word_embeddings);
    auto m = MlaConfig::from_json(json, *c);
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->q_lora_rank == 1536);
    CHECK(m->rope_interleave);
    CHECK(m->rope_mscale == 1.0);
    CHECK(m->softmax_scale == doctest::Approx(1.0 / std::sqrt(32.0 + 16.0)));
    CHECK(m->inv_freq == cpu::rope_inv_freq(10000.0, 16));
}

TEST_CASE("config defaults: a default topk_group above the config's n_group is refused") {
    // DeepSeek-V3's default topk_group is 4; with n_group 2 it would turn the group limit off.
    auto c = SigmoidMoeConfig::from_json(
        parse(minimal_config(kDeepseekV3Architecture, kMla + ", \"n_group\": 2")),
        kDeepseekV3Defaults);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().message().find("'topk_group' is missing") != std::string::npos);
    auto given = SigmoidMoeConfig::from_json(
        parse(
            minimal_config(kDeepseekV3Architecture, kMla + ", \"n_group\": 2, \"topk_group\": 1")),
        kDeepseekV3Defaults);
    REQUIRE_MESSAGE(given.ok(), given.status().to_string());
    CHECK(given->topk_group == 1);
}

TEST_CASE("config: first_k_dense_replace above num_hidden_layers makes every layer dense") {
    // transformers takes such a config (layer_idx >= first_k_dense_replace is never true): the
    // value is clamped, given or the architecture's default (DeepSeek-V3's 3) against 2 layers.
    struct Case {
        std::string architecture;
        const SigmoidMoeDefaults* defaults;
        int64_t layers;
        std::string extra;
    };
    for (const Case& k : {Case{kGlm4MoeArchitecture, &kGlm4MoeDefaults, 4,
                               "\"n_routed_experts\": 8, \"first_k_dense_replace\": 10"},
                          Case{kDeepseekV3Architecture, &kDeepseekV3Defaults, 4,
                               kMla + ", \"first_k_dense_replace\": 10"},
                          Case{kDeepseekV3Architecture, &kDeepseekV3Defaults, 2, kMla}}) {
        INFO(k.extra);
        std::string text = minimal_config(k.architecture, k.extra);
        const std::string four = "\"num_hidden_layers\": 4";
        text.replace(text.find(four), four.size(),
                     "\"num_hidden_layers\": " + std::to_string(k.layers));
        auto c = SigmoidMoeConfig::from_json(parse(text), *k.defaults);
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        CHECK(c->first_k_dense_replace == c->num_hidden_layers);
        for (int64_t l = 0; l < c->num_hidden_layers; ++l) {
            CHECK_FALSE(c->is_moe_layer(l));
        }
    }
    // A negative count is still a mistake.
    auto bad = SigmoidMoeConfig::from_json(
        parse(minimal_config(kGlm4MoeArchitecture,
                             "\"n_routed_experts\": 8, \"first_k_dense_replace\": -1")),
        kGlm4MoeDefaults);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().message().find("first_k_dense_replace") != std::string::npos);
}

TEST_CASE("config defaults: DeepseekV3Config q_lora_rank null means no query LoRA") {
    const ConfigJson json =
        parse(minimal_config(kDeepseekV3Architecture, kMla + ", \"q_lora_rank\": null"));
    auto c = SigmoidMoeConfig::from_json(json, kDeepseekV3Defaults);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    auto m = MlaConfig::from_json(json, *c);
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->q_lora_rank == 0);
}

TEST_CASE("config defaults: DeepSeek-V3 YaRN without mscale or original_max_position_embeddings") {
    // transformers' YaRN: cos/sin scaled by get_mscale(factor) unless both mscale and
    // mscale_all_dim are set, the pretrained length max_position_embeddings when the
    // original is absent; the softmax scale takes get_mscale(factor, mscale_all_dim)^2.
    const std::string yarn =
        ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, \"mscale_all_dim\": 0.5}";
    const ConfigJson json = parse(minimal_config(kDeepseekV3Architecture, kMla + yarn));
    auto c = SigmoidMoeConfig::from_json(json, kDeepseekV3Defaults);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    auto m = MlaConfig::from_json(json, *c);
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->rope_mscale == doctest::Approx(0.1 * std::log(4.0) + 1.0));
    const double ms = 0.1 * 0.5 * std::log(4.0) + 1.0;
    CHECK(m->softmax_scale == doctest::Approx(ms * ms / std::sqrt(32.0 + 16.0)));
    cpu::YarnConfig y;
    y.factor = 4.0;
    y.original_max_position = 2048;
    CHECK(m->inv_freq == cpu::yarn_inv_freq(10000.0, 16, y));
}

TEST_CASE("config: transformers v5 rope_parameters are read as the v4 fields") {
    // v5 saves rope_theta, partial_rotary_factor and the scaling in one object; read without
    // it, the theta fell back to 10000 and a YaRN scaling was dropped, in silence.
    const ConfigJson v5 = parse(minimal_config(kQwen3MoeArchitecture,
                                               "\"num_key_value_heads\": 2, \"num_experts\": 8, "
                                               "\"rope_parameters\": {\"rope_type\": \"default\", "
                                               "\"rope_theta\": 1000000.0}"));
    auto c = Qwen3MoeConfig::from_json(v5);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->rope_theta == 1000000.0);
    // A scaling there is the scaling: Qwen3-MoE reads it as it reads `rope_scaling`.
    auto yarn = Qwen3MoeConfig::from_json(
        parse(minimal_config(kQwen3MoeArchitecture,
                             "\"num_key_value_heads\": 2, \"num_experts\": 8, "
                             "\"rope_parameters\": {\"rope_type\": \"yarn\", "
                             "\"rope_theta\": 1000000.0, \"factor\": 4.0}")));
    REQUIRE_MESSAGE(yarn.ok(), yarn.status().to_string());
    REQUIRE(yarn->rope.yarn.has_value());
    CHECK(yarn->rope.yarn->factor == 4.0);
    // GLM-4.5's partial_rotary_factor comes from there too.
    const ConfigJson glm =
        parse(minimal_config(kGlm4MoeArchitecture,
                             "\"num_key_value_heads\": 2, \"n_routed_experts\": 8, "
                             "\"head_dim\": 32, \"rope_parameters\": {\"rope_theta\": "
                             "20000.0, \"partial_rotary_factor\": 0.25}"));
    CHECK(glm.get_double("partial_rotary_factor").value() == 0.25);
    CHECK(glm.get_double("rope_theta").value() == 20000.0);
    // The same value in both places is fine (1e6 and 1000000.0 alike); different ones are not.
    CHECK(ConfigJson::parse(minimal_config(kQwen3MoeArchitecture,
                                           "\"rope_theta\": 1e6, \"rope_parameters\": "
                                           "{\"rope_theta\": 1000000.0}"),
                            "c.json")
              .ok());
    auto clash = ConfigJson::parse(
        minimal_config(kQwen3MoeArchitecture,
                       "\"rope_theta\": 10000.0, \"rope_parameters\": {\"rope_theta\": 1e6}"),
        "c.json");
    REQUIRE_FALSE(clash.ok());
    CHECK(clash.status().message() ==
          "c.json: field 'rope_parameters.rope_theta' (1E6) disagrees with field 'rope_theta' "
          "(1E4)");
    // The scaling given both ways must agree too.
    auto scaling_clash = ConfigJson::parse(
        minimal_config(kDeepseekV3Architecture,
                       "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}, "
                       "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 8.0}"),
        "c.json");
    REQUIRE_FALSE(scaling_clash.ok());
    CHECK(scaling_clash.status().message().find(
              "field 'rope_parameters.factor' (8E0) disagrees with field 'rope_scaling.factor'") !=
          std::string::npos);
    auto not_object = ConfigJson::parse(
        minimal_config(kQwen3MoeArchitecture, "\"rope_parameters\": 5"), "c.json");
    REQUIRE_FALSE(not_object.ok());
    CHECK(not_object.status().message() == "c.json: field 'rope_parameters' is not an object");
}

TEST_CASE(
    "config: DeepSeek YaRN in rope_parameters equals it in rope_scaling, and attention_factor") {
    const std::string fields =
        "\"type\": \"yarn\", \"factor\": 4.0, \"mscale\": 1.0, \"mscale_all_dim\": 0.5, "
        "\"original_max_position_embeddings\": 512";
    auto mla = [](const std::string& extra) {
        const ConfigJson json = parse(minimal_config(kDeepseekV3Architecture, kMla + extra));
        auto c = SigmoidMoeConfig::from_json(json, kDeepseekV3Defaults);
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        auto m = MlaConfig::from_json(json, *c);
        REQUIRE_MESSAGE(m.ok(), m.status().to_string());
        return std::move(m).value();
    };
    const MlaConfig v4 = mla(", \"rope_theta\": 50000.0, \"rope_scaling\": {" + fields + "}");
    const MlaConfig v5 = mla(", \"rope_parameters\": {\"rope_theta\": 50000.0, " + fields + "}");
    CHECK(v5.inv_freq == v4.inv_freq);
    CHECK(v5.rope_mscale == v4.rope_mscale);
    CHECK(v5.softmax_scale == v4.softmax_scale);
    CHECK(v4.rope_mscale != 1.0);
    // attention_factor is the cos/sin scale itself; the softmax keeps mscale_all_dim's.
    const MlaConfig af = mla(", \"rope_theta\": 50000.0, \"rope_scaling\": {" + fields +
                             ", \"attention_factor\": 0.75}");
    CHECK(af.rope_mscale == 0.75);
    CHECK(af.softmax_scale == v4.softmax_scale);
    // truncate: false keeps the ramp's ends fractional.
    const MlaConfig exact =
        mla(", \"rope_theta\": 50000.0, \"rope_scaling\": {" + fields + ", \"truncate\": false}");
    CHECK(exact.inv_freq != v4.inv_freq);
    // A value that is not finite is named (it made NaN logits, blamed on the weights).
    const ConfigJson inf = parse(minimal_config(
        kDeepseekV3Architecture, kMla + ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, "
                                        "\"mscale_all_dim\": 1e999}"));
    auto c = SigmoidMoeConfig::from_json(inf, kDeepseekV3Defaults);
    REQUIRE(c.ok());
    auto bad = MlaConfig::from_json(inf, *c);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().message().find("rope_scaling.mscale_all_dim' is not a finite number") !=
          std::string::npos);
    // A negative one made the divisor 0 (factor 10, mscale_all_dim -10 / ln 10): refused.
    const ConfigJson negative =
        parse(minimal_config(kDeepseekV3Architecture,
                             kMla + ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 10.0, "
                                    "\"mscale\": 1.0, \"mscale_all_dim\": -4.342944819}"));
    auto refused = MlaConfig::from_json(negative, *c);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().message().find(
              "field 'rope_scaling.mscale_all_dim' is -4.342944819E0, expected 0 or more") !=
          std::string::npos);
    // A huge one squared into a softmax scale of about 1e40, infinite as a float: NaN logits.
    auto with_mscale_all_dim = [&](const std::string& v) {
        return MlaConfig::from_json(
            parse(minimal_config(kDeepseekV3Architecture,
                                 kMla + ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, "
                                        "\"mscale_all_dim\": " + v + "}")),
            *c);
    };
    auto huge = with_mscale_all_dim("1e21");
    REQUIRE_FALSE(huge.ok());
    CHECK(huge.status().code() == StatusCode::kInvalidArgument);
    CHECK(huge.status().message().find(
              "field 'rope_scaling.mscale_all_dim' is 1E21, expected 0 or more and at most 1000") !=
          std::string::npos);
    // At the bound it is taken, its softmax scale finite as a float.
    auto at_bound = with_mscale_all_dim("1000");
    REQUIRE_MESSAGE(at_bound.ok(), at_bound.status().to_string());
    const double ms = 0.1 * 1000.0 * std::log(40.0) + 1.0;
    CHECK(at_bound->softmax_scale == doctest::Approx(ms * ms / std::sqrt(48.0)));
    CHECK(std::isfinite(static_cast<float>(at_bound->softmax_scale)));
}

}  // namespace
}  // namespace edge::engine
